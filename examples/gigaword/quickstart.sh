#!/usr/bin/env bash
# The whole Gigaword recipe end to end, sized to the machine:
#
#   bash scripts/install.sh && bash examples/gigaword/quickstart.sh
#
# prepare.sh (training pairs, SentencePiece pieces, the first test pairs) ->
# train.sh (an HNAS model, ROUGE on the validation pairs at the end) ->
# generate.sh (beam search over the test articles) -> rouge_eval.py, next to
# the lead-8 baseline. Prints a few articles with their reference and
# generated headlines, then ROUGE.
#
# What each machine gets (DEVICE=auto: a GPU when torch sees one):
#   CPU: 10,000 training pairs, a tiny model (2 + 2 layers x 128), 1,500
#        updates of 64 headlines, the first 500 test pairs: a smoke run of
#        about 5 minutes on 2 idle cores (docs/results/README.md#current-figures),
#        ROUGE-1 about 20, below lead-8 (25.8 on those pairs).
#   GPU: up to 500,000 training pairs, the small model (3 + 3 layers x 256),
#        8,000 updates of 256 headlines in fp16, all 1,951 test pairs: a
#        budget chosen to beat lead-8 (not yet timed or scored on a GPU).
# Every setting below can be overridden from the environment.
#
# Data: the sumdata folder in $GIGAWORD_DIR when set, else the public release
# (about 300 MB, harvardnlp's Google Drive file, through gdown) is downloaded
# into WORK_DIR; offline, set GIGAWORD_DIR to a local copy of the sumdata
# folder. Python: $PYTHON, else the repository's .venv (made by
# scripts/install.sh), else python3 on PATH.
# Threads (CPU): CPU_THREADS, default the cores not already busy
# (fairseq_dnas/recipes/cpu_threads.py): all of an idle machine's, 1 on a busy
# one, where more threads than free cores train several times slower.
# DRY_RUN=1 prints the plan and stops. Safe to re-run: finished steps are
# skipped, training resumes.
set -euo pipefail

WORK_DIR="${WORK_DIR:-${TMPDIR:-/tmp}/fairseq-dnas-quickstart}"
GIGAWORD_DIR="${GIGAWORD_DIR:-}"            # a harvardnlp sumdata folder; empty: download
ARCH="${ARCH:-transformer_hnas}"            # transformer | transformer_dnas | transformer_hnas
DEVICE="${DEVICE:-auto}"                    # auto | cpu | gpu: the budget below follows it
SHOW="${SHOW:-5}"                           # examples printed at the end
DRY_RUN="${DRY_RUN:-0}"                     # 1: print the plan and stop

source "$(dirname "$0")/../common.sh"
HERE="$(cd "$(dirname "$0")" && pwd)"
check_python
DEVICE="$(resolve_device "$DEVICE")"
if [ "$DEVICE" = gpu ]; then                # one GPU, fp16 (train.sh adds --fp16 on GPUs)
  : "${TRAIN_PAIRS:=500000}" "${VALID_PAIRS:=500}" "${TEST_PAIRS:=0}" "${VOCAB_SIZE:=8000}"
  : "${SIZE:=small}" "${MAX_UPDATE:=8000}" "${BATCH:=256}" "${LR:=1e-3}" "${WARMUP_UPDATES:=1000}"
  : "${NPROC:=1}"
else
  : "${TRAIN_PAIRS:=10000}" "${VALID_PAIRS:=200}" "${TEST_PAIRS:=500}" "${VOCAB_SIZE:=4000}"
  : "${SIZE:=tiny}" "${MAX_UPDATE:=1500}" "${BATCH:=64}" "${LR:=1e-3}" "${WARMUP_UPDATES:=100}"
  : "${NPROC:=1}"
  if [ -n "${CPU_THREADS:-}" ]; then check_number CPU_THREADS 1; else
    CPU_THREADS="$("$PYTHON" -m fairseq_dnas.recipes.cpu_threads --explain)"
  fi
  export CPU_THREADS
  : "${WORKERS:=$CPU_THREADS}"; export WORKERS  # prepare.sh's encoding processes
