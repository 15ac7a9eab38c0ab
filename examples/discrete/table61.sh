#!/usr/bin/env bash
# The thesis's Table 6.1 (J. Kinley, 2020) at CPU scale: sentence
# classifiers of the thesis's size (6 layers, 64 wide, FFN 128, 4 heads)
# trained from scratch with every encoder in ARCHS and SEEDS seeds, on SST
# (Jain & Wallace's binary split) and 20 Newsgroups hockey vs baseball; for
# each, accuracy and the faithfulness metric (Kendall's tau between the
# attention a position receives and its gradient importance, both importance
# forms, and the gradient's with the attention detached, Jain & Wallace's
# code's form, computed here on each finished run's checkpoint_best.pt) and
# attention's share of the residual stream per layer; then the
# table, mean +- standard error over seeds, with the thesis's accuracies
# beside and the updates each run took (examples/discrete/faithfulness_table.py)
# -> OUT/table.md.
#
#   SST_BINARY_DIR=/path/to/sst-binary NEWS20_DIR=/path/to/20news-hockey-baseball \
#     JOBS=2 bash examples/discrete/table61.sh
#
# Each run is examples/discrete/classify.sh, trained to patience: the dev
# accuracy every <DATASET>_VALIDATE_INTERVAL updates, stop after PATIENCE
# validations without a better one or at <DATASET>_MAX_UPDATE (a cap, not
# a budget), constant LR after warm-up (classify.sh says why), the test set
# scored once at the best dev checkpoint. The same rule for every encoder of
# a dataset; each run's row.json says how many updates it ran and where its
# best dev accuracy was. Its other settings apply (LR, WARMUP_UPDATES, ...).
# Finished runs (row.md) are skipped, so it is safe to re-run; an interrupted
# run resumes from its checkpoint_last.pt. 20 Newsgroups has no dev split:
# DEV_FRACTION of its training posts (shuffled with seed 0) are held out for
# checkpoint selection and early stopping.
set -euo pipefail

SST_BINARY_DIR="${SST_BINARY_DIR:-}"        # train.tsv, dev.tsv, test.tsv
NEWS20_DIR="${NEWS20_DIR:-}"                # train.tsv, test.tsv
OUT="${OUT:-checkpoints/discrete/table61}"
DATASETS="${DATASETS:-sst news20}"
ARCHS="${ARCHS:-roberta roberta_dnas roberta_hnas roberta_discrete_single roberta_discrete roberta_two_stream}"
SEEDS="${SEEDS:-1 2 3}"
PATIENCE="${PATIENCE:-10}"                  # validations without a better dev accuracy, both datasets
SST_VALIDATE_INTERVAL="${SST_VALIDATE_INTERVAL:-100}"      # batch 32: 216 updates an epoch of 6,920 sentences
NEWS20_VALIDATE_INTERVAL="${NEWS20_VALIDATE_INTERVAL:-34}"  # about one epoch of 1,075 posts
SST_MAX_UPDATE="${SST_MAX_UPDATE:-20000}"   # caps (about 92 and 180 epochs)
NEWS20_MAX_UPDATE="${NEWS20_MAX_UPDATE:-6000}"
DEV_FRACTION="${DEV_FRACTION:-0.1}"
JOBS="${JOBS:-1}"

HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../common.sh"
check_number JOBS 1
check_number PATIENCE 0
for n in SST_VALIDATE_INTERVAL NEWS20_VALIDATE_INTERVAL SST_MAX_UPDATE NEWS20_MAX_UPDATE; do check_number "$n" 1; done
check_python
mkdir -p "$OUT"

# files DATASET -> "TRAIN DEV TEST" of that dataset (20 Newsgroups' dev split made once)
files() {
  case "$1" in
    sst)
      [ -d "$SST_BINARY_DIR" ] || die "SST_BINARY_DIR='$SST_BINARY_DIR' is not a folder (Jain & Wallace's SST: train.tsv, dev.tsv, test.tsv)"
      echo "$SST_BINARY_DIR/train.tsv $SST_BINARY_DIR/dev.tsv $SST_BINARY_DIR/test.tsv" ;;
    news20)
      [ -d "$NEWS20_DIR" ] || die "NEWS20_DIR='$NEWS20_DIR' is not a folder (20 Newsgroups hockey vs baseball: train.tsv, test.tsv)"
      local split="$OUT/news20/split"
      if [ ! -s "$split/dev.tsv" ]; then
        mkdir -p "$split"
        "$PYTHON" - "$NEWS20_DIR/train.tsv" "$split" "$DEV_FRACTION" <<'PY'
