#!/usr/bin/env python
"""sacreBLEU BLEU and chrF of a hypothesis file against one or more references.

    python -m fairseq_dnas.commands.bleu_eval --hyp test2016.hyp --ref raw/test_2016_flickr.en
    python -m fairseq_dnas.commands.bleu_eval --hyp sys.hyp --ref ref1 --ref ref2 --json

Files are aligned line by line, detokenized and cased (what sacreBLEU is made
for: it applies its own tokenization, ``13a`` for BLEU, so scores are
comparable across papers that print the same signature). Each score comes
with sacreBLEU's signature and a bootstrap 95% interval (sacreBLEU's own
resampling of sentences, ``--bootstrap`` samples, seed ``SACREBLEU_SEED`` or
12345): the interval is the bootstrap mean +- half the 2.5-97.5 percentile
range, as ``sacrebleu --confidence`` prints it. A hypothesis file whose line
count differs from any reference is refused (exit 1, message on stderr).
"""

import argparse
import sys

from fairseq_dnas.commands.rouge_eval import emit, load_aligned  # the same file checks and outputs as ROUGE
from sacrebleu.metrics import BLEU, CHRF

METRICS = {"bleu": BLEU, "chrf": CHRF}


def score(hyps, refs_list, samples=1000):
    """{"bleu": {...}, "chrf": {...}}: score, bootstrap mean, interval, signature."""
    result = {}
    for name, cls in METRICS.items():
        metric = cls()
        s = metric.corpus_score(hyps, refs_list, n_bootstrap=samples)
        entry = {"score": round(float(s.score), 4), "signature": str(metric.get_signature())}
        if samples > 1:  # sacreBLEU sets _mean and _ci only when it resampled
            entry.update(bootstrap_mean=round(float(s._mean), 4), low=round(float(s._mean - s._ci), 4),
                         high=round(float(s._mean + s._ci), 4))
        if name == "bleu":
            entry.update(precisions=[round(p, 4) for p in s.precisions], bp=round(s.bp, 4),
                         hyp_len=s.sys_len, ref_len=s.ref_len)
        result[name] = entry
    return result


def format_table(result):
    lines = [f"{result['sentences']} sentences, {result['references']} reference(s)"]
    for name, label in (("bleu", "BLEU"), ("chrf", "chrF")):
        r = result[name]
        interval = f" [{r['low']:.2f}, {r['high']:.2f}]" if "low" in r else ""
        lines.append(f"  {label:<4} {r['score']:6.2f}{interval}   {r['signature']}")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hyp", required=True, help="hypotheses, one detokenized sentence a line")
    p.add_argument("--ref", required=True, action="append",
                   help="references, aligned with --hyp; repeat for several")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--json-out", metavar="FILE",
                   help="also write the JSON object to FILE (the table still goes to stdout)")
    p.add_argument("--bootstrap", type=int, default=1000,
                   help="bootstrap resamples for the 95%% interval (1: none)")
    p.add_argument("--label", help="a name stored in the JSON (e.g. the architecture)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.bootstrap < 1:
        print("error: --bootstrap must be >= 1", file=sys.stderr)
        return 2
    try:
        hyps, refs_list = load_aligned(args.hyp, args.ref)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    result = {"sentences": len(hyps), "references": len(refs_list),
              "bootstrap_samples": args.bootstrap, **score(hyps, refs_list, args.bootstrap)}
    emit(result, args, format_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
