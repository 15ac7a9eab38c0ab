#!/usr/bin/env bash
# Train one Gigaword headline model: UNAS, DNAS or HNAS encoder, UNAS decoder.
#
#   DATA=data/gigaword/bin ARCH=transformer_hnas SEED=1 bash examples/gigaword/train.sh [fairseq-train flags]
#
# Flags after the script name go to fairseq-train last, so they override the
# preset (e.g. --lr 3e-4). Hardware and time:
#   SIZE=paper (222M parameters; the paper reports ~108M, see README.md): one or more GPUs (NPROC = the GPUs of this
#     node by default); PRESET=paper's 500k updates of 512 sentences took the
#     authors 16 h on 16 TPU v3; not timed on GPUs here.
#   SIZE=small on 2 CPU cores: about 0.7 s (UNAS) to 0.9 s (DNAS/HNAS) per
#     update of 64 sentences; SIZE=tiny about 0.2 s.
# Safe to re-run: fairseq resumes from SAVE_DIR/checkpoint_last.pt.
#
# Multi-node (torchrun): run this script once per node with
#   NNODES=4 NODE_RANK=<0..3> MASTER_ADDR=<first node> MASTER_PORT=29500
# Under SLURM (one task per node):
#   srun --nodes=4 --ntasks-per-node=1 bash -c 'NNODES=$SLURM_NNODES NODE_RANK=$SLURM_NODEID \
#     MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -1) bash examples/gigaword/train.sh'
# The update frequency is recomputed from the total process count, so the
# effective batch stays BATCH_SENTENCES.
set -euo pipefail

DATA="${DATA:-data/gigaword/bin}"           # prepare.sh's OUT_DIR/bin
ARCH="${ARCH:-transformer_hnas}"            # transformer (UNAS baseline) | transformer_dnas | transformer_hnas
SEED="${SEED:-1}"
SIZE="${SIZE:-paper}"                       # paper (12+12 layers, 768) | small (3+3, 256) | tiny (2+2, 128)
PRESET="${PRESET:-fast}"                    # paper (Adam 2e-5, 500k updates) | fast (inverse-sqrt, label smoothing)
SAVE_DIR="${SAVE_DIR:-checkpoints/gigaword/$ARCH-$SIZE-$PRESET-seed$SEED}"
DEVICE="${DEVICE:-auto}"                    # gpu | cpu | auto
NPROC="${NPROC:-0}"                         # processes on this node (0: every GPU; 1 on CPU)
NNODES="${NNODES:-1}"; NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"; MASTER_PORT="${MASTER_PORT:-29500}"  # used when NNODES > 1
BATCH_SENTENCES="${BATCH_SENTENCES:-512}"   # effective batch over all processes (paper: 512)
MAX_SENTENCES_PER_PROC="${MAX_SENTENCES_PER_PROC:-128}"  # per process and step; --update-freq makes up the rest
MAX_UPDATE="${MAX_UPDATE:-}"                # default: 500000 (paper) / 100000 (fast)
LR="${LR:-}"                                # default: 2e-5 (paper) / 5e-4 (fast)
WARMUP_UPDATES="${WARMUP_UPDATES:-}"        # default: 10000 (paper) / 4000 (fast)
VALIDATE_INTERVAL_UPDATES="${VALIDATE_INTERVAL_UPDATES:-5000}"  # validation (and checkpoint) every N updates
EVAL_ROUGE="${EVAL_ROUGE:-1}"               # 1: decode validation pairs and keep the best checkpoint by ROUGE-1
EVAL_ROUGE_SENTENCES="${EVAL_ROUGE_SENTENCES:-2000}"  # validation pairs decoded each time (0: all)
EVAL_ROUGE_BEAM="${EVAL_ROUGE_BEAM:-4}"
LOG_INTERVAL="${LOG_INTERVAL:-100}"
DRY_RUN="${DRY_RUN:-0}"                     # 1: print the command and stop
CPU_THREADS="${CPU_THREADS:-}"                 # CPU mode: threads shared by the processes (empty: the cores not already busy)

source "$(dirname "$0")/../common.sh"
check_python
[ -f "$DATA/dict.article.txt" ] || die "no binarized data in DATA=$DATA (run prepare.sh, then point DATA at OUT_DIR/bin)"

check_choice ARCH "transformer (UNAS baseline)" transformer_dnas transformer_hnas
# Every size starts from the paper's Gigaword preset (shared word-piece
# embeddings, learned positions, GELU, 128/64 positions, HNAS u = 0.1) and
# overrides only the sizes. transformer_gigaword is fairseq's own model.
case "$SIZE" in
  paper) SIZE_ARGS=() ;;
  small) SIZE_ARGS=(--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256
                    --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024
                    --encoder-attention-heads 4 --decoder-attention-heads 4) ;;
  tiny)  SIZE_ARGS=(--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 128
                    --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512
                    --encoder-attention-heads 4 --decoder-attention-heads 4) ;;
  *) die "SIZE=$SIZE: choose paper, small or tiny" ;;
esac

