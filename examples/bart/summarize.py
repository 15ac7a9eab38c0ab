#!/usr/bin/env python
"""Summarize a source file with a fine-tuned BART (softmax, DNAS or HNAS
encoder) through fairseq's hub interface, then score ROUGE-1/2/L/Lsum with
the project's scorer (``fairseq_dnas.commands.rouge_eval``; ROUGE-Lsum is
what CNN/DailyMail and XSum results are published in).

    python examples/bart/summarize.py --model-dir checkpoints/bart/bart_hnas_large \\
        --checkpoint checkpoint_best.pt --data cnn_dm-bin \\
        --gpt2-encoder-json gpt2_bpe/encoder.json --gpt2-vocab-bpe gpt2_bpe/vocab.bpe \\
        --source cnn_dm/test.source --reference cnn_dm/test.target --out test.hyp

This is ``BARTModel.from_pretrained(model_dir, checkpoint_file=...,
data_name_or_path=data, user_dir=<the plugin>, bpe=...)`` and ``sample()``
with the settings of fairseq's CNN/DailyMail recipe by default (beam 4,
lenpen 2.0, max_len_b 140, min_len 55, no_repeat_ngram_size 3; XSum: beam 6,
lenpen 1.0, max_len_b 60, min_len 10). The trigram blocking needs the
plugin's ``ngram_block`` patch (installed by the plugin import below): without
it fairseq's Python blocker blocks nothing. A missing checkpoint, data folder,
dictionary or BPE file is one line naming it. The hypotheses are written under a temporary
name and renamed when all are done; ``--reference`` adds OUT.rouge.json.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
USER_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "fairseq_dnas")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True, help="the folder of the checkpoint")
    p.add_argument("--checkpoint", default="checkpoint_best.pt", help="file name inside --model-dir")
    p.add_argument("--data", required=True, help="the binarized data folder (its dict.*.txt)")
    p.add_argument("--bpe", default="gpt2", choices=("gpt2", "sentencepiece"))
    p.add_argument("--gpt2-encoder-json", help="GPT-2 BPE encoder.json (--bpe gpt2)")
    p.add_argument("--gpt2-vocab-bpe", help="GPT-2 BPE vocab.bpe (--bpe gpt2)")
    p.add_argument("--sentencepiece-model", help="SentencePiece model (--bpe sentencepiece)")
    p.add_argument("--source", required=True, help="one article a line")
    p.add_argument("--reference", help="one reference summary a line: writes OUT.rouge.json")
    p.add_argument("--out", required=True, help="hypotheses, one a line")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--lenpen", type=float, default=2.0)
    p.add_argument("--max-len-b", type=int, default=140)
    p.add_argument("--min-len", type=int, default=55)
    p.add_argument("--no-repeat-ngram-size", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even when a GPU is there")
    p.add_argument("--fp16", action="store_true", help="half precision on the GPU")
    return p.parse_args(argv)


def bpe_kwargs(a):
    """from_pretrained's BPE keywords; a missing file or flag is one line."""
    if a.bpe == "gpt2":
        files = {"gpt2_encoder_json": a.gpt2_encoder_json, "gpt2_vocab_bpe": a.gpt2_vocab_bpe}
    else:
        files = {"sentencepiece_model": a.sentencepiece_model}
    for key, path in files.items():
        if not path:
            raise SystemExit(f"[summarize] error: --bpe {a.bpe} needs --{key.replace('_', '-')} PATH")
    return {"bpe": a.bpe, **files}


def main(argv=None):
    a = parse_args(argv)
    ckpt = os.path.join(a.model_dir, a.checkpoint)
    for path, what in ((ckpt, "checkpoint"), (a.source, "source file")):
        if not os.path.isfile(path):
            raise SystemExit(f"[summarize] error: {path}: no such {what}")
    if a.reference and not os.path.isfile(a.reference):
        raise SystemExit(f"[summarize] error: {a.reference}: no such reference file")
    if not os.path.isdir(a.data):
        raise SystemExit(f"[summarize] error: {a.data}: no such data folder (--data: the binarized data of the "
                         "fine-tuning, whose dict.source.txt / dict.target.txt the model was trained with)")
    kwargs = bpe_kwargs(a)
    import torch
    from fairseq.models.bart import BARTModel

    import fairseq_dnas.plugin  # noqa: F401  (fairseq skips a --user-dir whose package is already imported)
    from fairseq_dnas.errors import BadFile, BadFlag

    try:
        bart = BARTModel.from_pretrained(a.model_dir, checkpoint_file=a.checkpoint, data_name_or_path=a.data,
                                         user_dir=USER_DIR, **kwargs)
    except (BadFile, BadFlag) as err:
        raise SystemExit(f"[summarize] error: {err}") from None
    except FileNotFoundError as err:  # e.g. the data folder's dictionary
        raise SystemExit(f"[summarize] error: {err.filename}: no such file ({a.data} must hold the "
                         "dictionaries of the fine-tuning data)") from None
    bart.eval()
    if torch.cuda.is_available() and not a.cpu:
        bart = bart.cuda().half() if a.fp16 else bart.cuda()
    with open(a.source, encoding="utf-8") as f:
        sources = [line.strip() for line in f]
    settings = dict(beam=a.beam, lenpen=a.lenpen, max_len_b=a.max_len_b, min_len=a.min_len,
                    no_repeat_ngram_size=a.no_repeat_ngram_size)
    print(f"[summarize] {len(sources)} sources, {type(bart.model).__name__} "
          f"({getattr(bart.model.args, 'encoder_attention_scheme', 'unas')} encoder), {settings}", file=sys.stderr)
    hyps, t0 = [], time.time()
    with torch.no_grad():
        for i in range(0, len(sources), a.batch_size):
            hyps += bart.sample(sources[i:i + a.batch_size], **settings)
            print(f"[summarize] {len(hyps)}/{len(sources)} ({time.time() - t0:.0f} s)", file=sys.stderr)
    tmp = a.out + ".partial"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(" ".join(h.split()) + "\n" for h in hyps)
    os.replace(tmp, a.out)
    if a.reference:
        from fairseq_dnas.commands import rouge_eval

        return rouge_eval.main(["--hyp", a.out, "--ref", a.reference, "--json-out", a.out + ".rouge.json"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
