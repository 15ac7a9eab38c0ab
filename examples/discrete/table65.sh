#!/usr/bin/env bash
# The thesis's Table 6.5 (J. Kinley, 2020, Sections 5.2, 5.3 and 6.3) at CPU
# scale: multiview arithmetic (expressions over 0-4 with + and *, value mod 5,
# depths 1-3, infix and prefix views). For each seed in SEEDS it trains
#   infix     a two-stream (soft) classifier on the infix view only,
#   prefix    one on the prefix view only,
#   multiview the multiview two-stream model on both views (two controllers,
#             one model stream; loss CE(infix) + CE(prefix)),
# then scores each view of each model on the test expressions, by depth, and
# writes the table (mean +- standard error over seeds, the thesis's rows
# beside it: examples/discrete/arithmetic_table.py) -> OUT/table.md.
#
#   OUT=/work/exp/table65 bash examples/discrete/table65.sh
#
# Steps, each skipped when done (safe to re-run; an interrupted training run
# resumes from its checkpoint_last.pt):
# 1. OUT/data: examples/discrete/arithmetic.py (N_TRAIN training, N_TEST test
#    expressions, DATA_SEED; SPLIT=iid draws test and training expressions
#    independently, as the thesis does, SPLIT=disjoint keeps test expressions
#    out of training);
# 2. OUT/bin/{infix,prefix}/{input0,label} and OUT/bin/multiview/{input0,
#    input1,label} (links to the first two: input0 infix, input1 prefix), one
#    fixed dictionary of the 9 tokens and labels 0-4 in order. The valid
#    split is the first N_VALID training expressions: a learning monitor in
#    the log (training accuracy), not used to pick a checkpoint;
# 3. OUT/MODEL-seedS: fairseq-train, MAX_UPDATE updates of BATCH expressions;
#    the last checkpoint is the one scored (an unfinished run resumed with
#    other training settings is refused: OUT/MODEL-seedS/settings.txt; a
#    finished one, marked by OUT/MODEL-seedS/trained, is not trained again);
# 4. OUT/MODEL-seedS/predictions.json (examples/discrete/arithmetic_eval.py);
# 5. OUT/table.md.
# The defaults (ARCH_SIZE=thesis with LAYERS=2, 30,000 updates of 32 at a
# constant 1e-3 after 500 warm-up updates) are set by the learnability probes
# of docs/results/2026-11-27-cpu-table65-learnability.md: the loss sits on a
# plateau at the majority answer for about 8,000 updates, then depth 1 is
# learned (95% at depth 1 after 17,500 updates in the probe); the 2,500
# updates used before 2026-11-27 ended inside the plateau. PARAM_INIT=pytorch
# (the models' --param-init): fairseq's N(0, 0.02) initialisation, made for
# 768-wide models, lengthens that plateau at 64 wide. CPU: about 25
# minutes per single-view run and twice that per multiview run on a quiet
# core, about 5 hours for the 9 runs (several times that on a busy one).
set -euo pipefail

OUT="${OUT:-checkpoints/discrete/table65}"
N_TRAIN="${N_TRAIN:-30000}"            # the thesis's 30,000
N_TEST="${N_TEST:-3000}"               # the thesis's 3,000
N_VALID="${N_VALID:-500}"              # monitor: the first N_VALID training expressions
DATA_SEED="${DATA_SEED:-1}"
SPLIT="${SPLIT:-iid}"                  # iid (the thesis's reading: test lines may be training lines) | disjoint
MODELS="${MODELS:-infix prefix multiview}"
SEEDS="${SEEDS:-1 2 3}"
ARCH_SIZE="${ARCH_SIZE:-thesis}"       # thesis (6 layers, 64 wide, FFN 128, 4 heads) | small | base
LAYERS="${LAYERS:-2}"                  # overrides the size's layers (0: keep the size's)
MAX_UPDATE="${MAX_UPDATE:-30000}"     # the plateau lasts ~8,000 updates (see above)
BATCH="${BATCH:-32}"
LR="${LR:-1e-3}"
PARAM_INIT="${PARAM_INIT:-pytorch}"    # pytorch: PyTorch's own init of Linear/Embedding | bert: fairseq's N(0, 0.02)
DROPOUT="${DROPOUT:-0}"                # dropout and attention dropout (the data are noiseless)
WARMUP="${WARMUP:-500}"
SCHEDULE="${SCHEDULE:-fixed}"          # fixed: constant LR after warm-up | polynomial_decay: linear decay to 0 at MAX_UPDATE
LOG_INTERVAL="${LOG_INTERVAL:-100}"
VALIDATE_INTERVAL="${VALIDATE_INTERVAL:-1000}"
export DEVICE="${DEVICE:-cpu}"

HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../common.sh"
for n in N_TRAIN N_TEST N_VALID MAX_UPDATE BATCH WARMUP LOG_INTERVAL VALIDATE_INTERVAL; do check_number "$n" 1; done
check_number DATA_SEED
check_number LAYERS
check_choice ARCH_SIZE thesis small base
check_choice SPLIT iid disjoint
check_choice SCHEDULE fixed polynomial_decay
check_choice PARAM_INIT pytorch bert
[ "$N_VALID" -le "$N_TRAIN" ] || die "N_VALID=$N_VALID: at most N_TRAIN=$N_TRAIN (the monitor is a part of the training set)"
[[ "$LR" =~ ^[0-9.]+(e-?[0-9]+)?$ ]] || die "LR=$LR: give a positive number (e.g. 1e-3)"
[[ "$DROPOUT" =~ ^(0(\.[0-9]+)?|1(\.0*)?)$ ]] || die "DROPOUT=$DROPOUT: give a number from 0 to 1 (e.g. 0.1)"
for m in $MODELS; do MODEL="$m" check_choice MODEL infix prefix multiview; done
for s in $SEEDS; do SEED="$s" check_number SEED; done
[ -n "${MODELS// /}" ] || die "MODELS is empty: choose from infix prefix multiview"
[ -n "${SEEDS// /}" ] || die "SEEDS is empty: give seeds, e.g. SEEDS='1 2 3'"
check_python
mkdir -p "$OUT"
check_settings_file "$OUT" "N_TRAIN=$N_TRAIN N_TEST=$N_TEST N_VALID=$N_VALID DATA_SEED=$DATA_SEED SPLIT=$SPLIT"

# 1. the expressions
DATA="$OUT/data"
if [ ! -s "$DATA/test.depth" ]; then
  say "1/5 generating $N_TRAIN training and $N_TEST test expressions (seed $DATA_SEED, split $SPLIT)"
  "$PYTHON" "$HERE/arithmetic.py" "$DATA" --train "$N_TRAIN" --test "$N_TEST" --seed "$DATA_SEED" --split "$SPLIT" || exit 1
fi

# 2. text files per view and split, then fairseq's binary files
BIN="$OUT/bin"
if [ ! -s "$BIN/multiview/label/test.idx" ]; then
  say "2/5 binarizing the views (train, valid = first $N_VALID training expressions, test)"
  TEXT="$OUT/text"
  rm -rf "$TEXT" "$BIN.tmp"
  mkdir -p "$TEXT" "$BIN.tmp"
  for view in infix prefix; do
    tail -n +2 "$DATA/train.$view.tsv" | cut -f1 > "$TEXT/train.$view"
    tail -n +2 "$DATA/test.$view.tsv" | cut -f1 > "$TEXT/test.$view"
    head -n "$N_VALID" "$TEXT/train.$view" > "$TEXT/valid.$view"
  done
  tail -n +2 "$DATA/train.infix.tsv" | cut -f2 > "$TEXT/train.label"
  tail -n +2 "$DATA/test.infix.tsv" | cut -f2 > "$TEXT/test.label"
  head -n "$N_VALID" "$TEXT/train.label" > "$TEXT/valid.label"
  # Fixed dictionaries (fairseq's "symbol count" lines): the same ids in every
  # view, and class k is the value k.
  printf '%s 1\n' 0 1 2 3 4 + '*' '(' ')' > "$TEXT/dict.tokens.txt"
  printf '%s 1\n' 0 1 2 3 4 > "$TEXT/dict.label.txt"
  : > "$TEXT/preprocess.log"
  for part in infix prefix label; do
    dict="$TEXT/dict.tokens.txt"; dest="$BIN.tmp/$part/input0"
    [ "$part" = label ] && { dict="$TEXT/dict.label.txt"; dest="$BIN.tmp/infix/label"; }
    run_fairseq_preprocess "$TEXT/preprocess.log" "$dest" --only-source --srcdict "$dict" --workers 1 \
      --trainpref "$TEXT/train.$part" --validpref "$TEXT/valid.$part" --testpref "$TEXT/test.$part" \
      || { tail -5 "$TEXT/preprocess.log" >&2; die "fairseq-preprocess failed (log: $TEXT/preprocess.log)"; }
  done
  ln -s ../infix/label "$BIN.tmp/prefix/label"
  mkdir -p "$BIN.tmp/multiview"
  ln -s ../infix/input0 "$BIN.tmp/multiview/input0"
  ln -s ../prefix/input0 "$BIN.tmp/multiview/input1"
  ln -s ../infix/label "$BIN.tmp/multiview/label"
  rm -rf "$BIN" && mv "$BIN.tmp" "$BIN"
