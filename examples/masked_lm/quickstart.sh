#!/usr/bin/env bash
# The whole masked-LM recipe on a slice of the data, in minutes on a CPU:
# prepare -> pretrain roberta_hnas -> fine-tune on SST-2 -> score -> classify.
#
#   bash examples/masked_lm/quickstart.sh            # OUT=quickstart/masked_lm
#
# The figures it prints are those of a model trained for seconds (near
# chance); the README's table comes from examples/masked_lm/experiment.py.
set -euo pipefail

OUT="${OUT:-quickstart/masked_lm}"
ARCH="${ARCH:-roberta_hnas}"
MAX_LINES="${MAX_LINES:-2000}"             # sentences per source file
VOCAB="${VOCAB:-1000}"
PRETRAIN_UPDATES="${PRETRAIN_UPDATES:-30}"
FINETUNE_UPDATES="${FINETUNE_UPDATES:-20}"
export DEVICE="${DEVICE:-cpu}"

HERE="$(dirname "$0")"
source "$HERE/../common.sh"
check_python

OUT_DIR="$OUT/data" MAX_LINES="$MAX_LINES" VOCAB="$VOCAB" MAX_TRAIN=2000 MAX_EVAL=200 TASKS=sst2 \
  bash "$HERE/prepare.sh"
DATA="$OUT/data/bin/pretrain" ARCH="$ARCH" SIZE=small SAVE_DIR="$OUT/pretrain" MAX_UPDATE="$PRETRAIN_UPDATES" \
  BATCH_SEQUENCES=8 LOG_INTERVAL=10 bash "$HERE/pretrain.sh" > "$OUT.pretrain.log"
say "pretrained: $(grep -o "valid on 'valid' subset | loss [0-9.]* | ppl [0-9.]*" "$OUT/pretrain/train.log" | tail -1)"
DATA="$OUT/data/bin/sst2" TASK=sst2 ARCH="$ARCH" SIZE=small PRETRAINED="$OUT/pretrain/checkpoint_last.pt" \
  SAVE_DIR="$OUT/sst2" MAX_UPDATE="$FINETUNE_UPDATES" BATCH_SENTENCES=16 LOG_INTERVAL=10 \
  bash "$HERE/finetune.sh" > "$OUT.finetune.log"
RAW="$OUT/data/text/sst2"
paste "$RAW/test.input0" "$RAW/test.label" > "$RAW/test.tsv"
say "scoring $OUT/sst2/checkpoint_last.pt on SST-2's test.tsv (first 200 sentences)"
"$PYTHON" "$REPO/scripts/sentence_classify.py" score "$OUT/sst2/checkpoint_last.pt" "$RAW/test.tsv" \
  --json "$OUT/sst2/score.json" 2>&1 | grep -v INFO >&2 || true
[ -s "$OUT/sst2/score.json" ] || die "scoring failed"
"$PYTHON" "$REPO/scripts/sentence_classify.py" classify "$OUT/sst2/checkpoint_last.pt" "$OUT/data/text/sst2/test.input0" \
  -o "$OUT/sst2/test.labels" 2> "$OUT/classify.log" || die "classify failed (see $OUT/classify.log)"
say "classified $(wc -l < "$OUT/sst2/test.labels") sentences: $OUT/sst2/test.labels (label<TAB>probability); done"
