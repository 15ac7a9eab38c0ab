#!/usr/bin/env bash
# The discrete-attention experiments end to end in a few CPU minutes on the
# real data (small models, short training, the first test2016 pairs), each
# discrete model beside its soft twin, one seed: a smoke run that shows the
# chain runs and learns, not a result (the tables are table61.sh's and
# table62.sh's, README.md):
#
# 1. classification (the Table 6.1 form): SST in Jain & Wallace's split ->
#    roberta and roberta_discrete (two-stream, discrete), CLASSIFY_LAYERS
#    layers (the thesis has 6; 2 learn SST within the budget) trained from
#    scratch for a fixed CLASSIFY_UPDATES (no early stopping) -> accuracy and tau on the 1,821 test sentences (classify.sh,
#    faithfulness_table.py);
# 2. translation and streams (the Table 6.2 and 6.4 forms): Multi30k
#    English -> German (all 29,000 training pairs, or the first TRAIN_PAIRS) -> a
#    transformer and a transformer_discrete (SIZE=mini) -> BLEU and chrF on
#    the first TEST_PAIRS test2016 pairs, tau of the encoder and cross
#    attention, the CoNLL-2000 probe per stream, the t-SNE pictures of the
#    token embeddings and of the final states (table62.sh).
#
#   SST_BINARY_DIR=/path/to/sst-binary MULTI30K_DIR=/path/to/multi30k CONLL2000_DIR=/path/to/conll2000 \
#     bash examples/discrete/quickstart.sh
#
# The console shows each step and the progress of training and decoding;
# the whole output of each step is in WORK_DIR/*.log. With the defaults, on
# the 2-core development machine (one thread, load about 4): 318 s, SST
# accuracy 78.7 (roberta) and 75.9 (roberta_discrete), BLEU 4.18 and 3.90
# (docs/results/2026-11-27-cpu-discrete-quickstart.md).
# Safe to re-run: finished steps are skipped; other settings need another
# WORK_DIR (or delete it to start over).
set -euo pipefail

WORK_DIR="${WORK_DIR:-${TMPDIR:-/tmp}/fairseq-dnas-discrete-quickstart}"
SST_BINARY_DIR="${SST_BINARY_DIR:-}"        # train.tsv, dev.tsv, test.tsv
MULTI30K_DIR="${MULTI30K_DIR:-}"            # raw/
CONLL2000_DIR="${CONLL2000_DIR:-}"          # train.txt, test.txt
CLASSIFY_ARCHS="${CLASSIFY_ARCHS:-roberta roberta_discrete}"
CLASSIFY_LAYERS="${CLASSIFY_LAYERS:-2}"     # 64 wide, FFN 128, 4 heads (table61.sh: 6 layers)
CLASSIFY_UPDATES="${CLASSIFY_UPDATES:-300}" # of 32 sentences: 1.4 epochs of SST
CLASSIFY_LR="${CLASSIFY_LR:-2e-3}"
TRANSLATE_ARCHS="${TRANSLATE_ARCHS:-transformer transformer_discrete}"
TRAIN_PAIRS="${TRAIN_PAIRS:-0}"             # first N Multi30k training pairs (0: all 29,000)
TRANSLATE_UPDATES="${TRANSLATE_UPDATES:-200}"
TRANSLATE_BATCH_TOKENS="${TRANSLATE_BATCH_TOKENS:-1024}"
TRANSLATE_LR="${TRANSLATE_LR:-3e-3}"
TEST_PAIRS="${TEST_PAIRS:-100}"

HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../common.sh"
check_python
[ -s "$SST_BINARY_DIR/train.tsv" ] || die "set SST_BINARY_DIR to the SST folder (train.tsv, dev.tsv, test.tsv)"
[ -d "$MULTI30K_DIR/raw" ] || die "set MULTI30K_DIR to the Multi30k folder (raw/train.en, ...)"
[ -s "$CONLL2000_DIR/train.txt" ] || die "set CONLL2000_DIR to the CoNLL-2000 folder (train.txt, test.txt)"
for n in CLASSIFY_LAYERS CLASSIFY_UPDATES TRANSLATE_UPDATES TRANSLATE_BATCH_TOKENS TEST_PAIRS; do check_number "$n" 1; done
[ -f "$WORK_DIR/settings.txt" ] || [ ! -d "$WORK_DIR/translation" ] \
  || die "WORK_DIR=$WORK_DIR holds an earlier quickstart's runs: delete it, or set WORK_DIR to another folder"
