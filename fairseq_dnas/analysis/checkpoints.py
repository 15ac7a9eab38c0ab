"""What loading a fairseq checkpoint for analysis needs to know: this
plugin's ``transformer_dnas`` (or a plain ``transformer``) of a translation
task, or its encoder-only ``roberta_dnas`` (or a plain ``roberta``) of a
``masked_lm`` or ``sentence_prediction`` task; which data folder its task
reads; which scheme a loaded model's encoder runs. The loading itself
(which registers the plugin) is ``fairseq_dnas.loading.load_model``, a layer
above this library."""

import os

# Tasks whose models are RoBERTa encoders (no decoder), and the data folders
# they read their dictionary from.
MASKED_LM, SENTENCE_PREDICTION = "masked_lm", "sentence_prediction"
ENCODER_ONLY_TASKS = (MASKED_LM, SENTENCE_PREDICTION)


class DataMismatch(ValueError):
    """The data folder is of another kind than the checkpoint's task reads."""


def plugin_dir() -> str:
    """The installed ``fairseq_dnas`` folder: passed as ``user_dir`` so that a
    checkpoint trained from another clone (another --user-dir path) loads."""
    import fairseq_dnas

    return os.path.dirname(os.path.abspath(fairseq_dnas.__file__))


def data_layout(data: str) -> str:
    """What fairseq-preprocess wrote into ``data``:

    - 'masked_lm': ``dict.txt`` (``--only-source``, what ``--task masked_lm`` reads);
    - 'sentence_prediction': ``input0/dict.txt`` (``--task sentence_prediction``);
    - 'translation': ``dict.<lang>.txt``;
    - 'unknown': none of these.
    """
    files = set(os.listdir(data))
    if any(f.startswith("dict.") and f.endswith(".txt") and f != "dict.txt" for f in files):
        return "translation"
    if "dict.txt" in files:
        return MASKED_LM
    if os.path.isfile(os.path.join(data, "input0", "dict.txt")):
        return SENTENCE_PREDICTION
    return "unknown"


_GIVE = {
    MASKED_LM: "the fairseq-preprocess --only-source folder (dict.txt, <split>.bin/.idx) "
               "or a sentence_prediction folder (input0/dict.txt)",
    SENTENCE_PREDICTION: "its fine-tuning data folder (input0/dict.txt, label/dict.txt, "
                         "input0/<split>.bin/.idx)",
}
_WHAT = {"translation": "translation data (dict.<lang>.txt)", MASKED_LM: "masked-LM data (dict.txt)",
         SENTENCE_PREDICTION: "sentence_prediction data (input0/)", "unknown": "no fairseq dictionary"}


def task_data(task: str, data: str, path: str) -> str:
    """The folder to hand the checkpoint's ``task`` as its ``data``.

    A masked_lm task reads ``dict.txt`` and ``<split>.bin`` from its folder, so
    a sentence_prediction folder works through its ``input0/``. A
    sentence_prediction task needs its own folder (it also reads the label
    dictionary). A translation checkpoint gets ``data`` as given, as before,
    unless the folder is clearly encoder-only data. DataMismatch otherwise.
    """
    layout = data_layout(data)
    if task == MASKED_LM and layout == SENTENCE_PREDICTION:
        return os.path.join(data, "input0")
    if task in ENCODER_ONLY_TASKS and layout != task:
        raise DataMismatch(f"{data} holds {_WHAT[layout]}, but {path} is a {task} checkpoint: "
                           f"give {_GIVE[task]} as --data")
    if task not in ENCODER_ONLY_TASKS and layout in ENCODER_ONLY_TASKS:
        raise DataMismatch(f"{data} holds {_WHAT[layout]}, but {path} is a {task} checkpoint: "
                           "give its fairseq-preprocess folder (dict.<src>.txt, dict.<tgt>.txt) as --data")
    return data


def checkpoint_task(state) -> str:
    """The registered task name a fairseq checkpoint was trained with."""
    cfg = state.get("cfg")
    if cfg is not None and cfg.get("task") is not None:
        return str(cfg["task"].get("_name"))
    return str(getattr(state.get("args"), "task", "?"))


def _override(state, overrides) -> None:
    """What ``load_checkpoint_to_cpu(path, overrides)`` does to its state."""
    from fairseq.dataclass.utils import overwrite_args_by_name

    if state.get("args") is not None:
        for name, value in overrides.items():
            setattr(state["args"], name, value)
    if state.get("cfg") is not None:
        overwrite_args_by_name(state["cfg"], overrides)


def _encoder_layers(model):
    from fairseq_dnas.analysis.capture import encoder_stack

    return encoder_stack(model).layers


def encoder_scheme(model) -> str:
    """'unas', 'dnas' or 'hnas' (a plain fairseq ``transformer`` or
    ``roberta`` is 'unas')."""
    schemes = {getattr(layer.self_attn, "scheme", "unas") for layer in _encoder_layers(model)}
    return schemes.pop() if len(schemes) == 1 else "mixed"


def describe(model) -> str:
    """A short label such as 'DNAS' or 'HNAS (mean u 0.42)'."""
    scheme = encoder_scheme(model)
    if scheme == "hnas":
        us = [float(layer.self_attn.hybrid_weight.detach().mean()) for layer in _encoder_layers(model)]
        return f"HNAS (mean u {sum(us) / len(us):.2f})"
    return scheme.upper()
