#!/usr/bin/env bash
# The thesis's Tables 6.2 and 6.4 and Figure 6.2 (J. Kinley, 2020) at CPU
# scale, on Multi30k English -> German (the thesis's direction) and
# CoNLL-2000:
#
# 1. per encoder in ARCHS and seed in SEEDS: a translation model
#    (examples/translation/train.sh, SIZE=mini by default), its test2016
#    translations with sacreBLEU and a bootstrap interval (generate.sh), and
#    the translation form of the faithfulness metric
#    (fairseq_dnas/commands/translation_faithfulness.py: Kendall's tau between the encoder
#    self-attention, and apart the decoder cross-attention, each source token
#    receives and the gradient of the hypothesis's log-probability at its
#    embedding);
# 2. what each stream learns (examples/discrete/stream_analysis.py): the
#    CoNLL-2000 chunking probe on every model's frozen final encoder states
#    (two streams for transformer_discrete); Figure 6.2 and Table 6.3 of the
#    PICTURE_SEED models from each stream's token embeddings (as the thesis
#    draws them: OUT/streams/tsne-embeddings.png, neighbours-embeddings.md)
#    and from the final states (tsne.png, neighbours.md), the two side by
#    side in OUT/streams/table63.md;
# 3. the tables, mean +- standard error over seeds
#    (examples/discrete/translation_table.py) -> OUT/table.md.
#
#   MULTI30K_DIR=/path/to/multi30k CONLL2000_DIR=/path/to/conll2000 JOBS=2 bash examples/discrete/table62.sh
#
# Finished steps are skipped, so it is safe to re-run.
set -euo pipefail

MULTI30K_DIR="${MULTI30K_DIR:-}"            # raw/{train,val,test_2016_flickr,...}.{de,en}
CONLL2000_DIR="${CONLL2000_DIR:-}"          # train.txt, test.txt
OUT="${OUT:-checkpoints/discrete/table62}"
ARCHS="${ARCHS:-transformer transformer_discrete_single transformer_discrete}"
SEEDS="${SEEDS:-1 2 3}"
SIZE="${SIZE:-mini}"                        # train.sh's sizes: mini (2+2, 64), tiny (2+2, 128), small
MAX_UPDATE="${MAX_UPDATE:-300}"             # updates of BATCH_TOKENS target tokens
BATCH_TOKENS="${BATCH_TOKENS:-2048}"
LR="${LR:-2e-3}"
WARMUP_UPDATES="${WARMUP_UPDATES:-100}"
DROPOUT="${DROPOUT:-0.1}"
VOCAB_SIZE="${VOCAB_SIZE:-8000}"
MAX_TRAIN_PAIRS="${MAX_TRAIN_PAIRS:-0}"     # first N training pairs (0: all 29,000)
MAX_VALID_PAIRS="${MAX_VALID_PAIRS:-0}"     # 0: all 1,014 (validation BLEU at the end of training)
MAX_TEST_PAIRS="${MAX_TEST_PAIRS:-0}"       # first N pairs of each test set (0: all 1,000)
SUBSET="${SUBSET:-test}"                    # test = test2016, test1 = test2017
BEAM="${BEAM:-5}"
FAITH_EXAMPLES="${FAITH_EXAMPLES:-0}"       # sentences for the metric (0: the whole subset)
PROBE_WORDS="${PROBE_WORDS:-60000}"         # CoNLL-2000 training words for the probe (0: all 211,727)
PICTURE_SEED="${PICTURE_SEED:-1}"
ANALYSIS="${ANALYSIS:-1}"                   # 0: stop after the runs (step 2); a later call does the rest
JOBS="${JOBS:-1}"

HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../common.sh"
check_number JOBS 1
check_python
[ -d "$MULTI30K_DIR/raw" ] || die "MULTI30K_DIR='$MULTI30K_DIR' has no raw/ folder (the Multi30k folder: raw/train.en, ...)"
[ -s "$CONLL2000_DIR/train.txt" ] || die "CONLL2000_DIR='$CONLL2000_DIR' has no train.txt (the CoNLL-2000 folder)"
DATA="$OUT/data"
mkdir -p "$OUT/runs" "$OUT/logs"

say "1/4 prepare Multi30k en -> de into $DATA"
SRC=en TGT=de MULTI30K_DIR="$MULTI30K_DIR" VOCAB_SIZE="$VOCAB_SIZE" MAX_TRAIN_PAIRS="$MAX_TRAIN_PAIRS" \
  MAX_VALID_PAIRS="$MAX_VALID_PAIRS" MAX_TEST_PAIRS="$MAX_TEST_PAIRS" bash "$HERE/../translation/prepare.sh" "$DATA"

