#!/usr/bin/env bash
# Data for masked-LM pretraining and SST-2 / CoLA fine-tuning, one dictionary.
#
#   bash examples/masked_lm/prepare.sh        # OUT_DIR=data/masked_lm
#
# 1. The unlabelled English text at hand (about 1.6M words): WikiText-2
#    (valid + test), the Gigaword articles, the English side of Multi30k;
#    lowercased (the GLUE files here are), one sentence a line, every
#    VALID_EVERY-th sentence held out -> OUT_DIR/text/{train,valid}.txt
# 2. A SentencePiece model on it (VOCAB pieces) -> OUT_DIR/bin/sp.model
# 3. fairseq-preprocess --only-source -> OUT_DIR/bin/pretrain (--task masked_lm)
# 4. SST-2 and CoLA in sentence_prediction's layout, with the pretraining
#    dictionary: OUT_DIR/bin/{sst2,cola}/{input0,label} (train, valid, test)
# Safe to re-run: finished steps are skipped (delete OUT_DIR to start over).
set -euo pipefail

OUT_DIR="${OUT_DIR:-data/masked_lm}"
WIKITEXT_DIR="${WIKITEXT_DIR:-../shared/data/wikitext-2}"
GIGAWORD_DIR="${GIGAWORD_DIR:-../shared/data/gigaword/sumdata}"
MULTI30K_DIR="${MULTI30K_DIR:-../shared/data/multi30k}"
GLUE_DIR="${GLUE_DIR:-../shared/data/glue}"
VOCAB="${VOCAB:-8000}"                 # SentencePiece pieces
VALID_EVERY="${VALID_EVERY:-100}"      # 1% of the sentences validate the masked LM
MAX_PIECES="${MAX_PIECES:-126}"        # + <s> and </s> = 128 positions (the small preset)
MAX_LINES="${MAX_LINES:-0}"            # >0: at most N sentences per source file (quick runs)
MAX_TRAIN="${MAX_TRAIN:-0}"            # >0: at most N fine-tuning training sentences per task
MAX_EVAL="${MAX_EVAL:-0}"              # >0: at most N fine-tuning valid/test sentences per task
TASKS="${TASKS:-sst2 cola}"            # fine-tuning sets to prepare
WORKERS="${WORKERS:-$(nproc 2>/dev/null || echo 1)}"

source "$(dirname "$0")/../common.sh"
check_python

for d in "$WIKITEXT_DIR" "$GIGAWORD_DIR" "$MULTI30K_DIR" "$GLUE_DIR"; do
  [ -d "$d" ] || die "no folder $d (set WIKITEXT_DIR, GIGAWORD_DIR, MULTI30K_DIR, GLUE_DIR; see examples/masked_lm/README.md)"
done
SOURCES=("$WIKITEXT_DIR/valid.txt" "$WIKITEXT_DIR/test.txt"
         "$GIGAWORD_DIR/train/train.article.txt" "$GIGAWORD_DIR/train/valid.article.filter.txt"
         "$MULTI30K_DIR/raw/train.en" "$MULTI30K_DIR/raw/val.en"
         "$MULTI30K_DIR/raw/test_2016_flickr.en" "$MULTI30K_DIR/raw/test_2017_flickr.en")
for f in "${SOURCES[@]}"; do [ -s "$f" ] || die "missing or empty source text $f"; done
for task in $TASKS; do
  case "$task" in sst2|cola) ;; *) die "TASKS=$TASKS: choose among sst2 and cola" ;; esac
done
for n in VOCAB VALID_EVERY MAX_PIECES; do check_number "$n" 1; done
for n in MAX_LINES MAX_TRAIN MAX_EVAL; do check_number "$n"; done

