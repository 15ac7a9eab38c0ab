#!/usr/bin/env bash
# The dependency experiment of J. Kinley (2020, Appendix, Figure 4.1), at its
# own sizes: language models on the parenthesis language, their argmax
# receptive fields against the true dependencies (precision and recall;
# the thesis: 0.959 and 0.920).
#
#   OUT=checkpoints/dependencies SEED=1 bash examples/discrete/dependencies.sh [fairseq-train flags]
#   SIZE=quick OUT=/tmp/deps bash examples/discrete/dependencies.sh     # smoke run, about a minute on CPU
#
# Steps, each skipped when done (safe to re-run; an interrupted training
# resumes from its checkpoint_last.pt, fairseq's own restore):
# 1. the language (examples/discrete/parentheses.py: 50,000 / 5,000 / 5,000
#    sequences of 30 words, generator seed DATA_SEED) -> OUT/data/*.{txt,dep};
#    fairseq-preprocess -> OUT/data/bin;
# 2. the single-stream discrete LM (transformer_lm_discrete_single_thesis:
#    4 layers, 64 wide, FFN 256, 2 heads; Gumbel tau 1) with the
#    receptive-field penalty, coefficient PENALTY (0.1) -> OUT/discrete;
# 3. the soft LM for comparison: the same model and criterion with
#    --discrete-sampler soft (softmax attention, fairseq's transformer_lm)
#    -> OUT/soft (SOFT=0 skips it);
# 4. examples/discrete/dependencies_eval.py on the test split ->
#    OUT/result.json (precision, recall, test_perplexity, the soft model's
#    figures, the thesis's) and OUT/figure_4_1.png.
# Extra arguments go to both fairseq-train runs.
# CPU, one thread (OMP_NUM_THREADS=1), 6,000 updates of 64 sequences a
# model. Results, times, and why PENALTY_START matters (the penalty from
# the first update collapses the fields onto </s>): examples/discrete/
# README.md. Several OUTs in one table: examples/discrete/dependencies_table.py.
set -euo pipefail

OUT="${OUT:-checkpoints/dependencies}"
SEED="${SEED:-1}"                       # training seed (fairseq --seed)
SIZE="${SIZE:-full}"                    # full: the thesis's sizes | quick: a smoke run
DATA_SEED="${DATA_SEED:-1}"             # the generator's seed (the data stays when SEED changes)
PENALTY="${PENALTY:-0.1}"               # --receptive-field-penalty (the thesis: 0.1)
PENALTY_START="${PENALTY_START:-0}"     # --receptive-field-penalty-start: the first N updates without the penalty
RF_LAYERS="${RF_LAYERS:-final}"         # --receptive-field-layers: final (the thesis's) | all
SOFT="${SOFT:-1}"                       # 1: also train the soft LM for comparison
LR="${LR:-1e-3}"
WARMUP="${WARMUP:-500}"
DROPOUT="${DROPOUT:-0.1}"
if [ "$SIZE" = quick ]; then
  TRAIN="${TRAIN:-200}"; VALID="${VALID:-20}"; TEST="${TEST:-20}"; LENGTH="${LENGTH:-30}"
  ARCH="${ARCH:-transformer_lm_discrete_single_tiny}"
  BATCH="${BATCH:-32}"; MAX_UPDATE="${MAX_UPDATE:-10}"; INTERVAL="${INTERVAL:-10}"; WARMUP=1
else
  TRAIN="${TRAIN:-50000}"; VALID="${VALID:-5000}"; TEST="${TEST:-5000}"; LENGTH="${LENGTH:-30}"
  ARCH="${ARCH:-transformer_lm_discrete_single_thesis}"
  BATCH="${BATCH:-64}"; MAX_UPDATE="${MAX_UPDATE:-6000}"; INTERVAL="${INTERVAL:-1000}"
fi
LOG_INTERVAL="${LOG_INTERVAL:-100}"
export DEVICE="${DEVICE:-cpu}"
export CPU_THREADS="${CPU_THREADS:-1}"   # one thread: the machine is shared

HERE="$(dirname "$0")"
source "$HERE/../common.sh"
check_choice SIZE full quick
check_choice RF_LAYERS final all
check_choice SOFT 0 1
for n in TRAIN VALID TEST LENGTH BATCH MAX_UPDATE INTERVAL; do check_number "$n" 1; done
check_number DATA_SEED
check_number PENALTY_START
check_python
NPROC=1
check_run_settings
fairseq_train_launch
schedule_args "$INTERVAL"

