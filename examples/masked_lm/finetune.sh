#!/usr/bin/env bash
# Fine-tune a pretrained encoder on SST-2 or CoLA (fairseq's RoBERTa GLUE recipe:
# --restore-file, --reset-optimizer/-dataloader/-meters, --init-token 0
# --separator-token 2, a 2-class classification head).
#
#   PRETRAINED=checkpoints/masked_lm/roberta_hnas-small-seed1/checkpoint_last.pt \
#     ARCH=roberta_hnas TASK=sst2 SEED=1 bash examples/masked_lm/finetune.sh [fairseq-train flags]
#
# ARCH and SIZE must be those of the pretraining. The model of the last update
# is kept (SAVE_DIR/checkpoint_last.pt) and scored with
# scripts/sentence_classify.py score; the
# validation split is printed for model selection, the test split is never
# seen. Safe to re-run (a finished run is skipped).
set -euo pipefail

TASK="${TASK:-sst2}"                        # sst2 | cola
DATA="${DATA:-data/masked_lm/bin/$TASK}"     # prepare.sh's OUT_DIR/bin/<task>
PRETRAINED="${PRETRAINED:-}"                 # a masked_lm checkpoint of pretrain.sh
ARCH="${ARCH:-roberta_hnas}"                 # roberta | roberta_dnas | roberta_hnas, as pretrained
SIZE="${SIZE:-small}"                        # small | base | large | bert, as pretrained
SEED="${SEED:-1}"
SAVE_DIR="${SAVE_DIR:-checkpoints/masked_lm/$TASK-$ARCH-$SIZE-seed$SEED}"
DEVICE="${DEVICE:-auto}"
BATCH_SENTENCES="${BATCH_SENTENCES:-32}"
MAX_UPDATE="${MAX_UPDATE:-1000}"
LR="${LR:-1e-4}"
WARMUP_UPDATES="${WARMUP_UPDATES:-$((MAX_UPDATE * 6 / 100))}"  # fairseq's GLUE recipe: 6%
LOG_INTERVAL="${LOG_INTERVAL:-50}"
DRY_RUN="${DRY_RUN:-0}"
CPU_THREADS="${CPU_THREADS:-$(nproc 2>/dev/null || echo 1)}"

source "$(dirname "$0")/../common.sh"
case "$TASK" in sst2) METRIC=accuracy; REPORT=() ;; cola) METRIC=mcc; REPORT=(--report-mcc) ;;
  *) die "TASK=$TASK: choose sst2 or cola" ;; esac
case "$ARCH" in roberta|roberta_dnas|roberta_hnas) ;; *) die "ARCH=$ARCH: choose roberta, roberta_dnas or roberta_hnas (as pretrained)" ;; esac
case "$SIZE" in small|base|large|bert) ;; *) die "SIZE=$SIZE: choose small, base, large or bert (as pretrained)" ;; esac
[ -n "$PRETRAINED" ] || die "PRETRAINED is not set: give the masked_lm checkpoint of pretrain.sh (SAVE_DIR/checkpoint_last.pt)"
[ -s "$PRETRAINED" ] || die "PRETRAINED=$PRETRAINED: no such checkpoint (or empty)"
[ -f "$DATA/input0/dict.txt" ] && [ -f "$DATA/label/dict.txt" ] \
  || die "no sentence_prediction data in DATA=$DATA (run examples/masked_lm/prepare.sh; DATA=OUT_DIR/bin/$TASK)"
[ "$MAX_UPDATE" -ge 1 ] 2>/dev/null || die "MAX_UPDATE=$MAX_UPDATE: a positive number of updates"
ARCH_NAME="${ARCH}_$SIZE"
[ "$ARCH_NAME" = roberta_bert ] && ARCH_NAME=roberta_large

# TODO(common.sh): one process; GPU or CPU as in pretrain.sh.
[ "$DEVICE" = cpu ] || check_python
DEVICE="$(resolve_device "$DEVICE")"
DEVICE_ARGS=(--fp16); [ "$DEVICE" = cpu ] && { DEVICE_ARGS=(--cpu); export OMP_NUM_THREADS="$CPU_THREADS"; }

ARGS=("$DATA" --user-dir "$USER_DIR"
  --restore-file "$PRETRAINED" --reset-optimizer --reset-dataloader --reset-meters
  --task sentence_prediction --criterion sentence_prediction --num-classes 2 "${REPORT[@]}"
  --init-token 0 --separator-token 2 --arch "$ARCH_NAME"
  --dropout 0.1 --attention-dropout 0.1 --weight-decay 0.1
  --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-6 --clip-norm 0.0
  --lr "$LR" --lr-scheduler polynomial_decay --warmup-updates "$WARMUP_UPDATES" --total-num-update "$MAX_UPDATE"
  --max-update "$MAX_UPDATE" --batch-size "$BATCH_SENTENCES" --required-batch-size-multiple 1
  --seed "$SEED" --best-checkpoint-metric "$METRIC" --maximize-best-checkpoint-metric
  --validate-interval-updates "$MAX_UPDATE" --validate-interval 1000000
  --save-interval-updates "$MAX_UPDATE" --save-interval 1000000 --no-epoch-checkpoints --keep-interval-updates 1
  --save-dir "$SAVE_DIR" --log-format simple --log-interval "$LOG_INTERVAL" "${DEVICE_ARGS[@]}")
LAUNCH=("$PYTHON" "$REPO/scripts/run_fairseq.py" train)
if [ "$DRY_RUN" = 1 ]; then printf '%q ' "${LAUNCH[@]}" "${ARGS[@]}" "$@"; echo; exit 0; fi
if [ -f "$SAVE_DIR/done" ]; then say "$SAVE_DIR is done: skipping (delete it to train again)"; exit 0; fi
say "$TASK from $PRETRAINED ($ARCH_NAME, seed $SEED): $MAX_UPDATE updates of $BATCH_SENTENCES sentences on $DEVICE"
export PYTHONUNBUFFERED=1
mkdir -p "$SAVE_DIR"
printf '%q ' "${LAUNCH[@]}" "${ARGS[@]}" "$@" > "$SAVE_DIR/train.cmd"; echo >> "$SAVE_DIR/train.cmd"
say "log: $SAVE_DIR/train.log"
"${LAUNCH[@]}" "${ARGS[@]}" "$@" 2>&1 | tee -a "$SAVE_DIR/train.log"
[ -f "$SAVE_DIR/checkpoint_last.pt" ] || die "fine-tuning ended without $SAVE_DIR/checkpoint_last.pt (see $SAVE_DIR/train.log)"
touch "$SAVE_DIR/done"
say "done: $SAVE_DIR/checkpoint_last.pt (score it: python scripts/sentence_classify.py score $SAVE_DIR/checkpoint_last.pt TEST.tsv)"
