#!/usr/bin/env bash
# The whole masked-LM recipe on a slice of the data, in minutes on a CPU:
# prepare -> pretrain roberta_hnas (u per layer printed) -> fine-tune on SST-2
# -> score SST-2's test.tsv (accuracy, MCC, bootstrap 95% intervals) ->
# classify a text file (one label and probability a line).
#
#   bash examples/masked_lm/quickstart.sh            # OUT=quickstart/masked_lm
#
# The figures it prints are those of a model trained for seconds (near
# chance); the README's table comes from examples/masked_lm/experiment.py.
# Safe to re-run: finished steps are skipped (delete OUT to start over).
set -euo pipefail

OUT="${OUT:-quickstart/masked_lm}"
ARCH="${ARCH:-roberta_hnas}"               # roberta | roberta_dnas | roberta_hnas
MAX_LINES="${MAX_LINES:-2000}"             # sentences per source file
VOCAB="${VOCAB:-1000}"
MAX_EVAL="${MAX_EVAL:-200}"                # SST-2 valid/test sentences kept
PRETRAIN_UPDATES="${PRETRAIN_UPDATES:-30}"
FINETUNE_UPDATES="${FINETUNE_UPDATES:-20}"
export DEVICE="${DEVICE:-cpu}"

HERE="$(dirname "$0")"
source "$HERE/../common.sh"
check_python
check_choice ARCH roberta roberta_dnas roberta_hnas

OUT_DIR="$OUT/data" MAX_LINES="$MAX_LINES" VOCAB="$VOCAB" MAX_TRAIN=2000 MAX_EVAL="$MAX_EVAL" TASKS=sst2 \
  bash "$HERE/prepare.sh"
DATA="$OUT/data/bin/pretrain" ARCH="$ARCH" SIZE=small SAVE_DIR="$OUT/pretrain" MAX_UPDATE="$PRETRAIN_UPDATES" \
  BATCH_SEQUENCES=8 LOG_INTERVAL=5 bash "$HERE/pretrain.sh"
if [ "$ARCH" = roberta_hnas ]; then
  say "hybrid weight u per layer (mean over heads) after pretraining:"
  "$PYTHON" -m fairseq_dnas.commands.plot_hybrid_weights "$OUT/pretrain/checkpoint_last.pt" \
    --out "$OUT/pretrain/hybrid_weights.png" --csv "$OUT/pretrain/hybrid_weights.csv" >&2 \
    || die "reading the hybrid weights failed"
fi
DATA="$OUT/data/bin/sst2" TASK=sst2 ARCH="$ARCH" SIZE=small PRETRAINED="$OUT/pretrain/checkpoint_last.pt" \
  SAVE_DIR="$OUT/sst2" MAX_UPDATE="$FINETUNE_UPDATES" BATCH_SENTENCES=16 LOG_INTERVAL=5 \
  bash "$HERE/finetune.sh"
RAW="$OUT/data/text/sst2"
paste "$RAW/test.input0" "$RAW/test.label" > "$RAW/test.tsv"
say "scoring $OUT/sst2/checkpoint_last.pt on SST-2's test.tsv (its first $MAX_EVAL sentences)"
"$PYTHON" -m fairseq_dnas.commands.sentence_classify score "$OUT/sst2/checkpoint_last.pt" "$RAW/test.tsv" \
  --json "$OUT/sst2/score.json" > /dev/null 2> "$OUT/score.log" || { cat "$OUT/score.log" >&2; die "scoring failed"; }
grep -v 'INFO' "$OUT/score.log" >&2 || true
"$PYTHON" -m fairseq_dnas.commands.sentence_classify classify "$OUT/sst2/checkpoint_last.pt" "$RAW/test.input0" \
  -o "$OUT/sst2/test.labels" 2> "$OUT/classify.log" || { cat "$OUT/classify.log" >&2; die "classify failed"; }
say "classified $(wc -l < "$OUT/sst2/test.labels") sentences: $OUT/sst2/test.labels (label<TAB>probability); done"
