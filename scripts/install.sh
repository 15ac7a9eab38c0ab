#!/usr/bin/env bash
# Set up a virtual environment with torch, fairseq and fairseq-dnas.
# CPU: about a minute on 2 cores with the local torch wheel (uv for the dependencies;
# docs/results/README.md#current-figures). Safe to re-run.
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
# uv installs the same versions as pip (checked: identical package lists) in
# about a third of the time (28 s instead of 85 s on 2 cores), unpacking and
# byte-compiling in parallel. torch is already in the venv and satisfies the
# requirement, so uv does not fetch another build. --compile-bytecode: pip
# compiles too, and an environment with PYTHONDONTWRITEBYTECODE=1 would
# otherwise recompile every import of every test subprocess. pip is the
# fallback where uv cannot be installed (USE_UV=0 forces it).
if [ "${USE_UV:-1}" = 1 ] && "${PIP[@]}" uv 2>/dev/null && [ -x "$VENV/bin/uv" ]; then
  "$VENV/bin/uv" pip install --quiet --python "$PY" --compile-bytecode -e ".[test,triton,hf]"
else
  "${PIP[@]}" -e ".[test,triton,hf]"
fi
echo "[install] (a pip note that ve-fairseq requires torchaudio is expected: fairseq's speech models are not used)"

"$PY" - <<'PYCHECK'
import torch, fairseq, fairseq_dnas, transformers
import fairseq_dnas.hf  # registers 'dnas'/'hnas' with transformers
import fairseq_dnas.plugin  # what --user-dir fairseq_dnas does: registers the models and tasks
from fairseq.models import ARCH_MODEL_REGISTRY
assert "transformer_hnas" in ARCH_MODEL_REGISTRY, "fairseq-dnas architectures not registered"
print(f"[install] ok: torch {torch.__version__}, fairseq {fairseq.__version__}, "
      f"fairseq-dnas {fairseq_dnas.__version__}, transformers {transformers.__version__}")
PYCHECK
