#!/usr/bin/env python
"""ROUGE-1/2/L/Lsum F1 of a hypothesis file against one or more reference files.

    python -m fairseq_dnas.commands.rouge_eval --hyp test.hyp --ref raw/test.title
    python -m fairseq_dnas.commands.rouge_eval --hyp duc.hyp --ref ref0 --ref ref1 --ref ref2 --ref ref3 --json

Files are aligned line by line (one headline a line). Scores come from
Google's ``rouge-score`` package (a Python reimplementation of Perl
ROUGE-1.5.5), computed per sentence and averaged over sentences, reported in
percent twice: with Porter stemming (what papers scoring with Perl ROUGE
``-m`` report) and without. Each mean comes with a bootstrap 95% interval
(resampling sentences). The references are scored as they are: the Gigaword
test set's ``UNK`` and ``#`` stay in the file; rouge-score's tokenizer then
lowercases and keeps only [a-z0-9] tokens (``UNK`` counts as the word ``unk``,
``#`` disappears).

Relation to Perl ROUGE-1.5.5 (``-m -n 2``): the same definitions, but the
stemmer is NLTK's Porter stemmer (only words longer than 3 characters) while
the Perl script uses its own Porter implementation with a WordNet-derived
exception list, and the Perl script rounds per-sentence figures and
resamples differently for its interval. Expect agreement to within a few
tenths of a point, not to the last digit; compare systems with the same tool.

ROUGE-Lsum (rouge-score's ``rougeLsum``) is the summary-level LCS over
sentences, what CNN/DailyMail and XSum results are reported in (fairseq's
``files2rouge``, Hugging Face's ``run_summarization.py``). It needs the
sentences of each summary: a text holding newlines is split at them (one
sentence a line); a text without any (a line of a hypothesis or reference
file) is split by ``split_sentences``: a sentence ends at ``.``, ``!`` or
``?`` followed by white space and a capital letter or a digit, unless the
word before the period is a known abbreviation ("Mr.", "U.S.", "Jan.", ...)
or an initial. This is a small rule of our own, offline and deterministic:
the usual splitter, NLTK's trained Punkt model (``nltk.sent_tokenize``,
rouge-score's ``split_summaries=True``), is a download, and Punkt without
its model splits after every "u.s." of a lower-cased headline. On
lower-cased, one-sentence outputs (Gigaword headlines) ROUGE-Lsum therefore
equals ROUGE-L. ROUGE-1/2/L are unchanged by the splitting (newlines are
white space to rouge-score's tokenizer).

Several ``--ref`` (multi-reference sets, DUC-2004 has 4): each sentence's
score is the mean of its scores against each reference (``--multi-ref mean``,
close to Perl's default ``-f A``) or the best one (``--multi-ref max``, what
rouge-score's ``score_multi`` does). ``--max-bytes 75`` truncates hypotheses
to 75 bytes first, as Perl ``-b 75`` does for DUC-2004.
"""

import argparse
import json
import os
import re
import sys

import numpy as np
from rouge_score import rouge_scorer

TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
PARTS = ("precision", "recall", "fmeasure")


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f]


def truncate_bytes(text, limit):
    if not limit:
        return text
    return text.encode("utf-8")[:limit].decode("utf-8", errors="ignore")


# Words that end in a period without ending a sentence (compared lower-cased,
# without their final period); single letters (initials: "J. Smith") too.
ABBREVIATIONS = frozenset("""
    mr mrs ms messrs dr prof sr jr st mt rev hon pres gov gen sen rep col lt sgt capt cmdr adm maj supt det insp
    jan feb mar apr jun jul aug sep sept oct nov dec mon tue tues wed thu thur thurs fri sat sun
    inc corp co ltd bros no nos vs etc al approx dept est fig vol e.g i.e u.s u.k u.n e.u a.m p.m
""".split())
# A candidate boundary: white space after . ! or ? (and any closing quotes or
# brackets), before a capital letter or a digit (after any opening quotes).
_BOUNDARY = re.compile(r"""(?<=[.!?])["'\u201d\u2019)\]]*\s+(?=["'\u201c\u2018(\[]*[A-Z0-9])""")


