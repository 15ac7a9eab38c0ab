#!/usr/bin/env bash
# Translate a test set with beam search, put the translations back in input
# order, remove SentencePiece, and score them with fairseq_dnas/commands/bleu_eval.py
# (detokenized, cased sacreBLEU BLEU and chrF against the raw reference).
#
#   DATA=data/multi30k CHECKPOINT=checkpoints/translation/.../checkpoint_best.pt \
#     SUBSET=test bash examples/translation/generate.sh
#
# SUBSET: test, test1, ... in the order of prepare.sh's TEST_PREFIXES
# (Multi30k: test = test2016, test1 = test2017; see DATA/test_sets.txt), or valid.
# Writes OUT_PREFIX.hyp (one translation a line, aligned with the source),
# OUT_PREFIX.generate.log and, with SCORE=1, OUT_PREFIX.bleu.json. Time for
# 1,000 Multi30k sentences with SIZE=tiny: 56-130 s on one thread of a 2-core
# machine shared with other jobs. Safe to re-run (outputs are replaced).
set -euo pipefail

DATA="${DATA:-data/multi30k}"              # prepare.sh's OUT_DIR (bin/, spm/, text/)
CHECKPOINT="${CHECKPOINT:-}"               # a checkpoint from train.sh
SUBSET="${SUBSET:-test}"
SRC="${SRC:-de}"
TGT="${TGT:-en}"
OUT_PREFIX="${OUT_PREFIX:-${CHECKPOINT%.pt}.$SUBSET}"
BEAM="${BEAM:-5}"
LENPEN="${LENPEN:-1.0}"
MAX_LEN_A="${MAX_LEN_A:-1.2}"               # at most 1.2 x source pieces + MAX_LEN_B
MAX_LEN_B="${MAX_LEN_B:-10}"
BATCH_SIZE="${BATCH_SIZE:-128}"            # sentences per batch
DEVICE="${DEVICE:-auto}"                   # gpu | cpu | auto
SCORE="${SCORE:-1}"                        # 1: BLEU and chrF against DATA/text/SUBSET.TGT
LABEL="${LABEL:-}"                         # name stored in the BLEU JSON (e.g. the architecture)

source "$(dirname "$0")/../common.sh"
check_python
check_checkpoint
[ -f "$DATA/bin/dict.$SRC.txt" ] || die "no prepared data in DATA=$DATA (expected prepare.sh's OUT_DIR with bin/)"
[ -f "$DATA/bin/$SUBSET.$SRC-$TGT.$SRC.bin" ] || die "no subset '$SUBSET' in $DATA/bin (test sets: $(cut -d' ' -f1 "$DATA/test_sets.txt" 2>/dev/null | tr '\n' ' ')valid)"
[ -s "$DATA/spm/$SUBSET.$SRC" ] || die "$DATA/spm/$SUBSET.$SRC: missing or empty (run prepare.sh again)"
DEVICE="$(resolve_device "$DEVICE")"
mkdir -p "$(dirname "$OUT_PREFIX")"

say "translating $SUBSET with $CHECKPOINT (beam $BEAM, lenpen $LENPEN, $DEVICE)"
# --required-batch-size-multiple 1: some fairseq builds otherwise drop the last
# partial batch (fairseq_dnas/recipes/collect_hypotheses.py would then refuse). The console
# shows the sentences translated; a bad checkpoint or data file ends in one line.
run_fairseq_generate "$OUT_PREFIX" "$(wc -l < "$DATA/spm/$SUBSET.$SRC")" \
  "$PYTHON" -m fairseq_dnas.recipes.run_fairseq generate "$DATA/bin" \
  --user-dir "$USER_DIR" \
  --task translation --source-lang "$SRC" --target-lang "$TGT" \
  --path "$CHECKPOINT" \
  --gen-subset "$SUBSET" \
  --beam "$BEAM" \
  --nbest 1 \
  --lenpen "$LENPEN" \
  --max-len-a "$MAX_LEN_A" \
  --max-len-b "$MAX_LEN_B" \
  --batch-size "$BATCH_SIZE" \
  --required-batch-size-multiple 1 \
  "$(device_args "$DEVICE")"
collect_hypotheses "$OUT_PREFIX" "$DATA/spm/$SUBSET.$SRC"

if [ "$SCORE" = 1 ]; then
  LABEL_ARGS=(); [ -n "$LABEL" ] && LABEL_ARGS=(--label "$LABEL")
  "$PYTHON" -m fairseq_dnas.commands.bleu_eval --hyp "$OUT_PREFIX.hyp" --ref "$DATA/text/$SUBSET.$TGT" \
    "${LABEL_ARGS[@]}" --json-out "$OUT_PREFIX.bleu.json"
fi
say "translations: $OUT_PREFIX.hyp"
