#!/usr/bin/env bash
# Prepare parallel text for fairseq: check -> joint SentencePiece -> binarize.
#
#   MULTI30K_DIR=/path/to/multi30k bash examples/translation/prepare.sh OUT_DIR
#   TRAIN_PREFIX=my/train VALID_PREFIX=my/dev TEST_PREFIXES="my/test1 my/test2" \
#     SRC=fr TGT=en bash examples/translation/prepare.sh OUT_DIR
#
# Any PREFIX.SRC / PREFIX.TGT files aligned line by line (raw, untokenized
# text). With MULTI30K_DIR set, the prefixes default to Multi30k task 1:
# raw/train, raw/val, and the test sets raw/test_2016_flickr and
# raw/test_2017_flickr. OUT_DIR gets:
#   text/  the checked pairs: train, valid, test, test1, ... (test sets in the
#          order of TEST_PREFIXES; test*.TGT is the BLEU reference, line for line)
#   spm/   SentencePiece model (one for both languages) and encoded text
#   bin/   fairseq-preprocess output (--joined-dictionary): what train.sh reads
#   test_sets.txt  "test /path/to/prefix" per test set
# Time: Multi30k (29k pairs) about 40 s on 2 CPU cores. Safe to re-run:
# finished steps are skipped; a changed setting is refused (use another OUT_DIR).
set -euo pipefail

SRC="${SRC:-de}"
TGT="${TGT:-en}"
MULTI30K_DIR="${MULTI30K_DIR:-}"            # Multi30k folder (README, raw/); sets the defaults below
TRAIN_PREFIX="${TRAIN_PREFIX:-${MULTI30K_DIR:+$MULTI30K_DIR/raw/train}}"
VALID_PREFIX="${VALID_PREFIX:-${MULTI30K_DIR:+$MULTI30K_DIR/raw/val}}"
TEST_PREFIXES="${TEST_PREFIXES:-${MULTI30K_DIR:+$MULTI30K_DIR/raw/test_2016_flickr $MULTI30K_DIR/raw/test_2017_flickr}}"
VOCAB_SIZE="${VOCAB_SIZE:-8000}"            # joint pieces; 8k is the usual size for ~30k pairs
SPM_TYPE="${SPM_TYPE:-unigram}"             # unigram or bpe
MAX_TRAIN_PAIRS="${MAX_TRAIN_PAIRS:-0}"     # first N training pairs (0: all)
MAX_VALID_PAIRS="${MAX_VALID_PAIRS:-0}"     # first N validation pairs (0: all)
MAX_TEST_PAIRS="${MAX_TEST_PAIRS:-0}"       # first N pairs of each test set (0: all)
WORKERS="${WORKERS:-$(nproc 2>/dev/null || echo 1)}"

source "$(dirname "$0")/../common.sh"

OUT="${1:-}"
[ -n "$OUT" ] || die "usage: prepare.sh OUT_DIR (set MULTI30K_DIR, or TRAIN_PREFIX, VALID_PREFIX and TEST_PREFIXES; see the top of $0)"
[ -n "$TRAIN_PREFIX" ] && [ -n "$VALID_PREFIX" ] && [ -n "$TEST_PREFIXES" ] \
  || die "no data: set MULTI30K_DIR (e.g. ../shared/data/multi30k), or TRAIN_PREFIX, VALID_PREFIX and TEST_PREFIXES"
[ "$SRC" != "$TGT" ] || die "SRC and TGT are both '$SRC'"
# Every input file, checked before anything is written.
for prefix in "$TRAIN_PREFIX" "$VALID_PREFIX" $TEST_PREFIXES; do
  for lang in "$SRC" "$TGT"; do
    [ -f "$prefix.$lang" ] || die "missing file: $prefix.$lang"
  done
done
[ -n "$PYTHON" ] && [ -x "$PYTHON" ] || die "no Python found; run 'bash scripts/install.sh' or set PYTHON"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# A changed setting would silently mix old and new outputs: refuse instead.
SETTINGS="src=$SRC tgt=$TGT train=$TRAIN_PREFIX valid=$VALID_PREFIX test=$TEST_PREFIXES vocab=$VOCAB_SIZE spm_type=$SPM_TYPE max_train=$MAX_TRAIN_PAIRS max_valid=$MAX_VALID_PAIRS max_test=$MAX_TEST_PAIRS"
check_settings_file "$OUT" "$SETTINGS"

