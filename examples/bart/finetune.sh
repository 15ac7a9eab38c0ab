#!/usr/bin/env bash
# Fine-tune a pretrained BART for summarization with a softmax (UNAS), DNAS or
# HNAS encoder: fairseq's examples/bart/README.summarization.md command, with
# the plugin's architecture. The decoder stays fairseq's softmax.
#
#   RESTORE=bart.large/model.pt DATA=cnn_dm-bin ARCH=bart_hnas_large \
#     bash examples/bart/finetune.sh [more fairseq-train flags]
#
# RESTORE: the pretrained checkpoint (bart.large/model.pt, bart.base/model.pt,
#   or your own). Every weight loads where it was; the HNAS mixing logits,
#   which a softmax checkpoint lacks, start at HYBRID_INIT (one log line says
#   so). HYBRID_INIT=0.01 starts closest to the pretrained model.
# DATA: prepare_cnndm.sh's OUT_DIR (dict.source.txt, train.source-target.*).
# ARCH: bart_large (fairseq's, UNAS) | bart_dnas_large | bart_hnas_large, and
#   the _base sizes (bart_base, bart_dnas_base, bart_hnas_base) for bart.base.
# Flags after the script name go to fairseq-train last (they override).
# The settings below are fairseq's for CNN/DailyMail on 8 GPUs
# (MAX_TOKENS x UPDATE_FREQ x GPUs tokens per update). Safe to re-run: fairseq
# resumes from SAVE_DIR/checkpoint_last.pt (RESTORE is read only on the first start).
set -euo pipefail

RESTORE="${RESTORE:-}"                      # pretrained model.pt
DATA="${DATA:-cnn_dm-bin}"
ARCH="${ARCH:-bart_hnas_large}"
SAVE_DIR="${SAVE_DIR:-checkpoints/bart/$ARCH}"
HYBRID_INIT="${HYBRID_INIT:-}"              # HNAS only; empty: the architecture's 0.5
SOURCE_LANG="${SOURCE_LANG:-source}"
TARGET_LANG="${TARGET_LANG:-target}"
TOTAL_NUM_UPDATES="${TOTAL_NUM_UPDATES:-20000}"
WARMUP_UPDATES="${WARMUP_UPDATES:-500}"
LR="${LR:-3e-05}"
MAX_TOKENS="${MAX_TOKENS:-2048}"
UPDATE_FREQ="${UPDATE_FREQ:-4}"
SEED="${SEED:-1}"
DEVICE="${DEVICE:-auto}"                    # gpu (fp16, every visible GPU) | cpu | auto
DRY_RUN="${DRY_RUN:-0}"                     # 1: print the command and stop

source "$(dirname "$0")/../common.sh"
check_python
[ -n "$RESTORE" ] || die "set RESTORE to the pretrained checkpoint (e.g. bart.large/model.pt from https://dl.fbaipublicfiles.com/fairseq/models/bart.large.tar.gz)"
[ -s "$RESTORE" ] || die "missing $RESTORE (the pretrained checkpoint; nothing here downloads it)"
[ -s "$DATA/dict.$SOURCE_LANG.txt" ] || die "no binarized data in DATA=$DATA (run examples/bart/prepare_cnndm.sh, then point DATA at its OUT_DIR)"
check_choice ARCH "bart_large (UNAS)" bart_dnas_large bart_hnas_large "bart_base (UNAS)" bart_dnas_base bart_hnas_base \
  "mbart_large (UNAS)" mbart_dnas_large mbart_hnas_large
for n in TOTAL_NUM_UPDATES MAX_TOKENS UPDATE_FREQ SEED; do check_number "$n" 1; done
HNAS_ARGS=()
if [ -n "$HYBRID_INIT" ]; then
  case "$ARCH" in *hnas*) ;; *) die "HYBRID_INIT is for the HNAS architectures; ARCH=$ARCH" ;; esac
  HNAS_ARGS=(--hybrid-init "$HYBRID_INIT")   # fairseq-train checks it lies in (0, 1)
fi
DEVICE="$(resolve_device "$DEVICE")"
if [ "$DEVICE" = gpu ]; then DEVICE_ARGS=(--fp16); else DEVICE_ARGS=(--cpu); fi

CMD=("$PYTHON" -m fairseq_dnas.recipes.run_fairseq train "$DATA" --user-dir "$USER_DIR"
  --restore-file "$RESTORE" --reset-optimizer --reset-dataloader --reset-meters
  --max-tokens "$MAX_TOKENS" --task translation --source-lang "$SOURCE_LANG" --target-lang "$TARGET_LANG"
  --truncate-source --layernorm-embedding --share-all-embeddings --share-decoder-input-output-embed
  --required-batch-size-multiple 1 --arch "$ARCH" "${HNAS_ARGS[@]}"
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1
  --dropout 0.1 --attention-dropout 0.1 --weight-decay 0.01 --optimizer adam --adam-betas "(0.9, 0.999)"
  --adam-eps 1e-08 --clip-norm 0.1 --lr-scheduler polynomial_decay --lr "$LR"
  --total-num-update "$TOTAL_NUM_UPDATES" --max-update "$TOTAL_NUM_UPDATES" --warmup-updates "$WARMUP_UPDATES"
  --update-freq "$UPDATE_FREQ" --skip-invalid-size-inputs-valid-test --find-unused-parameters
  --seed "$SEED" --save-dir "$SAVE_DIR" --log-format simple --log-interval 100
  "${DEVICE_ARGS[@]}" "$@")
if [ "$DRY_RUN" = 1 ]; then quote_command "${CMD[@]}"; exit 0; fi
mkdir -p "$SAVE_DIR"
say "$ARCH from $RESTORE on $DEVICE: $TOTAL_NUM_UPDATES updates, log in $SAVE_DIR/train.log"
set +e
"${CMD[@]}" 2>&1 | tee -a "$SAVE_DIR/train.log" >&2
status="${PIPESTATUS[0]}"
set -e
[ "$status" = 0 ] || exit "$status"  # fairseq's last line (error: ...) says why
say "done: $SAVE_DIR/checkpoint_best.pt"
