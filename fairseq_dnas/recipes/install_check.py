"""scripts/install.sh's last step: the environment imports, the plugin's
architectures are registered, and, with --gpu (nvidia-smi saw a GPU), torch
can use it.

    .venv/bin/python -m fairseq_dnas.recipes.install_check [--gpu]

Prints one line with the versions; with --gpu and a torch that sees no CUDA
device, one more line saying which setting to change. Exit 1 only when the
environment is broken (an import fails, the architectures are missing).
"""

import argparse
import logging
import sys

# fairseq configures Python's logging at import (INFO and DEBUG handlers) and
# then logs, at INFO, that tensorboardX is missing: a note for its speech
# models, not a problem. Configuring logging first makes fairseq's calls no-ops.
logging.basicConfig(level=logging.WARNING, format="%(levelname)s:%(name)s:%(message)s")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="a GPU is present: check that torch can use it")
    args = p.parse_args(argv)
    try:
        import fairseq
        import torch
        import transformers

        import fairseq_dnas
        import fairseq_dnas.hf  # noqa: F401  (registers 'dnas'/'hnas'/'discrete' with transformers)
        import fairseq_dnas.plugin  # noqa: F401  (what --user-dir fairseq_dnas does: registers the models and tasks)
        from fairseq.models import ARCH_MODEL_REGISTRY
    except ImportError as err:
        print(f"[install] error: the environment does not import: {err}", file=sys.stderr)
        return 1
    if "transformer_hnas" not in ARCH_MODEL_REGISTRY:
        print("[install] error: fairseq-dnas architectures not registered", file=sys.stderr)
        return 1
    device = "CPU"
    if torch.cuda.is_available():
        device = f"CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}"
    print(f"[install] ok: torch {torch.__version__} ({device}), fairseq {fairseq.__version__}, "
          f"fairseq-dnas {fairseq_dnas.__version__}, transformers {transformers.__version__}")
    if args.gpu and not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        print(f"[install] warning: nvidia-smi sees a GPU but torch {torch.__version__} ({build}) cannot use it; "
              "set TORCH_SPEC (and TORCH_INDEX_URL) to a CUDA build your driver supports and re-run "
              "(docs/installation.md#gpu-machines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
