#!/usr/bin/env bash
# Take the GPU figures of docs/performance.md on a CUDA machine.
#
# The default step, quick, answers the questions that decide the attention
# defaults in one command of about five minutes on an H100, compilation
# included (each step fits a 10-minute command): every kernel
# configuration auto runs against float64, the kernels alone against SDPA,
# and the module against fairseq's with and without attention dropout, time
# and memory (benchmarks/gpu_quick.py: quick.jsonl, quick.md).
#
# Longer steps (STEPS=a,b,...), each about one 10-minute command or less:
#   tests      the Triton tests on the GPU (TESTS; pytest-gpu.log)
#   kernels    benchmark.py --sections kernels: both kernel sets at T 64 to 4096 (kernels.json, kernels.md)
#   benchmark  the module, whole-model and generation sections (SECTIONS, MODEL_ROUNDS; gpu.json, gpu.md)
#   tiles      tile timings for TILE_CASES (tiles.json, tiles.log); tuned: the module with them (tuned.*)
#   mask       the dropout mask against the interpreter's (mask.log)
#   train      fairseq-train --fp16 at the Gigaword paper size, ARCHS, TRAIN_UPDATES updates each
#              (needs TRAIN_DATA: examples/gigaword/prepare.sh's OUT_DIR/bin)
#
#   OUT_DIR=/path/to/results bash benchmarks/gpu_measure.sh     # after scripts/install.sh on the GPU machine
#   STEPS=tests,kernels OUT_DIR=/path/to/results bash benchmarks/gpu_measure.sh
#
# Safe to re-run: every output is rewritten.
set -euo pipefail
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # the header above
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi

PYTHON="${PYTHON:-python3}"                  # an interpreter with CUDA torch, fairseq and triton
OUT_DIR="${OUT_DIR:-gpu-results}"            # where the logs and results go
STEPS="${STEPS:-quick}"                      # steps (above), comma-separated, run in the order listed below
SECTIONS="${SECTIONS:-module,model,generate}" # step benchmark: benchmark.py sections
MODEL_ROUNDS="${MODEL_ROUNDS:-40}"           # step benchmark: timed updates per model
TESTS="${TESTS:-tests/test_triton.py tests/test_triton_short.py tests/test_triton_tiles.py tests/test_kernels.py}"
TILE_CASES="${TILE_CASES:-fp16:64}"          # step tiles: cases benchmarks/triton_tiles.py times
MASK_REFERENCE="${MASK_REFERENCE:-}"         # step mask: the interpreter's masks (gpu_dropout_mask.py --interpreter); empty: computed there
TRAIN_DATA="${TRAIN_DATA:-data/gigaword/bin}" # step train: examples/gigaword/prepare.sh's OUT_DIR/bin
ARCHS="${ARCHS:-transformer transformer_dnas transformer_hnas}" # step train
TRAIN_UPDATES="${TRAIN_UPDATES:-200}"        # step train: updates per model

cd "$(dirname "$0")/.."
ALL_STEPS="quick,tests,kernels,benchmark,tiles,tuned,mask,train"
for step in ${STEPS//,/ }; do
  if [[ ",$ALL_STEPS," != *",$step,"* ]]; then
    echo "gpu_measure.sh: unknown step '$step' in STEPS=$STEPS (choose from $ALL_STEPS)" >&2
    exit 2
  fi
done
has_step() { [[ ",$STEPS," == *",$1,"* ]]; }

"$PYTHON" - <<'PYCHECK'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_measure.sh: torch sees no CUDA device; run it on a GPU machine")
print(f"[gpu_measure] {torch.cuda.get_device_name()}, torch {torch.__version__}")
PYCHECK
mkdir -p "$OUT_DIR"

if has_step quick; then
  echo "[gpu_measure] quick: exactness of every default kernel configuration, kernels alone, the module"
  PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/gpu_quick.py --out "$OUT_DIR" 2>&1 | tee "$OUT_DIR/quick.log"
fi
if has_step tests; then
  echo "[gpu_measure] tests on the GPU: $TESTS"
  # shellcheck disable=SC2086  # TESTS is a list of paths
  "$PYTHON" -m pytest -q -p no:cacheprovider $TESTS 2>&1 | tee "$OUT_DIR/pytest-gpu.log"
fi
if has_step kernels; then
  echo "[gpu_measure] both kernel sets alone against SDPA, T 64 to 4096"
  PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/benchmark.py --device cuda --sections kernels \
    --json "$OUT_DIR/kernels.json" --markdown "$OUT_DIR/kernels.md" 2>&1 | tee "$OUT_DIR/kernels.log"
fi
if has_step benchmark; then
  echo "[gpu_measure] benchmark: $SECTIONS, $MODEL_ROUNDS model rounds"
  PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/benchmark.py --device cuda --sections "$SECTIONS" \
    --model-rounds "$MODEL_ROUNDS" --json "$OUT_DIR/gpu.json" --markdown "$OUT_DIR/gpu.md" 2>&1 \
    | tee "$OUT_DIR/benchmark.log"
fi
if has_step tiles; then
  echo "[gpu_measure] tile timings: $TILE_CASES"
  "$PYTHON" benchmarks/triton_tiles.py --cases "$TILE_CASES" --json "$OUT_DIR/tiles.json" 2>&1 \
    | tee "$OUT_DIR/tiles.log"
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
if has_step mask; then
  echo "[gpu_measure] dropout mask against the interpreter's"
  "$PYTHON" benchmarks/gpu_dropout_mask.py ${MASK_REFERENCE:+--reference "$MASK_REFERENCE"} 2>&1 | tee "$OUT_DIR/mask.log"
fi
if has_step train; then
  echo "[gpu_measure] fairseq-train --fp16, Gigaword paper size, Triton path ($TRAIN_DATA): $ARCHS, $TRAIN_UPDATES updates"
  DATA="$TRAIN_DATA" OUT_DIR="$OUT_DIR" PYTHON="$PYTHON" ARCHS="$ARCHS" MAX_UPDATE="$TRAIN_UPDATES" \
    bash benchmarks/gpu_train_fp16.sh 2>&1 | tee "$OUT_DIR/train.log"
fi
echo "[gpu_measure] done: $OUT_DIR"
