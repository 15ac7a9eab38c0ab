#!/usr/bin/env bash
# Set up a virtual environment with torch, fairseq and fairseq-dnas.
# CPU: about 1.5 minutes on 2 cores with the local torch wheel. Safe to re-run.
#
#   bash scripts/install.sh                 # CPU, torch 2.13.0, into ./.venv
#   TORCH_SPEC=torch bash scripts/install.sh  # GPU machine: the default CUDA build
#
# Why it is done this way: docs/installation.md.
set -euo pipefail

PYTHON="${PYTHON:-python3}"                 # interpreter for the venv
VENV="${VENV:-.venv}"                       # where the environment goes
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"   # CPU wheel here; a CUDA build on GPUs
FAIRSEQ_SPEC="${FAIRSEQ_SPEC:-}"            # empty: chosen by Python version below

cd "$(dirname "$0")/.."

if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

if [ -z "$FAIRSEQ_SPEC" ]; then
  # PyPI fairseq 0.12.2 does not import on Python >= 3.11 (dataclass mutable
  # default); ve-fairseq 0.12.3 is a community build of the same code with
  # wheels for CPython 3.11/3.12.
  if "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    FAIRSEQ_SPEC="ve-fairseq==0.12.3"
  else
    FAIRSEQ_SPEC="fairseq==0.12.2"
  fi
fi

echo "[install] $TORCH_SPEC"
"${PIP[@]}" "$TORCH_SPEC"
echo "[install] $FAIRSEQ_SPEC (--no-deps: its torchaudio pin would replace torch)"
"${PIP[@]}" --no-deps "$FAIRSEQ_SPEC"
echo "[install] fairseq-dnas, fairseq's runtime dependencies, pytest + xdist, triton (GPU kernels; tested on CPU by its interpreter), transformers (fairseq_dnas.hf)"
"${PIP[@]}" -e ".[test,triton,hf]"
echo "[install] (a pip note that ve-fairseq requires torchaudio is expected: fairseq's speech models are not used)"

"$PY" - <<'PYCHECK'
import torch, fairseq, fairseq_dnas, transformers
import fairseq_dnas.hf  # registers 'dnas'/'hnas' with transformers
from fairseq.models import ARCH_MODEL_REGISTRY
assert "transformer_hnas" in ARCH_MODEL_REGISTRY, "fairseq-dnas architectures not registered"
print(f"[install] ok: torch {torch.__version__}, fairseq {fairseq.__version__}, "
      f"fairseq-dnas {fairseq_dnas.__version__}, transformers {transformers.__version__}")
PYCHECK
