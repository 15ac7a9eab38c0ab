#!/usr/bin/env bash
# From sentence<TAB>label text files to a sentence classifier trained from
# scratch and its row of the faithfulness table (accuracy; Kendall's tau
# between attention and gradient importance, mean +- std, both importance
# forms): the thesis's Table 6.1 (J. Kinley, 2020, Chapter 6).
#
#   TRAIN=train.tsv DEV=dev.tsv TEST=test.tsv ARCH=roberta_hnas \
#     bash examples/discrete/classify.sh [fairseq-train flags]
#
# The files: "sentence<TAB>label" a line, a "sentence<TAB>label" header line
# skipped (GLUE's layout, as Jain & Wallace's SST split in sst-binary/);
# labels are any words (those of TRAIN). Steps, each skipped when done (safe
# to re-run):
# 1. the text split into OUT/text/{train,valid,test}.{input0,label}
#    (fairseq_dnas/recipes/masked_lm_data.py tsv), lowercased as sentence_classify.py reads;
# 2. a SentencePiece model (VOCAB pieces) on the training sentences ->
#    OUT/bin/sp.model, and fairseq-preprocess -> OUT/bin/data/{input0,label};
# 3. training from scratch with examples/masked_lm/finetune.sh's settings
#    (PRETRAINED=none), the thesis's size by default (6 layers, 64 wide,
#    FFN 128, 4 heads), trained to patience: the dev accuracy is taken every
#    VALIDATE_INTERVAL updates, training stops after PATIENCE validations in
#    a row without a better one (fairseq's --patience; PATIENCE=0: never;
#    a resumed run keeps its count, fairseq_dnas/fairseq_patches/exact_resume.py) or
#    at MAX_UPDATE, whichever comes first, and the best dev checkpoint is kept
#    -> OUT/ARCH-seedSEED/checkpoint_best.pt (and checkpoint_last.pt; the
#    interval checkpoints are deleted once training is done);
# 4. fairseq_dnas/commands/faithfulness.py on TEST, once, at checkpoint_best.pt,
#    importance 'grad' and 'grad-x-input' (accuracy, tau, attention's share
#    of the residual stream per layer) -> OUT/ARCH-seedSEED/faithfulness-*.jsonl,
#    tau-*.png, and the row: OUT/ARCH-seedSEED/row.json and row.md (printed),
#    with the updates run and the update of the best dev accuracy, read from
#    the checkpoints (examples/discrete/faithfulness_table.py --row).
# The LR schedule under early stopping: LR_SCHEDULE=constant by default (a
# linear warm-up over WARMUP_UPDATES, then LR: fairseq's fixed schedule).
# finetune.sh's polynomial decay to 0 at MAX_UPDATE would tie the LR at every
# update to the cap, so the update at which patience runs out, and the model
# it keeps, would depend on a number that is only meant as a safety limit;
# with a constant LR the same rule (PATIENCE validations of VALIDATE_INTERVAL
# updates) means the same budget for every encoder whatever the cap.
# LR_SCHEDULE=polynomial_decay PATIENCE=0 VALIDATE_INTERVAL=MAX_UPDATE gives
# the fixed-length GLUE schedule instead.
# CPU, one thread on a busy 2-core machine: on sst-binary (6,920 training
# sentences) a thesis-size roberta ran 200 updates in about 75 s and the
# metric took 8-10 s per importance form on the 1,821 test sentences
# (docs/results/2026-11-27-table61-attention-share.md); a run to patience
# takes as many updates as it needs (row.json says how many).
set -euo pipefail

TRAIN="${TRAIN:-}"; DEV="${DEV:-}"; TEST="${TEST:-}"
OUT="${OUT:-checkpoints/classify}"
ARCH="${ARCH:-roberta}"                 # roberta | roberta_dnas | roberta_hnas | roberta_discrete_single | roberta_discrete | roberta_two_stream
SEED="${SEED:-1}"
VOCAB="${VOCAB:-4000}"                  # SentencePiece pieces (a soft limit on small data)
MAX_PIECES="${MAX_PIECES:-126}"         # + <s> and </s> = 128 positions
LAYERS="${LAYERS:-6}"; DIM="${DIM:-64}"; FFN="${FFN:-128}"; HEADS="${HEADS:-4}"
MAX_UPDATE="${MAX_UPDATE:-20000}"       # the cap; PATIENCE normally stops training first
VALIDATE_INTERVAL="${VALIDATE_INTERVAL:-100}"  # updates between dev scores (sst-binary: 216 updates an epoch)
PATIENCE="${PATIENCE:-10}"              # validations without a better dev accuracy before stopping (0: never)
BATCH_SENTENCES="${BATCH_SENTENCES:-32}"
LR="${LR:-5e-4}"
LR_SCHEDULE="${LR_SCHEDULE:-constant}"  # constant (after warm-up) | polynomial_decay (to 0 at MAX_UPDATE)
WARMUP_UPDATES="${WARMUP_UPDATES:-100}"
LOG_INTERVAL="${LOG_INTERVAL:-100}"
PREPARE_ONLY="${PREPARE_ONLY:-0}"       # 1: steps 1-2 only (data for several runs of one OUT)
export DEVICE="${DEVICE:-cpu}"
WORKERS="${WORKERS:-$(nproc 2>/dev/null || echo 1)}"

