#!/usr/bin/env bash
# Fine-tune a pretrained encoder on SST-2 or CoLA (fairseq's RoBERTa GLUE recipe:
# --restore-file, --reset-optimizer/-dataloader/-meters, --init-token 0
# --separator-token 2, a 2-class classification head).
#
#   PRETRAINED=checkpoints/masked_lm/roberta_hnas-small-seed1/checkpoint_last.pt \
#     ARCH=roberta_hnas TASK=sst2 SEED=1 bash examples/masked_lm/finetune.sh [fairseq-train flags]
#
# ARCH and SIZE must be those of the pretraining. PRETRAINED=none trains the
# encoder from scratch instead (examples/discrete/classify.sh: any
# sentence<TAB>label set, TASK=tsv, NUM_CLASSES classes, sizes as extra
# fairseq-train flags). The dev split (valid) is scored every
# VALIDATE_INTERVAL updates (default: once, at MAX_UPDATE) and the model with
# the best dev metric so far is kept as SAVE_DIR/checkpoint_best.pt (fairseq's
# >=: of equal scores, the later), the last as checkpoint_last.pt; with
# PATIENCE=N training stops after N validations in a row without a strictly
# better dev metric (fairseq's --patience; its count restarts when an
# interrupted run resumes). Score a checkpoint with
# fairseq_dnas/commands/sentence_classify.py score (accuracy, MCC, bootstrap
# 95% intervals); the test split is never seen here. LR_SCHEDULE:
# polynomial_decay (fairseq's GLUE recipe: warm-up, then linear decay to 0
# at MAX_UPDATE) or constant (warm-up, then LR: fairseq's fixed schedule;
# what early stopping needs, as the LR then does not depend on the cap).
# DEVICE/NPROC as in pretrain.sh. Safe to re-run (a finished run is
# skipped).
set -euo pipefail

TASK="${TASK:-sst2}"                        # sst2 | cola | tsv (any set: accuracy)
DATA="${DATA:-data/masked_lm/bin/$TASK}"     # prepare.sh's OUT_DIR/bin/<task>
PRETRAINED="${PRETRAINED:-}"                 # a masked_lm checkpoint of pretrain.sh, or none (from scratch)
NUM_CLASSES="${NUM_CLASSES:-2}"
ARCH="${ARCH:-roberta_hnas}"                 # roberta | roberta_dnas | roberta_hnas, as pretrained
SIZE="${SIZE:-small}"                        # small | base | large | bert, as pretrained
SEED="${SEED:-1}"
SAVE_DIR="${SAVE_DIR:-checkpoints/masked_lm/$TASK-$ARCH-$SIZE-seed$SEED}"
DEVICE="${DEVICE:-auto}"                     # gpu | cpu | auto
NPROC="${NPROC:-0}"                          # processes (0: every GPU; 1 on CPU)
BATCH_SENTENCES="${BATCH_SENTENCES:-32}"     # sentences per update, all processes
MAX_SENTENCES_PER_PROC="${MAX_SENTENCES_PER_PROC:-32}"
MAX_UPDATE="${MAX_UPDATE:-1000}"
LR="${LR:-1e-4}"
LR_SCHEDULE="${LR_SCHEDULE:-polynomial_decay}"  # polynomial_decay | constant (after warm-up)
WARMUP_UPDATES="${WARMUP_UPDATES:-$((MAX_UPDATE * 6 / 100))}"  # fairseq's GLUE recipe: 6%
VALIDATE_INTERVAL="${VALIDATE_INTERVAL:-$MAX_UPDATE}"  # dev score (and checkpoint) every N updates
PATIENCE="${PATIENCE:-0}"                    # stop after N validations without improvement (0: never)
LOG_INTERVAL="${LOG_INTERVAL:-50}"
CPU_THREADS="${CPU_THREADS:-}"                 # CPU mode: threads shared by the processes (empty: the cores not already busy)
DRY_RUN="${DRY_RUN:-0}"                      # 1: print the command and stop

