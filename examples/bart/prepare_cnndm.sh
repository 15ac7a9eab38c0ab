#!/usr/bin/env bash
# CNN/DailyMail (or any summarization corpus in the same layout) for BART
# fine-tuning: fairseq's GPT-2 BPE, then fairseq-preprocess with BART's
# dictionary. The steps of fairseq's examples/bart/README.summarization.md.
#
#   CNNDM_DIR=cnn_dm GPT2_DIR=gpt2_bpe OUT_DIR=cnn_dm-bin bash examples/bart/prepare_cnndm.sh
#
# Nothing here downloads. You need, already on disk:
#   CNNDM_DIR/{train,val,test}.{source,target}   one article / summary a line
#     (made by fairseq's pointer: https://github.com/artmatsak/cnn-dailymail,
#      or any corpus written that way, e.g. XSum)
#   GPT2_DIR/encoder.json, GPT2_DIR/vocab.bpe    the GPT-2 BPE
#     (https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/encoder.json, vocab.bpe)
#   GPT2_DIR/dict.txt                            BART's dictionary
#     (https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/dict.txt; bart.large's
#      own dict.txt is the same file)
# A missing file ends the script with one line naming it.
# Writes CNNDM_DIR/{train,val,test}.bpe.{source,target} and OUT_DIR (what
# finetune.sh reads as DATA). Safe to re-run: finished steps are skipped.
set -euo pipefail

CNNDM_DIR="${CNNDM_DIR:-cnn_dm}"
GPT2_DIR="${GPT2_DIR:-gpt2_bpe}"
OUT_DIR="${OUT_DIR:-${CNNDM_DIR%/}-bin}"
SPLITS="${SPLITS:-train val test}"
WORKERS="${WORKERS:-$(nproc 2>/dev/null || echo 1)}"

source "$(dirname "$0")/../common.sh"
check_python

for f in encoder.json vocab.bpe dict.txt; do
  [ -s "$GPT2_DIR/$f" ] || die "missing $GPT2_DIR/$f (fetch it from https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/$f on a machine with internet, then set GPT2_DIR)"
done
for split in $SPLITS; do
  for side in source target; do
    [ -s "$CNNDM_DIR/$split.$side" ] || die "missing $CNNDM_DIR/$split.$side (one article or summary a line; set CNNDM_DIR)"
  done
done
check_number WORKERS 1

for split in $SPLITS; do
  for side in source target; do
    out="$CNNDM_DIR/$split.bpe.$side"
    if [ -s "$out" ]; then say "BPE $out: done already"; continue; fi
    say "BPE $CNNDM_DIR/$split.$side"
    "$PYTHON" "$(dirname "$0")/bpe_encode.py" --encoder-json "$GPT2_DIR/encoder.json" \
      --vocab-bpe "$GPT2_DIR/vocab.bpe" --inputs "$CNNDM_DIR/$split.$side" --outputs "$out" --workers "$WORKERS"
  done
done

if [ -f "$OUT_DIR/dict.source.txt" ]; then say "binarized $OUT_DIR: done already"; exit 0; fi
PREFIXES=()
for split in $SPLITS; do
  case "$split" in
    train) PREFIXES+=(--trainpref "$CNNDM_DIR/train.bpe") ;;
    val|valid) PREFIXES+=(--validpref "$CNNDM_DIR/$split.bpe") ;;
    test) PREFIXES+=(--testpref "$CNNDM_DIR/test.bpe") ;;
    *) die "SPLITS=$SPLITS: use train, val and test" ;;
  esac
done
say "fairseq-preprocess -> $OUT_DIR"
"$PYTHON" -m fairseq_cli.preprocess --source-lang source --target-lang target "${PREFIXES[@]}" \
  --destdir "$OUT_DIR.partial" --workers "$WORKERS" --srcdict "$GPT2_DIR/dict.txt" --tgtdict "$GPT2_DIR/dict.txt"
rm -rf "$OUT_DIR"; mv "$OUT_DIR.partial" "$OUT_DIR"
say "ready: $OUT_DIR"
