#!/usr/bin/env bash
# Prepare Gigaword headline generation for fairseq: clean -> SentencePiece ->
# truncate -> binarize.
#
#   bash examples/gigaword/prepare.sh SUMDATA_DIR OUT_DIR
#   bash examples/gigaword/prepare.sh download OUT_DIR   # fetch the public release first
#
# SUMDATA_DIR is the harvardnlp `sumdata` folder (train/train.{article,title}.txt,
# train/valid.{article,title}.filter.txt, Giga/input.txt, Giga/task1_ref0.txt).
# OUT_DIR gets:
#   text/  cleaned pairs          spm/  SentencePiece model + encoded text
#   raw/   test.article, test.title: the test files byte for byte (the ROUGE
#          reference and the lead-N baseline's input)
#   bin/   fairseq-preprocess output (--joined-dictionary): what train.sh reads
#
# Time: full corpus (3.8M pairs) about 30-40 min on 8 cores (SentencePiece on a
# 2M-line sample, then encoding); a 10k-pair training sample about
# 30 s on 2 cores. Safe to re-run: finished steps are skipped; a changed
# setting is refused (use another OUT_DIR).
set -euo pipefail

VOCAB_SIZE="${VOCAB_SIZE:-30522}"          # SentencePiece pieces (paper: 30,522 word pieces; ~8000 for 30k pairs)
SPM_TYPE="${SPM_TYPE:-unigram}"            # unigram or bpe
SPM_SAMPLE="${SPM_SAMPLE:-2000000}"        # lines SentencePiece trains on (random sample)
MAX_SOURCE_PIECES="${MAX_SOURCE_PIECES:-127}"  # + </s> = the paper's 128 encoder positions
MAX_TARGET_PIECES="${MAX_TARGET_PIECES:-63}"   # + </s> = the paper's 64 decoder positions
MAX_TRAIN_PAIRS="${MAX_TRAIN_PAIRS:-0}"    # first N pairs of each training file pair (0: all)
MAX_VALID_PAIRS="${MAX_VALID_PAIRS:-0}"    # first N validation pairs (0: all)
MAX_TEST_PAIRS="${MAX_TEST_PAIRS:-0}"      # first N test pairs (0: all 1,951)
EXTRA_TRAIN="${EXTRA_TRAIN:-}"             # more training pairs: "ARTICLE:TITLE ARTICLE:TITLE ..."
UNK_TO="${UNK_TO:-UNK}"                    # train/valid <unk> -> the test set's UNK ("" keeps <unk>)
DECONTAMINATE="${DECONTAMINATE:-1}"        # 1: drop training pairs whose article is a valid/test article
WORKERS="${WORKERS:-$(nproc 2>/dev/null || echo 1)}"
DOWNLOAD_URL="${DOWNLOAD_URL:-}"           # with 'download': another URL of summary.tar.gz (a mirror)

source "$(dirname "$0")/../common.sh"

SUMDATA="${1:-}"
OUT="${2:-}"
[ -n "$SUMDATA" ] && [ -n "$OUT" ] || die "usage: prepare.sh SUMDATA_DIR|download OUT_DIR (settings: see the top of $0)"
check_python
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

if [ "$SUMDATA" = "download" ]; then
  say "no sumdata folder given: downloading the public Gigaword release (harvardnlp sent-summary) into $OUT/download"
  URL_ARGS=(); [ -n "$DOWNLOAD_URL" ] && URL_ARGS=(--url "$DOWNLOAD_URL")
  "$PYTHON" -m fairseq_dnas.recipes.gigaword_download "$OUT/download" "${URL_ARGS[@]}"
  SUMDATA="$OUT/download/sumdata"
fi
[ -d "$SUMDATA" ] || die "$SUMDATA is not a folder (expected the harvardnlp sumdata layout, or the word 'download')"
SUMDATA="$(cd "$SUMDATA" && pwd)"

TRAIN_A="$SUMDATA/train/train.article.txt";      TRAIN_T="$SUMDATA/train/train.title.txt"
VALID_A="$SUMDATA/train/valid.article.filter.txt"; VALID_T="$SUMDATA/train/valid.title.filter.txt"
TEST_A="$SUMDATA/Giga/input.txt";                TEST_T="$SUMDATA/Giga/task1_ref0.txt"
for f in "$TRAIN_A" "$TRAIN_T" "$VALID_A" "$VALID_T" "$TEST_A" "$TEST_T"; do
  [ -f "$f" ] || die "missing file: $f (expected the harvardnlp sumdata layout under $SUMDATA)"
done
EXTRA_PAIRS=()
for pair in $EXTRA_TRAIN; do
  a="${pair%%:*}"; t="${pair#*:}"
  [ "$a" != "$pair" ] || die "EXTRA_TRAIN entry '$pair' is not ARTICLE:TITLE"
  EXTRA_PAIRS+=(--pair "$a" "$t")
done

