#!/usr/bin/env bash
# Train one translation model: UNAS, DNAS or HNAS encoder, UNAS decoder, with
# validation BLEU (fairseq's --eval-bleu) and the best checkpoint by BLEU.
#
#   DATA=data/multi30k/bin ARCH=transformer_hnas SEED=1 bash examples/translation/train.sh [fairseq-train flags]
#
# Flags after the script name go to fairseq-train last (they override these).
# SIZE=small (default): 3 encoder + 3 decoder layers, width 256, 4 heads, FFN
# 1024, all embeddings shared (7.6M parameters with an 8k joint vocabulary;
# SIZE=tiny 1.9M).
# Multi30k's 29k short caption pairs are little data for fairseq's base model
# (6 + 6 layers, width 512); small-data recipes commonly use 3-6 layers of
# width 256-512 (not compared here), and 3 x 256 keeps a CPU run affordable.
# SIZE=tiny (2 + 2, width 128) is for smoke tests and the CPU table; SIZE=mini
# (2 + 2, width 64, FFN 256: the thesis's classification width) for the
# CPU-scale tables of the discrete models (examples/discrete/table62.sh).
# Hardware and time, measured with one thread per run and two runs sharing
# 2 CPU cores: about 1.2 s (SIZE=small) and 0.8 s
# (SIZE=tiny) per update of 2,048 tokens, UNAS and HNAS alike; slower when
# the machine is busier. GPUs: NPROC of them, the effective batch stays
# BATCH_TOKENS (not timed here; NPROC > 1 runs under torchrun).
# Safe to re-run: fairseq resumes from SAVE_DIR/checkpoint_last.pt.
set -euo pipefail

DATA="${DATA:-data/multi30k/bin}"           # prepare.sh's OUT_DIR/bin
ARCH="${ARCH:-transformer_hnas}"            # transformer (UNAS baseline) | transformer_dnas | transformer_hnas | transformer_discrete_single | transformer_discrete | transformer_two_stream
SRC="${SRC:-de}"
TGT="${TGT:-en}"
SEED="${SEED:-1}"
SIZE="${SIZE:-small}"                       # small (3+3 layers, 256) | tiny (2+2, 128) | mini (2+2, 64)
DROPOUT="${DROPOUT:-0.3}"                   # 0.3 for long runs on 29k pairs; short CPU runs learn faster with 0.1
MAX_UPDATE="${MAX_UPDATE:-20000}"
LR="${LR:-1e-3}"
WARMUP_UPDATES="${WARMUP_UPDATES:-1000}"
BATCH_TOKENS="${BATCH_TOKENS:-4096}"        # effective target tokens per update, over all processes
MAX_TOKENS_PER_PROC="${MAX_TOKENS_PER_PROC:-4096}"  # per process and step; --update-freq makes up the rest
VALIDATE_INTERVAL_UPDATES="${VALIDATE_INTERVAL_UPDATES:-1000}"  # validation (BLEU) and checkpoint every N updates
EVAL_BLEU_BEAM="${EVAL_BLEU_BEAM:-1}"        # validation decoding (greedy: cheap, ranks checkpoints the same way)
SAVE_DIR="${SAVE_DIR:-checkpoints/translation/$ARCH-$SIZE-seed$SEED}"
DEVICE="${DEVICE:-auto}"                    # gpu | cpu | auto
NPROC="${NPROC:-0}"                         # processes (0: every GPU; 1 on CPU)
CPU_THREADS="${CPU_THREADS:-}"                 # CPU mode: threads shared by the processes (empty: the cores not already busy)
LOG_INTERVAL="${LOG_INTERVAL:-100}"
DRY_RUN="${DRY_RUN:-0}"                     # 1: print the command and stop

source "$(dirname "$0")/../common.sh"
check_python
[ -f "$DATA/dict.$SRC.txt" ] || die "no binarized data in DATA=$DATA (run prepare.sh, then point DATA at OUT_DIR/bin)"

