#!/usr/bin/env bash
# The one prepared command for a GPU machine (H100/H200; Python 3.12 with
# CUDA torch and Triton). Every step runs under its own timeout, writes its
# own log under OUT, and a failed or cut step does not stop the others.
#
# First, under a deadline of its own (FIRST_S, 300 s: what a short GPU run
# must bring back):
#
#   kernels    gpu_lean.py --no-exact           the lean and long kernels alone against SDPA, fp16, head size
#                                               64, dropout 0, T 512-4,096: ms, TFLOP/s, x SDPA (kernels/lean.json)
#   tiles      triton_tiles.py --lean           the lean kernels' candidate tiles, warps and stages timed
#                                               (tiles.json)
#   model      bench_update.py --device cuda    one training update, fp16: bart_dnas_large / bart_hnas_large
#                                               against bart_large at 512, 1,024, 2,048 source tokens, and
#                                               roberta_dnas_base / roberta_hnas_base against roberta_base at
#                                               512; ratio and attention's share (model.json)
#
# Then the rest, each with its own timeout (STEPS= picks some, in this order):
#
#   exact      gpu_quick.py --parts exact       every kernel configuration `auto` runs, against float64
#   lean       gpu_lean.py                      the lean kernels exact on the GPU and timed in every
#                                               configuration (lean/lean.json: the table selection.LEAN_CHOSEN
#                                               reads; `gpu_lean.py --render lean.log --out DIR` rebuilds it)
#   breakdown  gpu_quick.py --parts breakdown   each kernel's GPU time in one forward + backward at T 1,024
#   short      gpu_quick.py --parts kernels     the kernels alone against SDPA at T 64, 128 and 1,024
#   module     gpu_quick.py --parts module      the module against fairseq's, fp16/bf16, dropout 0/0.1
#   tests      pytest on the GPU                the Triton tests (TESTS)
#   benchmark  benchmark.py --device cuda       module, whole-model (Gigaword sizes), generation, both kernel
#                                               sets at T 64-4,096 (benchmark.json, benchmark.md)
#   mask       gpu_dropout_mask.py              the GPU's dropout mask against Triton's interpreter
#   train      gpu_train_fp16.sh                fairseq-train --fp16 at the Gigaword paper size (needs
#                                               TRAIN_DATA, examples/gigaword/prepare.sh's OUT_DIR/bin;
#                                               skipped without it)
#
# Python: with a folder of wheels (WHEELS, default .whl) the script installs
# them into SITE first, for a machine that reaches no package registry; the
# wheels (Python 3.12, x86-64), once, on a machine that reaches one, in the
# repository root (.whl/ in .git/info/exclude):
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl ve-fairseq==0.12.3 hydra-core==1.3.8 omegaconf==2.3.0 bitarray
#   python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
# Without the folder, PYTHON must import fairseq already (after scripts/install.sh: PYTHON=.venv/bin/python).
#
#   OUT=/path/to/results bash benchmarks/gpu_session.sh
#   STEPS=kernels,tiles,model OUT=/path/to/results bash benchmarks/gpu_session.sh   # the first 5 minutes only
#   bash benchmarks/gpu_session.sh --dry-run     # the plan, on any machine (PYTHON with torch and fairseq)
#
# It stops with one line, writing nothing, when a wheel is missing or torch
# sees no GPU. OUT gets session.log (this script's output: GPU, driver,
# torch, Triton, CUDA and fairseq versions, each step's exit and seconds,
# summaries), versions.json, one log per step and the steps' JSON. Exit 0
# when every step ran, 1 otherwise. Safe to re-run: every output is rewritten.
set -euo pipefail

