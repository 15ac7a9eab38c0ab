#!/usr/bin/env bash
# One prepared command for a GPU machine without a package registry (an
# offline one): the quick step, each kernel's GPU time and the masked-LM
# update, each step with its own timeout, at most 8 minutes on an H100 in all
# (the timeouts below add up to 445 s, plus the checks and the wheel
# install). The steps, the most needed first, so that a run cut short still
# has the newest figures:
#
#   exact      gpu_quick.py --parts exact       every kernel configuration `auto` runs, against float64
#   lean       gpu_lean.py                      the lean kernels: exact on the GPU, and timed against the
#                                               long kernels and SDPA (JSON lines in lean.log; `gpu_lean.py
#                                               --render lean.log --out DIR` writes the table
#                                               selection.LEAN_CHOSEN reads); its T_LEAN (190 s) comes on
#                                               top of the 445 s above
#   breakdown  gpu_quick.py --parts breakdown   each kernel's GPU time in one forward + backward of the
#                                               long kernels (DNAS, HNAS) and SDPA at T 1024
#   roberta    bench_roberta.py --device cuda   a masked-LM training update, fp16, roberta_dnas_base and
#                                               roberta_hnas_base against roberta_base, 512 tokens a block
#   kernels    gpu_quick.py --parts kernels     the kernels alone against SDPA at T 64, 128, 1024
#   module     gpu_quick.py --parts module      the module against fairseq's, fp16/bf16, dropout 0/0.1
#
# It checks first that the wheels are there and that torch sees a GPU, and
# stops with one line if not; then installs the wheels into SITE (the GPU
# machine reaches no package registry) and runs the steps. Output under OUT
# (a folder you name), at most 8 files: session.log (this script's
# output: machine, versions, each step's exit and seconds, short summaries),
# exact.log, breakdown.log, kernels.log, module.log (JSON lines of
# gpu_quick.py), roberta.log, roberta.json. Exit 0 when every step ran and
# every configuration was exact, 1 otherwise (the other steps still run).
#
# The wheels (Python 3.12, x86-64), once, on a machine that reaches a package
# registry, in the repository root (.whl/ in .git/info/exclude):
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl ve-fairseq==0.12.3 hydra-core==1.3.8 omegaconf==2.3.0 bitarray
#   python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
# Then copy the repository with .whl/ to the GPU machine and run there, with
# its Python 3.12 that has CUDA torch and Triton:
#   OUT=/path/to/results bash benchmarks/gpu_session.sh
#
#   bash benchmarks/gpu_session.sh --dry-run     # the plan, on any machine (PYTHON with torch and fairseq)
#
# Safe to re-run: every output is rewritten.
set -euo pipefail

OUT="${OUT:-gpu-session}"                  # where the logs go (a folder you name)
PYTHON="${PYTHON:-python3}"                # the GPU machine's Python 3.12 with CUDA torch and Triton
WHEELS="${WHEELS:-.whl}"                   # the wheels copied with the repository (relative to its root)
SITE="${SITE:-/tmp/site}"                  # where they are installed
T_EXACT="${T_EXACT:-90}"                   # seconds each step may take
T_LEAN="${T_LEAN:-190}"                    # (gpu_lean.py stops starting configurations 40 s before it)
T_BREAKDOWN="${T_BREAKDOWN:-45}"
T_ROBERTA="${T_ROBERTA:-100}"
T_KERNELS="${T_KERNELS:-80}"
T_MODULE="${T_MODULE:-130}"
BREAKDOWN_STEPS="${BREAKDOWN_STEPS:-20}"   # profiled steps a case
ROBERTA_ARGS="${ROBERTA_ARGS:---size base --length 512 --batch 16 --rounds 10 --warmup 3}"
# the wheels the GPU machine lacks (file-name patterns)
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

STEPS=(exact lean breakdown roberta kernels module)
step_timeout() { case "$1" in exact) echo "$T_EXACT" ;; lean) echo "$T_LEAN" ;; breakdown) echo "$T_BREAKDOWN" ;;
  roberta) echo "$T_ROBERTA" ;; kernels) echo "$T_KERNELS" ;; module) echo "$T_MODULE" ;; esac; }
