#!/usr/bin/env bash
# Regenerate every picture of docs/analysis.md into docs/images/.
#
#   GIGAWORD_DIR=/path/to/sumdata bash scripts/make_analysis_pictures.sh
#
# What it does: binarizes the 10k-pair Gigaword training sample (whitespace
# words, one joined vocabulary of VOCAB words), trains three small models
# (UNAS = fairseq's transformer, DNAS, HNAS; same sizes, data order and
# seed) for MAX_UPDATE updates each, then draws the hybrid weights (HNAS
# checkpoint after every epoch), the explaining-away histograms on the first
# ANALYSE_SENTENCES validation pairs, and the mode-collapse simulations.
# Hardware/time: 2 CPU cores, about 35 minutes (training: about 10 per model);
# a GPU is used by fairseq-train when present. Safe to re-run: finished steps
# (binarized data, trained models) are kept in WORK_DIR and skipped.
set -euo pipefail

GIGAWORD_DIR="${GIGAWORD_DIR:?set GIGAWORD_DIR to the sumdata folder (e.g. ../shared/data/gigaword/sumdata)}"
WORK_DIR="${WORK_DIR:-${TMPDIR:-/tmp}/fairseq-dnas-analysis}"   # data, checkpoints, raw outputs
IMAGES="${IMAGES:-$(dirname "$0")/../docs/images}"  # where the pictures go
VENV="${VENV:-.venv}"                           # made by scripts/install.sh
VOCAB="${VOCAB:-10000}"                         # joined source/target vocabulary (words)
MAX_UPDATE="${MAX_UPDATE:-2000}"                # updates per model (about 12 epochs)
MAX_TOKENS="${MAX_TOKENS:-2048}"                # batch size in tokens
HYBRID_INIT="${HYBRID_INIT:-0.5}"               # HNAS u at the start (neutral; the gigaword preset uses 0.1)
ANALYSE_SENTENCES="${ANALYSE_SENTENCES:-2000}"  # validation pairs for the explaining-away pictures
SEED="${SEED:-1}"
CPU_LOCK="${CPU_LOCK:-}"                        # optional lock file: heavy steps run under flock

# Paths given relative to where the script is called from.
GIGAWORD_DIR="$(realpath -m "$GIGAWORD_DIR")"
WORK_DIR="$(realpath -m "$WORK_DIR")"
IMAGES="$(realpath -m "$IMAGES")"
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
BIN="$ROOT/$VENV/bin"
heavy() {  # run a CPU-heavy step, under the shared lock when one is given
  if [ -n "$CPU_LOCK" ]; then flock "$CPU_LOCK" "$@"; else "$@"; fi
}
publish() {  # copy a picture into IMAGES without leaving half a file there
  cp "$1" "$2.tmp" && mv "$2.tmp" "$2"
}

for f in train/train.article.txt train/train.title.txt train/valid.article.filter.txt train/valid.title.filter.txt; do
  [ -f "$GIGAWORD_DIR/$f" ] || { echo "error: $GIGAWORD_DIR/$f not found (GIGAWORD_DIR must be the sumdata folder)" >&2; exit 1; }
done
mkdir -p "$WORK_DIR/raw" "$IMAGES"

# 1. Binarize (fairseq-preprocess wants <prefix>.<lang>: link the files, no copy).
DATA="$WORK_DIR/data-bin"
if [ ! -f "$DATA/valid.article-title.title.idx" ]; then
  ln -sf "$GIGAWORD_DIR/train/train.article.txt" "$WORK_DIR/raw/train.article"
  ln -sf "$GIGAWORD_DIR/train/train.title.txt" "$WORK_DIR/raw/train.title"
  ln -sf "$GIGAWORD_DIR/train/valid.article.filter.txt" "$WORK_DIR/raw/valid.article"
  ln -sf "$GIGAWORD_DIR/train/valid.title.filter.txt" "$WORK_DIR/raw/valid.title"
  rm -rf "$DATA.tmp"
  heavy "$BIN/fairseq-preprocess" --source-lang article --target-lang title \
    --trainpref "$WORK_DIR/raw/train" --validpref "$WORK_DIR/raw/valid" \
    --joined-dictionary --nwordssrc "$VOCAB" --workers 2 --destdir "$DATA.tmp"
  rm -rf "$DATA" && mv "$DATA.tmp" "$DATA"