mkdir -p "$WORK_DIR"
# Finished runs are skipped, so runs of other settings must not share a folder.
check_settings_file "$WORK_DIR" "CLASSIFY_ARCHS=$CLASSIFY_ARCHS CLASSIFY_LAYERS=$CLASSIFY_LAYERS \
CLASSIFY_UPDATES=$CLASSIFY_UPDATES CLASSIFY_LR=$CLASSIFY_LR TRANSLATE_ARCHS=$TRANSLATE_ARCHS TRAIN_PAIRS=$TRAIN_PAIRS \
TRANSLATE_UPDATES=$TRANSLATE_UPDATES TRANSLATE_BATCH_TOKENS=$TRANSLATE_BATCH_TOKENS TRANSLATE_LR=$TRANSLATE_LR \
TEST_PAIRS=$TEST_PAIRS" WORK_DIR
START=$SECONDS

# step NAME LOG CMD...: runs CMD with its whole output in LOG and its
# "[script] ..." lines (the steps, training and decoding progress, errors)
# on the console as they come; when CMD fails, the log's last 20 lines and die.
step() {
  local name="$1" log="$2" status=0
  shift 2
  "$@" 2>&1 | tee "$log" | { grep --line-buffered '^\[' >&2 || true; } || status=$?
  [ "$status" = 0 ] && return 0
  tail -n 20 "$log" >&2
  die "$name failed (log: $log)"
}

SST="$WORK_DIR/sst"
for arch in $CLASSIFY_ARCHS; do
  say "1/2 classification: SST -> $arch ($CLASSIFY_LAYERS layers, $CLASSIFY_UPDATES updates) -> accuracy and tau"
  step classify.sh "$WORK_DIR/sst-$arch.log" env TRAIN="$SST_BINARY_DIR/train.tsv" DEV="$SST_BINARY_DIR/dev.tsv" \
    TEST="$SST_BINARY_DIR/test.tsv" OUT="$SST" ARCH="$arch" SEED=1 LAYERS="$CLASSIFY_LAYERS" \
    MAX_UPDATE="$CLASSIFY_UPDATES" LR="$CLASSIFY_LR" LOG_INTERVAL=25 \
    VALIDATE_INTERVAL="$CLASSIFY_UPDATES" PATIENCE=0 LR_SCHEDULE=polynomial_decay \
    WARMUP_UPDATES="$((CLASSIFY_UPDATES * 6 / 100))" bash "$HERE/classify.sh"
done
"$PYTHON" "$HERE/faithfulness_table.py" --out "$SST/table.md" "sst=$SST" > /dev/null

say "2/2 translation: Multi30k en -> de, $TRANSLATE_ARCHS ($TRANSLATE_UPDATES updates), CoNLL-2000 probe"
step table62.sh "$WORK_DIR/translation.log" env MULTI30K_DIR="$MULTI30K_DIR" CONLL2000_DIR="$CONLL2000_DIR" \
  OUT="$WORK_DIR/translation" ARCHS="$TRANSLATE_ARCHS" SEEDS=1 MAX_UPDATE="$TRANSLATE_UPDATES" \
  BATCH_TOKENS="$TRANSLATE_BATCH_TOKENS" LR="$TRANSLATE_LR" WARMUP_UPDATES=$((TRANSLATE_UPDATES / 4)) \
  VOCAB_SIZE=2000 MAX_TRAIN_PAIRS="$TRAIN_PAIRS" MAX_VALID_PAIRS=50 MAX_TEST_PAIRS="$TEST_PAIRS" \
  PROBE_WORDS=5000 bash "$HERE/table62.sh"

PAIRS="all 29,000"; [ "$TRAIN_PAIRS" = 0 ] || PAIRS="the first $TRAIN_PAIRS"
echo
echo "=== A smoke run: each soft model beside its discrete twin, $CLASSIFY_UPDATES and $TRANSLATE_UPDATES updates, one seed"
echo "    (so no standard error). The tables at thesis size: table61.sh (Table 6.1), table62.sh (Tables 6.2, 6.4) ==="
echo
echo "=== classification: SST test ($(wc -l < "$SST/text/test.input0") sentences, chance 50%), $CLASSIFY_LAYERS-layer encoders,"
echo "    $CLASSIFY_UPDATES updates of 32 sentences ==="
cat "$SST/table.md"
echo
echo "=== translation and streams: Multi30k en -> de ($PAIRS training pairs, the first $TEST_PAIRS test2016 pairs),"
echo "    mini models, $TRANSLATE_UPDATES updates of $TRANSLATE_BATCH_TOKENS tokens ==="
cat "$WORK_DIR/translation/table.md"
echo
say "t-SNE pictures: $WORK_DIR/translation/streams/tsne-embeddings.png (token embeddings), tsne.png (final states); neighbours: table63.md; done in $((SECONDS - START)) s"
