"""Patch ``fairseq.data.encoders.build_bpe``: a missing BPE file is one line
that says what to pass.

fairseq builds the BPE of a loaded model (``BARTModel.from_pretrained``, the
hub interface, ``fairseq-generate --bpe ...``) from the file paths in the
checkpoint or the call. A path that does not exist on this machine (the
checkpoint was trained elsewhere, or fine-tuned without ``--bpe``: the
failure of fairseq#2874) ends deep inside the BPE's own reader (``OSError``
from SentencePiece, ``FileNotFoundError`` from the GPT-2 reader). Here it is
``BadFile("<path>: no such BPE file ...; pass <keyword>=PATH ...")`` before
the reader runs. URLs (fairseq's GPT-2 defaults, fetched into its cache) and
BPEs without files are left to fairseq.
"""

import os

from fairseq_dnas.errors import BadFile

# --bpe name -> (config field, command-line flag) of each file it reads.
BPE_FILES = {
    "gpt2": (("gpt2_encoder_json", "--gpt2-encoder-json"), ("gpt2_vocab_bpe", "--gpt2-vocab-bpe")),
    "sentencepiece": (("sentencepiece_model", "--sentencepiece-model"),),
    "subword_nmt": (("bpe_codes", "--bpe-codes"),),
    "fastbpe": (("bpe_codes", "--bpe-codes"),),
    "hf_byte_bpe": (("bpe_merges", "--bpe-merges"), ("bpe_vocab", "--bpe-vocab")),
}


def _get(cfg, name):
    try:
        return getattr(cfg, name, None)
    except Exception:  # an omegaconf struct without the key
        return None


def bpe_name(cfg):
    """The BPE's registry name from a dataclass config (``_name``) or a Namespace (``bpe``)."""
    return _get(cfg, "_name") or _get(cfg, "bpe")


def check_bpe_files(cfg) -> None:
    """Raise BadFile naming the keyword and flag to pass when a local BPE file is missing."""
    if cfg is None:
        return
    for field, flag in BPE_FILES.get(bpe_name(cfg), ()):
        path = _get(cfg, field)
        if not isinstance(path, str) or "://" in path:
            continue
        if not os.path.isfile(path):
            raise BadFile(path, f"no such BPE file ({field}); pass {field}=PATH to from_pretrained, "
                                f"or {flag} PATH to fairseq-generate / fairseq-interactive")


def install() -> None:
    """Idempotent."""
    from fairseq.data import encoders

    from fairseq_dnas.fairseq_patches import is_patched, mark

    if is_patched(encoders.build_bpe):
        return
    build_bpe = encoders.build_bpe

    def checked_build_bpe(cfg, *args, **kwargs):
        check_bpe_files(cfg)
        return build_bpe(cfg, *args, **kwargs)

    checked_build_bpe.__wrapped__ = build_bpe
    encoders.build_bpe = mark(checked_build_bpe, "bpe_files")