fi
for n in TRAIN_PAIRS VALID_PAIRS TEST_PAIRS; do check_number "$n"; done
for n in VOCAB_SIZE MAX_UPDATE BATCH WARMUP_UPDATES; do check_number "$n" 1; done
TESTS="the first $TEST_PAIRS"; [ "$TEST_PAIRS" = 0 ] && TESTS="all"
where="$DEVICE"; [ "$DEVICE" = cpu ] && where="CPU, $CPU_THREADS thread(s)"
say "plan: $ARCH, $SIZE, $MAX_UPDATE updates of $BATCH headlines on $where; $TRAIN_PAIRS training pairs, $TESTS test pairs"
[ "$DRY_RUN" = 1 ] && exit 0
mkdir -p "$WORK_DIR"
DATA="$WORK_DIR/data"
CKPT="$WORK_DIR/checkpoints/$ARCH"
START=$SECONDS

SOURCE="${GIGAWORD_DIR:-download}"
[ "$SOURCE" = download ] && say "GIGAWORD_DIR is not set: downloading the public Gigaword release (about 300 MB); offline, set GIGAWORD_DIR to a local sumdata folder"
say "1/4 prepare ($TRAIN_PAIRS training pairs, $TESTS test pairs) into $DATA"
VOCAB_SIZE="$VOCAB_SIZE" MAX_TRAIN_PAIRS="$TRAIN_PAIRS" MAX_VALID_PAIRS="$VALID_PAIRS" \
  MAX_TEST_PAIRS="$TEST_PAIRS" bash "$HERE/prepare.sh" "$SOURCE" "$DATA"

say "2/4 train a $SIZE $ARCH model for $MAX_UPDATE updates (log: $CKPT/train.log)"
DATA="$DATA/bin" ARCH="$ARCH" SIZE="$SIZE" PRESET=fast SEED=1 DEVICE="$DEVICE" NPROC="$NPROC" \
  BATCH_SENTENCES="$BATCH" MAX_SENTENCES_PER_PROC="$BATCH" MAX_UPDATE="$MAX_UPDATE" LR="$LR" WARMUP_UPDATES="$WARMUP_UPDATES" \
  VALIDATE_INTERVAL_UPDATES="$MAX_UPDATE" EVAL_ROUGE=1 EVAL_ROUGE_SENTENCES="$VALID_PAIRS" \
  LOG_INTERVAL=50 SAVE_DIR="$CKPT" bash "$HERE/train.sh"

say "3/4 generate headlines for $TESTS test articles"
DATA="$DATA" CHECKPOINT="$CKPT/checkpoint_best.pt" OUT_PREFIX="$WORK_DIR/results/$ARCH" \
  LABEL="$ARCH" DEVICE="$DEVICE" bash "$HERE/generate.sh" > /dev/null

say "4/4 ROUGE, next to the lead-8 baseline"
mkdir -p "$WORK_DIR/results"
"$PYTHON" -m fairseq_dnas.commands.lead_baseline --input "$DATA/raw/test.article" --words 8 > "$WORK_DIR/results/lead8.hyp"
"$PYTHON" -m fairseq_dnas.commands.rouge_eval --hyp "$WORK_DIR/results/lead8.hyp" --ref "$DATA/raw/test.title" \
  --label lead-8 --json-out "$WORK_DIR/results/lead8.rouge.json" > /dev/null

echo
echo "=== $SHOW test articles, reference and generated headlines ($ARCH, $SIZE, $MAX_UPDATE updates) ==="
# awk, not head: head would close the pipe early and pipefail turn SIGPIPE into failure.
paste -d '\t' "$DATA/raw/test.article" "$DATA/raw/test.title" "$WORK_DIR/results/$ARCH.hyp" |
  awk -v n="$SHOW" 'NR <= n' |
  while IFS=$'\t' read -r article reference generated; do
    echo "article:   $article"
    echo "reference: $reference"
    echo "generated: $generated"
    echo
  done
echo "=== ROUGE on $TESTS test pairs ($DEVICE budget; not the paper's setting) ==="
"$PYTHON" -m fairseq_dnas.commands.seed_table --order "$ARCH,lead-8" \
  "$WORK_DIR/results/$ARCH.rouge.json" "$WORK_DIR/results/lead8.rouge.json"
echo
say "done in $(( SECONDS - START )) s; outputs under $WORK_DIR"