fi

# 3.-4. training and predictions, one run per model and seed
SIZE_ARGS=()
DECAY_ARGS=()
[ "$SCHEDULE" = polynomial_decay ] && DECAY_ARGS=(--total-num-update "$MAX_UPDATE")
[ "$LAYERS" != 0 ] && SIZE_ARGS=(--encoder-layers "$LAYERS")
RUNS=()
# Seed by seed (all models of a seed, then the next): an interrupted driver
# leaves whole seeds to tabulate.
for s in $SEEDS; do for m in $MODELS; do RUNS+=("$m:$s"); done; done
n_run=0
for item in "${RUNS[@]}"; do
  model="${item%%:*}" seed="${item#*:}"
  n_run=$((n_run + 1))
  RUN="$OUT/$model-seed$seed"
  if [ -s "$RUN/predictions.json" ]; then
    say "run $n_run/${#RUNS[@]}: $model seed $seed done"
    continue
  fi
  case "$model" in
    multiview) arch="roberta_two_stream_multiview_$ARCH_SIZE" task=sentence_prediction_multiview views=infix,prefix ;;
    *) arch="roberta_two_stream_$ARCH_SIZE" task=sentence_prediction views="$model" ;;
  esac
  arch="${arch%_base}"
  # A run resumed with other settings would mix two schedules: refuse it.
  mkdir -p "$RUN"
  check_settings_file "$RUN" "ARCH=$arch LAYERS=$LAYERS MAX_UPDATE=$MAX_UPDATE BATCH=$BATCH LR=$LR SCHEDULE=$SCHEDULE WARMUP=$WARMUP DROPOUT=$DROPOUT PARAM_INIT=$PARAM_INIT"
  say "3/5 run $n_run/${#RUNS[@]}: $model seed $seed ($arch, $MAX_UPDATE updates of $BATCH)"
  ARGS=("$BIN/$model" --user-dir "$USER_DIR" --arch "$arch" "${SIZE_ARGS[@]}"
    --task "$task" --criterion "$task" --num-classes 5 --init-token 0 --param-init "$PARAM_INIT"
    --dropout "$DROPOUT" --attention-dropout "$DROPOUT" --weight-decay 0.01
    --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-6
    --lr "$LR" --lr-scheduler "$SCHEDULE" --warmup-updates "$WARMUP" "${DECAY_ARGS[@]}"
    --max-update "$MAX_UPDATE" --batch-size "$BATCH" --required-batch-size-multiple 1
    --num-workers 0 --seed "$seed" --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric
    --validate-interval-updates "$VALIDATE_INTERVAL" --validate-interval 1000000
    --save-interval-updates "$VALIDATE_INTERVAL" --save-interval 1000000 --keep-interval-updates 1
    --no-epoch-checkpoints --save-dir "$RUN" --log-format simple --log-interval "$LOG_INTERVAL" --cpu)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
  # RUN/trained marks a finished training: fairseq resumed from a checkpoint
  # at --max-update still takes one more update before it stops.
  if [ -f "$RUN/trained" ]; then
    say "$model seed $seed: trained already ($RUN/trained marks it)"
  else
    run_fairseq_train "$RUN" "$MAX_UPDATE" "$PYTHON" -m fairseq_dnas.recipes.run_fairseq train "${ARGS[@]}"
    date -u +%FT%TZ > "$RUN/trained"
  fi
  say "4/5 predictions of $model seed $seed on the $N_TEST test expressions"
  "$PYTHON" "$HERE/arithmetic_eval.py" "$RUN/checkpoint_last.pt" --data "$BIN/$model" --views "$views" \
    --out "$RUN/predictions.json" || exit 1
done

say "5/5 the table"
"$PYTHON" "$HERE/arithmetic_table.py" "$OUT" --out "$OUT/table.md"
