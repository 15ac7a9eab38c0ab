"""Switch a transformers model to DNAS/HNAS or discrete attention, and load
one saved that way.

``enable`` tags each attention module with its role, adds the HNAS logit
``hybrid_logit`` (the fairseq plugin's name) to each bidirectional
self-attention module (HNAS), or sets the Gumbel temperature and the
straight-through switch on it (discrete: ``gumbel_temperature``,
``gumbel_hard``, the fairseq flags' names), records the settings in
``config.dnas`` (saved in config.json) and sets the attention implementation. ``from_pretrained``
loads a model saved after ``enable``: transformers drops the weights its
classes do not define, so the HNAS logits are read back from the files.
"""

import contextlib
import inspect
import json
import os
import warnings
from typing import List, Tuple

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from fairseq_dnas.attention.gumbel_schedule import check_temperature
from fairseq_dnas.attention.hybrid import HYBRID_PER, check_hybrid_init, hybrid_logit
from fairseq_dnas.hf.attention import DISCRETE, HARD_ATTR, ROLE_ATTR, SCHEMES, TEMPERATURE_ATTR, infer_role, register

TESTED = ("BERT, RoBERTa, XLM-R, ALBERT, DistilBERT, ELECTRA, BART/mBART/PEGASUS (encoder), T5/mT5/UMT5 (encoder), "
          "Whisper (encoder), ViT, "
          "DINOv2, SigLIP, CLIP (vision tower), wav2vec 2.0, HuBERT")
LOGIT = "hybrid_logit"


PROBE = "dnas_probe"  # the implementation name of the probe forward


PROBE_LENGTH = 8  # tokens (or decoder tokens, or audio frames) of the probe forward's one sequence


def _sub_config(config, name: str):
    """``config``'s sub-config ``name`` (CLIP/SigLIP: text_config, vision_config), or ``config`` itself."""
    return getattr(config, name, None) or config


def _token_ids(config, length: int) -> torch.Tensor:
    """(1, length) ids below the vocabulary size, ending with the end-of-sequence id when there is one
    (BART's classification head reads the hidden state at the end tokens)."""
    vocab = getattr(config, "vocab_size", None) or 2
    length = min(length, getattr(config, "max_position_embeddings", None) or length)
    ids = torch.arange(length) % vocab
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, int) and 0 <= eos < vocab:
        ids[-1] = eos
    return ids[None]


def _audio_samples(config, frames: int) -> int:
    """Raw samples that wav2vec 2.0's convolutional feature encoder turns into ``frames`` frames."""
    samples = frames
    for kernel, stride in reversed(list(zip(config.conv_kernel, config.conv_stride))):
        samples = (samples - 1) * stride + kernel  # a Conv1d without padding, inverted
    return samples


def _probe_inputs(model) -> dict:
    """A batch of one sequence for ``model.forward``, built from its config
    (not from ``dummy_inputs``, which many models lack or build wrongly):
    token ids, images (``pixel_values``), raw audio (``input_values``), log-mel
    features (``input_features``, Whisper's encoder length) and, for an
    encoder-decoder model, decoder ids; each only where ``forward`` takes it."""
    config = model.config
    takes = inspect.signature(model.forward).parameters
    dtype = next(model.parameters()).dtype
    inputs = {}
    if "input_ids" in takes and (model.main_input_name == "input_ids" or "pixel_values" in takes):
        inputs["input_ids"] = _token_ids(_sub_config(config, "text_config"), PROBE_LENGTH)  # CLIP/SigLIP: both towers
    if "pixel_values" in takes:
        vision = _sub_config(config, "vision_config")
        size = vision.image_size if isinstance(vision.image_size, int) else vision.image_size[0]
        inputs["pixel_values"] = torch.randn(1, vision.num_channels, size, size, dtype=dtype)
    if "input_values" in takes and hasattr(config, "conv_kernel"):
        inputs["input_values"] = torch.randn(1, _audio_samples(config, PROBE_LENGTH), dtype=dtype)
    if "input_features" in takes and hasattr(config, "max_source_positions"):
        # Whisper's encoder takes exactly 2 * max_source_positions frames (its second convolution has stride 2)
        inputs["input_features"] = torch.randn(1, config.num_mel_bins, 2 * config.max_source_positions, dtype=dtype)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in takes:
        # the source's ids where there are (PEGASUS, unlike BART, makes no decoder input from them; of the
        # same length, a classification head that reads the decoder at the end tokens finds them)
        inputs["decoder_input_ids"] = inputs.get("input_ids", _token_ids(config, PROBE_LENGTH))
    if not inputs:
        raise ValueError(f"cannot build an input for {type(model).__name__}.forward from its config (it takes none of "
                         "input_ids, pixel_values, input_values, input_features)")
    return inputs