OUT="${OUT:-gpu-session}"                  # where the logs go (a folder you name)
PYTHON="${PYTHON:-python3}"                # the GPU machine's Python with CUDA torch and Triton
WHEELS="${WHEELS:-.whl}"                   # the wheels copied with the repository (relative to its root)
SITE="${SITE:-/tmp/site}"                  # where they are installed
STEPS="${STEPS:-kernels,tiles,model,exact,lean,breakdown,short,module,tests,benchmark,mask,train}"
FIRST_S="${FIRST_S:-300}"                  # the deadline of the first steps (kernels, tiles, model) together
T_KERNELS="${T_KERNELS:-80}"               # seconds each step may take (a first step also ends at FIRST_S)
T_TILES="${T_TILES:-70}"
T_MODEL="${T_MODEL:-150}"
T_EXACT="${T_EXACT:-90}"
T_LEAN="${T_LEAN:-190}"                    # (gpu_lean.py stops starting configurations 40 s before it)
T_BREAKDOWN="${T_BREAKDOWN:-45}"
T_SHORT="${T_SHORT:-80}"
T_MODULE="${T_MODULE:-130}"
T_TESTS="${T_TESTS:-600}"
T_BENCHMARK="${T_BENCHMARK:-600}"
T_MASK="${T_MASK:-120}"
T_TRAIN="${T_TRAIN:-600}"
BREAKDOWN_STEPS="${BREAKDOWN_STEPS:-20}"   # profiled steps a case
MODEL_ARGS="${MODEL_ARGS:---src-lens 1024,2048,512 --rounds 8 --warmup 2 --profile-steps 2}"  # bench_update.py: the targets first
TESTS="${TESTS:-tests/test_triton.py tests/test_triton_short.py tests/test_lean.py tests/test_kernels.py}"
TRAIN_DATA="${TRAIN_DATA:-data/gigaword/bin}"
# the wheels a machine without a registry lacks (file-name patterns)
NEEDED_WHEELS="ve_fairseq-0.12.3-* hydra_core-* omegaconf-* antlr4_python3_runtime-* bitarray-*"

cd "$(dirname "$0")/.."
ROOT="$PWD"
DRY_RUN=0
case "${1:-}" in
  "") ;;
  --dry-run) DRY_RUN=1 ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_session.sh: unknown argument '$1' (only --dry-run or --help)" >&2; exit 2 ;;
esac