import os, random, sys
src, out, fraction = sys.argv[1], sys.argv[2], float(sys.argv[3])
lines = open(src, encoding="utf-8").read().splitlines()
header, rows = lines[0], lines[1:]
random.Random(0).shuffle(rows)
n_dev = int(round(fraction * len(rows)))
for name, part in (("train.tsv", rows[n_dev:]), ("dev.tsv", rows[:n_dev])):
    with open(os.path.join(out, name + ".tmp"), "w", encoding="utf-8") as f:
        f.write("\n".join([header] + part) + "\n")
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
PY
      fi
      echo "$split/train.tsv $split/dev.tsv $NEWS20_DIR/test.tsv" ;;
    *) die "DATASETS: unknown '$1' (choose from sst news20)" ;;
  esac
}

max_update() { case "$1" in sst) echo "$SST_MAX_UPDATE" ;; news20) echo "$NEWS20_MAX_UPDATE" ;; esac; }
validate_interval() { case "$1" in sst) echo "$SST_VALIDATE_INTERVAL" ;; news20) echo "$NEWS20_VALIDATE_INTERVAL" ;; esac; }

run_job() {  # NAME=DATASET/ARCH SEED
  local dataset="${1%%/*}" arch="${1#*/}" seed="$2" spec train dev test
  spec="$(files "$dataset")"
  read -r train dev test <<< "$spec"
  TRAIN="$train" DEV="$dev" TEST="$test" OUT="$OUT/$dataset" ARCH="$arch" SEED="$seed" \
    MAX_UPDATE="$(max_update "$dataset")" VALIDATE_INTERVAL="$(validate_interval "$dataset")" PATIENCE="$PATIENCE" \
    bash "$HERE/classify.sh"
}

TODO=()
for dataset in $DATASETS; do
  spec="$(files "$dataset")"  # set -e: a bad folder ends the script here, with files' one line
  read -r train dev test <<< "$spec"
  # The data once per dataset, before runs share it.
  TRAIN="$train" DEV="$dev" TEST="$test" OUT="$OUT/$dataset" PREPARE_ONLY=1 bash "$HERE/classify.sh"
  for arch in $ARCHS; do
    for seed in $SEEDS; do
      [ -s "$OUT/$dataset/$arch-seed$seed/row.md" ] || TODO+=("$dataset/$arch:$seed")
    done
  done
done
say "${#TODO[@]} runs to do, $JOBS at a time"
log_of() { mkdir -p "$OUT/logs"; echo "$OUT/logs/${1//\//-}-seed$2.log"; }
run_jobs run_job log_of ${TODO[@]+"${TODO[@]}"}
[ "$JOBS_FAILED" = 0 ] || die "$JOBS_FAILED of ${#TODO[@]} runs failed (logs in $OUT/logs); re-run to retry them"

# The detached form of the metric (faithfulness.py --detach-attention) on
# every finished run that lacks it: runs finished before the option existed
# get it here, without training again.
for dataset in $DATASETS; do
  spec="$(files "$dataset")"
  read -r train dev test <<< "$spec"
  for arch in $ARCHS; do
    for seed in $SEEDS; do
      run="$OUT/$dataset/$arch-seed$seed"
      [ -s "$run/row.md" ] && [ ! -s "$run/summary-grad-detached.json" ] || continue
      say "$dataset/$arch-seed$seed: tau with the attention detached"
      "$PYTHON" -m fairseq_dnas.commands.faithfulness "$run/checkpoint_best.pt" --test "$test" --importance grad \
        --detach-attention --labels "$arch" --json "$run/faithfulness-grad-detached.jsonl" \
        > "$run/summary-grad-detached.json.tmp" 2> "$run/faithfulness-grad-detached.log" \
        || { tail -3 "$run/faithfulness-grad-detached.log" >&2; die "faithfulness.py failed (log: $run/faithfulness-grad-detached.log)"; }
      mv "$run/summary-grad-detached.json.tmp" "$run/summary-grad-detached.json"
    done
  done
done

"$PYTHON" "$HERE/faithfulness_table.py" --out "$OUT/table.md" \
  $(for d in $DATASETS; do echo "$d=$OUT/$d"; done)
