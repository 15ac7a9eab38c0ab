#!/usr/bin/env bash
# The whole translation recipe on a CPU in about 2 minutes (Multi30k de-en):
#
#   MULTI30K_DIR=/path/to/multi30k bash examples/translation/quickstart.sh
#
# prepare.sh (all 29,000 training pairs, 4,000 joint SentencePiece pieces, the
# first 100 validation and 200 pairs of each test set) -> train.sh (a tiny
# HNAS model, MAX_UPDATE updates of 2,048 tokens, validation BLEU at the end)
# -> generate.sh (beam 5 on the first 200 test2016 sentences) ->
# bleu_eval.py. Prints a few sentences with reference and translation, then
# BLEU and chrF. Time on 2 CPU cores: 102 s (CI's test of it, load about 1.5);
# 27 min when the cores were shared with other jobs (load 7-9).
# Expect BLEU about 11 (a smoke run, not a result; see README.md).
# Safe to re-run: finished steps are skipped.
set -euo pipefail

WORK_DIR="${WORK_DIR:-${TMPDIR:-/tmp}/fairseq-dnas-translation-quickstart}"
MULTI30K_DIR="${MULTI30K_DIR:-}"            # the Multi30k folder (README, raw/)
ARCH="${ARCH:-transformer_hnas}"            # transformer | transformer_dnas | transformer_hnas
VALID_PAIRS="${VALID_PAIRS:-100}"
TEST_PAIRS="${TEST_PAIRS:-200}"
VOCAB_SIZE="${VOCAB_SIZE:-4000}"
MAX_UPDATE="${MAX_UPDATE:-200}"
LR="${LR:-2e-3}"
SHOW="${SHOW:-3}"                           # examples printed at the end
DEVICE="${DEVICE:-auto}"

source "$(dirname "$0")/../common.sh"
HERE="$(cd "$(dirname "$0")" && pwd)"
check_python
[ -n "$MULTI30K_DIR" ] || die "set MULTI30K_DIR to the Multi30k folder (e.g. ../shared/data/multi30k)"
mkdir -p "$WORK_DIR/results"
DATA="$WORK_DIR/data"
CKPT="$WORK_DIR/checkpoints/$ARCH"
START=$SECONDS

say "1/3 prepare (Multi30k, $VALID_PAIRS validation pairs, $TEST_PAIRS pairs per test set) into $DATA"
MULTI30K_DIR="$MULTI30K_DIR" VOCAB_SIZE="$VOCAB_SIZE" MAX_VALID_PAIRS="$VALID_PAIRS" \
  MAX_TEST_PAIRS="$TEST_PAIRS" bash "$HERE/prepare.sh" "$DATA"

say "2/3 train a tiny $ARCH model for $MAX_UPDATE updates (log: $CKPT/train.log)"
DATA="$DATA/bin" ARCH="$ARCH" SIZE=tiny DROPOUT=0.1 LR="$LR" WARMUP_UPDATES=100 SEED=1 DEVICE="$DEVICE" \
  BATCH_TOKENS=2048 MAX_TOKENS_PER_PROC=2048 MAX_UPDATE="$MAX_UPDATE" \
  VALIDATE_INTERVAL_UPDATES="$MAX_UPDATE" LOG_INTERVAL=10 SAVE_DIR="$CKPT" bash "$HERE/train.sh"

say "3/3 translate the first $TEST_PAIRS test2016 sentences and score them"
DATA="$DATA" CHECKPOINT="$CKPT/checkpoint_best.pt" SUBSET=test OUT_PREFIX="$WORK_DIR/results/$ARCH" \
  LABEL="$ARCH" DEVICE="$DEVICE" bash "$HERE/generate.sh" > /dev/null

echo
echo "=== $SHOW test2016 sentences: source, reference, translation ($ARCH, tiny, $MAX_UPDATE updates) ==="
# awk, not head: head would close the pipe early and pipefail turn SIGPIPE into failure.
paste -d '\t' "$DATA/text/test.de" "$DATA/text/test.en" "$WORK_DIR/results/$ARCH.hyp" |
  awk -v n="$SHOW" 'NR <= n' |
  while IFS=$'\t' read -r source reference translation; do
    echo "source:      $source"
    echo "reference:   $reference"
    echo "translation: $translation"
    echo
  done
echo "=== sacreBLEU on the first $TEST_PAIRS test2016 pairs (small-scale smoke run) ==="
"$PYTHON" -m fairseq_dnas.commands.bleu_eval --hyp "$WORK_DIR/results/$ARCH.hyp" --ref "$DATA/text/test.en"
echo
say "done in $(( SECONDS - START )) s; outputs under $WORK_DIR"
