#!/usr/bin/env python
"""The CPU-scale check of the BART path, end to end: a small BART
denoising-pretrained on Gigaword articles (fairseq's ``denoising`` task, plain
softmax ``bart_base`` layers at a tiny size), then fine-tuned on the headlines
from that checkpoint (``--restore-file``) with a UNAS (``bart_base``), DNAS
(``bart_dnas_base``) or HNAS (``bart_hnas_base``) encoder, several seeds each,
ROUGE on the Gigaword test pairs with the project's scorer, and u per layer of
every HNAS model after fine-tuning.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python examples/bart/experiment.py \\
        --sumdata ../shared/data/gigaword/sumdata --out checkpoints/bart-cpu

Steps and what they leave in OUT (safe to re-run: a finished step is skipped):
  data/                 examples/gigaword/prepare.sh's output (SentencePiece, bin/)
  denoise/              the articles binarized for --task denoising
  pretrain/             the pretrained BART (checkpoint_last.pt, train.log)
  ft-ARCH-seedN/        fine-tuned model, test.hyp, rouge.json
  results.jsonl         one line per finished fine-tuning run
  table.md              mean +- s.e. over seeds, u per layer of HNAS

Everything runs in this one process with one thread (``--threads``), so
fairseq is imported once. Sizes are flags (the defaults are what the dated
record used); the time is dominated by the fine-tuning runs.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
USER_DIR = os.path.join(REPO, "fairseq_dnas")
ENCODERS = {"unas": "bart_base", "dnas": "bart_dnas_base", "hnas": "bart_hnas_base"}


def log(msg):
    print(f"[experiment {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def size_args(a):
    return ["--encoder-layers", str(a.layers), "--decoder-layers", str(a.layers),
            "--encoder-embed-dim", str(a.dim), "--decoder-embed-dim", str(a.dim),
            "--encoder-ffn-embed-dim", str(4 * a.dim), "--decoder-ffn-embed-dim", str(4 * a.dim),
            "--encoder-attention-heads", str(a.heads), "--decoder-attention-heads", str(a.heads),
            "--max-source-positions", "128", "--max-target-positions", "128"]


def fairseq_main(module, argv, logfile):
    """Run fairseq_cli.<module>.cli_main(argv) here, its log into logfile."""
    import importlib
    import logging

    from fairseq import checkpoint_utils

    if hasattr(checkpoint_utils.save_checkpoint, "best"):  # a fresh run must not inherit it
        del checkpoint_utils.save_checkpoint.best
    cli = importlib.import_module(f"fairseq_cli.{module}")
    handler = logging.FileHandler(logfile)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    sys.argv = [f"fairseq-{module}", *map(str, argv)]
    with open(logfile, "a") as f:
        print("# fairseq-" + module + " " + " ".join(shlex.quote(str(x)) for x in argv), file=f, flush=True)
    t0 = time.time()
    try:
        cli.cli_main()
    finally:
        root.removeHandler(handler)
        handler.close()
    return time.time() - t0


def prepare(a):
    data = os.path.join(a.out, "data")
    if not os.path.isfile(os.path.join(data, "bin", "dict.article.txt")):
        log("preparing Gigaword (examples/gigaword/prepare.sh)")
        env = {**os.environ, "PYTHON": sys.executable, "VOCAB_SIZE": str(a.vocab), "MAX_VALID_PAIRS": "200", "WORKERS": "1",
               "MAX_TRAIN_PAIRS": str(a.train_pairs), "MAX_TEST_PAIRS": str(a.test_pairs)}
        subprocess.run(["bash", os.path.join(REPO, "examples", "gigaword", "prepare.sh"), a.sumdata, data],
                       env=env, check=True)
    denoise = os.path.join(a.out, "denoise")
    # --only-source without a language writes train.{bin,idx} and dict.txt:
    # the layout the denoising task reads.
    if not os.path.isfile(os.path.join(denoise, "train.idx")):
        log("binarizing the articles for --task denoising")
        os.makedirs(denoise, exist_ok=True)
        fairseq_main("preprocess", ["--only-source", "--trainpref", f"{data}/spm/train.article",
                                    "--validpref", f"{data}/spm/valid.article",
                                    "--srcdict", f"{data}/bin/dict.article.txt", "--destdir", denoise,
                                    "--workers", "1"], os.path.join(denoise, "preprocess.log"))
    return data, denoise


def pretrain(a, denoise):
    save = os.path.join(a.out, "pretrain")
    done = os.path.join(save, "done")
    if os.path.exists(done):
        return os.path.join(save, "checkpoint_last.pt")
    os.makedirs(save, exist_ok=True)
    log(f"denoising pretraining: {a.pretrain_updates} updates")
    argv = [denoise, "--user-dir", USER_DIR, "--task", "denoising", "--arch", "bart_base", *size_args(a),
            "--tokens-per-sample", "128", "--sample-break-mode", "eos",
            "--mask", "0.3", "--mask-random", "0.1", "--mask-length", "span-poisson", "--poisson-lambda", "3.5",
            "--replace-length", "1", "--permute-sentences", "0", "--rotate", "0", "--insert", "0",
            "--criterion", "cross_entropy", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
            "--lr", "1e-3", "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(a.pretrain_updates // 10),
            "--total-num-update", str(a.pretrain_updates), "--max-update", str(a.pretrain_updates),
            "--batch-size", "64", "--dropout", "0.1", "--weight-decay", "0.01", "--clip-norm", "1.0",
            "--seed", "1", "--cpu", "--disable-validation", "--no-epoch-checkpoints", "--save-dir", save,
            "--log-format", "simple", "--log-interval", "50", "--num-workers", "0"]
    seconds = fairseq_main("train", argv, os.path.join(save, "train.log"))
    with open(done, "w") as f:
        f.write(f"{seconds:.0f}\n")
    return os.path.join(save, "checkpoint_last.pt")


def hnas_u(checkpoint):
    """u per encoder layer (mean over heads) from a checkpoint, or None."""
    import torch

    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)["model"]
    keys = sorted((k for k in state if k.endswith("self_attn.hybrid_logit") and k.startswith("encoder.")),
                  key=lambda k: int(k.split(".")[2]))
    if not keys:
        return None
    return [round(torch.sigmoid(state[k].float()).mean().item(), 4) for k in keys]


def finetune(a, data, pretrained, scheme, seed):
    arch = ENCODERS[scheme]
    save = os.path.join(a.out, f"ft-{scheme}-seed{seed}")
    os.makedirs(save, exist_ok=True)
    ckpt = os.path.join(save, "checkpoint_last.pt")
    if not os.path.exists(os.path.join(save, "done")):
        log(f"fine-tuning {arch} seed {seed}: {a.finetune_updates} updates from {pretrained}")
        hnas = ["--hybrid-init", str(a.hybrid_init)] if scheme == "hnas" else []
        argv = [f"{data}/bin", "--user-dir", USER_DIR, "--task", "translation", "-s", "article", "-t", "title",
                "--arch", arch, *size_args(a), *hnas, "--truncate-source",
                "--restore-file", pretrained, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
                "--reset-lr-scheduler",
                "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                "--optimizer", "adam", "--adam-betas", "(0.9, 0.999)", "--lr", "1e-3",
                "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(a.finetune_updates // 10),
                "--total-num-update", str(a.finetune_updates), "--max-update", str(a.finetune_updates),
                "--batch-size", "64", "--dropout", "0.1", "--attention-dropout", "0.1", "--weight-decay", "0.01",
                "--clip-norm", "1.0", "--seed", str(seed), "--cpu", "--disable-validation",
                "--no-epoch-checkpoints", "--save-dir", save, "--log-format", "simple", "--log-interval", "50",
                "--num-workers", "0", "--required-batch-size-multiple", "1"]
        seconds = fairseq_main("train", argv, os.path.join(save, "train.log"))
        with open(os.path.join(save, "done"), "w") as f:
            f.write(f"{seconds:.0f}\n")
    rouge = os.path.join(save, "rouge.json")
    if not os.path.exists(rouge):
        log(f"decoding the test pairs with {arch} seed {seed}")
        gen = os.path.join(save, "generate")
        fairseq_main("generate", [f"{data}/bin", "--user-dir", USER_DIR, "--task", "translation", "-s", "article",
                                  "-t", "title", "--path", ckpt, "--gen-subset", "test", "--beam", "4",
                                  "--lenpen", "1.0", "--max-len-a", "0", "--max-len-b", "63",
                                  "--no-repeat-ngram-size", "3", "--batch-size", "128",
                                  "--required-batch-size-multiple", "1", "--cpu", "--results-path", gen],
                     os.path.join(save, "generate.log"))
        subprocess.run([sys.executable, "-m", "fairseq_dnas.recipes.collect_hypotheses", "--generate-log",
                        f"{gen}/generate-test.txt", "--sources", f"{data}/spm/test.article", "--out",
                        f"{save}/test.hyp"], check=True)
        subprocess.run([sys.executable, "-m", "fairseq_dnas.commands.rouge_eval", "--hyp", f"{save}/test.hyp",
                        "--ref", f"{data}/raw/test.title", "--label", arch, "--json-out", rouge], check=True)
    with open(rouge) as f:
        score = json.load(f)
    with open(os.path.join(save, "done")) as f:
        seconds = int(f.read().split()[0])
    return {"scheme": scheme, "arch": arch, "seed": seed, "train_seconds": seconds,
            "rouge": score, "hnas_u": hnas_u(ckpt)}


def f1(result, kind):
    """ROUGE F1 (stemmed, percent) of one rouge_eval JSON."""
    r = result["rouge"]
    stemmed = r.get("stemmed", r)
    return stemmed[kind]["fmeasure"]["mean"] if isinstance(stemmed[kind], dict) else stemmed[kind]


def table(a, results):
    from fairseq_dnas.stats import mean_se

    lines = ["| encoder | arch | seeds | ROUGE-1 | ROUGE-2 | ROUGE-L |", "| --- | --- | --- | --- | --- | --- |"]
    for scheme, arch in ENCODERS.items():
        rows = [r for r in results if r["scheme"] == scheme]
        if not rows:
            continue
        cells = []
        for kind in ("rouge1", "rouge2", "rougeL"):
            m, se = mean_se([f1(r, kind) for r in rows])
            cells.append(f"{m:.2f} +- {se:.2f}")
        lines.append(f"| {scheme.upper()} | `{arch}` | {len(rows)} | " + " | ".join(cells) + " |")
    us = sorted((r for r in results if r["hnas_u"]), key=lambda r: r["seed"])
    if us:
        lines += ["", "u per encoder layer (mean over heads) after fine-tuning, HNAS from "
                  f"--hybrid-init {a.hybrid_init}:", ""]
        for r in us:
            lines.append(f"- seed {r['seed']}: " + ", ".join(f"L{i} {u:.4f}" for i, u in enumerate(r["hnas_u"])))
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sumdata", default=os.environ.get("GIGAWORD_DIR", ""), help="Gigaword sumdata folder")
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--schemes", nargs="+", default=list(ENCODERS), choices=list(ENCODERS))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--train-pairs", type=int, default=0, help="0: all")
    p.add_argument("--test-pairs", type=int, default=0, help="0: all 1,951")
    p.add_argument("--pretrain-updates", type=int, default=300)
    p.add_argument("--finetune-updates", type=int, default=200)
    p.add_argument("--hybrid-init", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--report-only", action="store_true")
    a = p.parse_args()
    if not a.report_only and not os.path.isdir(a.sumdata):
        sys.exit(f"[experiment] error: no Gigaword sumdata folder {a.sumdata!r} (pass --sumdata or set GIGAWORD_DIR)")
    os.makedirs(a.out, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch

    torch.set_num_threads(a.threads)
    import fairseq_dnas.plugin  # noqa: F401  (the architectures, and fairseq's patches)

    results_path = os.path.join(a.out, "results.jsonl")
    if not a.report_only:
        data, denoise = prepare(a)
        pretrained = pretrain(a, denoise)
        done = set()
        if os.path.exists(results_path):
            with open(results_path) as f:
                done = {(r["scheme"], r["seed"]) for r in map(json.loads, f)}
        for seed in a.seeds:
            for scheme in a.schemes:
                if (scheme, seed) in done:
                    continue
                result = finetune(a, data, pretrained, scheme, seed)
                with open(results_path, "a") as f:
                    f.write(json.dumps(result) + "\n")
                log(f"{scheme} seed {seed}: ROUGE-1/2/L {f1(result, 'rouge1'):.2f} / "
                    f"{f1(result, 'rouge2'):.2f} / {f1(result, 'rougeL'):.2f}")
    results = []
    if os.path.exists(results_path):
        with open(results_path) as f:
            results = [json.loads(line) for line in f]
    text = table(a, results)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