HERE="$(dirname "$0")"
source "$HERE/../common.sh"
check_choice ARCH roberta roberta_dnas roberta_hnas roberta_discrete_single roberta_discrete roberta_two_stream
for f in TRAIN DEV TEST; do
  [ -n "${!f}" ] || die "$f is not set: give a sentence<TAB>label file (TRAIN=, DEV=, TEST=)"
  [ -s "${!f}" ] || die "$f=${!f}: no such file (or empty)"
done
for n in VOCAB MAX_PIECES LAYERS DIM FFN HEADS MAX_UPDATE VALIDATE_INTERVAL; do check_number "$n" 1; done
check_number PATIENCE 0
check_number WARMUP_UPDATES 0
check_choice LR_SCHEDULE "constant (after WARMUP_UPDATES)" "polynomial_decay (to 0 at MAX_UPDATE)"
check_python

TEXT="$OUT/text"; BIN="$OUT/bin"; DATA="$BIN/data"
mkdir -p "$OUT"
check_settings_file "$OUT" "TRAIN=$TRAIN DEV=$DEV TEST=$TEST VOCAB=$VOCAB MAX_PIECES=$MAX_PIECES"
if [ ! -s "$DATA/label/test.idx" ]; then
  say "1/4 reading $TRAIN, $DEV, $TEST"
  "$PYTHON" -m fairseq_dnas.recipes.masked_lm_data tsv --train "$TRAIN" --valid "$DEV" --test "$TEST" --out "$TEXT" \
    || exit 1
  say "2/4 SentencePiece ($VOCAB pieces) and fairseq-preprocess"
  "$PYTHON" -m fairseq_dnas.recipes.sentencepiece_tool train --input "$TEXT/train.input0" --model-prefix "$BIN/sp" \
    --vocab-size "$VOCAB" --threads "$WORKERS" > "$TEXT/sentencepiece.log" 2>&1 \
    || { tail -5 "$TEXT/sentencepiece.log" >&2; die "SentencePiece training failed (log: $TEXT/sentencepiece.log)"; }
  for split in train valid test; do
    encode_pieces "$BIN/sp.model" "$TEXT/$split.input0" "$TEXT/$split.input0.sp" --max-pieces "$MAX_PIECES"
  done
  rm -rf "$DATA.tmp"
  : > "$TEXT/preprocess.log"
  for part in input0 label; do
    ext=".$part"; [ "$part" = input0 ] && ext=".input0.sp"
    run_fairseq_preprocess "$TEXT/preprocess.log" "$DATA.tmp/$part" --only-source --workers "$WORKERS" \
      --trainpref "$TEXT/train$ext" --validpref "$TEXT/valid$ext" --testpref "$TEXT/test$ext" \
      || die "fairseq-preprocess failed (log: $TEXT/preprocess.log)"
  done
  rm -rf "$DATA" && mv "$DATA.tmp" "$DATA"
fi
[ "$PREPARE_ONLY" = 1 ] && { say "data ready: $DATA"; exit 0; }
NUM_CLASSES="$(sort -u "$TEXT/train.label" | wc -l)"

RUN="$OUT/$ARCH-seed$SEED"
say "3/4 $ARCH from scratch ($LAYERS layers, $DIM wide, FFN $FFN, $HEADS heads, $NUM_CLASSES classes): dev accuracy every $VALIDATE_INTERVAL updates, patience $PATIENCE, at most $MAX_UPDATE updates"
DATA="$DATA" TASK=tsv ARCH="$ARCH" SIZE=small PRETRAINED=none NUM_CLASSES="$NUM_CLASSES" SEED="$SEED" \
  SAVE_DIR="$RUN" MAX_UPDATE="$MAX_UPDATE" BATCH_SENTENCES="$BATCH_SENTENCES" LR="$LR" LOG_INTERVAL="$LOG_INTERVAL" \
  LR_SCHEDULE="$LR_SCHEDULE" WARMUP_UPDATES="$WARMUP_UPDATES" VALIDATE_INTERVAL="$VALIDATE_INTERVAL" \
  PATIENCE="$PATIENCE" \
  bash "$REPO/examples/masked_lm/finetune.sh" --encoder-layers "$LAYERS" --encoder-embed-dim "$DIM" \
  --encoder-ffn-embed-dim "$FFN" --encoder-attention-heads "$HEADS" "$@"
[ -s "$RUN/checkpoint_best.pt" ] || die "training ended without $RUN/checkpoint_best.pt (see $RUN/train.log)"
rm -f "$RUN"/checkpoint_[0-9]*_[0-9]*.pt  # interval checkpoints: only for resuming, and training is done

say "4/4 faithfulness on $TEST at the best dev checkpoint"
for form in grad grad-x-input; do
  [ -s "$RUN/summary-$form.json" ] && continue
  "$PYTHON" -m fairseq_dnas.commands.faithfulness "$RUN/checkpoint_best.pt" --test "$TEST" --importance "$form" \
    --labels "$ARCH" --json "$RUN/faithfulness-$form.jsonl" --plot "$RUN/tau-$form.png" \
    > "$RUN/summary-$form.json.tmp" 2> "$RUN/faithfulness-$form.log" \
    || { tail -3 "$RUN/faithfulness-$form.log" >&2; die "faithfulness.py failed (log: $RUN/faithfulness-$form.log)"; }
  mv "$RUN/summary-$form.json.tmp" "$RUN/summary-$form.json"
done
"$PYTHON" "$HERE/faithfulness_table.py" --row "$RUN" > /dev/null || die "could not write $RUN/row.md"
cat "$RUN/row.md"
say "done: $RUN/row.md, $RUN/row.json (per example: $RUN/faithfulness-grad.jsonl; histogram: $RUN/tau-grad.png)"
