#!/usr/bin/env bash
# Take the GPU figures of docs/performance.md on a CUDA machine, in one go:
# the Triton and kernel tests on the GPU, then the benchmark with the GPU
# targets. Writes pytest-gpu.log, benchmark.log, gpu.json and gpu.md to
# OUT_DIR. About 15 minutes on an H100.
#
#   bash scripts/gpu_measure.sh                       # after scripts/install.sh (TORCH_SPEC=torch)
#   OUT_DIR=$OUT bash scripts/gpu_measure.sh          # on the lent machine (see ../shared/docs/gpu.md)
#
# Safe to re-run: every output is rewritten (the JSON through a temporary file).
set -euo pipefail

PYTHON="${PYTHON:-python3}"                  # an interpreter with CUDA torch, fairseq and triton
OUT_DIR="${OUT_DIR:-gpu-results}"            # where the logs and results go
SECTIONS="${SECTIONS:-module,model,generate}" # benchmark sections (crossover: dense vs triton)
TESTS="${TESTS:-tests/test_triton.py tests/test_kernels.py}"

cd "$(dirname "$0")/.."
mkdir -p "$OUT_DIR"
"$PYTHON" - <<'PYCHECK'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_measure.sh: torch sees no CUDA device; run it on a GPU machine")
print(f"[gpu_measure] {torch.cuda.get_device_name()}, torch {torch.__version__}")
PYCHECK

echo "[gpu_measure] tests on the GPU: $TESTS"
# shellcheck disable=SC2086  # TESTS is a list of paths
"$PYTHON" -m pytest -q -p no:cacheprovider $TESTS 2>&1 | tee "$OUT_DIR/pytest-gpu.log"

echo "[gpu_measure] benchmark: $SECTIONS"
PYTHONUNBUFFERED=1 "$PYTHON" scripts/benchmark.py --device cuda --sections "$SECTIONS" \
  --json "$OUT_DIR/gpu.json" --markdown "$OUT_DIR/gpu.md" 2>&1 | tee "$OUT_DIR/benchmark.log"
echo "[gpu_measure] done: $OUT_DIR/gpu.md"