DATA="$OUT/data"
mkdir -p "$DATA"
check_settings_file "$DATA" "TRAIN=$TRAIN VALID=$VALID TEST=$TEST LENGTH=$LENGTH DATA_SEED=$DATA_SEED"
if [ ! -s "$DATA/bin/test.idx" ]; then
  say "1/4 the parenthesis language ($TRAIN / $VALID / $TEST sequences of $LENGTH words) -> $DATA"
  "$PYTHON" "$HERE/parentheses.py" "$DATA" --train "$TRAIN" --valid "$VALID" --test "$TEST" \
    --length "$LENGTH" --seed "$DATA_SEED"
  binarize "$DATA" --only-source --workers 1 \
    --trainpref "$DATA/train.txt" --validpref "$DATA/valid.txt" --testpref "$DATA/test.txt"
else
  say "1/4 data ready: $DATA"
fi

# train NAME [flags]: one language model into OUT/NAME (resumes from its
# checkpoint_last.pt); OUT/NAME/done marks a finished one, skipped.
train() {
  local name="$1"
  shift
  if [ -f "$OUT/$name/done" ]; then say "$OUT/$name/done exists: training is finished, skipping"; return 0; fi
  local args=(
    "$DATA/bin"
    --user-dir "$USER_DIR"
    --task language_modeling
    --sample-break-mode eos
    --tokens-per-sample $((LENGTH + 2))
    --arch "$ARCH"
    --criterion cross_entropy_rf_penalty
    --receptive-field-penalty "$PENALTY"
    --receptive-field-layers "$RF_LAYERS"
    --receptive-field-penalty-start "$PENALTY_START"
    --dropout "$DROPOUT"
    --optimizer adam
    --adam-betas "(0.9, 0.98)"
    --lr "$LR"
    --lr-scheduler inverse_sqrt
    --warmup-updates "$WARMUP"
    --warmup-init-lr 1e-7
    --batch-size "$BATCH"
    --max-update "$MAX_UPDATE"
    --seed "$SEED"
    --num-workers 0
    --log-format simple
    --log-interval "$LOG_INTERVAL"
    --save-dir "$OUT/$name"
  )
  run_fairseq_train "$OUT/$name" "$MAX_UPDATE" "${LAUNCH[@]}" "${args[@]}" "$@" "${SCHEDULE_ARGS[@]}" \
    "${LAUNCH_ARGS[@]}"
  date -u +%FT%TZ > "$OUT/$name/done"
}

say "2/4 $ARCH, discrete attention, --receptive-field-penalty $PENALTY from update $PENALTY_START ($MAX_UPDATE updates) -> $OUT/discrete"
train discrete "$@"
EVAL=(--discrete "$OUT/discrete/checkpoint_last.pt")
if [ "$SOFT" = 1 ]; then
  say "3/4 the same with softmax attention (--discrete-sampler soft) -> $OUT/soft"
  train soft --discrete-sampler soft "$@"
  EVAL+=(--soft "$OUT/soft/checkpoint_last.pt")
else
  say "3/4 skipped (SOFT=0)"
fi

say "4/4 receptive fields against the true dependencies ($TEST test sequences)"
"$PYTHON" "$HERE/dependencies_eval.py" --data "$DATA" --bin "$DATA/bin" "${EVAL[@]}" \
  --out "$OUT/result.json" --plot "$OUT/figure_4_1.png" > "$OUT/eval.log" 2>&1 \
  || { tail -5 "$OUT/eval.log" >&2; die "dependencies_eval.py failed (log: $OUT/eval.log)"; }
"$PYTHON" - "$OUT/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
line = f"discrete: precision {r['precision']:.3f}, recall {r['recall']:.3f}, test perplexity {r['test_perplexity']:.3f}"
if "soft" in r:
    s = r["soft"]
    line += f"; soft: precision {s['precision']:.3f}, recall {s['recall']:.3f}, test perplexity {s['test_perplexity']:.3f}"
print(line + f" (thesis: precision {r['thesis']['precision']}, recall {r['thesis']['recall']})")
PY
say "done: $OUT/result.json, $OUT/figure_4_1.png"
