#!/usr/bin/env bash
# The paper's protocol (Table 3): several seeds per encoder, each trained,
# decoded on the test set and scored; then mean +- standard error per encoder.
#
#   DATA_DIR=data/gigaword SEEDS="1 2 3 4 5" bash examples/gigaword/run_seeds.sh
#   JOBS=9 SEEDS="1 2 3" bash examples/gigaword/run_seeds.sh   # 9 runs at once
#
# Every train.sh / generate.sh setting (SIZE, PRESET, MAX_UPDATE, DEVICE,
# NPROC, BEAM, ...) passes through from the environment. Time: ARCHS x SEEDS
# training runs (see train.sh); on 2 CPU cores SIZE=small with 3000 updates is
# about 35-45 min per run.
#
# JOBS=N runs N train+decode jobs at once, each logging to
# RESULTS/<arch>/seed<N>.log. On GPUs each job gets one GPU (CUDA_VISIBLE_DEVICES),
# the GPUs of the node taken in turn (GPUS lists them; default: all), so N may
# exceed the GPU count when small runs share a GPU (mind its memory); on CPU
# the cores are split between the jobs (CPU_THREADS each). JOBS=1 (default)
# runs one job at a time, as before, NPROC processes each.
#
# Safe to re-run and to interrupt: runs with a result are skipped, an
# interrupted training resumes from its last checkpoint, and Ctrl-C or a kill
# of this script stops its running jobs. Each job holds a lock
# (RESULTS/<arch>/seed<N>.lock), so two invocations on the same RESULTS never
# train the same run twice: the second waits, then finds the result.
set -euo pipefail

DATA_DIR="${DATA_DIR:-data/gigaword}"       # prepare.sh's OUT_DIR
ARCHS="${ARCHS:-transformer transformer_dnas transformer_hnas}"
SEEDS="${SEEDS:-1 2 3 4 5}"
JOBS="${JOBS:-1}"                           # train+decode jobs at once
GPUS="${GPUS:-}"                            # GPU ids for JOBS > 1 (default: CUDA_VISIBLE_DEVICES, else all)
RESULTS="${RESULTS:-results/gigaword}"      # RESULTS/<arch>/seed<N>.{hyp,rouge.json,log}, RESULTS/table.md
CKPT_ROOT="${CKPT_ROOT:-checkpoints/gigaword}"
CHECKPOINT_NAME="${CHECKPOINT_NAME:-checkpoint_best.pt}"  # best validation ROUGE-1 (or loss with EVAL_ROUGE=0)
LEAD_WORDS="${LEAD_WORDS:-8}"               # add the lead-N baseline (0: no)
RUN_WRAPPER="${RUN_WRAPPER:-}"              # prefix for each job, e.g. "flock /tmp/cpu.lock" or "srun ..."
SIZE="${SIZE:-paper}"; PRESET="${PRESET:-fast}"
export SIZE PRESET

source "$(dirname "$0")/../common.sh"
check_python
HERE="$(cd "$(dirname "$0")" && pwd)"
[ -f "$DATA_DIR/bin/dict.article.txt" ] || die "no prepared data in DATA_DIR=$DATA_DIR (run prepare.sh)"
[ "$JOBS" -ge 1 ] 2>/dev/null || die "JOBS=$JOBS: give a positive number of jobs"
mkdir -p "$RESULTS"

# One run: train (resuming), decode, score, under the run's lock.
run_job() {
  local arch="$1" seed="$2" out="$RESULTS/$1/seed$2"
  local save="$CKPT_ROOT/$arch-$SIZE-$PRESET-seed$seed"
  exec 9> "$out.lock"
  flock 9  # another invocation on this run: wait for it, then see its result
  if [ -f "$out.rouge.json" ]; then say "$arch seed $seed: done already ($out.rouge.json)"; return 0; fi
  say "$arch seed $seed: training into $save"
  $RUN_WRAPPER env DATA="$DATA_DIR/bin" ARCH="$arch" SEED="$seed" SAVE_DIR="$save" \
    bash "$HERE/train.sh"
  say "$arch seed $seed: decoding the test set"
  $RUN_WRAPPER env DATA="$DATA_DIR" CHECKPOINT="$save/$CHECKPOINT_NAME" OUT_PREFIX="$out" LABEL="$arch" \
    bash "$HERE/generate.sh"
}

TODO=()
for seed in $SEEDS; do
  for arch in $ARCHS; do
    mkdir -p "$RESULTS/$arch"
    if [ -f "$RESULTS/$arch/seed$seed.rouge.json" ]; then
      say "$arch seed $seed: done already ($RESULTS/$arch/seed$seed.rouge.json)"
    else
      TODO+=("$arch:$seed")
    fi
  done
done

# JOBS at a time (examples/common.sh); each job's log with JOBS > 1:
log_of() { echo "$RESULTS/$1/seed$2.log"; }
run_jobs run_job log_of ${TODO[@]+"${TODO[@]}"}
[ "$JOBS_FAILED" = 0 ] || die "$JOBS_FAILED of ${#TODO[@]} jobs failed (see their logs under $RESULTS); re-run to retry them"

if [ "$LEAD_WORDS" -gt 0 ]; then
  mkdir -p "$RESULTS/lead$LEAD_WORDS"
  "$PYTHON" -m fairseq_dnas.commands.lead_baseline --input "$DATA_DIR/raw/test.article" --words "$LEAD_WORDS" \
    > "$RESULTS/lead$LEAD_WORDS/lead.hyp.tmp"
  mv "$RESULTS/lead$LEAD_WORDS/lead.hyp.tmp" "$RESULTS/lead$LEAD_WORDS/lead.hyp"
  "$PYTHON" -m fairseq_dnas.commands.rouge_eval --hyp "$RESULTS/lead$LEAD_WORDS/lead.hyp" \
    --ref "$DATA_DIR/raw/test.title" --label "lead-$LEAD_WORDS" \
    --json-out "$RESULTS/lead$LEAD_WORDS/lead.rouge.json" > /dev/null
fi

"$PYTHON" -m fairseq_dnas.commands.seed_table --order "${ARCHS// /,}" "$RESULTS"/*/*.rouge.json > "$RESULTS/table.md.tmp"
mv "$RESULTS/table.md.tmp" "$RESULTS/table.md"
cat "$RESULTS/table.md"
