#!/usr/bin/env bash
# The paper's protocol (Table 3): several seeds per encoder, each trained,
# decoded on the test set and scored; then mean +- standard error per encoder.
#
#   DATA_DIR=data/gigaword SEEDS="1 2 3 4 5" bash examples/gigaword/run_seeds.sh
#
# Every train.sh / generate.sh setting (SIZE, PRESET, MAX_UPDATE, DEVICE,
# NPROC, BEAM, ...) passes through from the environment. Time: ARCHS x SEEDS
# training runs (see train.sh); on 2 CPU cores SIZE=small with 3000 updates is
# about 35-45 min per run. Safe to re-run: runs with a result are skipped, an
# interrupted training resumes from its last checkpoint.
set -euo pipefail

DATA_DIR="${DATA_DIR:-data/gigaword}"       # prepare.sh's OUT_DIR
ARCHS="${ARCHS:-transformer transformer_dnas transformer_hnas}"
SEEDS="${SEEDS:-1 2 3 4 5}"
RESULTS="${RESULTS:-results/gigaword}"      # RESULTS/<arch>/seed<N>.{hyp,rouge.json}, RESULTS/table.md
CKPT_ROOT="${CKPT_ROOT:-checkpoints/gigaword}"
CHECKPOINT_NAME="${CHECKPOINT_NAME:-checkpoint_best.pt}"  # best validation ROUGE-1 (or loss with EVAL_ROUGE=0)
LEAD_WORDS="${LEAD_WORDS:-8}"               # add the lead-N baseline (0: no)
RUN_WRAPPER="${RUN_WRAPPER:-}"              # prefix for each job, e.g. "flock /tmp/cpu.lock" or "srun ..."
SIZE="${SIZE:-paper}"; PRESET="${PRESET:-fast}"
export SIZE PRESET

source "$(dirname "$0")/common.sh"
check_python
HERE="$(cd "$(dirname "$0")" && pwd)"
[ -f "$DATA_DIR/bin/dict.article.txt" ] || die "no prepared data in DATA_DIR=$DATA_DIR (run prepare.sh)"
mkdir -p "$RESULTS"

for seed in $SEEDS; do
  for arch in $ARCHS; do
    out="$RESULTS/$arch/seed$seed"
    if [ -f "$out.rouge.json" ]; then say "$arch seed $seed: done already ($out.rouge.json)"; continue; fi
    save="$CKPT_ROOT/$arch-$SIZE-$PRESET-seed$seed"
    say "$arch seed $seed: training into $save"
    $RUN_WRAPPER env DATA="$DATA_DIR/bin" ARCH="$arch" SEED="$seed" SAVE_DIR="$save" \
      bash "$HERE/train.sh"
    say "$arch seed $seed: decoding the test set"
    $RUN_WRAPPER env DATA="$DATA_DIR" CHECKPOINT="$save/$CHECKPOINT_NAME" OUT_PREFIX="$out" LABEL="$arch" \
      bash "$HERE/generate.sh"
  done
done

if [ "$LEAD_WORDS" -gt 0 ]; then
  mkdir -p "$RESULTS/lead$LEAD_WORDS"
  "$PYTHON" "$REPO/scripts/lead_baseline.py" --input "$DATA_DIR/raw/test.article" --words "$LEAD_WORDS" \
    > "$RESULTS/lead$LEAD_WORDS/lead.hyp"
  "$PYTHON" "$REPO/scripts/rouge_eval.py" --hyp "$RESULTS/lead$LEAD_WORDS/lead.hyp" \
    --ref "$DATA_DIR/raw/test.title" --label "lead-$LEAD_WORDS" \
    --json-out "$RESULTS/lead$LEAD_WORDS/lead.rouge.json" > /dev/null
fi

"$PYTHON" "$REPO/scripts/seed_table.py" --order "${ARCHS// /,}" "$RESULTS"/*/*.rouge.json > "$RESULTS/table.md.tmp"
mv "$RESULTS/table.md.tmp" "$RESULTS/table.md"
cat "$RESULTS/table.md"
