#!/usr/bin/env python
"""GPT-2 BPE of text files, one line in, one line of BPE ids out: what
fairseq's ``examples/roberta/multiprocessing_bpe_encoder.py`` does for BART
(that script ships with fairseq's repository, not with its pip package; this
is the same encoding through the package's ``gpt2_bpe_utils``).

    python examples/bart/bpe_encode.py --encoder-json encoder.json --vocab-bpe vocab.bpe \\
        --inputs cnn_dm/train.source --outputs cnn_dm/train.bpe.source --workers 8

Empty lines stay (``--keep-empty`` in fairseq's script), so source and target
files stay aligned. A missing file is one line naming it; an output is written
under a temporary name and renamed when complete.
"""

import argparse
import os
import sys
from multiprocessing import Pool

_bpe = None


def _init(encoder_json, vocab_bpe):
    global _bpe
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    _bpe = get_encoder(encoder_json, vocab_bpe)


def encode_line(line):
    line = line.strip()
    return " ".join(map(str, _bpe.encode(line))) if line else ""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--encoder-json", required=True)
    p.add_argument("--vocab-bpe", required=True)
    p.add_argument("--inputs", nargs="+", required=True)
    p.add_argument("--outputs", nargs="+", required=True)
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args(argv)
    if len(a.inputs) != len(a.outputs):
        sys.exit("[bpe_encode] error: give as many --outputs as --inputs")
    for path in (a.encoder_json, a.vocab_bpe, *a.inputs):
        if not os.path.isfile(path):
            sys.exit(f"[bpe_encode] error: {path}: no such file")
    for src, dst in zip(a.inputs, a.outputs):
        with open(src, encoding="utf-8") as f:
            lines = f.readlines()
        if a.workers > 1:
            with Pool(a.workers, _init, (a.encoder_json, a.vocab_bpe)) as pool:
                out = pool.map(encode_line, lines, chunksize=1000)
        else:
            _init(a.encoder_json, a.vocab_bpe)
            out = [encode_line(line) for line in lines]
        tmp = dst + ".partial"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in out)
        os.replace(tmp, dst)
        print(f"[bpe_encode] {dst}: {len(out)} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