check_choice ARCH "transformer (UNAS baseline)" transformer_dnas transformer_hnas \
  "transformer_discrete_single (discrete, J. Kinley 2020)" "transformer_discrete (discrete two-stream)" \
  "transformer_two_stream (soft two-stream)"
case "$SIZE" in
  small) LAYERS=3; DIM=256; FFN=1024; HEADS=4 ;;
  tiny)  LAYERS=2; DIM=128; FFN=512;  HEADS=4 ;;
  mini)  LAYERS=2; DIM=64;  FFN=256;  HEADS=4 ;;
  *) die "SIZE=$SIZE: choose small, tiny or mini" ;;
esac

check_run_settings  # SEED, DEVICE -> cpu|gpu, NPROC -> a count, WORLD
# Effective batch ~ tokens per process and step x processes x --update-freq.
split_batch BATCH_TOKENS "$BATCH_TOKENS" "$WORLD" "$MAX_TOKENS_PER_PROC" floor
say "$ARCH ($SIZE, seed $SEED) on $WORLD $DEVICE process(es): $PER_PROC tokens x $WORLD x update-freq $UPDATE_FREQ ~ $BATCH_TOKENS per update, $MAX_UPDATE updates"

schedule_args "$VALIDATE_INTERVAL_UPDATES"
ARGS=("$DATA"
  --user-dir "$USER_DIR"
  --task translation --source-lang "$SRC" --target-lang "$TGT"
  --arch "$ARCH" --share-all-embeddings
  --encoder-layers "$LAYERS" --decoder-layers "$LAYERS"
  --encoder-embed-dim "$DIM" --decoder-embed-dim "$DIM"
  --encoder-ffn-embed-dim "$FFN" --decoder-ffn-embed-dim "$FFN"
  --encoder-attention-heads "$HEADS" --decoder-attention-heads "$HEADS"
  --dropout "$DROPOUT"
  --optimizer adam --adam-betas "(0.9, 0.98)" --weight-decay 0.0001
  --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP_UPDATES" --warmup-init-lr 1e-7
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1
  --max-tokens "$PER_PROC" --update-freq "$UPDATE_FREQ"
  --max-update "$MAX_UPDATE"
  --seed "$SEED"
  "${SCHEDULE_ARGS[@]}"  # validate and save every VALIDATE_INTERVAL_UPDATES updates only
  # Validation BLEU: decode, remove SentencePiece, detokenized sacreBLEU.
  --eval-bleu --eval-bleu-remove-bpe sentencepiece
  --eval-bleu-args "{\"beam\": $EVAL_BLEU_BEAM, \"max_len_a\": 1.2, \"max_len_b\": 10}"
  --best-checkpoint-metric bleu --maximize-best-checkpoint-metric
  --save-dir "$SAVE_DIR"
  --log-format simple --log-interval "$LOG_INTERVAL")

# LAUNCH: python or torchrun; LAUNCH_ARGS: --fp16 / --cpu and the process group
# (on CPU: gloo and fairseq's legacy DDP, as in examples/gigaword/train.sh).
fairseq_train_launch
CMD=("${LAUNCH[@]}" "${ARGS[@]}" "${LAUNCH_ARGS[@]}" "$@")

if [ "$DRY_RUN" = 1 ]; then quote_command "${CMD[@]}"; exit 0; fi
# A finished run is not resumed: fairseq would take one more update past
# --max-update and validate and save again.
if [ -f "$SAVE_DIR/done" ]; then say "$SAVE_DIR/done exists: training is finished, skipping"; exit 0; fi
# The whole log goes to SAVE_DIR/train.log; the console shows the progress.
run_fairseq_train "$SAVE_DIR" "$MAX_UPDATE" "${CMD[@]}"
[ -f "$SAVE_DIR/checkpoint_best.pt" ] || die "training ended without $SAVE_DIR/checkpoint_best.pt (see $SAVE_DIR/train.log)"
date -u +%FT%TZ > "$SAVE_DIR/done"
say "done: $SAVE_DIR/checkpoint_best.pt"