case "$PRESET" in
  paper)
    # Section 6.3 / Appendix D: Adam, learning rate 2e-5, batch 512, 500k steps.
    # Not stated in the paper, taken from the BERT/ALBERT code base it was
    # built on: beta2 0.999, eps 1e-6, weight decay 0.01, 10k linear warmup
    # then linear decay, gradient norm clipped at 1, no label smoothing.
    : "${MAX_UPDATE:=500000}" "${LR:=2e-5}" "${WARMUP_UPDATES:=10000}"
    PRESET_ARGS=(--optimizer adam --adam-betas "(0.9, 0.999)" --adam-eps 1e-6 --weight-decay 0.01
                 --lr "$LR" --lr-scheduler polynomial_decay --warmup-updates "$WARMUP_UPDATES"
                 --total-num-update "$MAX_UPDATE" --end-learning-rate 0
                 --clip-norm 1.0 --criterion cross_entropy) ;;
  fast)
    # fairseq's Transformer recipe, which reaches good ROUGE in far fewer
    # updates than 2e-5: inverse-sqrt schedule with warmup (large steps early,
    # no fixed horizon), beta2 0.98 (steadier with the large early steps),
    # label smoothing 0.1 (regularizes the short, noisy headlines), small
    # weight decay. 100k updates are about 13 epochs of the 3.8M pairs.
    : "${MAX_UPDATE:=100000}" "${LR:=5e-4}" "${WARMUP_UPDATES:=4000}"
    PRESET_ARGS=(--optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-8 --weight-decay 0.0001
                 --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP_UPDATES"
                 --warmup-init-lr 1e-7 --clip-norm 0.0
                 --criterion label_smoothed_cross_entropy --label-smoothing 0.1) ;;
  *) die "PRESET=$PRESET: choose paper or fast" ;;
esac

check_run_settings  # SEED, DEVICE -> cpu|gpu, NPROC -> a count, WORLD
# Effective batch = per-process batch x processes x --update-freq, exactly.
split_batch BATCH_SENTENCES "$BATCH_SENTENCES" "$WORLD" "$MAX_SENTENCES_PER_PROC" exact
say "$ARCH ($SIZE, preset $PRESET, seed $SEED) on $WORLD $DEVICE process(es): $PER_PROC sentences x $WORLD x update-freq $UPDATE_FREQ = $BATCH_SENTENCES per update, $MAX_UPDATE updates"

ARCH_NAME="${ARCH}_gigaword"
ROUGE_ARGS=()
if [ "$EVAL_ROUGE" = 1 ]; then
  ROUGE_ARGS=(--eval-rouge --eval-rouge-remove-bpe sentencepiece
              --eval-rouge-args "{\"beam\": $EVAL_ROUGE_BEAM, \"max_len_a\": 0, \"max_len_b\": 63}"
              --eval-rouge-max-sentences "$EVAL_ROUGE_SENTENCES"
              --best-checkpoint-metric rouge1 --maximize-best-checkpoint-metric)
fi

schedule_args "$VALIDATE_INTERVAL_UPDATES"
ARGS=("$DATA"
  --user-dir "$USER_DIR"
  --task translation_rouge --source-lang article --target-lang title
  --arch "$ARCH_NAME" "${SIZE_ARGS[@]}"
  "${PRESET_ARGS[@]}"
  --max-update "$MAX_UPDATE"
  --batch-size "$PER_PROC" --update-freq "$UPDATE_FREQ"
  --required-batch-size-multiple 1
  --seed "$SEED"
  "${SCHEDULE_ARGS[@]}"  # validate and save every VALIDATE_INTERVAL_UPDATES updates only
  "${ROUGE_ARGS[@]}"
  --save-dir "$SAVE_DIR"
  --log-format simple --log-interval "$LOG_INTERVAL")

# LAUNCH: python or torchrun; LAUNCH_ARGS: --fp16 / --cpu and the process group.
fairseq_train_launch
CMD=("${LAUNCH[@]}" "${ARGS[@]}" "${LAUNCH_ARGS[@]}" "$@")

if [ "$DRY_RUN" = 1 ]; then quote_command "${CMD[@]}"; exit 0; fi
# A finished run is not resumed: fairseq would take one more update past
# --max-update and validate and save again.
if [ -f "$SAVE_DIR/checkpoint_last.pt" ]; then
  DONE_UPDATES="$("$PYTHON" - "$SAVE_DIR/checkpoint_last.pt" <<'PY'
import sys
import fairseq_dnas.plugin  # noqa: F401  (makes fairseq's checkpoints loadable with torch >= 2.6)
from fairseq import checkpoint_utils
from fairseq_dnas.errors import BadFile
from fairseq_dnas.fairseq_patches.file_checks import read_checkpoint
try:
    state = read_checkpoint(checkpoint_utils.load_checkpoint_to_cpu, sys.argv[1])
except BadFile as err:
    sys.exit(f"[train] error: {err} (move it away to restart from an earlier checkpoint)")
print(state["optimizer_history"][-1].get("num_updates", 0))
PY
)"
  if [ "$DONE_UPDATES" -ge "$MAX_UPDATE" ]; then
    say "$SAVE_DIR/checkpoint_last.pt has $DONE_UPDATES updates (MAX_UPDATE=$MAX_UPDATE): training is done, skipping"
    exit 0
  fi
  say "resuming from $SAVE_DIR/checkpoint_last.pt ($DONE_UPDATES of $MAX_UPDATE updates)"
fi
# The whole log goes to SAVE_DIR/train.log; the console shows the progress.
run_fairseq_train "$SAVE_DIR" "$MAX_UPDATE" "${CMD[@]}"
[ -f "$SAVE_DIR/checkpoint_last.pt" ] || die "training ended without $SAVE_DIR/checkpoint_last.pt (see $SAVE_DIR/train.log)"
say "done: $SAVE_DIR/checkpoint_best.pt"
