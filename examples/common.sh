# Shared by the recipes under examples/ (sourced, not run).
#
# Which Python runs everything: $PYTHON if set, else the repository's .venv
# (what scripts/install.sh makes), else python3 from PATH. PYTHON may be a
# path or a command name on PATH (PYTHON=python3). fairseq's tools are
# started as modules of that interpreter (python -m fairseq_cli.train, and
# python -m torch.distributed.run for torchrun), so no console script from
# another environment can sneak in.

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then
    PYTHON="$REPO/.venv/bin/python"
  else
    PYTHON="$(command -v python3 || true)"
  fi
fi
USER_DIR="${USER_DIR:-$REPO/fairseq_dnas}"

say() { echo "[$(basename "$0" .sh)] $*" >&2; }
die() { echo "[$(basename "$0" .sh)] error: $*" >&2; exit 1; }

check_python() {
  # PYTHON may be a path or a command on PATH (PYTHON=python3); resolve it once
  # so that every later use (and every job started from here) runs the same one.
  local found
  found="$(command -v "${PYTHON:-}" 2>/dev/null || true)"
  [ -n "$PYTHON" ] && [ -n "$found" ] && [ -x "$found" ] \
    || die "no Python found at PYTHON=${PYTHON:-} (a path or a command on PATH); run 'bash scripts/install.sh' or set PYTHON"
  PYTHON="$found"
  # Checked once per run: the scripts this one starts (train.sh, generate.sh
  # from run_seeds.sh or quickstart.sh) inherit the result.
  [ "${FAIRSEQ_DNAS_CHECKED_PYTHON:-}" = "$PYTHON" ] && return 0
  "$PYTHON" -c 'import fairseq, fairseq_dnas, sentencepiece, rouge_score' 2>/dev/null \
    || die "$PYTHON lacks fairseq, fairseq_dnas, sentencepiece or rouge-score; run 'bash scripts/install.sh' (or set PYTHON to the environment that has them)"
  export FAIRSEQ_DNAS_CHECKED_PYTHON="$PYTHON"
}

# cpu or gpu: DEVICE=auto picks gpu when torch sees one.
resolve_device() {
  case "$1" in
    cpu|gpu) echo "$1" ;;
    auto) "$PYTHON" -c 'import torch; print("gpu" if torch.cuda.is_available() else "cpu")' ;;
    *) die "DEVICE=$1: choose cpu, gpu or auto" ;;
  esac
}