TEXT="$OUT_DIR/text"; BIN="$OUT_DIR/bin"
mkdir -p "$TEXT" "$BIN"
# A folder prepared with other settings is refused, never mixed with new output.
check_settings_file "$OUT_DIR" "VOCAB=$VOCAB VALID_EVERY=$VALID_EVERY MAX_PIECES=$MAX_PIECES MAX_LINES=$MAX_LINES MAX_TRAIN=$MAX_TRAIN MAX_EVAL=$MAX_EVAL"
SPM=("$PYTHON" -m fairseq_dnas.recipes.sentencepiece_tool)
DATA=("$PYTHON" -m fairseq_dnas.recipes.masked_lm_data)
PREPROCESS_OPTS=(--only-source --workers "$WORKERS")
PREPROCESS=("$PYTHON" -m fairseq_cli.preprocess "${PREPROCESS_OPTS[@]}")

if [ ! -s "$TEXT/valid.txt" ]; then
  say "1/4 collecting the pretraining text"
  "${DATA[@]}" corpus --out "$TEXT" --valid-every "$VALID_EVERY" --max-lines "$MAX_LINES" "${SOURCES[@]}"
fi

if [ ! -s "$BIN/sp.model" ]; then
  say "2/4 SentencePiece ($VOCAB pieces) on $TEXT/train.txt"
  "${SPM[@]}" train --input "$TEXT/train.txt" --model-prefix "$BIN/sp" --vocab-size "$VOCAB" --threads "$WORKERS"
fi

encode() {  # encode IN OUT: SentencePiece pieces, progress shown for large files (common.sh)
  encode_pieces "$BIN/sp.model" "$1" "$2" --max-pieces "$MAX_PIECES"
}

if [ ! -s "$BIN/pretrain/valid.idx" ]; then
  say "3/4 binarizing the pretraining text"
  for split in train valid; do encode "$TEXT/$split.txt" "$TEXT/$split.sp"; done
  rm -rf "$BIN/pretrain.tmp"
  : > "$TEXT/preprocess.log"
  run_fairseq_preprocess "$TEXT/preprocess.log" "$BIN/pretrain.tmp" "${PREPROCESS_OPTS[@]}" \
    --trainpref "$TEXT/train.sp" --validpref "$TEXT/valid.sp" \
    || die "fairseq-preprocess failed (see $TEXT/preprocess.log)"
  rm -rf "$BIN/pretrain" && mv "$BIN/pretrain.tmp" "$BIN/pretrain"
fi

for task in $TASKS; do
  [ -s "$BIN/$task/label/test.idx" ] && continue
  say "4/4 $task: sentence_prediction layout with the pretraining dictionary"
  RAW="$TEXT/$task"
  "${DATA[@]}" glue --task "$task" --glue-dir "$GLUE_DIR" --out "$RAW" --max-train "$MAX_TRAIN" --max-eval "$MAX_EVAL"
  for split in train valid test; do encode "$RAW/$split.input0" "$RAW/$split.input0.sp"; done
  rm -rf "$BIN/$task.tmp"
  "${PREPROCESS[@]}" --srcdict "$BIN/pretrain/dict.txt" --trainpref "$RAW/train.input0.sp" \
    --validpref "$RAW/valid.input0.sp" --testpref "$RAW/test.input0.sp" \
    --destdir "$BIN/$task.tmp/input0" > "$RAW/preprocess.log" 2>&1 \
    || die "fairseq-preprocess failed for $task (see $RAW/preprocess.log)"
  "${PREPROCESS[@]}" --trainpref "$RAW/train.label" --validpref "$RAW/valid.label" \
    --testpref "$RAW/test.label" --destdir "$BIN/$task.tmp/label" >> "$RAW/preprocess.log" 2>&1 \
    || die "fairseq-preprocess failed for $task labels (see $RAW/preprocess.log)"
  rm -rf "$BIN/$task" && mv "$BIN/$task.tmp" "$BIN/$task"
done
say "done: pretraining data $BIN/pretrain, fine-tuning data in $BIN/{${TASKS// /,}}, SentencePiece $BIN/sp.model"
