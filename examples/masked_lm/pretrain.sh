#!/usr/bin/env bash
# Pretrain one masked-LM encoder: roberta (UNAS), roberta_dnas or roberta_hnas.
#
#   ARCH=roberta_hnas SIZE=small SEED=1 bash examples/masked_lm/pretrain.sh [fairseq-train flags]
#
# Flags after the script name go to fairseq-train last (they override).
# SIZE=small (4 layers, 256 wide, 4 heads, FFN 1,024, 128 positions) is the
#   CPU size of the README's table; base / large are fairseq's RoBERTa sizes,
#   bert the paper's (24 layers, 1,024 wide, 16 heads = large): GPUs.
# DEVICE=gpu runs on NPROC GPUs of this node (all by default) with fp16.
# Safe to re-run: fairseq resumes from SAVE_DIR/checkpoint_last.pt.
set -euo pipefail

DATA="${DATA:-data/masked_lm/bin/pretrain}"  # prepare.sh's OUT_DIR/bin/pretrain
ARCH="${ARCH:-roberta_hnas}"                 # roberta (UNAS) | roberta_dnas | roberta_hnas
SIZE="${SIZE:-small}"                        # small | base | large | bert
SEED="${SEED:-1}"
SAVE_DIR="${SAVE_DIR:-checkpoints/masked_lm/$ARCH-$SIZE-seed$SEED}"
DEVICE="${DEVICE:-auto}"                     # gpu | cpu | auto
NPROC="${NPROC:-0}"                          # processes (0: every GPU; 1 on CPU)
BATCH_SEQUENCES="${BATCH_SEQUENCES:-32}"     # sequences of TOKENS_PER_SAMPLE per update, all processes
TOKENS_PER_SAMPLE="${TOKENS_PER_SAMPLE:-128}"
BREAK_MODE="${BREAK_MODE:-complete}"         # none | complete | complete_doc | eos
MAX_UPDATE="${MAX_UPDATE:-2000}"
LR="${LR:-5e-4}"
WARMUP_UPDATES="${WARMUP_UPDATES:-$((MAX_UPDATE / 10))}"
LOG_INTERVAL="${LOG_INTERVAL:-50}"
DRY_RUN="${DRY_RUN:-0}"
CPU_THREADS="${CPU_THREADS:-$(nproc 2>/dev/null || echo 1)}"

source "$(dirname "$0")/../common.sh"
check_python
[ -f "$DATA/dict.txt" ] || die "no binarized data in DATA=$DATA (run examples/masked_lm/prepare.sh, then point DATA at OUT_DIR/bin/pretrain)"
case "$ARCH" in roberta|roberta_dnas|roberta_hnas) ;; *) die "ARCH=$ARCH: choose roberta (UNAS baseline), roberta_dnas or roberta_hnas" ;; esac
case "$SIZE" in small|base|large|bert) ;; *) die "SIZE=$SIZE: choose small, base, large or bert" ;; esac
case "$BREAK_MODE" in none|complete|complete_doc|eos) ;; *) die "BREAK_MODE=$BREAK_MODE: choose none, complete, complete_doc or eos" ;; esac
[ "$MAX_UPDATE" -ge 1 ] 2>/dev/null || die "MAX_UPDATE=$MAX_UPDATE: a positive number of updates"
# fairseq's own roberta has base and large; the paper's BERT is large's size.
ARCH_NAME="${ARCH}_$SIZE"
[ "$ARCH_NAME" = roberta_bert ] && ARCH_NAME=roberta_large

# TODO(common.sh): the GPU/CPU launch below is examples/gigaword/train.sh's, for one node.
DEVICE="$(resolve_device "$DEVICE")"
if [ "$NPROC" = 0 ]; then
  if [ "$DEVICE" = gpu ]; then NPROC="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')"; else NPROC=1; fi
fi
[ "$NPROC" -ge 1 ] 2>/dev/null || die "NPROC=$NPROC: no GPU found or not a positive number (DEVICE=cpu trains on CPU)"
[ $((BATCH_SEQUENCES % NPROC)) = 0 ] || die "BATCH_SEQUENCES=$BATCH_SEQUENCES cannot be split evenly over $NPROC processes"
PER_PROC=$((BATCH_SEQUENCES / NPROC))

FAIRSEQ="$REPO/scripts/run_fairseq.py"
ARGS=("$DATA" --user-dir "$USER_DIR"
  --task masked_lm --criterion masked_lm --arch "$ARCH_NAME"
  --sample-break-mode "$BREAK_MODE" --tokens-per-sample "$TOKENS_PER_SAMPLE"
  --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-6 --weight-decay 0.01 --clip-norm 0.0
  --lr "$LR" --lr-scheduler polynomial_decay --warmup-updates "$WARMUP_UPDATES" --total-num-update "$MAX_UPDATE"
  --max-update "$MAX_UPDATE" --batch-size "$PER_PROC" --required-batch-size-multiple 1
  --seed "$SEED" --skip-invalid-size-inputs-valid-test
  --validate-interval-updates "$MAX_UPDATE" --validate-interval 1000000
  --save-interval-updates "$MAX_UPDATE" --save-interval 1000000 --no-epoch-checkpoints --keep-interval-updates 1
  --save-dir "$SAVE_DIR" --log-format simple --log-interval "$LOG_INTERVAL")
if [ "$DEVICE" = gpu ]; then
  ARGS+=(--fp16)
  if [ "$NPROC" -gt 1 ]; then
    LAUNCH=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" "$FAIRSEQ" train)
    ARGS+=(--distributed-world-size "$NPROC")
  else
    LAUNCH=("$PYTHON" "$FAIRSEQ" train)
  fi
else
  [ "$NPROC" = 1 ] || die "NPROC=$NPROC on CPU: use NPROC=1 (the CPU's threads are shared by one process)"
  ARGS+=(--cpu)
  export OMP_NUM_THREADS="$CPU_THREADS"
  LAUNCH=("$PYTHON" "$FAIRSEQ" train)
fi
say "$ARCH_NAME (seed $SEED) on $NPROC $DEVICE process(es): $BATCH_SEQUENCES x $TOKENS_PER_SAMPLE tokens per update, $MAX_UPDATE updates"

if [ "$DRY_RUN" = 1 ]; then printf '%q ' "${LAUNCH[@]}" "${ARGS[@]}" "$@"; echo; exit 0; fi
if [ -f "$SAVE_DIR/checkpoint_last.pt" ] && [ -f "$SAVE_DIR/done" ]; then
  say "$SAVE_DIR is done ($SAVE_DIR/done): skipping (delete it to train again)"
  exit 0
fi
export PYTHONUNBUFFERED=1
mkdir -p "$SAVE_DIR"
printf '%q ' "${LAUNCH[@]}" "${ARGS[@]}" "$@" > "$SAVE_DIR/train.cmd"; echo >> "$SAVE_DIR/train.cmd"
say "command: $SAVE_DIR/train.cmd; log: $SAVE_DIR/train.log"
"${LAUNCH[@]}" "${ARGS[@]}" "$@" 2>&1 | tee -a "$SAVE_DIR/train.log"
[ -f "$SAVE_DIR/checkpoint_last.pt" ] || die "training ended without $SAVE_DIR/checkpoint_last.pt (see $SAVE_DIR/train.log)"
touch "$SAVE_DIR/done"
say "done: $SAVE_DIR/checkpoint_last.pt"