def _interface_callers(model) -> dict:
    """module -> role seen, for each module that calls the attention function
    transformers takes from its AttentionInterface, found by what the model
    does: one forward of inputs built from its config (``_probe_inputs``)
    under a registered probe implementation that records each module calling
    it (and computes as ``sdpa``). The role is 'causal' where the call says
    ``is_causal=True`` (CLIP's text tower shares its attention class with the
    vision tower and says it only there), 'cross' where queries and keys differ
    in length, else None (told by ``infer_role``). Empty when transformers
    refuses to set the implementation (a model that does not use the
    interface) or the forward never reaches it."""
    called = {}

    def probe(module, query, key, value, attention_mask, **kwargs):
        role = "causal" if kwargs.get("is_causal") else "cross" if query.shape[-2] != key.shape[-2] else None
        called.setdefault(module, role)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(PROBE, probe)
    AttentionMaskInterface.register(PROBE, sdpa_mask)
    previous, was_training = model.config._attn_implementation, model.training
    try:
        model.set_attn_implementation(PROBE)
        if model.config._attn_implementation != PROBE:
            return {}
        model.eval()
        device = next(model.parameters()).device
        inputs = _probe_inputs(model)
        with torch.no_grad():
            model(**{k: v.to(device) for k, v in inputs.items()})
    except Exception as err:  # noqa: BLE001 (any model: say which one and why)
        raise ValueError(f"{type(model).__name__}: the probe forward (inputs built from its config) that finds the "
                         f"attention modules failed ({type(err).__name__}: {err})") from None
    finally:
        if model.config._attn_implementation != previous:
            model.set_attn_implementation(previous)
        model.train(was_training)
    return called


def attention_modules(model) -> List[Tuple[str, torch.nn.Module, str]]:
    """(name, module, role) of every attention module that calls the
    interface (``_interface_callers``), in model order (encoder layers bottom
    first). A module shared by several layers (ALBERT) appears once."""
    callers = _interface_callers(model)
    seen, found = set(), []
    for name, module in model.named_modules():
        if id(module) in seen or module not in callers:
            continue
        seen.add(id(module))
        found.append((name, module, callers[module] or infer_role(module, name)))
    return found


def _num_heads(module, config) -> int:
    for attr in ("num_heads", "num_attention_heads", "n_heads"):
        value = getattr(module, attr, None)
        if isinstance(value, int):
            return value
    for attr in ("num_attention_heads", "encoder_attention_heads", "n_heads"):
        value = getattr(config, attr, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"cannot tell the number of heads of {type(module).__name__}")


# The settings each scheme reads, with their defaults; any other setting given
# to enable() does nothing and is refused.
SETTINGS = {
    "unas": {},
    "dnas": {},
    "hnas": {"hybrid_init": 0.5, "per": "head"},
    DISCRETE: {"gumbel_temperature": 1.0, "gumbel_hard": False},
}


