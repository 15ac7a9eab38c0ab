#!/usr/bin/env bash
# Pretrain one masked-LM encoder: roberta (UNAS), roberta_dnas or roberta_hnas.
#
#   ARCH=roberta_hnas SIZE=small SEED=1 bash examples/masked_lm/pretrain.sh [fairseq-train flags]
#
# Flags after the script name go to fairseq-train last (they override).
# SIZE=small (4 layers, 128 wide, 4 heads, FFN 512, 128 positions) is the
#   CPU size of the README's table; base / large are fairseq's RoBERTa sizes,
#   bert the paper's (24 layers, 1,024 wide, 16 heads = large): GPUs.
# DEVICE=gpu runs on NPROC GPUs of this node (all by default) with fp16; the
# effective batch stays BATCH_SEQUENCES (--update-freq makes up the rest).
# The console shows the updates done and the loss; the whole log is
# SAVE_DIR/train.log. Safe to re-run: fairseq resumes from
# SAVE_DIR/checkpoint_last.pt; a finished run (SAVE_DIR/done) is skipped.
set -euo pipefail

DATA="${DATA:-data/masked_lm/bin/pretrain}"  # prepare.sh's OUT_DIR/bin/pretrain
ARCH="${ARCH:-roberta_hnas}"                 # roberta (UNAS) | roberta_dnas | roberta_hnas
SIZE="${SIZE:-small}"                        # small | base | large | bert
SEED="${SEED:-1}"
SAVE_DIR="${SAVE_DIR:-checkpoints/masked_lm/$ARCH-$SIZE-seed$SEED}"
DEVICE="${DEVICE:-auto}"                     # gpu | cpu | auto
NPROC="${NPROC:-0}"                          # processes (0: every GPU; 1 on CPU)
BATCH_SEQUENCES="${BATCH_SEQUENCES:-32}"     # sequences of TOKENS_PER_SAMPLE per update, all processes
MAX_SEQUENCES_PER_PROC="${MAX_SEQUENCES_PER_PROC:-32}"  # per process and step; --update-freq makes up the rest
TOKENS_PER_SAMPLE="${TOKENS_PER_SAMPLE:-128}"
BREAK_MODE="${BREAK_MODE:-complete}"         # none | complete | complete_doc | eos
MAX_UPDATE="${MAX_UPDATE:-2000}"
LR="${LR:-5e-4}"
WARMUP_UPDATES="${WARMUP_UPDATES:-$((MAX_UPDATE / 10))}"
VALIDATE_INTERVAL_UPDATES="${VALIDATE_INTERVAL_UPDATES:-$MAX_UPDATE}"  # validation and checkpoint every N updates
LOG_INTERVAL="${LOG_INTERVAL:-50}"
CPU_THREADS="${CPU_THREADS:-}"                 # CPU mode: threads shared by the processes (empty: the cores not already busy)
DRY_RUN="${DRY_RUN:-0}"                      # 1: print the command and stop

source "$(dirname "$0")/../common.sh"
check_python
[ -f "$DATA/dict.txt" ] || die "no binarized data in DATA=$DATA (run examples/masked_lm/prepare.sh, then point DATA at OUT_DIR/bin/pretrain)"
check_choice ARCH "roberta (UNAS baseline)" roberta_dnas roberta_hnas
check_choice SIZE small base large bert
check_choice BREAK_MODE none complete complete_doc eos
check_number MAX_UPDATE 1
check_number BATCH_SEQUENCES 1
check_number TOKENS_PER_SAMPLE 8
# fairseq's own roberta has base and large; the paper's BERT is large's size.
ARCH_NAME="${ARCH}_$SIZE"
[ "$ARCH_NAME" = roberta_bert ] && ARCH_NAME=roberta_large

check_run_settings  # SEED, DEVICE -> cpu|gpu, NPROC -> a count, WORLD
split_batch BATCH_SEQUENCES "$BATCH_SEQUENCES" "$WORLD" "$MAX_SEQUENCES_PER_PROC" exact
say "$ARCH_NAME (seed $SEED) on $WORLD $DEVICE process(es): $PER_PROC x $WORLD x update-freq $UPDATE_FREQ = $BATCH_SEQUENCES sequences of $TOKENS_PER_SAMPLE tokens per update, $MAX_UPDATE updates"

schedule_args "$VALIDATE_INTERVAL_UPDATES"
ARGS=("$DATA" --user-dir "$USER_DIR"
  --task masked_lm --criterion masked_lm --arch "$ARCH_NAME"
  --sample-break-mode "$BREAK_MODE" --tokens-per-sample "$TOKENS_PER_SAMPLE"
  --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-6 --weight-decay 0.01 --clip-norm 0.0
  --lr "$LR" --lr-scheduler polynomial_decay --warmup-updates "$WARMUP_UPDATES" --total-num-update "$MAX_UPDATE"
  --max-update "$MAX_UPDATE" --batch-size "$PER_PROC" --update-freq "$UPDATE_FREQ" --required-batch-size-multiple 1
  --seed "$SEED" --skip-invalid-size-inputs-valid-test
  "${SCHEDULE_ARGS[@]}"
  --save-dir "$SAVE_DIR" --log-format simple --log-interval "$LOG_INTERVAL")

fairseq_train_launch  # LAUNCH: python or torchrun; LAUNCH_ARGS: --fp16 / --cpu, process group
CMD=("${LAUNCH[@]}" "${ARGS[@]}" "${LAUNCH_ARGS[@]}" "$@")
if [ "$DRY_RUN" = 1 ]; then quote_command "${CMD[@]}"; exit 0; fi
# A finished run is not resumed: fairseq would take one more update past --max-update.
if [ -f "$SAVE_DIR/done" ]; then say "$SAVE_DIR/done exists: pretraining is finished, skipping"; exit 0; fi
run_fairseq_train "$SAVE_DIR" "$MAX_UPDATE" "${CMD[@]}"
[ -f "$SAVE_DIR/checkpoint_last.pt" ] || die "training ended without $SAVE_DIR/checkpoint_last.pt (see $SAVE_DIR/train.log)"
date -u +%FT%TZ > "$SAVE_DIR/done"
say "done: $SAVE_DIR/checkpoint_last.pt ($(grep -o "valid on 'valid' subset | loss [0-9.]* | ppl [0-9.]*" "$SAVE_DIR/train.log" | tail -1))"