source "$(dirname "$0")/../common.sh"
check_choice TASK "sst2 (accuracy)" "cola (Matthews correlation)" "tsv (any sentence<TAB>label set: accuracy)"
case "$TASK" in sst2|tsv) METRIC=accuracy; REPORT=() ;; cola) METRIC=mcc; REPORT=(--report-mcc) ;; esac
check_choice ARCH roberta roberta_dnas roberta_hnas roberta_discrete_single roberta_discrete roberta_two_stream
check_choice SIZE small base large bert
check_number MAX_UPDATE 1
check_number VALIDATE_INTERVAL 1
check_number PATIENCE 0
check_number WARMUP_UPDATES 0
check_choice LR_SCHEDULE "polynomial_decay (to 0 at MAX_UPDATE)" "constant (after WARMUP_UPDATES)"
check_number BATCH_SENTENCES 1
check_number NUM_CLASSES 2
[ -n "$PRETRAINED" ] || die "PRETRAINED is not set: give the masked_lm checkpoint of pretrain.sh (SAVE_DIR/checkpoint_last.pt), or none to train from scratch"
if [ "$PRETRAINED" = none ]; then
  RESTORE=()
else
  [ -s "$PRETRAINED" ] || die "PRETRAINED=$PRETRAINED: no such checkpoint (or empty)"
  RESTORE=(--restore-file "$PRETRAINED" --reset-optimizer --reset-dataloader --reset-meters)
fi
[ -f "$DATA/input0/dict.txt" ] && [ -f "$DATA/label/dict.txt" ] \
  || die "no sentence_prediction data in DATA=$DATA (run examples/masked_lm/prepare.sh; DATA=OUT_DIR/bin/$TASK)"
check_python
ARCH_NAME="${ARCH}_$SIZE"
[ "$ARCH_NAME" = roberta_bert ] && ARCH_NAME=roberta_large

check_run_settings  # SEED, DEVICE -> cpu|gpu, NPROC -> a count, WORLD
split_batch BATCH_SENTENCES "$BATCH_SENTENCES" "$WORLD" "$MAX_SENTENCES_PER_PROC" exact

schedule_args "$VALIDATE_INTERVAL"
case "$LR_SCHEDULE" in
  polynomial_decay) LR_ARGS=(--lr-scheduler polynomial_decay --warmup-updates "$WARMUP_UPDATES" --total-num-update "$MAX_UPDATE") ;;
  constant) LR_ARGS=(--lr-scheduler fixed --warmup-updates "$WARMUP_UPDATES") ;;
esac
ARGS=("$DATA" --user-dir "$USER_DIR"
  "${RESTORE[@]}"
  --task sentence_prediction --criterion sentence_prediction --num-classes "$NUM_CLASSES" "${REPORT[@]}"
  --init-token 0 --separator-token 2 --arch "$ARCH_NAME"
  --dropout 0.1 --attention-dropout 0.1 --weight-decay 0.1
  --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-6 --clip-norm 0.0
  --lr "$LR" "${LR_ARGS[@]}"
  --max-update "$MAX_UPDATE" --batch-size "$PER_PROC" --update-freq "$UPDATE_FREQ" --required-batch-size-multiple 1
  --seed "$SEED" --best-checkpoint-metric "$METRIC" --maximize-best-checkpoint-metric --patience "$PATIENCE"
  "${SCHEDULE_ARGS[@]}"
  --save-dir "$SAVE_DIR" --log-format simple --log-interval "$LOG_INTERVAL")

fairseq_train_launch  # LAUNCH: python or torchrun; LAUNCH_ARGS: --fp16 / --cpu, process group
CMD=("${LAUNCH[@]}" "${ARGS[@]}" "${LAUNCH_ARGS[@]}" "$@")
if [ "$DRY_RUN" = 1 ]; then quote_command "${CMD[@]}"; exit 0; fi
if [ -f "$SAVE_DIR/done" ]; then say "$SAVE_DIR/done exists: fine-tuning is finished, skipping"; exit 0; fi
say "$TASK from $PRETRAINED ($ARCH_NAME, seed $SEED): $MAX_UPDATE updates of $BATCH_SENTENCES sentences on $WORLD $DEVICE process(es)"
run_fairseq_train "$SAVE_DIR" "$MAX_UPDATE" "${CMD[@]}"
[ -f "$SAVE_DIR/checkpoint_last.pt" ] || die "fine-tuning ended without $SAVE_DIR/checkpoint_last.pt (see $SAVE_DIR/train.log)"
date -u +%FT%TZ > "$SAVE_DIR/done"
say "done: $SAVE_DIR/checkpoint_best.pt, the best dev $METRIC, and checkpoint_last.pt (score one: python -m fairseq_dnas.commands.sentence_classify score $SAVE_DIR/checkpoint_best.pt TEST.tsv)"