def scheme_settings(scheme: str, **given) -> dict:
    """The settings ``scheme`` reads, from ``given`` (None: not given) or its
    defaults; ValueError naming a setting given that the scheme does not read."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    wanted = SETTINGS[scheme]
    for name, value in given.items():
        if value is not None and name not in wanted:
            users = " and ".join(f"scheme={s!r}" for s, names in SETTINGS.items() if name in names)
            raise ValueError(f"{name}={value!r} does nothing with scheme={scheme!r}: it applies to {users} "
                             f"only; drop it")
    return {name: default if given.get(name) is None else given[name] for name, default in wanted.items()}


def enable(model, scheme: str = "hnas", hybrid_init: float = None, per: str = None,
           gumbel_temperature: float = None, gumbel_hard: bool = None):
    """Make ``model``'s bidirectional self-attention DNAS, HNAS or discrete (in place; returns ``model``).

    scheme: 'dnas', 'hnas', 'discrete' (J. Kinley, 2020: one key per query
        and head, sampled from softmax(L)) or 'unas' (softmax through the
        same code, for checks).
    hybrid_init: HNAS only: the initial u (default 0.5, the paper's; 0.1 for Gigaword).
    per: HNAS only: 'head' (default: one u per layer and head) or 'layer' (one per layer).
    gumbel_temperature: discrete only: tau of the relaxed sample in training
        (default 1, the thesis's; fairseq's --gumbel-temperature). Set
        ``module.gumbel_temperature`` on the attention modules to anneal it.
    gumbel_hard: discrete only: straight-through, a one-hot forward with the
        relaxed gradient (default False; fairseq's --gumbel-hard).
    A setting given for a scheme that does not read it is a ValueError.
    On a model that has u already (a second call, or after from_pretrained),
    'hnas' starts u afresh at hybrid_init and any other scheme removes it,
    each with a warning saying so.
    In eval mode (``model.eval()``) discrete attention takes the argmax key
    of each row, without noise.

    The implementation is set on ``model.config``: other models built from the
    same config object switch with it (give each its own copy).
    """
    settings = scheme_settings(scheme, hybrid_init=hybrid_init, per=per, gumbel_temperature=gumbel_temperature,
                               gumbel_hard=gumbel_hard)
    hybrid_init, per = settings.get("hybrid_init"), settings.get("per", "head")
    gumbel_temperature, gumbel_hard = settings.get("gumbel_temperature"), settings.get("gumbel_hard")
    if per not in HYBRID_PER:
        raise ValueError(f"unknown per={per!r}: choose one of {', '.join(HYBRID_PER)}")
    if scheme == DISCRETE:
        try:
            check_temperature(gumbel_temperature)
        except ValueError:
            raise ValueError(f"gumbel_temperature must be a finite number > 0 (the thesis uses 1); "
                             f"got {gumbel_temperature!r}") from None
        if not isinstance(gumbel_hard, bool):
            raise ValueError(f"gumbel_hard must be True or False; got {gumbel_hard!r}")
    register()
    kind = type(model).__name__
    modules = attention_modules(model)
    if not modules:
        raise ValueError(
            f"{kind} does not route its attention through transformers' AttentionInterface, so DNAS/HNAS "
            f"cannot replace it; supported (tested): {TESTED}"
        )
    for name, module, _ in modules:
        if getattr(module, "sliding_window", None) or getattr(module, "local_attention", None) not in (None, (-1, -1)):
            raise ValueError(
                f"{kind} has sliding-window (local) attention ({name}): DNAS/HNAS supports full bidirectional "
                f"self-attention with padding masks only; use a model such as {TESTED}"
            )
    selfs = [(name, module) for name, module, role in modules if role == "self"]
    if not selfs:
        raise ValueError(
            f"{kind} has no bidirectional self-attention (all its attention is causal or cross-attention, which "
            f"stays softmax): DNAS/HNAS is for encoders such as {TESTED}"
        )
    if scheme == "hnas":  # a bad hybrid_init is refused before anything changes
        check_hybrid_init(hybrid_init, "hybrid_init", "scheme='unas' or 'dnas'")
    for name, module, role in modules:
        setattr(module, ROLE_ATTR, role)
    _say_what_happens_to_u(model, [m for _, m in selfs], scheme, hybrid_init, per)
    for name, module in selfs:
        heads = _num_heads(module, model.config)
        current = getattr(module, LOGIT, None)
        if scheme == "hnas":
            # u starts at hybrid_init, also where the module has u already (a second call): config.dnas says so
            device = next(module.parameters()).device
            fresh = hybrid_logit(heads, hybrid_init, per, name="hybrid_init", fixed="scheme='unas' or 'dnas'",
                                 device=device)
            if current is not None and current.shape == fresh.shape:
                with torch.no_grad():  # the same Parameter: an optimizer holding it keeps training it
                    current.copy_(fresh.to(current.dtype))
            else:
                module.register_parameter(LOGIT, fresh)
        elif current is not None:
            delattr(module, LOGIT)
        if scheme == DISCRETE:
            setattr(module, TEMPERATURE_ATTR, float(gumbel_temperature))
            setattr(module, HARD_ATTR, gumbel_hard)
        else:
            for attr in (TEMPERATURE_ATTR, HARD_ATTR):
                if hasattr(module, attr):
                    delattr(module, attr)
    if scheme == DISCRETE:
        settings["gumbel_temperature"] = float(gumbel_temperature)
    model.config.dnas = {"scheme": scheme, **settings}  # only what the scheme reads
    # Saved in config.json, read back by transformers' own from_pretrained as the
    # implementation: a plain load of this folder then runs the scheme (DNAS), or
    # stops at the first forward with a line naming hf.from_pretrained (HNAS,
    # discrete: their weights and settings are not restored), or, without
    # fairseq_dnas.hf imported, is refused by transformers: never a silent sdpa model.
    model.config.attn_implementation = scheme
    model.set_attn_implementation(scheme)
    return model


def _say_what_happens_to_u(model, modules, scheme: str, hybrid_init, per):
    """A warning when ``enable`` is called on a model that has HNAS weights u
    already (a second call, or after hf.from_pretrained): 'hnas' starts them
    afresh at ``hybrid_init``, any other scheme removes them."""
    logits = [getattr(m, LOGIT) for m in modules if getattr(m, LOGIT, None) is not None]
    if not logits:
        return
    mean = float(torch.cat([torch.sigmoid(x.detach().float()).flatten() for x in logits]).mean())
    had = f"{type(model).__name__} has HNAS weights u already ({len(logits)} modules, mean u {mean:.4g})"
    if scheme == "hnas":
        warnings.warn(f"{had}: enable(scheme='hnas') starts them afresh at hybrid_init={hybrid_init}, per={per!r}, "
                      "as config.dnas records; to keep trained u, do not call enable again (hf.from_pretrained "
                      "restores them)", stacklevel=3)
    else:
        warnings.warn(f"{had}: scheme={scheme!r} has none, so enable removes them; save the model "
                      "(save_pretrained) first to keep them", stacklevel=3)


def _saved_tensors(path: str):
    """name -> tensor of the HNAS logits saved in directory ``path``."""
    files = []
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted({os.path.join(path, v) for v in json.load(f)["weight_map"].values()})
    elif os.path.exists(os.path.join(path, "model.safetensors")):
        files = [os.path.join(path, "model.safetensors")]
    elif os.path.exists(os.path.join(path, "pytorch_model.bin")):
        state = torch.load(os.path.join(path, "pytorch_model.bin"), map_location="cpu", weights_only=True)
        return {k: v for k, v in state.items() if k.endswith(LOGIT)}
    else:
        raise ValueError(f"{path} holds no model weights (model.safetensors or pytorch_model.bin): pass the directory given to save_pretrained")
    from safetensors import safe_open

    found = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for k in f.keys():
                if k.endswith(LOGIT):
                    found[k] = f.get_tensor(k)
    return found


def _saved_name(model, name: str, param) -> str:
    """The name ``save_pretrained`` gives parameter ``name``: transformers 5
    saves some models under their earlier names (ViT's ``layers.0`` as
    ``encoder.layer.0``) and renames them back on loading."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers before 5: saved as named
        return name
    (saved,) = revert_weight_conversion(model, {name: param}).keys()
    return saved


def load_hybrid_logits(model, path: str) -> int:
    """Copy the HNAS logits saved in ``path`` into ``model`` (after ``enable``); returns how many."""
    saved = _saved_tensors(path)
    own = {n: p for n, p in model.named_parameters() if n.endswith(LOGIT)}
    missing = []
    for own_name, param in own.items():
        name = _saved_name(model, own_name, param)
        # The saved name may carry or lack the base model's prefix
        # (saved from BertForSequenceClassification, loaded into BertModel).
        match = [k for k in saved if k == name or k.endswith("." + name) or name.endswith("." + k)]
        if len(match) != 1 or saved[match[0]].shape != param.shape:
            missing.append(own_name)
            continue
        with torch.no_grad():
            param.copy_(saved[match[0]].to(param.device, param.dtype))
    if missing:
        raise ValueError(
            f"{path} lacks the HNAS weights {missing[0]}"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
            + ": save the model with save_pretrained after fairseq_dnas.hf.enable(model, scheme='hnas'), "
            "or start HNAS afresh with enable(model, scheme='hnas', hybrid_init=...) instead of loading"
        )
    return len(own)


@contextlib.contextmanager
def _hybrid_logits_expected(model_class):
    """transformers reports the saved weights its classes do not define as
    UNEXPECTED in its LOAD REPORT; ``from_pretrained`` restores the HNAS
    logits itself (load_hybrid_logits), so during its load, and for those
    keys only, transformers is told to expect them. Any other unexpected or
    missing key is still reported."""
    own = "_keys_to_ignore_on_load_unexpected" in vars(model_class)
    before = vars(model_class).get("_keys_to_ignore_on_load_unexpected")
    inherited = getattr(model_class, "_keys_to_ignore_on_load_unexpected", None) or []
    model_class._keys_to_ignore_on_load_unexpected = [*inherited, rf"(^|\.){LOGIT}$"]
    try:
        yield
    finally:
        if own:
            model_class._keys_to_ignore_on_load_unexpected = before
        else:
            del model_class._keys_to_ignore_on_load_unexpected


def from_pretrained(model_class, path: str, **kwargs):
    """``model_class.from_pretrained(path)`` for a model saved after ``enable``,
    with its scheme and HNAS weights restored."""
    if not os.path.isdir(path):
        raise ValueError(f"{path} is not a folder: hf.from_pretrained loads the folder that save_pretrained wrote "
                         "after fairseq_dnas.hf.enable")
    register()  # config.json names the scheme as its implementation
    with _hybrid_logits_expected(model_class):
        model = model_class.from_pretrained(path, **kwargs)
    settings = getattr(model.config, "dnas", None)
    if not isinstance(settings, dict) or settings.get("scheme") not in SCHEMES:
        raise ValueError(
            f"{path} was not saved after fairseq_dnas.hf.enable (config.json has no 'dnas' entry): load it with "
            f"{model_class.__name__}.from_pretrained and call fairseq_dnas.hf.enable(model, scheme=...)"
        )
    # only the settings its scheme reads (folders saved by earlier versions record all of them)
    scheme = settings["scheme"]
    enable(model, scheme=scheme, **{k: v for k, v in settings.items() if k in SETTINGS[scheme]})
    if settings["scheme"] == "hnas":
        load_hybrid_logits(model, path)
    return model
