#!/usr/bin/env bash
# The whole Gigaword recipe on a CPU-sized slice, in about 5 minutes on 2 cores (docs/results, 2026-11-28):
#
#   bash scripts/install.sh && bash examples/gigaword/quickstart.sh
#
# prepare.sh (10,000 training pairs, 4,000 SentencePiece pieces, the first 500
# test pairs) -> train.sh (a tiny HNAS model, 1,500 updates of 64 headlines, ROUGE
# on 200 validation pairs at each validation) -> generate.sh (beam search over
# the 500 test articles) -> rouge_eval.py, next to the lead-8 baseline. Prints
# a few articles with their reference and generated headlines, then ROUGE.
#
# Data: the sumdata folder in $GIGAWORD_DIR when set, else the public release
# is downloaded (about 300 MB) into WORK_DIR. Python: $PYTHON, else the
# repository's .venv (made by scripts/install.sh), else python3 on PATH.
# Time: about 5 minutes on 2 idle CPU cores (training about 4.5 of them). Expect
# ROUGE-1 about 20, below lead-8 (25.8): a smoke run, not a result.
# Safe to re-run: finished steps are skipped, training resumes.
set -euo pipefail

WORK_DIR="${WORK_DIR:-${TMPDIR:-/tmp}/fairseq-dnas-quickstart}"
GIGAWORD_DIR="${GIGAWORD_DIR:-}"            # a harvardnlp sumdata folder; empty: download
ARCH="${ARCH:-transformer_hnas}"            # transformer | transformer_dnas | transformer_hnas
TRAIN_PAIRS="${TRAIN_PAIRS:-10000}"
VALID_PAIRS="${VALID_PAIRS:-200}"
TEST_PAIRS="${TEST_PAIRS:-500}"
VOCAB_SIZE="${VOCAB_SIZE:-4000}"
MAX_UPDATE="${MAX_UPDATE:-1500}"
SHOW="${SHOW:-5}"                           # examples printed at the end
DEVICE="${DEVICE:-auto}"

source "$(dirname "$0")/../common.sh"
HERE="$(cd "$(dirname "$0")" && pwd)"
check_python
mkdir -p "$WORK_DIR"
DATA="$WORK_DIR/data"
CKPT="$WORK_DIR/checkpoints/$ARCH"
START=$SECONDS

SOURCE="${GIGAWORD_DIR:-download}"
[ "$SOURCE" = download ] && say "GIGAWORD_DIR is not set: the public Gigaword release will be downloaded"
say "1/4 prepare ($TRAIN_PAIRS training pairs, $TEST_PAIRS test pairs) into $DATA"
VOCAB_SIZE="$VOCAB_SIZE" MAX_TRAIN_PAIRS="$TRAIN_PAIRS" MAX_VALID_PAIRS="$VALID_PAIRS" \
  MAX_TEST_PAIRS="$TEST_PAIRS" bash "$HERE/prepare.sh" "$SOURCE" "$DATA"

say "2/4 train a tiny $ARCH model for $MAX_UPDATE updates (log: $CKPT/train.log)"
DATA="$DATA/bin" ARCH="$ARCH" SIZE=tiny PRESET=fast SEED=1 DEVICE="$DEVICE" \
  BATCH_SENTENCES=64 MAX_SENTENCES_PER_PROC=64 MAX_UPDATE="$MAX_UPDATE" LR=1e-3 WARMUP_UPDATES=100 \
  VALIDATE_INTERVAL_UPDATES="$MAX_UPDATE" EVAL_ROUGE=1 EVAL_ROUGE_SENTENCES="$VALID_PAIRS" \
  LOG_INTERVAL=50 SAVE_DIR="$CKPT" bash "$HERE/train.sh"

say "3/4 generate headlines for the $TEST_PAIRS test articles"
DATA="$DATA" CHECKPOINT="$CKPT/checkpoint_best.pt" OUT_PREFIX="$WORK_DIR/results/$ARCH" \
  LABEL="$ARCH" DEVICE="$DEVICE" bash "$HERE/generate.sh" > /dev/null

say "4/4 ROUGE, next to the lead-8 baseline"
mkdir -p "$WORK_DIR/results"
"$PYTHON" -m fairseq_dnas.commands.lead_baseline --input "$DATA/raw/test.article" --words 8 > "$WORK_DIR/results/lead8.hyp"
"$PYTHON" -m fairseq_dnas.commands.rouge_eval --hyp "$WORK_DIR/results/lead8.hyp" --ref "$DATA/raw/test.title" \
  --label lead-8 --json-out "$WORK_DIR/results/lead8.rouge.json" > /dev/null

echo
echo "=== $SHOW test articles, reference and generated headlines ($ARCH, tiny, $MAX_UPDATE updates) ==="
# awk, not head: head would close the pipe early and pipefail turn SIGPIPE into failure.
paste -d '\t' "$DATA/raw/test.article" "$DATA/raw/test.title" "$WORK_DIR/results/$ARCH.hyp" |
  awk -v n="$SHOW" 'NR <= n' |
  while IFS=$'\t' read -r article reference generated; do
    echo "article:   $article"
    echo "reference: $reference"
    echo "generated: $generated"
    echo
  done
echo "=== ROUGE on the first $TEST_PAIRS test pairs (small-scale smoke run, not the paper's setting) ==="
"$PYTHON" -m fairseq_dnas.commands.seed_table --order "$ARCH,lead-8" \
  "$WORK_DIR/results/$ARCH.rouge.json" "$WORK_DIR/results/lead8.rouge.json"
echo
say "done in $(( SECONDS - START )) s; outputs under $WORK_DIR"
