#!/usr/bin/env bash
# The discrete-attention experiments end to end in a few CPU minutes, on
# small slices of the real data (a smoke run, not a result):
#
# 1. classification (the Table 6.1 form): SST in Jain & Wallace's split ->
#    a thesis-size roberta_discrete (two-stream, discrete) trained from
#    scratch for a fixed CLASSIFY_UPDATES (no early stopping: a smoke run)
#    -> its faithfulness row (classify.sh);
# 2. translation and streams (the Table 6.2 and 6.4 forms): the first
#    TRAIN_PAIRS Multi30k pairs, English -> German -> a transformer and a
#    transformer_discrete (SIZE=mini) -> BLEU, tau of the encoder and cross
#    attention, the CoNLL-2000 probe per stream, the t-SNE pictures of the
#    token embeddings and of the final states (table62.sh).
#
#   SST_BINARY_DIR=/path/to/sst-binary MULTI30K_DIR=/path/to/multi30k CONLL2000_DIR=/path/to/conll2000 \
#     bash examples/discrete/quickstart.sh
#
# Safe to re-run: finished steps are skipped (delete WORK_DIR to start over).
set -euo pipefail

WORK_DIR="${WORK_DIR:-${TMPDIR:-/tmp}/fairseq-dnas-discrete-quickstart}"
SST_BINARY_DIR="${SST_BINARY_DIR:-}"        # train.tsv, dev.tsv, test.tsv
MULTI30K_DIR="${MULTI30K_DIR:-}"            # raw/
CONLL2000_DIR="${CONLL2000_DIR:-}"          # train.txt, test.txt
CLASSIFY_UPDATES="${CLASSIFY_UPDATES:-100}"
TRAIN_PAIRS="${TRAIN_PAIRS:-3000}"
TRANSLATE_UPDATES="${TRANSLATE_UPDATES:-60}"
TEST_PAIRS="${TEST_PAIRS:-100}"

HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../common.sh"
check_python
[ -s "$SST_BINARY_DIR/train.tsv" ] || die "set SST_BINARY_DIR to the SST folder (train.tsv, dev.tsv, test.tsv)"
mkdir -p "$WORK_DIR"
START=$SECONDS

say "1/2 classification: SST -> roberta_discrete ($CLASSIFY_UPDATES updates) -> faithfulness row"
TRAIN="$SST_BINARY_DIR/train.tsv" DEV="$SST_BINARY_DIR/dev.tsv" TEST="$SST_BINARY_DIR/test.tsv" \
  OUT="$WORK_DIR/classify" ARCH=roberta_discrete SEED=1 MAX_UPDATE="$CLASSIFY_UPDATES" LOG_INTERVAL=20 \
  VALIDATE_INTERVAL="$CLASSIFY_UPDATES" PATIENCE=0 LR_SCHEDULE=polynomial_decay \
  WARMUP_UPDATES="$((CLASSIFY_UPDATES * 6 / 100))" \
  bash "$HERE/classify.sh" > "$WORK_DIR/classify.log" 2>&1 || { tail -n 20 "$WORK_DIR/classify.log" >&2; die "classify.sh failed (log: $WORK_DIR/classify.log)"; }

say "2/2 translation: $TRAIN_PAIRS Multi30k pairs en -> de, transformer and transformer_discrete ($TRANSLATE_UPDATES updates), CoNLL-2000 probe"
MULTI30K_DIR="$MULTI30K_DIR" CONLL2000_DIR="$CONLL2000_DIR" OUT="$WORK_DIR/translation" \
  ARCHS="transformer transformer_discrete" SEEDS=1 MAX_UPDATE="$TRANSLATE_UPDATES" WARMUP_UPDATES=20 \
  VOCAB_SIZE=2000 MAX_TRAIN_PAIRS="$TRAIN_PAIRS" MAX_VALID_PAIRS=50 MAX_TEST_PAIRS="$TEST_PAIRS" \
  PROBE_WORDS=5000 bash "$HERE/table62.sh" > "$WORK_DIR/translation.log" 2>&1 || { tail -n 20 "$WORK_DIR/translation.log" >&2; die "table62.sh failed (log: $WORK_DIR/translation.log)"; }

echo
echo "=== classification (SST test, $CLASSIFY_UPDATES updates; a smoke run, not a result) ==="
cat "$WORK_DIR/classify/roberta_discrete-seed1/row.md"
echo
echo "=== translation and streams (first $TEST_PAIRS test2016 pairs; a smoke run, not a result) ==="
cat "$WORK_DIR/translation/table.md"
echo
say "t-SNE pictures: $WORK_DIR/translation/streams/tsne-embeddings.png (token embeddings), tsne.png (final states); neighbours: table63.md; done in $((SECONDS - START)) s"
