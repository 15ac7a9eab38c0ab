#!/usr/bin/env bash
# fairseq-train --fp16 of the Gigaword paper-size model on a GPU, end to end on
# the Triton path: transformer (fairseq's, the baseline), then transformer_dnas
# and transformer_hnas with FAIRSEQ_DNAS_ATTENTION_PATH=triton (a forced path
# that raises if the kernels cannot run, so no silent fallback), MAX_UPDATE
# updates each from the same seed; prints the training loss every LOG_INTERVAL
# updates side by side and the seconds per update (one of the GPU figures of
# docs/performance.md).
#
#   DATA=data/gigaword/bin OUT_DIR=gpu-results bash benchmarks/gpu_train_fp16.sh
#
# Safe to re-run: each run trains from scratch into a fresh folder.
set -euo pipefail
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # the header above
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi

DATA="${DATA:-data/gigaword/bin}"          # examples/gigaword/prepare.sh's OUT_DIR/bin
OUT_DIR="${OUT_DIR:-gpu-results}"
ARCHS="${ARCHS:-transformer transformer_dnas transformer_hnas}"
MAX_UPDATE="${MAX_UPDATE:-200}"
LOG_INTERVAL="${LOG_INTERVAL:-20}"
BATCH_SENTENCES="${BATCH_SENTENCES:-512}"
PYTHON="${PYTHON:-python3}"
SIZE="${SIZE:-paper}"                       # train.sh SIZE (tiny/cpu: a smoke run of this script)
DEVICE="${DEVICE:-gpu}"
KERNEL_PATH="${KERNEL_PATH:-triton}"        # FAIRSEQ_DNAS_ATTENTION_PATH of the DNAS/HNAS runs

cd "$(dirname "$0")/.."
mkdir -p "$OUT_DIR"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for arch in $ARCHS; do
  path=auto; [ "$arch" = transformer ] || path="$KERNEL_PATH"
  echo "[gpu_train_fp16] $arch (attention path $path), $MAX_UPDATE updates"
  FAIRSEQ_DNAS_ATTENTION_PATH="$path" DATA="$DATA" ARCH="$arch" SIZE="$SIZE" PRESET=fast SEED=1 DEVICE="$DEVICE" NPROC=1 \
    BATCH_SENTENCES="$BATCH_SENTENCES" MAX_SENTENCES_PER_PROC=128 MAX_UPDATE="$MAX_UPDATE" \
    WARMUP_UPDATES=100 LR=5e-4 VALIDATE_INTERVAL_UPDATES="$MAX_UPDATE" EVAL_ROUGE=0 \
    LOG_INTERVAL="$LOG_INTERVAL" SAVE_DIR="$WORK/$arch" PYTHON="$PYTHON" \
    bash examples/gigaword/train.sh
  cp "$WORK/$arch/train.log" "$OUT_DIR/train-$arch.log"
done
"$PYTHON" - "$OUT_DIR" $ARCHS <<'PY'
import re, sys, statistics
out, archs = sys.argv[1], sys.argv[2:]
curves, speed = {}, {}
for a in archs:
    rows = [l for l in open(f"{out}/train-{a}.log") if "train_inner" in l]
    curves[a] = {int(re.search(r"num_updates=(\d+)", l).group(1)): float(re.search(r"\bloss=([\d.]+)", l).group(1)) for l in rows}
    ups = [float(m.group(1)) for l in rows[1:] if (m := re.search(r"ups=([\d.]+)", l))]
    speed[a] = statistics.median(ups) if ups else float("nan")
print("| update | " + " | ".join(archs) + " |")
print("| --- |" + " --- |" * len(archs))
for u in sorted(curves[archs[0]]):
    print(f"| {u} | " + " | ".join(f"{curves[a].get(u, float('nan')):.3f}" for a in archs) + " |")
base = speed[archs[0]]
print("| updates/s (median, first interval left out) | " + " | ".join(f"{speed[a]:.2f} ({base / speed[a]:.2f}x the time)" for a in archs) + " |")
PY
