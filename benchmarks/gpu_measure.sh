#!/usr/bin/env bash
# Take the GPU figures of docs/performance.md on a CUDA machine: the Triton
# and kernel tests on the GPU, the tile timings, then the benchmark with the
# GPU targets (built-in tiles, then the module section again with the timed
# tiles), and on request (STEPS=mask,train) the dropout mask against the
# interpreter's and fp16 training of the Gigaword paper-size model. Writes
# pytest-gpu.log, tiles.json, tiles.log, benchmark.log, gpu.json, gpu.md,
# tuned.json, tuned.md, mask.log and train*.log to OUT_DIR. STEPS=kernels times the
# v1 and v2 Triton kernels alone against SDPA (benchmark.py --sections kernels:
# kernels.json, kernels.md; T 512-4096, then T 64 and 128 at B 128 x H 16 with
# the one-tile kernels, v2-short, beside v1 and v2's long ones) after checking
# v2 and v2-short on this GPU (FAIRSEQ_DNAS_TRITON_KERNELS=v2 python -m
# fairseq_dnas.check: check-v2.log); about 4 minutes.
# About 20 minutes on an H100 in all; the lent machine runs at most 10
# minutes a command, so there run one step a call (STEPS=tests, then tiles,
# then benchmark, then tuned; see docs/performance.md#running-on-a-gpu).
#
#   bash benchmarks/gpu_measure.sh                       # after scripts/install.sh (TORCH_SPEC=torch)
#   STEPS=tiles OUT_DIR=$OUT bash benchmarks/gpu_measure.sh
#
# Safe to re-run: every output is rewritten (the JSON files through temporary files).
set -euo pipefail

PYTHON="${PYTHON:-python3}"                  # an interpreter with CUDA torch, fairseq and triton
OUT_DIR="${OUT_DIR:-gpu-results}"            # where the logs and results go
STEPS="${STEPS:-tests,tiles,benchmark,tuned}" # any of tests,tiles,benchmark,tuned,kernels,mask,train, comma-separated, in this order
SECTIONS="${SECTIONS:-module,model,generate}" # benchmark sections (crossover: dense vs triton)
TESTS="${TESTS:-tests/test_triton.py tests/test_triton_v2.py tests/test_triton_short.py tests/test_triton_tiles.py tests/test_kernels.py}"
TILE_CASES="${TILE_CASES:-fp16:64}"          # cases benchmarks/triton_tiles.py times (the benchmark's head size 64)
MASK_REFERENCE="${MASK_REFERENCE:-}"         # step mask: the interpreter's masks (gpu_dropout_mask.py --interpreter); empty: computed there
TRAIN_DATA="${TRAIN_DATA:-data/gigaword/bin}" # step train: examples/gigaword/prepare.sh's OUT_DIR/bin

cd "$(dirname "$0")/.."
for step in ${STEPS//,/ }; do
  case "$step" in tests|tiles|benchmark|tuned|kernels|mask|train) ;; *)
    echo "gpu_measure.sh: unknown step '$step' in STEPS=$STEPS (choose from tests,tiles,benchmark,tuned,kernels,mask,train)" >&2
    exit 2 ;;
  esac
done
has_step() { [[ ",$STEPS," == *",$1,"* ]]; }

"$PYTHON" - <<'PYCHECK'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_measure.sh: torch sees no CUDA device; run it on a GPU machine")
print(f"[gpu_measure] {torch.cuda.get_device_name()}, torch {torch.__version__}")
PYCHECK
mkdir -p "$OUT_DIR"

if has_step tests; then
  echo "[gpu_measure] tests on the GPU: $TESTS"
  # shellcheck disable=SC2086  # TESTS is a list of paths
  "$PYTHON" -m pytest -q -p no:cacheprovider $TESTS 2>&1 | tee "$OUT_DIR/pytest-gpu.log"
fi
if has_step tiles; then
  echo "[gpu_measure] tile timings: $TILE_CASES"
  "$PYTHON" benchmarks/triton_tiles.py --cases "$TILE_CASES" --json "$OUT_DIR/tiles.json" 2>&1 \
    | tee "$OUT_DIR/tiles.log"
fi
if has_step benchmark; then
  echo "[gpu_measure] benchmark (built-in tiles): $SECTIONS"
  PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/benchmark.py --device cuda --sections "$SECTIONS" \
    --json "$OUT_DIR/gpu.json" --markdown "$OUT_DIR/gpu.md" 2>&1 | tee "$OUT_DIR/benchmark.log"
fi
if has_step tuned; then
  if [[ ! -s "$OUT_DIR/tiles.json" ]]; then
    echo "gpu_measure.sh: step 'tuned' needs $OUT_DIR/tiles.json; run STEPS=tiles first" >&2
    exit 1
  fi
  echo "[gpu_measure] module benchmark with the timed tiles ($OUT_DIR/tiles.json)"
  FAIRSEQ_DNAS_TRITON_TILES="$OUT_DIR/tiles.json" PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/benchmark.py \
    --device cuda --sections module --json "$OUT_DIR/tuned.json" --markdown "$OUT_DIR/tuned.md" 2>&1 \
    | tee "$OUT_DIR/tuned.log"
fi
if has_step kernels; then
  echo "[gpu_measure] v2 and v2-short kernels against float64 on this GPU, then v1, v2, v2-short timed against SDPA"
  FAIRSEQ_DNAS_TRITON_KERNELS=v2 "$PYTHON" -m fairseq_dnas.check 2>&1 | tee "$OUT_DIR/check-v2.log"
  PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/benchmark.py --device cuda --sections kernels \
    --json "$OUT_DIR/kernels.json" --markdown "$OUT_DIR/kernels.md" 2>&1 | tee "$OUT_DIR/kernels.log"
fi
if has_step mask; then
  echo "[gpu_measure] dropout mask against the interpreter's"
  "$PYTHON" benchmarks/gpu_dropout_mask.py ${MASK_REFERENCE:+--reference "$MASK_REFERENCE"} 2>&1 | tee "$OUT_DIR/mask.log"
fi
if has_step train; then
  echo "[gpu_measure] fairseq-train --fp16, Gigaword paper size, Triton path ($TRAIN_DATA)"
  DATA="$TRAIN_DATA" OUT_DIR="$OUT_DIR" PYTHON="$PYTHON" bash benchmarks/gpu_train_fp16.sh 2>&1 | tee "$OUT_DIR/train.log"
fi
echo "[gpu_measure] done: $OUT_DIR"