fi

# 2. Train the three models (same sizes, data order and seed).
COMMON=(
  --user-dir "$ROOT/fairseq_dnas"
  --encoder-layers 4 --decoder-layers 2
  --encoder-embed-dim 128 --decoder-embed-dim 128
  --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512
  --encoder-attention-heads 4 --decoder-attention-heads 4
  --share-all-embeddings --max-source-positions 128 --max-target-positions 64
  --dropout 0.1 --attention-dropout 0.0
  --optimizer adam --adam-betas "(0.9, 0.98)" --lr 1e-3
  --lr-scheduler inverse_sqrt --warmup-updates 200
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1
  --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --seed "$SEED"
  --skip-invalid-size-inputs-valid-test --max-valid-steps 20
  --log-format simple --log-interval 50 --no-progress-bar
)
train() {  # name, arch, extra flags...
  local name="$1" arch="$2"; shift 2
  local save="$WORK_DIR/checkpoints/$name"
  if [ -f "$save/checkpoint_last.pt" ] && "$BIN/python" - "$save/checkpoint_last.pt" "$MAX_UPDATE" <<'EOF'
import sys, fairseq_dnas, torch  # noqa: F401
from fairseq import checkpoint_utils
state = checkpoint_utils.load_checkpoint_to_cpu(sys.argv[1])
sys.exit(0 if state["optimizer_history"][-1]["num_updates"] >= int(sys.argv[2]) else 1)
EOF
  then
    echo "[train] $name: done already ($save)"
    return
  fi
  echo "[train] $name ($arch), log: $save/train.log"
  mkdir -p "$save"
  heavy "$BIN/fairseq-train" "$DATA" --arch "$arch" "${COMMON[@]}" "$@" \
    --save-dir "$save" >> "$save/train.log" 2>&1 || { tail -20 "$save/train.log" >&2; exit 1; }
  grep -E "\| (train|valid) \|" "$save/train.log" | tail -2
}
train unas transformer --no-epoch-checkpoints
train dnas transformer_dnas --no-epoch-checkpoints
train hnas transformer_hnas --hybrid-init "$HYBRID_INIT"  # keeps checkpoint<epoch>.pt
CK="$WORK_DIR/checkpoints"

# 3. Pictures (and the numbers behind them, in WORK_DIR/results).
RESULTS="$WORK_DIR/results"
# u per layer after some epochs (at most 5, evenly spaced, the first included) and at the end.
mapfile -t EPOCHS < <(ls -v "$CK"/hnas/checkpoint[0-9]*.pt 2>/dev/null)
HNAS_STEPS=()
STRIDE=$(( (${#EPOCHS[@]} + 4) / 5 ))
for ((i = 0; i < ${#EPOCHS[@]}; i += STRIDE)); do HNAS_STEPS+=("${EPOCHS[$i]}"); done
HNAS_STEPS+=("$CK/hnas/checkpoint_last.pt")
"$BIN/python" -m fairseq_dnas.commands.plot_hybrid_weights "${HNAS_STEPS[@]}" \
  --out "$IMAGES/hybrid_weights.png" --csv "$RESULTS/hybrid_weights.csv"
heavy "$BIN/python" -m fairseq_dnas.commands.explaining_away \
  --path "$CK/unas/checkpoint_last.pt" "$CK/dnas/checkpoint_last.pt" "$CK/hnas/checkpoint_last.pt" \
  --labels UNAS DNAS HNAS --data "$DATA" --subset valid --max-sentences "$ANALYSE_SENTENCES" \
  --out "$RESULTS/explaining_away"
for kind in encoder_self decoder_cross decoder_self; do
  publish "$RESULTS/explaining_away/$kind.png" "$IMAGES/explaining_away_$kind.png"
done
"$BIN/python" -m fairseq_dnas.commands.mode_collapse --out "$RESULTS/mode_collapse"
for f in center_distance collapse_500_50 collapse_225_225; do
  publish "$RESULTS/mode_collapse/$f.png" "$IMAGES/mode_collapse_$f.png"
done
echo "pictures in $IMAGES/, numbers in $RESULTS/"