run_job() {  # ARCH SEED: train, translate and score, the metric
  local arch="$1" seed="$2" run="$OUT/runs/$1-seed$2"
  DATA="$DATA/bin" SRC=en TGT=de ARCH="$arch" SEED="$seed" SIZE="$SIZE" DROPOUT="$DROPOUT" LR="$LR" \
    WARMUP_UPDATES="$WARMUP_UPDATES" BATCH_TOKENS="$BATCH_TOKENS" MAX_TOKENS_PER_PROC="$BATCH_TOKENS" \
    MAX_UPDATE="$MAX_UPDATE" VALIDATE_INTERVAL_UPDATES="$MAX_UPDATE" LOG_INTERVAL=50 SAVE_DIR="$run" \
    bash "$HERE/../translation/train.sh"
  if [ ! -s "$run/$SUBSET.bleu.json" ]; then
    DATA="$DATA" SRC=en TGT=de CHECKPOINT="$run/checkpoint_best.pt" SUBSET="$SUBSET" BEAM="$BEAM" \
      OUT_PREFIX="$run/$SUBSET" LABEL="$arch" bash "$HERE/../translation/generate.sh" > /dev/null
  fi
  if [ ! -s "$run/faithfulness.json" ]; then
    "$PYTHON" -m fairseq_dnas.commands.translation_faithfulness "$run/checkpoint_best.pt" --data "$DATA/bin" \
      --subset "$SUBSET" --beam "$BEAM" --max-examples "$FAITH_EXAMPLES" --labels "$arch-seed$seed" \
      --json "$run/faithfulness.jsonl" > "$run/faithfulness.json.tmp"
    mv "$run/faithfulness.json.tmp" "$run/faithfulness.json"
  fi
}

TODO=()
for arch in $ARCHS; do
  for seed in $SEEDS; do
    [ -s "$OUT/runs/$arch-seed$seed/faithfulness.json" ] || TODO+=("$arch:$seed")
  done
done
say "2/4 ${#TODO[@]} models to train, translate and measure, $JOBS at a time (logs in $OUT/logs)"
log_of() { echo "$OUT/logs/$1-seed$2.log"; }
run_jobs run_job log_of ${TODO[@]+"${TODO[@]}"}
[ "$JOBS_FAILED" = 0 ] || die "$JOBS_FAILED of ${#TODO[@]} runs failed (logs in $OUT/logs); re-run to retry them"
if [ "$ANALYSIS" = 0 ]; then say "ANALYSIS=0: stopping after the runs"; exit 0; fi

MODELS=()
PICTURES=()
for arch in $ARCHS; do
  for seed in $SEEDS; do MODELS+=("$arch-seed$seed=$OUT/runs/$arch-seed$seed/checkpoint_best.pt"); done
  PICTURES+=("$arch-seed$PICTURE_SEED")
done
# probed_all: every model has a row in probe.jsonl (a two-stream model has
# two, one per stream, so the rows are matched by name, not counted).
probed_all() {
  [ -s "$OUT/streams/probe.jsonl" ] || return 1
  local m
  for m in "${MODELS[@]}"; do grep -qF "\"model\": \"${m%%=*}\"" "$OUT/streams/probe.jsonl" || return 1; done
}
if probed_all && [ -z "$(find "$OUT/runs" -name checkpoint_best.pt -newer "$OUT/streams/probe.jsonl")" ]; then
  say "3/4 stream analysis: done already ($OUT/streams)"
else
  say "3/4 stream analysis of ${#MODELS[@]} encoders on CoNLL-2000 (probe; t-SNE and neighbours of embeddings and final states) -> $OUT/streams"
  "$PYTHON" "$HERE/stream_analysis.py" --conll "$CONLL2000_DIR" --data "$DATA/bin" \
    --spm "$DATA/spm/sentencepiece.model" --out "$OUT/streams" --max-train-words "$PROBE_WORDS" \
    --pictures-of "$(IFS=,; echo "${PICTURES[*]}")" "${MODELS[@]}"
fi

say "4/4 tables -> $OUT/table.md"
"$PYTHON" "$HERE/translation_table.py" "$OUT" --subset "$SUBSET" --out "$OUT/table.md"
