#!/usr/bin/env bash
# UNAS/DNAS/HNAS x 3 seeds of finetune_sst2.py (random-init small BERT, CPU),
# one JSON per run under $OUT, then the table (table.py). Safe to re-run:
# finished runs are skipped.
#
#   bash examples/hf/run_experiment.sh
#   SCHEMES=hnas bash examples/hf/run_experiment.sh   # one scheme (run the three side by side)
set -euo pipefail

OUT="${OUT:-examples/hf/results}"          # one JSON per run
SST2_DIR="${SST2_DIR:?set SST2_DIR to a GLUE SST-2 folder (train.tsv, and dev.tsv or a labelled test.tsv)}"
STEPS="${STEPS:-400}"                       # training steps per run (batch 32)
SEEDS="${SEEDS:-1 2 3}"
SCHEMES="${SCHEMES:-unas dnas hnas}"
PY="${PY:-python}"

cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
for seed in $SEEDS; do
  for scheme in $SCHEMES; do
    out="$OUT/${scheme}_seed${seed}.json"
    if [ -f "$out" ]; then echo "[experiment] $out exists, skipped"; continue; fi
    echo "[experiment] $(date -u +%H:%M:%S) $scheme seed $seed"
    "$PY" examples/hf/finetune_sst2.py --scheme "$scheme" --seed "$seed" --max-steps "$STEPS" \
      --data-dir "$SST2_DIR" --out "$out" 2>&1 | grep -v "^{'loss'" | grep -v Warning || true
    [ -f "$out" ] || { echo "[experiment] $scheme seed $seed failed" >&2; exit 1; }
  done
done
"$PY" examples/hf/table.py "$OUT"