# A changed setting would silently mix old and new outputs: refuse instead.
SETTINGS="sumdata=$SUMDATA vocab=$VOCAB_SIZE spm_type=$SPM_TYPE spm_sample=$SPM_SAMPLE src=$MAX_SOURCE_PIECES tgt=$MAX_TARGET_PIECES train=$MAX_TRAIN_PAIRS valid=$MAX_VALID_PAIRS test=$MAX_TEST_PAIRS extra=$EXTRA_TRAIN unk_to=$UNK_TO decontaminate=$DECONTAMINATE"
check_settings_file "$OUT" "$SETTINGS"

PAIRS=("$PYTHON" -m fairseq_dnas.recipes.gigaword_pairs --unk-to "$UNK_TO")
mkdir -p "$OUT/text" "$OUT/raw" "$OUT/spm"

# 1. Check and clean the text. Validation and test first: training pairs with
#    the same article are dropped (DECONTAMINATE=1).
if [ -f "$OUT/text/valid.title" ]; then say "1/4 valid text: done already"; else
  say "1/4 cleaning validation pairs"
  "${PAIRS[@]}" --pair "$VALID_A" "$VALID_T" --max-pairs "$MAX_VALID_PAIRS" --out-prefix "$OUT/text/valid"
fi
if [ -f "$OUT/raw/test.title" ]; then say "1/4 test text: done already"; else
  say "1/4 test pairs (kept whole: every test source gets a headline)"
  "${PAIRS[@]}" --pair "$TEST_A" "$TEST_T" --max-pairs "$MAX_TEST_PAIRS" --keep-empty --out-prefix "$OUT/text/test"
  # The reference is scored raw (UNK and # as released), so copy it byte for byte.
  for side in article:"$TEST_A" title:"$TEST_T"; do
    if [ "$MAX_TEST_PAIRS" -gt 0 ]; then head -n "$MAX_TEST_PAIRS" "${side#*:}" > "$OUT/raw/test.${side%%:*}.tmp"
    else cp "${side#*:}" "$OUT/raw/test.${side%%:*}.tmp"; fi
  done
  mv "$OUT/raw/test.article.tmp" "$OUT/raw/test.article"
  mv "$OUT/raw/test.title.tmp" "$OUT/raw/test.title"
fi
if [ -f "$OUT/text/train.title" ]; then say "1/4 train text: done already"; else
  say "1/4 cleaning training pairs"
  EXCLUDE=()
  [ "$DECONTAMINATE" = 1 ] && EXCLUDE=(--exclude-articles "$OUT/text/valid.article" "$OUT/text/test.article")
  "${PAIRS[@]}" --pair "$TRAIN_A" "$TRAIN_T" "${EXTRA_PAIRS[@]}" --max-pairs "$MAX_TRAIN_PAIRS" \
    "${EXCLUDE[@]}" --out-prefix "$OUT/text/train"
fi

# 2. One SentencePiece model for articles and titles (shared embeddings).
if [ -f "$OUT/spm/sentencepiece.model" ]; then say "2/4 SentencePiece model: done already"; else
  say "2/4 training SentencePiece ($SPM_TYPE, $VOCAB_SIZE pieces)"
  "$PYTHON" -m fairseq_dnas.recipes.sentencepiece_tool train \
    --input "$OUT/text/train.article" "$OUT/text/train.title" \
    --model-prefix "$OUT/spm/sentencepiece" \
    --vocab-size "$VOCAB_SIZE" \
    --model-type "$SPM_TYPE" \
    --sample "$SPM_SAMPLE" \
    --threads "$WORKERS"
fi

# 3. Encode and truncate (128 source / 64 target positions with </s>).
for split in train valid test; do
  for side in article title; do
    limit="$MAX_SOURCE_PIECES"; [ "$side" = title ] && limit="$MAX_TARGET_PIECES"
    if [ -f "$OUT/spm/$split.$side" ]; then continue; fi
    say "3/4 encoding $split.$side"
    encode_pieces "$OUT/spm/sentencepiece.model" "$OUT/text/$split.$side" "$OUT/spm/$split.$side" \
      --max-pieces "$limit"
  done
done

# 4. Binarize with one dictionary for both sides.
if [ -f "$OUT/bin/dict.article.txt" ]; then say "4/4 binarized data: done already"; else
  say "4/4 fairseq-preprocess"
  binarize "$OUT" \
    --source-lang article \
    --target-lang title \
    --trainpref "$OUT/spm/train" \
    --validpref "$OUT/spm/valid" \
    --testpref "$OUT/spm/test" \
    --joined-dictionary \
    --workers "$WORKERS"
fi

say "ready: $OUT/bin ($(wc -l < "$OUT/spm/train.article") train, $(wc -l < "$OUT/spm/valid.article") valid, $(wc -l < "$OUT/spm/test.article") test pairs; dictionary $(wc -l < "$OUT/bin/dict.article.txt") types)"