ALL_STEPS=(kernels tiles model exact lean breakdown short module tests benchmark mask train)
FIRST=" kernels tiles model "
for step in ${STEPS//,/ }; do
  if [[ " ${ALL_STEPS[*]} " != *" $step "* ]]; then
    echo "gpu_session.sh: unknown step '$step' in STEPS=$STEPS (choose from ${ALL_STEPS[*]})" >&2
    exit 2
  fi
done
CHOSEN=()
for step in "${ALL_STEPS[@]}"; do [[ ",$STEPS," == *",$step,"* ]] && CHOSEN+=("$step"); done

step_timeout() {
  local name="T_${1^^}"
  echo "${!name}"
}
# One line a step; the flags of a step are easy to change here. $2: the step's time limit (a first step's
# limit shrinks to what is left of FIRST_S), from which its own deadline is set.
within() { local s=$(( $1 - $2 )); [ "$s" -ge 1 ] && echo "$s" || echo 1; }
step_command() {
  local limit="${2:-$(step_timeout "$1")}"
  case "$1" in
    kernels) echo "$PYTHON benchmarks/gpu_lean.py --no-exact --dtypes float16 --heads 64 --dropouts 0 --lengths 512,1024,2048,4096 --budget-s $(within "$limit" 20) --out $OUT/kernels" ;;
    tiles) echo "$PYTHON benchmarks/triton_tiles.py --lean --json $OUT/tiles.json --deadline-s $(within "$limit" 10)" ;;
    model) echo "$PYTHON benchmarks/bench_update.py --device cuda $MODEL_ARGS --deadline-s $(within "$limit" 45) --json $OUT/model.json" ;;
    exact) echo "$PYTHON benchmarks/gpu_quick.py --parts exact" ;;
    lean) echo "$PYTHON benchmarks/gpu_lean.py --budget-s $(within "$limit" 40) --out $OUT/lean" ;;
    breakdown) echo "$PYTHON benchmarks/gpu_quick.py --parts breakdown --breakdown-steps $BREAKDOWN_STEPS" ;;
    short) echo "$PYTHON benchmarks/gpu_quick.py --parts kernels" ;;
    module) echo "$PYTHON benchmarks/gpu_quick.py --parts module" ;;
    tests) echo "$PYTHON -m pytest -q -p no:cacheprovider $TESTS" ;;
    benchmark) echo "$PYTHON benchmarks/benchmark.py --device cuda --sections module,model,generate,kernels --json $OUT/benchmark.json --markdown $OUT/benchmark.md" ;;
    mask) echo "$PYTHON benchmarks/gpu_dropout_mask.py" ;;
    train) echo "env DATA=$TRAIN_DATA OUT_DIR=$OUT/train PYTHON=$PYTHON bash benchmarks/gpu_train_fp16.sh" ;;
  esac
}
for t in "$FIRST_S" "$BREAKDOWN_STEPS" $(for s in "${ALL_STEPS[@]}"; do step_timeout "$s"; done); do
  if ! [[ "$t" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_session.sh: FIRST_S, the T_* timeouts and BREAKDOWN_STEPS take positive integers; got '$t'" >&2
    exit 2
  fi
done
for s in KERNELS:20 TILES:10 MODEL:45 LEAN:40; do
  name="T_${s%%:*}"
  if [ "${!name}" -le "${s#*:}" ]; then
    echo "gpu_session.sh: $name must be more than ${s#*:} s (the step stops starting work that long before it); got ${!name}" >&2
    exit 2
  fi
done

if [ "$DRY_RUN" = 1 ]; then
  first=0 total=0
  echo "plan (OUT=$OUT; wheels from $WHEELS installed into $SITE when that folder is there):"
  for step in "${CHOSEN[@]}"; do
    limit=$(step_timeout "$step")
    total=$(( total + limit ))
    if [[ "$FIRST" == *" $step "* ]]; then
      first=$(( first + limit ))
      echo "step $step: timeout $limit s (first, by $FIRST_S s): $(step_command "$step") > $OUT/$step.log"
    else
      echo "step $step: timeout $limit s: $(step_command "$step") > $OUT/$step.log"
    fi
  done
  echo "first steps: timeouts $first s, deadline $FIRST_S s; timeouts in all: $total s"
  if [[ " ${CHOSEN[*]} " == *" model "* ]]; then
    echo "model's cases:"
    PYTHONPATH="$ROOT:$ROOT/benchmarks${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" benchmarks/bench_update.py --dry-run \
      --device cuda $MODEL_ARGS
  fi
  parts=()
  for step in exact breakdown short module; do
    [[ " ${CHOSEN[*]} " == *" $step "* ]] && parts+=("$([ "$step" = short ] && echo kernels || echo "$step")")
  done
  if [ "${#parts[@]}" -gt 0 ]; then
    echo "gpu_quick.py's parts:"
    parts_csv=$(IFS=,; echo "${parts[*]}")
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" benchmarks/gpu_quick.py --dry-run \
      --parts "$parts_csv" --breakdown-steps "$BREAKDOWN_STEPS"
  fi
  exit 0
fi

# The checks, before anything is written: the wheels (or a Python that has fairseq), then the GPU.
INSTALL=0
if [ -d "$WHEELS" ]; then
  INSTALL=1
  for pattern in $NEEDED_WHEELS; do
    if ! compgen -G "$WHEELS/$pattern.whl" >/dev/null; then
      echo "gpu_session.sh: no wheel $pattern.whl in $WHEELS; fetch it as this script's header says and copy $WHEELS with the repository" >&2
      exit 1
    fi
  done
elif ! "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('fairseq') is None)" >/dev/null 2>&1; then
  echo "gpu_session.sh: no wheel folder $WHEELS and $PYTHON has no fairseq; put the wheels there (see this script's header) or run scripts/install.sh and set PYTHON=.venv/bin/python" >&2
  exit 1
fi
"$PYTHON" - <<'PY'
import sys
try:
    import torch
except ImportError as err:
    sys.exit(f"gpu_session.sh: torch does not import ({err}); run it on the GPU machine's Python")
if not torch.cuda.is_available():
    sys.exit("gpu_session.sh: torch sees no CUDA device; run it on a GPU machine")
PY

# Everything below goes to the console and to session.log. (Called in a
# pipeline, the function runs without set -e: each step's status is checked.)
session() {
  local T0 FIRST_END step limit left rc failed=()
  T0=$(date +%s)
  say() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }
  if [ "$INSTALL" = 1 ]; then
    say "installing the wheels from $WHEELS into $SITE"
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl >"$OUT/pip.tmp" 2>&1; then
      tail -5 "$OUT/pip.tmp"; rm -f "$OUT/pip.tmp"
      echo "gpu_session.sh: the wheels in $WHEELS do not install (above)"
      return 1
    fi
    rm -f "$OUT/pip.tmp"
    export PYTHONPATH="$SITE:$ROOT:$ROOT/benchmarks" PATH="$SITE/bin:$PATH"
  else
    export PYTHONPATH="$ROOT:$ROOT/benchmarks"
  fi
  export PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  if ! "$PYTHON" - "$OUT/versions.json" <<'PY'
import json, subprocess, sys, time
import fairseq, torch, triton
v = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
     "cuda": torch.version.cuda, "fairseq": fairseq.__version__, "python": sys.version.split()[0],
     "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
try:
    v["tree"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    v["tree"] = None
print(" ".join(f"{k} {v[k]}" for k in v))
with open(sys.argv[1], "w") as f:
    json.dump(v, f, indent=1)
PY
  then
    echo "gpu_session.sh: torch, triton or fairseq does not import (above)"
    return 1
  fi

  FIRST_END=$(( T0 + FIRST_S ))
  for step in "${CHOSEN[@]}"; do
    limit=$(step_timeout "$step")
    if [[ "$FIRST" == *" $step "* ]]; then  # a first step also ends at the first steps' deadline
      left=$(( FIRST_END - $(date +%s) ))
      if [ "$left" -le 0 ]; then
        say "$step: not started (the first steps' deadline of $FIRST_S s has passed)"
        failed+=("$step")
        continue
      fi
      [ "$left" -lt "$limit" ] && limit=$left
    fi
    if [ "$step" = train ] && [ ! -d "$TRAIN_DATA" ]; then
      say "train: skipped (no TRAIN_DATA folder $TRAIN_DATA: examples/gigaword/prepare.sh's OUT_DIR/bin)"
      continue
    fi
    say "$step (timeout $limit s): $(step_command "$step" "$limit")"
    rc=0
    # shellcheck disable=SC2046  # the command is words by design
    timeout "$limit" $(step_command "$step" "$limit") >"$OUT/$step.log" 2>&1 || rc=$?
    if [ "$rc" -eq 124 ]; then
      say "$step: cut at its timeout of $limit s (the rows printed so far are in $step.log)"
    else
      say "$step: exit $rc"
    fi
    [ "$rc" -eq 0 ] || failed+=("$step")
    case "$step" in
      kernels|lean) grep '^lean: ' "$OUT/$step.log" || true ;;
      model) grep -E "^\| |^target " "$OUT/model.log" || true ;;
      exact) echo "exact: $(grep -c '"ok": true' "$OUT/exact.log") configurations ok," \
                  "$(grep -c '"ok": false' "$OUT/exact.log") not" ;;
      breakdown) grep '(all kernels)' "$OUT/breakdown.log" || true ;;
      short) grep '"part": "kernels done"' "$OUT/short.log" || true ;;
      module) grep '"part": "module done"' "$OUT/module.log" || true ;;
      *) tail -3 "$OUT/$step.log" ;;
    esac
  done
  if [ "${#failed[@]}" -gt 0 ]; then
    say "done; steps that failed or were cut: ${failed[*]}"
    return 1
  fi
  say "done; every step ran"
}

mkdir -p "$OUT"
status=0
session 2>&1 | tee "$OUT/session.log" || status=$?
exit "$status"
