#!/usr/bin/env bash
# Set up a virtual environment with torch, fairseq and fairseq-dnas.
# About a minute on 2 idle CPU cores with a local torch wheel (uv for the
# dependencies; docs/results/README.md#current-figures): longer on a busy
# machine, and when torch itself is downloaded. Safe to re-run.
#
#   bash scripts/install.sh                 # into ./.venv; a CUDA torch when nvidia-smi sees a GPU
#   DRY_RUN=1 bash scripts/install.sh       # print what it would install, and why
#   TORCH_SPEC="torch==2.13.0" TORCH_INDEX_URL=... bash scripts/install.sh   # another torch build
#
# Why it is done this way: docs/installation.md.
set -euo pipefail

PYTHON="${PYTHON:-python3}"                 # interpreter for the venv
VENV="${VENV:-.venv}"                       # where the environment goes
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TORCH_SPEC="${TORCH_SPEC:-}"                # empty: torch TORCH_VERSION, the CUDA build on a GPU machine (below)
TORCH_INDEX_URL="${TORCH_INDEX_URL:-}"      # another package index for torch only (e.g. PyTorch's own, per CUDA version)
FAIRSEQ_SPEC="${FAIRSEQ_SPEC:-}"            # empty: chosen by Python version below
DRY_RUN="${DRY_RUN:-0}"                     # 1: print the choices and stop

cd "$(dirname "$0")/.."

# A GPU machine: nvidia-smi lists at least one GPU.
GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then GPU=1; fi
if [ -z "$TORCH_SPEC" ]; then
  if [ "$GPU" = 1 ] && [ -z "$TORCH_INDEX_URL" ]; then
    # '===': exactly this version, not a local '+cpu' build that a pip
    # configuration's extra index may also offer; PyPI's plain Linux build of
    # torch is the CUDA one.
    TORCH_SPEC="torch===$TORCH_VERSION"
    TORCH_WHY="nvidia-smi sees a GPU: the CUDA build"
  else
    TORCH_SPEC="torch==$TORCH_VERSION"
    TORCH_WHY="no GPU found by nvidia-smi"
    [ "$GPU" = 1 ] && TORCH_WHY="nvidia-smi sees a GPU: the build TORCH_INDEX_URL offers"
  fi
else
  TORCH_WHY="TORCH_SPEC"
fi
TORCH_INDEX=(); [ -n "$TORCH_INDEX_URL" ] && TORCH_INDEX=(--index-url "$TORCH_INDEX_URL")

if [ -z "$FAIRSEQ_SPEC" ]; then
  # PyPI fairseq 0.12.2 does not import on Python >= 3.11 (dataclass mutable
  # default); ve-fairseq 0.12.3 is a community build of the same code with
  # wheels for CPython 3.11/3.12.
  VERSION_OF="$PYTHON"; [ -x "$VENV/bin/python" ] && VERSION_OF="$VENV/bin/python"  # the venv's, once it exists
  if "$VERSION_OF" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    FAIRSEQ_SPEC="ve-fairseq==0.12.3"
  else
    FAIRSEQ_SPEC="fairseq==0.12.2"
  fi
fi

if [ "$DRY_RUN" = 1 ]; then
  echo "[install] would install into $VENV with $($PYTHON --version 2>&1):"
  echo "[install]   $TORCH_SPEC ($TORCH_WHY)${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}"
  echo "[install]   $FAIRSEQ_SPEC (--no-deps)"
  echo "[install]   fairseq-dnas with the extras test, triton, hf"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

echo "[install] $TORCH_SPEC ($TORCH_WHY)"
"${PIP[@]}" ${TORCH_INDEX[@]+"${TORCH_INDEX[@]}"} "$TORCH_SPEC"
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
  # pip then notes that ve-fairseq requires torchaudio: expected, fairseq's
  # speech models are not used (docs/installation.md).
  "${PIP[@]}" -e ".[test,triton,hf]"
fi

GPU_CHECK=(); [ "$GPU" = 1 ] && GPU_CHECK=(--gpu)
"$PY" -m fairseq_dnas.recipes.install_check ${GPU_CHECK[@]+"${GPU_CHECK[@]}"}
