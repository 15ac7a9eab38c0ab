#!/usr/bin/env bash
# Take the GPU figures of docs/performance.md on a CUDA machine, in three
# parts that each fit one 10-minute command (a lent machine's limit):
#
#   part1  the v2 and one-tile (v2-short) kernels' tests on the GPU
#          (TESTS_V2), their float64 check (FAIRSEQ_DNAS_TRITON_KERNELS=v2
#          python -m fairseq_dnas.check: check-v2.log), then the kernels alone
#          against SDPA (benchmark.py --sections kernels: v1, v2, v2-short;
#          kernels.json, kernels.md). The figure that decides AUTO_KERNELS.
#   part2  the module, whole-model and generation benchmark with v2 selected,
#          the model timed over MODEL_ROUNDS (40) updates (gpu-v2.json, gpu-v2.md).
#   part3  tile timings for TILE_CASES_PART3 (head size 128; tiles.json,
#          tiles.log), then fp16 training of the Gigaword paper-size model,
#          transformer against transformer_hnas (HNAS's seconds per update;
#          needs TRAIN_DATA: examples/gigaword/prepare.sh's OUT_DIR/bin).
#
# The single steps stay available (STEPS=a,b,...): tests (TESTS), tiles,
# benchmark (v1: gpu.json, gpu.md), tuned (the module section with
# tiles.json), kernels, tests-v2, benchmark-v2, mask (the dropout mask
# against the interpreter's), train (ARCHS).
#
#   STEPS=part1 OUT_DIR=$OUT bash benchmarks/gpu_measure.sh     # after scripts/install.sh (TORCH_SPEC=torch)
#   bash benchmarks/gpu_measure.sh                                # part1,part2,part3
#
# Safe to re-run: every output is rewritten (the JSON files through temporary files).
set -euo pipefail

PYTHON="${PYTHON:-python3}"                  # an interpreter with CUDA torch, fairseq and triton
OUT_DIR="${OUT_DIR:-gpu-results}"            # where the logs and results go
STEPS="${STEPS:-part1,part2,part3}"          # parts or steps (below), comma-separated, run in the order below
SECTIONS="${SECTIONS:-module,model,generate}" # benchmark sections (crossover: dense vs triton)
MODEL_ROUNDS="${MODEL_ROUNDS:-40}"           # benchmark-v2: timed updates per model (the v1 run had 10)
TESTS="${TESTS:-tests/test_triton.py tests/test_triton_v2.py tests/test_triton_short.py tests/test_triton_tiles.py tests/test_kernels.py}"
TESTS_V2="${TESTS_V2:-tests/test_triton_v2.py tests/test_triton_short.py}"
TILE_CASES="${TILE_CASES:-fp16:64}"          # step tiles: cases benchmarks/triton_tiles.py times
TILE_CASES_PART3="${TILE_CASES_PART3:-fp16:128}" # part3's tiles: head size 128, never timed
TILE_VERSION="${TILE_VERSION:-v1}"           # step tiles: which kernels' tiles (v2: the file's "tiles_v2")
MASK_REFERENCE="${MASK_REFERENCE:-}"         # step mask: the interpreter's masks (gpu_dropout_mask.py --interpreter); empty: computed there
TRAIN_DATA="${TRAIN_DATA:-data/gigaword/bin}" # step train: examples/gigaword/prepare.sh's OUT_DIR/bin
ARCHS="${ARCHS:-transformer transformer_dnas transformer_hnas}" # step train
TRAIN_UPDATES="${TRAIN_UPDATES:-200}"        # step train: updates per model

cd "$(dirname "$0")/.."
ALL_STEPS="tests,tests-v2,tiles,benchmark,tuned,kernels,benchmark-v2,mask,train"
expanded=""
for step in ${STEPS//,/ }; do
  case "$step" in
    part1) expanded+=",tests-v2,kernels" ;;
    part2) expanded+=",benchmark-v2" ;;
    part3)
      expanded+=",tiles,train"
      TILE_CASES="$TILE_CASES_PART3"
      ARCHS="transformer transformer_hnas"
      TRAIN_UPDATES=80 ;;
    tests|tests-v2|tiles|benchmark|tuned|kernels|benchmark-v2|mask|train) expanded+=",$step" ;;
    *)
      echo "gpu_measure.sh: unknown step '$step' in STEPS=$STEPS (choose from part1,part2,part3,$ALL_STEPS)" >&2
      exit 2 ;;
  esac
done
has_step() { [[ "$expanded," == *",$1,"* ]]; }

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
if has_step tests-v2; then
  echo "[gpu_measure] the v2 and one-tile kernels' tests on the GPU: $TESTS_V2"
  # shellcheck disable=SC2086  # TESTS_V2 is a list of paths
  "$PYTHON" -m pytest -q -p no:cacheprovider $TESTS_V2 2>&1 | tee "$OUT_DIR/pytest-gpu-v2.log"
fi
if has_step tiles; then
  echo "[gpu_measure] tile timings: $TILE_CASES, $TILE_VERSION kernels"
  "$PYTHON" benchmarks/triton_tiles.py --cases "$TILE_CASES" --version "$TILE_VERSION" --json "$OUT_DIR/tiles.json" 2>&1 \
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
if has_step benchmark-v2; then
  echo "[gpu_measure] benchmark with the v2 kernels (v2-short for short inputs): $SECTIONS, $MODEL_ROUNDS model rounds"
  FAIRSEQ_DNAS_TRITON_KERNELS=v2 PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/benchmark.py --device cuda \
    --sections "$SECTIONS" --model-rounds "$MODEL_ROUNDS" \
    --json "$OUT_DIR/gpu-v2.json" --markdown "$OUT_DIR/gpu-v2.md" 2>&1 | tee "$OUT_DIR/benchmark-v2.log"
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