# 1. Check and copy each pair of files (test sets whole: their target side is
#    the reference). fairseq names the test sets test, test1, test2, ...
SPLITS=(train valid)
PREFIXES=("$TRAIN_PREFIX" "$VALID_PREFIX")
i=0
for prefix in $TEST_PREFIXES; do
  name=test; [ "$i" -gt 0 ] && name="test$i"
  SPLITS+=("$name"); PREFIXES+=("$prefix"); i=$((i + 1))
done
for k in "${!SPLITS[@]}"; do
  split="${SPLITS[$k]}"
  [ -f "$OUT/text/$split.$TGT" ] && continue
  case "$split" in
    train) ARGS=(--max-pairs "$MAX_TRAIN_PAIRS") ;;
    valid) ARGS=(--max-pairs "$MAX_VALID_PAIRS") ;;
    *)     ARGS=(--max-pairs "$MAX_TEST_PAIRS" --keep-empty) ;;
  esac
  say "1/4 checking $split: ${PREFIXES[$k]}.{$SRC,$TGT}"
  "$PYTHON" -m fairseq_dnas.recipes.parallel_text --pair "${PREFIXES[$k]}.$SRC" "${PREFIXES[$k]}.$TGT" \
    --src "$SRC" --tgt "$TGT" --out-prefix "$OUT/text/$split" "${ARGS[@]}"
done
for k in "${!SPLITS[@]}"; do
  case "${SPLITS[$k]}" in test*) echo "${SPLITS[$k]} ${PREFIXES[$k]}" ;; esac
done > "$OUT/test_sets.txt"

# 2. One SentencePiece model for both languages (shared embeddings). Step 1
#    needs only Python; from here on fairseq and sentencepiece.
check_python
if [ -f "$OUT/spm/sentencepiece.model" ]; then say "2/4 SentencePiece model: done already"; else
  say "2/4 training SentencePiece ($SPM_TYPE, $VOCAB_SIZE pieces, $SRC + $TGT)"
  "$PYTHON" -m fairseq_dnas.recipes.sentencepiece_tool train \
    --input "$OUT/text/train.$SRC" "$OUT/text/train.$TGT" \
    --model-prefix "$OUT/spm/sentencepiece" \
    --vocab-size "$VOCAB_SIZE" \
    --model-type "$SPM_TYPE" \
    --threads "$WORKERS"
fi

# 3. Encode every split (no truncation: fairseq's positions cover these lengths).
for split in "${SPLITS[@]}"; do
  for lang in "$SRC" "$TGT"; do
    [ -f "$OUT/spm/$split.$lang" ] && continue
    say "3/4 encoding $split.$lang"
    encode_pieces "$OUT/spm/sentencepiece.model" "$OUT/text/$split.$lang" "$OUT/spm/$split.$lang"
  done
done

# 4. Binarize with one dictionary for both languages.
if [ -f "$OUT/bin/dict.$SRC.txt" ]; then say "4/4 binarized data: done already"; else
  say "4/4 fairseq-preprocess"
  TESTPREF="$(printf "$OUT/spm/%s," "${SPLITS[@]:2}")"
  binarize "$OUT" \
    --source-lang "$SRC" \
    --target-lang "$TGT" \
    --trainpref "$OUT/spm/train" \
    --validpref "$OUT/spm/valid" \
    --testpref "${TESTPREF%,}" \
    --joined-dictionary \
    --workers "$WORKERS"
fi

say "ready: $OUT/bin ($(wc -l < "$OUT/text/train.$SRC") train, $(wc -l < "$OUT/text/valid.$SRC") valid pairs; test sets: $(cut -d' ' -f1 "$OUT/test_sets.txt" | tr '\n' ' '); dictionary $(wc -l < "$OUT/bin/dict.$SRC.txt") types)"