def split_sentences(text):
    """The sentences of ``text`` joined by newlines, as ``rougeLsum`` reads
    them. A text with several lines keeps its lines. Otherwise a sentence
    ends at . ! or ? followed by white space and a capital letter or a digit,
    unless the word before the period is in ``ABBREVIATIONS`` or a single
    letter. Lower-cased text (Gigaword's headlines) is therefore one sentence."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        return "\n".join(lines)
    text, sentences, start = lines[0], [], 0
    for m in _BOUNDARY.finditer(text):
        before = text[start:m.start()].rstrip("\"'\u201d\u2019)]")
        if before.endswith("."):
            word = before[:-1].split()[-1].lower() if before[:-1].split() else ""
            if word in ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
                continue
        sentences.append(text[start:m.start()].strip() + m.group(0).strip())
        start = m.end()
    sentences.append(text[start:].strip())
    return "\n".join(s for s in sentences if s)


def sentence_scores(hyps, refs_list, use_stemmer, multi_ref="mean"):
    """(N, len(TYPES) types, 3 parts) array of per-sentence precision/recall/F1 in [0, 1].

    ``refs_list`` holds one list of references per reference file."""
    scorer = rouge_scorer.RougeScorer(list(TYPES), use_stemmer=use_stemmer, split_summaries=False)
    out = np.zeros((len(hyps), len(TYPES), len(PARTS)))
    for i, hyp in enumerate(hyps):
        hyp = split_sentences(hyp)
        per_ref = np.array([
            [[getattr(s[t], p) for p in PARTS] for t in TYPES]
            for s in (scorer.score(split_sentences(refs[i]), hyp) for refs in refs_list)
        ])  # (R, types, 3): reference, type, part
        if multi_ref == "max":  # the reference with the best F1, per type
            best = per_ref[:, :, 2].argmax(axis=0)
            out[i] = per_ref[best, np.arange(len(TYPES))]
        else:
            out[i] = per_ref.mean(axis=0)
    return out


def bootstrap_interval(values, samples, seed, level=0.95):
    """Percentile bootstrap interval of the mean of ``values`` (N, ...)."""
    rng = np.random.default_rng(seed)
    n = len(values)
    means = np.stack([values[rng.integers(0, n, n)].mean(axis=0) for _ in range(samples)])
    lo, hi = np.percentile(means, [100 * (1 - level) / 2, 100 * (1 + level) / 2], axis=0)
    return lo, hi


def summarize(scores, samples, seed):
    """{type: {part: {"mean", "low", "high"}}} in percent."""
    mean = scores.mean(axis=0)
    lo, hi = bootstrap_interval(scores, samples, seed)
    return {
        t: {p: {"mean": round(100 * mean[a, b], 4), "low": round(100 * lo[a, b], 4),
                "high": round(100 * hi[a, b], 4)} for b, p in enumerate(PARTS)}
        for a, t in enumerate(TYPES)
    }


def evaluate(hyps, refs_list, samples=1000, seed=0, multi_ref="mean", max_bytes=0):
    """The full result: both stemming variants, F1/precision/recall, intervals."""
    hyps = [truncate_bytes(h, max_bytes) for h in hyps]
    result = {"sentences": len(hyps), "references": len(refs_list), "multi_ref": multi_ref,
              "max_bytes": max_bytes, "bootstrap_samples": samples, "scale": "percent"}
    for name, stem in (("stemmed", True), ("unstemmed", False)):
        result[name] = summarize(sentence_scores(hyps, refs_list, stem, multi_ref), samples, seed)
    return result


def format_table(result):
    lines = [f"{result['sentences']} sentences, {result['references']} reference(s); "
             f"ROUGE F1 (%), mean [95% bootstrap interval]"]
    for name in ("stemmed", "unstemmed"):
        cells = [f"{t.upper().replace('ROUGE', 'R-').replace('LSUM', 'Lsum')} {r['fmeasure']['mean']:.2f} "
                 f"[{r['fmeasure']['low']:.2f}, {r['fmeasure']['high']:.2f}]"
                 for t, r in result[name].items()]
        lines.append(f"  {name:<9}  " + "   ".join(cells))
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--hyp", required=True, help="hypotheses, one a line")
    p.add_argument("--ref", required=True, action="append",
                   help="references, one a line, aligned with --hyp; repeat for several")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--json-out", metavar="FILE",
                   help="also write the JSON object to FILE (the table still goes to stdout)")
    p.add_argument("--multi-ref", choices=("mean", "max"), default="mean",
                   help="how several references combine per sentence (default: mean)")
    p.add_argument("--max-bytes", type=int, default=0,
                   help="truncate hypotheses to N bytes first (DUC-2004: 75); 0: no limit")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--label", help="a name stored in the JSON (e.g. the architecture)")
    return p.parse_args(argv)


def load_aligned(hyp_path, ref_paths):
    """(hypotheses, [references per file]); ValueError naming the files when
    they cannot be read, are empty, or are not aligned line by line."""
    texts = []
    for path in (hyp_path, *ref_paths):
        try:
            texts.append(read_lines(path))
        except OSError as err:
            raise ValueError(f"{path}: cannot read ({err.strerror or err})") from None
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}: not UTF-8 text (corrupt? byte {err.start}: {err.reason})") from None
    hyps, refs_list = texts[0], texts[1:]
    for path, refs in zip(ref_paths, refs_list):
        if len(refs) != len(hyps):
            raise ValueError(f"{hyp_path} has {len(hyps)} lines but {path} has {len(refs)}; "
                             "hypotheses and references must be aligned line by line")
    if not hyps:
        raise ValueError(f"{hyp_path}: empty, no hypothesis to score")
    return hyps, refs_list


def emit(result, args, format_table):
    """Add the files and label to ``result``, write --json-out (atomically),
    print JSON (--json) or the table."""
    result["hyp"], result["ref"] = args.hyp, args.ref
    if args.label:
        result["label"] = args.label
    if args.json_out:
        tmp = args.json_out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(result) + "\n")
        os.replace(tmp, args.json_out)
    print(json.dumps(result) if args.json else format_table(result))


def main(argv=None):
    args = parse_args(argv)
    if args.bootstrap < 1 or args.max_bytes < 0:
        print("error: --bootstrap must be >= 1 and --max-bytes >= 0", file=sys.stderr)
        return 2
    try:
        hyps, refs_list = load_aligned(args.hyp, args.ref)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    result = evaluate(hyps, refs_list, args.bootstrap, args.seed, args.multi_ref, args.max_bytes)
    emit(result, args, format_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
