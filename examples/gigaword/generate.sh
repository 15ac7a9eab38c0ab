#!/usr/bin/env bash
# Beam-search a headline for every test article, put them back in input
# order, remove SentencePiece, and score them with fairseq_dnas/commands/rouge_eval.py.
#
#   DATA=data/gigaword CHECKPOINT=checkpoints/gigaword/.../checkpoint_best.pt \
#     bash examples/gigaword/generate.sh
#
# Writes OUT_PREFIX.hyp (one headline a line, aligned with the test set),
# OUT_PREFIX.generate.log (fairseq-generate's output) and, with SCORE=1,
# OUT_PREFIX.rouge.json. Time for the 1,951 test articles: about 1 min for
# SIZE=small and 15 s for SIZE=tiny on 2 CPU cores; a GPU takes seconds.
# Safe to re-run (outputs are replaced; a failed run leaves no .hyp or
# .rouge.json behind). A bad checkpoint or data file ends in one line naming it.
#
# Decoding settings (the paper gives none; these are the common ones for
# Gigaword): beam 5, length penalty 1.0, no minimum length, at most 63 pieces
# (the 64 decoder positions minus </s>).
set -euo pipefail

DATA="${DATA:-data/gigaword}"              # prepare.sh's OUT_DIR (bin/, spm/, raw/)
CHECKPOINT="${CHECKPOINT:-}"               # a checkpoint from train.sh
OUT_PREFIX="${OUT_PREFIX:-${CHECKPOINT%.pt}.test}"
SUBSET="${SUBSET:-test}"                   # test or valid
BEAM="${BEAM:-5}"
LENPEN="${LENPEN:-1.0}"                    # > 1 favours longer headlines
MIN_LEN="${MIN_LEN:-1}"                    # pieces
MAX_LEN_B="${MAX_LEN_B:-63}"               # pieces (fixed cap: --max-len-a 0)
BATCH_SIZE="${BATCH_SIZE:-128}"            # sentences per batch
DEVICE="${DEVICE:-auto}"                   # gpu | cpu | auto
SCORE="${SCORE:-1}"                        # 1: ROUGE against the reference
LABEL="${LABEL:-}"                         # name stored in the ROUGE JSON (e.g. the architecture)

source "$(dirname "$0")/../common.sh"
check_python
check_checkpoint
[ -f "$DATA/bin/dict.article.txt" ] || die "no prepared data in DATA=$DATA (expected prepare.sh's OUT_DIR with bin/)"
case "$SUBSET" in
  test) REF="$DATA/raw/test.title" ;;      # raw: scored as released
  valid) REF="$DATA/text/valid.title" ;;
  *) die "SUBSET=$SUBSET: choose test or valid" ;;
esac
DEVICE="$(resolve_device "$DEVICE")"
mkdir -p "$(dirname "$OUT_PREFIX")"
# Results of an earlier run must not survive a failed one and look like its own.
rm -f "$OUT_PREFIX.hyp" "$OUT_PREFIX.rouge.json"
SOURCES="$DATA/spm/$SUBSET.article"         # what was binarized: one hypothesis per line
[ -s "$SOURCES" ] || die "$SOURCES: missing or empty (run prepare.sh again)"
if [ "$SCORE" = 1 ]; then
  [ -s "$REF" ] || die "$REF: missing or empty (run prepare.sh again)"
  n_src="$(wc -l < "$SOURCES")"; n_ref="$(wc -l < "$REF")"
  [ "$n_src" = "$n_ref" ] || die "$REF: $n_ref lines but $SOURCES has $n_src (truncated? run prepare.sh again)"
fi

say "decoding $SUBSET with $CHECKPOINT (beam $BEAM, lenpen $LENPEN, $DEVICE)"
# --user-dir: the architectures and the checkpoint-loading fix for torch >= 2.6,
# needed even for the plain transformer baseline.
# --required-batch-size-multiple 1: otherwise the fairseq builds that import on
# Python 3.11 drop the last partial batch (7 of the 1,951 test sentences).
# The console shows the sentences decoded; a bad file ends in one line.
run_fairseq_generate "$OUT_PREFIX" "$(wc -l < "$SOURCES")" \
  "$PYTHON" -m fairseq_dnas.recipes.run_fairseq generate "$DATA/bin" \
  --user-dir "$USER_DIR" \
  --task translation --source-lang article --target-lang title \
  --path "$CHECKPOINT" \
  --gen-subset "$SUBSET" \
  --beam "$BEAM" \
  --nbest 1 \
  --lenpen "$LENPEN" \
  --min-len "$MIN_LEN" \
  --max-len-a 0 \
  --max-len-b "$MAX_LEN_B" \
  --batch-size "$BATCH_SIZE" \
  --required-batch-size-multiple 1 \
  "$(device_args "$DEVICE")"
collect_hypotheses "$OUT_PREFIX" "$SOURCES"

if [ "$SCORE" = 1 ]; then
  LABEL_ARGS=(); [ -n "$LABEL" ] && LABEL_ARGS=(--label "$LABEL")
  "$PYTHON" -m fairseq_dnas.commands.rouge_eval --hyp "$OUT_PREFIX.hyp" --ref "$REF" \
    "${LABEL_ARGS[@]}" --json-out "$OUT_PREFIX.rouge.json"
  say "ROUGE: $OUT_PREFIX.rouge.json"
fi
say "headlines: $OUT_PREFIX.hyp"