step_command() {
  case "$1" in
    breakdown) echo "$PYTHON benchmarks/gpu_quick.py --parts breakdown --breakdown-steps $BREAKDOWN_STEPS" ;;
    lean) echo "$PYTHON benchmarks/gpu_lean.py --budget-s $(( T_LEAN - 40 ))" ;;
    roberta) echo "$PYTHON benchmarks/bench_roberta.py --device cuda $ROBERTA_ARGS --json $OUT/roberta.json" ;;
    *) echo "$PYTHON benchmarks/gpu_quick.py --parts $1" ;;
  esac
}
for t in "$T_EXACT" "$T_LEAN" "$T_BREAKDOWN" "$T_ROBERTA" "$T_KERNELS" "$T_MODULE" "$BREAKDOWN_STEPS"; do
  if ! [[ "$t" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_session.sh: timeouts and BREAKDOWN_STEPS take positive integers; got '$t'" >&2
    exit 2
  fi
done

if [ "$DRY_RUN" = 1 ]; then
  total=0
  echo "plan (OUT=$OUT, wheels from $WHEELS installed into $SITE):"
  for step in "${STEPS[@]}"; do
    total=$(( total + $(step_timeout "$step") ))
    echo "step $step: timeout $(step_timeout "$step") s: $(step_command "$step") > $OUT/$step.log"
  done
  echo "timeouts in all: $total s"
  echo "roberta args: $ROBERTA_ARGS"
  echo "gpu_quick.py's parts:"
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" benchmarks/gpu_quick.py --dry-run \
    --parts exact,breakdown,kernels,module --breakdown-steps "$BREAKDOWN_STEPS"
  exit 0
fi

# The checks, before anything is written: the wheels, then the GPU.
if [ ! -d "$WHEELS" ]; then
  echo "gpu_session.sh: no wheel folder $WHEELS; put the wheels there (see this script's header) and copy it with the repository" >&2
  exit 1
fi
for pattern in $NEEDED_WHEELS; do
  if ! compgen -G "$WHEELS/$pattern.whl" >/dev/null; then
    echo "gpu_session.sh: no wheel $pattern.whl in $WHEELS; fetch it as this script's header says and copy $WHEELS with the repository" >&2
    exit 1
  fi
done
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
  local T0 step limit rc failed=()
  T0=$(date +%s)
  say() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }
  say "installing the wheels from $WHEELS into $SITE"
  if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/*.whl >"$OUT/pip.tmp" 2>&1; then
    tail -5 "$OUT/pip.tmp"; rm -f "$OUT/pip.tmp"
    echo "gpu_session.sh: the wheels in $WHEELS do not install (above)"
    return 1
  fi
  rm -f "$OUT/pip.tmp"
  export PYTHONPATH="$SITE:$ROOT:$ROOT/benchmarks" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  if ! "$PYTHON" -c "import torch, triton, fairseq
print('torch', torch.__version__, 'triton', triton.__version__, 'fairseq', fairseq.__version__)"; then
    echo "gpu_session.sh: torch, triton or fairseq does not import with the wheels installed (above)"
    return 1
  fi
  echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')"

  for step in "${STEPS[@]}"; do
    limit=$(step_timeout "$step")
    say "$step (timeout $limit s): $(step_command "$step")"
    rc=0
    # shellcheck disable=SC2046  # the command is words by design
    timeout "$limit" $(step_command "$step") >"$OUT/$step.log" 2>&1 || rc=$?
    if [ "$rc" -eq 124 ]; then
      say "$step: cut at its timeout of $limit s (the rows printed so far are in $step.log)"
    else
      say "$step: exit $rc"
    fi
    [ "$rc" -eq 0 ] || failed+=("$step")
    case "$step" in
      exact) echo "exact: $(grep -c '"ok": true' "$OUT/exact.log") configurations ok," \
                  "$(grep -c '"ok": false' "$OUT/exact.log") not" ;;
      lean) grep '^lean: ' "$OUT/lean.log" || true ;;
      breakdown) grep '(all kernels)' "$OUT/breakdown.log" ;;
      roberta) grep -E '^\| roberta|^target' "$OUT/roberta.log" ;;
      *) grep '"part": "'"$step"' done"' "$OUT/$step.log" ;;
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
