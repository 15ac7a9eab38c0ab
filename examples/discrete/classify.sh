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
# skipped (GLUE's layout, ../shared/data/sst-binary/); labels are any words
# (those of TRAIN). Steps, each skipped when done (safe to re-run):
# 1. the text split into OUT/text/{train,valid,test}.{input0,label}
#    (fairseq_dnas/recipes/masked_lm_data.py tsv), lowercased as sentence_classify.py reads;
# 2. a SentencePiece model (VOCAB pieces) on the training sentences ->
#    OUT/bin/sp.model, and fairseq-preprocess -> OUT/bin/data/{input0,label};
# 3. training from scratch with examples/masked_lm/finetune.sh's settings
#    (PRETRAINED=none), the thesis's size by default (6 layers, 64 wide,
#    FFN 128, 4 heads) -> OUT/ARCH-seedSEED/checkpoint_last.pt;
# 4. fairseq_dnas/commands/faithfulness.py on TEST, importance 'grad' and 'grad-x-input'
#    -> OUT/ARCH-seedSEED/faithfulness-*.jsonl, tau.png, and the table row
#    OUT/ARCH-seedSEED/row.md (printed).
# CPU: on sst-binary (6,920 training sentences) with MAX_UPDATE=400, about
# 20 minutes on 2 busy cores, nearly all of it training; the metric itself
# takes seconds per 1,000 sentences (docs/analysis.md, section 4).
set -euo pipefail

TRAIN="${TRAIN:-}"; DEV="${DEV:-}"; TEST="${TEST:-}"
OUT="${OUT:-checkpoints/classify}"
ARCH="${ARCH:-roberta}"                 # roberta | roberta_dnas | roberta_hnas | roberta_discrete_single | roberta_discrete | roberta_two_stream
SEED="${SEED:-1}"
VOCAB="${VOCAB:-4000}"                  # SentencePiece pieces (a soft limit on small data)
MAX_PIECES="${MAX_PIECES:-126}"         # + <s> and </s> = 128 positions
LAYERS="${LAYERS:-6}"; DIM="${DIM:-64}"; FFN="${FFN:-128}"; HEADS="${HEADS:-4}"
MAX_UPDATE="${MAX_UPDATE:-2000}"
BATCH_SENTENCES="${BATCH_SENTENCES:-32}"
LR="${LR:-5e-4}"
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
for n in VOCAB MAX_PIECES LAYERS DIM FFN HEADS MAX_UPDATE; do check_number "$n" 1; done
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
say "3/4 $ARCH from scratch ($LAYERS layers, $DIM wide, FFN $FFN, $HEADS heads, $NUM_CLASSES classes)"
DATA="$DATA" TASK=tsv ARCH="$ARCH" SIZE=small PRETRAINED=none NUM_CLASSES="$NUM_CLASSES" SEED="$SEED" \
  SAVE_DIR="$RUN" MAX_UPDATE="$MAX_UPDATE" BATCH_SENTENCES="$BATCH_SENTENCES" LR="$LR" LOG_INTERVAL="$LOG_INTERVAL" \
  bash "$REPO/examples/masked_lm/finetune.sh" --encoder-layers "$LAYERS" --encoder-embed-dim "$DIM" \
  --encoder-ffn-embed-dim "$FFN" --encoder-attention-heads "$HEADS" "$@"

say "4/4 faithfulness on $TEST"
for form in grad grad-x-input; do
  [ -s "$RUN/summary-$form.json" ] && continue
  "$PYTHON" -m fairseq_dnas.commands.faithfulness "$RUN/checkpoint_last.pt" --test "$TEST" --importance "$form" \
    --labels "$ARCH" --json "$RUN/faithfulness-$form.jsonl" --plot "$RUN/tau-$form.png" \
    > "$RUN/summary-$form.json.tmp" 2> "$RUN/faithfulness-$form.log" \
    || { tail -3 "$RUN/faithfulness-$form.log" >&2; die "faithfulness.py failed (log: $RUN/faithfulness-$form.log)"; }
  mv "$RUN/summary-$form.json.tmp" "$RUN/summary-$form.json"
done
"$PYTHON" - "$ARCH" "$RUN" > "$RUN/row.md" <<'PY'
import json, sys
arch, run = sys.argv[1:]
s = {f: json.load(open(f"{run}/summary-{f}.json")) for f in ("grad", "grad-x-input")}
cells = [f"{s[f]['tau_mean']:.3f} +- {s[f]['tau_std']:.3f}" for f in s]
print("| encoder | accuracy (%) | tau, gradient | tau, gradient x input | left out |")
print("| --- | --- | --- | --- | --- |")
left = f"{s['grad']['left_out']} of {s['grad']['n']}"
print(f"| {arch} | {100 * s['grad']['accuracy']:.1f} | {cells[0]} | {cells[1]} | {left} |")
PY
cat "$RUN/row.md"
say "done: $RUN/row.md (per example: $RUN/faithfulness-grad.jsonl; histogram: $RUN/tau-grad.png)"
