"""Load a fairseq checkpoint (of this plugin or a plain ``transformer``) for analysis."""

import os

import torch


def plugin_dir() -> str:
    """The installed ``fairseq_dnas`` folder: passed as ``user_dir`` so that a
    checkpoint trained from another clone (another --user-dir path) loads."""
    import fairseq_dnas

    return os.path.dirname(os.path.abspath(fairseq_dnas.__file__))


def load_model(path: str, data: str, device: str = "cpu"):
    """(model in eval mode, cfg, task) of checkpoint ``path``, with the task's
    data folder set to ``data`` (the dictionaries are read from there).

    FileNotFoundError for a missing file or folder; ``file_checks.BadFile``
    (one line naming the file) for a truncated or corrupt checkpoint, one
    that does not fit the data's dictionary, or a bad data file."""
    import fairseq_dnas  # noqa: F401  (fairseq checkpoint loading under torch >= 2.6)
    from fairseq import checkpoint_utils

    from fairseq_dnas import file_checks

    file_checks.install()  # a bad checkpoint or data file: BadFile naming it
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if not os.path.isdir(data):
        raise FileNotFoundError(f"data folder not found: {data} (give the fairseq-preprocess --destdir)")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data, "user_dir": plugin_dir()}
    )
    model = models[0].eval().to(torch.device(device))
    return model, cfg, task


def encoder_scheme(model) -> str:
    """'unas', 'dnas' or 'hnas' (a plain fairseq ``transformer`` is 'unas')."""
    schemes = {getattr(layer.self_attn, "scheme", "unas") for layer in model.encoder.layers}
    return schemes.pop() if len(schemes) == 1 else "mixed"


def describe(model) -> str:
    """A short label such as 'DNAS' or 'HNAS (mean u 0.42)'."""
    scheme = encoder_scheme(model)
    if scheme == "hnas":
        us = [float(layer.self_attn.hybrid_weight.detach().mean()) for layer in model.encoder.layers]
        return f"HNAS (mean u {sum(us) / len(us):.2f})"
    return scheme.upper()
