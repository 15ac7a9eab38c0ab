#!/usr/bin/env python
"""Both Multi30k tables, trained to a stopping rule, in one command on one GPU.

    python examples/translation/gpu_multi30k.py prepare --size gpu     # on CPU, beforehand (about 2 minutes)
    python examples/translation/gpu_multi30k.py run --size gpu [--dry-run] [--report DIR]
    python examples/translation/gpu_multi30k.py table --size gpu [--report DIR]
    python examples/translation/gpu_multi30k.py run --size tiny        # the same code path on CPU, a few minutes

Two tables, every model with the same recipe (examples/translation/train.sh
and generate.sh, one run per architecture and seed):

- de-en, UNAS / DNAS / HNAS encoders (transformer, transformer_dnas,
  transformer_hnas): sacreBLEU BLEU and chrF on test2016 and test2017
  (fairseq_dnas/commands/bleu_table.py), and u per layer of HNAS;
- en-de, the thesis's Table 6.2 / 6.4 form (transformer,
  transformer_discrete_single, transformer_discrete): BLEU, Kendall's tau of
  the encoder self-attention and of the cross-attention
  (fairseq_dnas/commands/translation_faithfulness.py), the CoNLL-2000 probe
  per stream and Figure 6.2 / Table 6.3 (examples/discrete/stream_analysis.py),
  written by examples/discrete/translation_table.py.

Stopping rule, the same for every model: validation (greedy BLEU on the
1,014 validation pairs) every VALIDATE updates; training stops when
validation BLEU has not improved for PATIENCE validations (fairseq's
--patience) or at MAX_UPDATE updates; the checkpoint with the best validation
BLEU is scored. runs.json records the updates each run took and why it stopped.

Safe to re-run: every run has its own folder (WORK/<pair>/runs/<arch>-seed<N>),
a finished step is not redone, an interrupted training resumes from its last
checkpoint. A run that fails (non-zero exit: out of memory, fairseq's
FloatingPointError on NaN; or a non-finite validation loss) or that the wall
budget stops is reported in runs.json and on the console and left out of
the tables. --budget-s bounds the whole command: no run starts when too
little time is left, running steps are stopped at the training deadline,
and the analysis and tables use what finished.
"""

import argparse
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

EXAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(EXAMPLES)
NAME = "gpu_multi30k"
CARRY_LIMIT = 64 * 2**20  # what the lent GPU machine's `carry` takes in all
TEST_SETS = (("test", "test2016"), ("test1", "test2017"))  # fairseq's subset name, the file name
PAIRS = {  # pair: (source, target, architectures)
    "de-en": ("de", "en", ("transformer", "transformer_dnas", "transformer_hnas")),
    "en-de": ("en", "de", ("transformer", "transformer_discrete_single", "transformer_discrete")),
}


@dataclass(frozen=True)
class Size:
    """One size of the experiment: data slice, model, schedule, stopping rule, budget."""

    model: str  # train.sh's SIZE
    seeds: tuple
    max_train_pairs: int  # 0: all 29,000
    max_valid_pairs: int  # 0: all 1,014
    max_test_pairs: int  # 0: all 1,000
    vocab: int
    conll_sentences: int  # CoNLL-2000 sentences carried (0: all)
    batch_tokens: int
    lr: float
    warmup: int
    dropout: float
    max_update: int
    validate: int  # updates between validations
    validate_after: int  # no validation before (fairseq's --validate-after-updates; see plan())
    patience: int  # validations without a better validation BLEU
    faith_examples: int
    probe_words: int  # CoNLL-2000 training words for the probe
    tsne_words: int  # words in the t-SNE picture (Figure 6.2)
    device: str  # gpu | cpu
    jobs: int  # runs at once
    threads: int  # CPU threads per run
    budget_s: int  # the whole `run` command
    reserve_s: int  # kept for the analysis and tables after the training deadline
    min_start_s: int  # a run starts only with this much time left before the deadline


SIZES = {
    # 3 + 3 layers x 256 (train.sh's SIZE=small, 7.6M parameters), dropout
    # 0.3, label smoothing 0.1, 8,192 target tokens an update (73 updates
    # an epoch on the 29,000 pairs): at most 2,000 updates (27 epochs),
    # validation every 100 after the warmup, patience 5. 18 runs, 9 at once.
    # Why this budget fits 8 minutes: docs/results/2026-11-28-gpu-multi30k-plan.md.
    "gpu": Size(model="small", seeds=(1, 2, 3), max_train_pairs=0, max_valid_pairs=0, max_test_pairs=0,
                vocab=8000, conll_sentences=0, batch_tokens=8192, lr=1.5e-3, warmup=400, dropout=0.3,
                max_update=2000, validate=100, validate_after=400, patience=5, faith_examples=500,
                probe_words=60000, tsne_words=1000,
                device="gpu", jobs=9, threads=1, budget_s=450, reserve_s=120, min_start_s=120),
    # The CPU form: all six models, one seed, the thesis's classification
    # width (train.sh's SIZE=mini) on a slice, so that the test suite runs
    # the whole code path in minutes (80 updates: enough for the models to
    # end sentences, so that validation has a BLEU and beam search stops early).
    "tiny": Size(model="mini", seeds=(1,), max_train_pairs=600, max_valid_pairs=20, max_test_pairs=12,
                 vocab=1000, conll_sentences=200, batch_tokens=1024, lr=3e-3, warmup=20, dropout=0.1,
                 max_update=80, validate=20, validate_after=60, patience=1, faith_examples=4,
                 probe_words=800, tsne_words=100,
                 device="cpu", jobs=2, threads=1, budget_s=900, reserve_s=120, min_start_s=10),
}


class Fail(Exception):
    """A one-line error for the user; str() says what to change."""


def say(text):
    print(f"[{NAME}] {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------ layout


def data_root(args):
    return os.path.abspath(args.data or os.path.join(REPO, "data", "gpu-multi30k", args.size))


def work_root(args):
    return os.path.abspath(args.work or os.path.join(REPO, "checkpoints", "gpu-multi30k", args.size))


def python_path():
    """This checkout first, then what PYTHONPATH holds (on the GPU machine: the wheels in /tmp/site)."""
    return os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


# ------------------------------------------------------------ prepare


def _conll_slice(src, dst, sentences):
    """The first SENTENCES sentences (blank-line separated) of src into dst (0: all)."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(src, encoding="utf-8") as f:
        text = f.read()
    if sentences:
        text = "\n\n".join(text.strip("\n").split("\n\n")[:sentences]) + "\n\n"
    with open(dst + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(dst + ".tmp", dst)


def prepare(args, size):
    multi30k, conll = os.environ.get("MULTI30K_DIR", ""), os.environ.get("CONLL2000_DIR", "")
    if not os.path.isdir(os.path.join(multi30k, "raw")):
        raise Fail(f"MULTI30K_DIR='{multi30k}' has no raw/ folder: set it to the Multi30k folder")
    if not os.path.isfile(os.path.join(conll, "train.txt")):
        raise Fail(f"CONLL2000_DIR='{conll}' has no train.txt: set it to the CoNLL-2000 folder")
    root = data_root(args)
    for pair in selected(args):
        src, tgt, _ = PAIRS[pair]
        out = os.path.join(root, pair)
        if os.path.isfile(os.path.join(out, "bin", f"dict.{src}.txt")) and not os.path.exists(
                os.path.join(out, "text", f"train.{src}")):
            say(f"prepare {pair}: done already ({out})")
            continue
        say(f"prepare {pair} into {out}")
        env = dict(os.environ, SRC=src, TGT=tgt, VOCAB_SIZE=str(size.vocab),
                   MAX_TRAIN_PAIRS=str(size.max_train_pairs), MAX_VALID_PAIRS=str(size.max_valid_pairs),
                   MAX_TEST_PAIRS=str(size.max_test_pairs))
        if subprocess.call(["bash", os.path.join(EXAMPLES, "translation", "prepare.sh"), out], env=env) != 0:
            raise Fail(f"examples/translation/prepare.sh failed for {pair} (its message is above)")
        # The training text and pieces are in bin/ now; the GPU command reads bin/, the test
        # sets' pieces and references, and the SentencePiece model: the rest is not carried.
        for name in (f"text/train.{src}", f"text/train.{tgt}", f"spm/train.{src}", f"spm/train.{tgt}"):
            os.remove(os.path.join(out, name))
    for split in ("train", "test"):
        _conll_slice(os.path.join(conll, f"{split}.txt"), os.path.join(root, "conll2000", f"{split}.txt"),
                     size.conll_sentences)
    with open(os.path.join(root, "size.txt"), "w") as f:
        f.write(args.size + "\n")
    total = folder_bytes(root)
    say(f"ready: {root}, {total / 2**20:.1f} MiB (the GPU machine's carry takes 64 MiB in all)")
    if total > CARRY_LIMIT:
        raise Fail(f"{root} is {total / 2**20:.1f} MiB, more than the 64 MiB a GPU command can carry")
    return 0


# ------------------------------------------------------------ checks


def check_device(size):
    """Fails with one line unless this Python can run the size: fairseq and the recipes' other
    modules (examples/check_python.py), and for gpu CUDA and Triton."""
    python = shutil.which(os.environ.get("PYTHON", sys.executable)) or os.environ["PYTHON"]
    try:
        check = subprocess.run([python, os.path.join(EXAMPLES, "check_python.py")], capture_output=True, text=True)
    except OSError as err:
        raise Fail(f"PYTHON={python} cannot run ({err.strerror}): set PYTHON to an interpreter path")
    if check.returncode != 0:
        raise Fail(f"{python} lacks what the recipes need ({check.stdout.strip() or check.stderr.strip()[-200:]}): "
                   f"on the GPU machine install the wheels (downloaded into .whl as examples/translation/README.md shows, carry .whl, "
                   f"begin the command with its install line); elsewhere run scripts/install.sh")
    os.environ["FAIRSEQ_DNAS_CHECKED_PYTHON"] = python  # every step's check_python: done once, here
    if size.device != "gpu":
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        raise Fail("no CUDA device (torch.cuda.is_available() is False): --size gpu needs a GPU; "
                   "--size tiny runs on CPU")
    try:
        import triton  # noqa: F401
    except ImportError as err:
        raise Fail(f"triton is not importable ({err}): the DNAS/HNAS kernels need it on the GPU")
    return torch.cuda.get_device_name(0)


def check_data(args):
    """Fails with one line unless prepare has written what every step reads."""
    root = data_root(args)
    size_file = os.path.join(root, "size.txt")
    if not os.path.isfile(size_file):
        raise Fail(f"no prepared data in {root}: run "
                   f"'python examples/translation/gpu_multi30k.py prepare --size {args.size}' "
                   f"first (on CPU), and carry that folder")
    prepared = open(size_file).read().strip()
    if prepared != args.size:
        raise Fail(f"{root} was prepared for --size {prepared}, not {args.size}: prepare it again")
    pairs = selected(args)
    needed = [os.path.join(root, "conll2000", "train.txt")] if "en-de" in pairs else []
    for pair in pairs:
        src, tgt, _ = PAIRS[pair]
        needed += [os.path.join(root, pair, "bin", f"dict.{src}.txt"),
                   os.path.join(root, pair, "spm", "sentencepiece.model")]
        for subset, _ in TEST_SETS:
            needed += [os.path.join(root, pair, "spm", f"{subset}.{src}"),
                       os.path.join(root, pair, "text", f"{subset}.{tgt}")]
    missing = [p for p in needed if not os.path.isfile(p)]
    if missing:
        raise Fail(f"prepared data incomplete: {missing[0]} is missing ({len(missing)} files): run prepare again")


# ------------------------------------------------------------ the runs


@dataclass
class Step:
    name: str
    command: List[str]
    env: Dict[str, str]
    done: str  # the file whose presence means the step is finished
    stdout: Optional[str] = None  # a step whose stdout is its result: written as .tmp, renamed when it succeeds


@dataclass
class Run:
    pair: str
    arch: str
    seed: int
    folder: str
    log: str
    steps: List[Step]
    status: str = "not started"  # ok | failed | stopped by the budget | not started
    reason: str = ""
    wall_s: float = 0.0
    proc: Optional[subprocess.Popen] = field(default=None, repr=False)

    @property
    def name(self):
        return f"{self.pair} {self.arch} seed {self.seed}"

    def finished(self):
        return all(os.path.isfile(s.done) for s in self.steps)


def selected(args):
    """{pair: architectures} that --models names (default: both tables, every model)."""
    if not args.models:
        return {pair: archs for pair, (_, _, archs) in PAIRS.items()}
    out = {}
    for item in args.models.split(","):
        pair, _, arch = item.partition(":")
        if pair not in PAIRS or arch not in PAIRS[pair][2]:
            raise Fail(f"--models {item}: not one of " + ", ".join(f"{p}:{a}" for p, (_, _, archs) in PAIRS.items()
                                                                    for a in archs))
        out.setdefault(pair, []).append(arch)
    return out


def plan(args, size):
    data, work = data_root(args), work_root(args)
    python = shutil.which(os.environ.get("PYTHON", sys.executable)) or os.environ["PYTHON"]
    base = {"PYTHON": python, "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": str(size.threads), "DEVICE": size.device, "PROGRESS": "0"}
    runs = []
    for pair, archs in selected(args).items():
        src, tgt, _ = PAIRS[pair]
        for arch in archs:
            for seed in size.seeds:
                folder = os.path.join(work, pair, "runs", f"{arch}-seed{seed}")
                common = dict(base, SRC=src, TGT=tgt)
                train_env = dict(common, DATA=os.path.join(data, pair, "bin"), ARCH=arch, SEED=str(seed),
                                 SIZE=size.model, DROPOUT=str(size.dropout), LR=str(size.lr),
                                 WARMUP_UPDATES=str(size.warmup), BATCH_TOKENS=str(size.batch_tokens),
                                 MAX_TOKENS_PER_PROC=str(size.batch_tokens), MAX_UPDATE=str(size.max_update),
                                 VALIDATE_INTERVAL_UPDATES=str(size.validate), LOG_INTERVAL="50",
                                 SAVE_DIR=folder, NPROC="1", CPU_THREADS=str(size.threads))
                # No validation during the warmup: a model that still ends every
                # sentence at once gives fairseq no BLEU to compare (KeyError 'bleu').
                steps = [Step("train", ["bash", os.path.join(EXAMPLES, "translation", "train.sh"),
                                        "--patience", str(size.patience),
                                        "--validate-after-updates", str(size.validate_after)],
                              train_env, os.path.join(folder, "done"))]
                checkpoint = os.path.join(folder, "checkpoint_best.pt")
                test_sets = TEST_SETS if pair == "de-en" else TEST_SETS[:1]
                for subset, label in test_sets:
                    env = dict(common, DATA=os.path.join(data, pair), CHECKPOINT=checkpoint, SUBSET=subset,
                               OUT_PREFIX=os.path.join(folder, label), LABEL=arch)
                    steps.append(Step(f"translate {label}",
                                      ["bash", os.path.join(EXAMPLES, "translation", "generate.sh")],
                                      env, os.path.join(folder, f"{label}.bleu.json")))
                if pair == "en-de":  # the thesis's metric, on test2016 (as table62.sh)
                    steps.append(Step("faithfulness", [
                        base["PYTHON"], "-m", "fairseq_dnas.commands.translation_faithfulness", checkpoint,
                        "--data", os.path.join(data, pair, "bin"), "--subset", "test", "--beam", "5",
                        "--max-examples", str(size.faith_examples), "--labels", f"{arch}-seed{seed}",
                        "--threads", str(size.threads), "--json", os.path.join(folder, "faithfulness.jsonl")],
                        dict(common, PYTHONPATH=python_path()), os.path.join(folder, "faithfulness.json"),
                        stdout=os.path.join(folder, "faithfulness.json")))
                runs.append(Run(pair, arch, seed, folder, os.path.join(work, pair, "logs", f"{arch}-seed{seed}.log"),
                                steps))
    return runs


def train_summary(folder):
    """Updates taken, why training stopped, best validation BLEU, last validation loss (from train.log)."""
    path = os.path.join(folder, "train.log")
    if not os.path.isfile(path):
        return {}
    text = open(path, encoding="utf-8", errors="replace").read()
    valid = [l for l in text.splitlines() if "| valid on 'valid' subset" in l]
    out = {"validations": len(valid),
           "stopped_by": "patience" if "early stop since valid performance hasn't improved" in text else "max_update"}
    updates = re.findall(r"num_updates (\d+)", text)
    if updates:
        out["updates"] = int(updates[-1])
    if valid:
        loss, best = re.search(r"\| loss ([^ |]+)", valid[-1]), re.search(r"best_bleu ([^ |]+)", valid[-1])
        out["last_valid_loss"] = float(loss.group(1)) if loss else None
        out["best_valid_bleu"] = float(best.group(1)) if best else None
    return out


def _finite_training(run):
    """'' if the last validation loss is finite, else why not (fp16 can end with a NaN and exit 0)."""
    loss = train_summary(run.folder).get("last_valid_loss")
    return "" if loss is not None and math.isfinite(loss) else f"validation loss is {loss} (see {run.folder}/train.log)"


def execute(run, deadline, stop):
    """Runs run's unfinished steps one after the other (a thread per run); sets status and reason."""
    start = time.time()
    os.makedirs(os.path.dirname(run.log), exist_ok=True)
    with open(run.log, "a") as log:
        for step in run.steps:
            if os.path.isfile(step.done):
                continue
            if stop.is_set() or time.time() >= deadline:
                run.status, run.reason = "stopped by the budget", f"before {step.name}"
                break
            log.write(f"[{NAME}] {step.name}: {' '.join(map(shlex.quote, step.command))}\n")
            log.flush()
            out = open(step.stdout + ".tmp", "w") if step.stdout else log
            run.proc = subprocess.Popen(step.command, env=dict(os.environ, **step.env), stdout=out, stderr=log,
                                        cwd=REPO, start_new_session=True)
            code = run.proc.wait()
            run.proc = None
            if step.stdout:
                out.close()
                if code == 0:
                    os.replace(step.stdout + ".tmp", step.stdout)
            if stop.is_set() or (code != 0 and time.time() >= deadline):
                run.status, run.reason = "stopped by the budget", f"during {step.name}"
                break
            if code != 0:
                run.status, run.reason = "failed", f"{step.name} exited with status {code} (log: {run.log})"
                break
            if step.name == "train" and _finite_training(run):
                run.status, run.reason = "failed", _finite_training(run)
                break
        else:
            run.status = "ok"
    run.wall_s += time.time() - start


def _stop(run):
    proc = run.proc
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def run_all(runs, size, t0, budget_s):
    """Runs SIZE.jobs runs at once until all are done or the training deadline; prints progress."""
    deadline = t0 + budget_s - size.reserve_s
    stop = threading.Event()
    pending = [r for r in runs if r.status == "not started"]
    active = []

    def interrupted(signum, frame):  # Ctrl-C or a kill: stop every running step (each has its own session)
        stop.set()
        for r in active:
            _stop(r)
        say("interrupted: running steps stopped; run the same command again to resume")
        sys.exit(130)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    last_line = 0.0
    while pending or active:
        for r in [r for r in active if not r.thread.is_alive()]:
            active.remove(r)
            say(f"{r.name}: {r.status}{' (' + r.reason + ')' if r.reason else ''}, {r.wall_s:.0f} s"
                + (f", {train_summary(r.folder).get('updates', '?')} updates" if r.status == "ok" else ""))
        while pending and len(active) < size.jobs:
            if time.time() + size.min_start_s > deadline:
                for r in pending:
                    r.reason = f"fewer than {size.min_start_s} s were left before the training deadline"
                say(f"budget: {len(pending)} runs not started ({', '.join(r.name for r in pending)})")
                pending = []
                break
            r = pending.pop(0)
            r.thread = threading.Thread(target=execute, args=(r, deadline, stop), daemon=True)
            r.thread.start()
            active.append(r)
            say(f"{r.name}: started (log: {r.log})")
        if time.time() >= deadline and active and not stop.is_set():
            say(f"budget: training deadline reached; stopping {len(active)} running runs")
            stop.set()
        if stop.is_set():
            for r in active:
                _stop(r)
        if time.time() - last_line >= 30 and active:
            last_line = time.time()
            done = sum(r.status == "ok" for r in runs)
            say(f"{time.time() - t0:.0f} s: {done}/{len(runs)} runs ok, {len(active)} running, "
                f"{len(pending)} waiting; {max(0, deadline - time.time()):.0f} s to the training deadline")
        time.sleep(0.5)


# ------------------------------------------------------------ analysis and tables


def _ok_view(work, pair, runs):
    """WORK/<pair>/table-view/runs/: links to the runs that finished (and streams/), so that the
    tables read those and nothing else (a failed or stopped run may have left files behind)."""
    view = os.path.join(work, pair, "table-view")
    shutil.rmtree(view, ignore_errors=True)
    os.makedirs(os.path.join(view, "runs"))
    for r in runs:
        if r.pair == pair and r.status == "ok":
            os.symlink(r.folder, os.path.join(view, "runs", os.path.basename(r.folder)))
    streams = os.path.join(work, pair, "streams")
    if os.path.isdir(streams):
        os.symlink(streams, os.path.join(view, "streams"))
    return view


def stream_analysis(args, size, runs, t0, budget_s):
    """The CoNLL-2000 probe and Figure 6.2 / Table 6.3 of the en-de models that finished."""
    data, work = data_root(args), work_root(args)
    ok = [r for r in runs if r.pair == "en-de" and r.status == "ok"]
    if not ok:
        return "no en-de run finished"
    out = os.path.join(work, "en-de", "streams")
    models = [f"{r.arch}-seed{r.seed}={r.folder}/checkpoint_best.pt" for r in ok]
    stamp = os.path.join(out, "models.txt")
    if os.path.isfile(stamp) and open(stamp).read() == "\n".join(models):
        return "done already"
    left = t0 + budget_s - time.time() - 15  # the tables need a few seconds
    if left < 20:
        return f"not run: {left + 15:.0f} s of the budget left"
    pictures = []
    for r in ok:
        if f"{r.arch}-seed" not in ",".join(pictures):
            pictures.append(f"{r.arch}-seed{r.seed}")  # the first seed that finished, per architecture
    cmd = [os.environ.get("PYTHON", sys.executable), os.path.join(EXAMPLES, "discrete", "stream_analysis.py"),
           "--conll", os.path.join(data, "conll2000"), "--data", os.path.join(data, "en-de", "bin"),
           "--spm", os.path.join(data, "en-de", "spm", "sentencepiece.model"), "--out", out,
           "--max-train-words", str(size.probe_words), "--tsne-words", str(size.tsne_words),
           "--threads", str(min(8, os.cpu_count() or 1)),
           "--pictures-of", ",".join(pictures)] + models
    say(f"stream analysis of {len(ok)} en-de encoders on CoNLL-2000 -> {out}")
    log = os.path.join(work, "en-de", "logs", "stream_analysis.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                env=dict(os.environ, PYTHONPATH=python_path()))
        try:
            code = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            return f"stopped by the budget after {left:.0f} s (log: {log})"
    if code != 0:
        return f"failed with status {code} (log: {log})"
    with open(stamp, "w") as f:
        f.write("\n".join(models))
    return "ok"


def run_figures(run):
    """One run's figures for runs.json."""
    out = {"pair": run.pair, "arch": run.arch, "seed": run.seed, "status": run.status, "reason": run.reason,
           "wall_s": round(run.wall_s, 1), "folder": run.folder}
    out.update(train_summary(run.folder))
    for _, label in TEST_SETS:
        path = os.path.join(run.folder, f"{label}.bleu.json")
        if os.path.isfile(path):
            r = json.load(open(path))
            out[label] = {m: {"score": r[m]["score"], "signature": r[m]["signature"]} for m in ("bleu", "chrf")}
    faith = os.path.join(run.folder, "faithfulness.json")
    if os.path.isfile(faith):
        lines = [json.loads(l) for l in open(faith) if l.startswith("{")]
        if lines:
            out["faithfulness"] = {k: lines[-1][k] for k in ("encoder", "cross") if k in lines[-1]}
    if run.arch == "transformer_hnas" and os.path.isfile(os.path.join(run.folder, "checkpoint_best.pt")):
        from fairseq_dnas.loading import read_hybrid_weights

        out["u_per_layer"] = [round(u, 4) for u in read_hybrid_weights(os.path.join(run.folder,
                                                                                   "checkpoint_best.pt")).means]
    return out


def hnas_table(figures):
    from fairseq_dnas.stats import mean_se_cell

    rows = [f["u_per_layer"] for f in figures if f["status"] == "ok" and "u_per_layer" in f]
    if not rows:
        return []
    lines = ["| HNAS encoder layer | seeds | u (mean over heads) |", "| --- | --- | --- |"]
    for layer in range(len(rows[0])):
        lines.append(f"| {layer + 1} | {len(rows)} | {mean_se_cell([r[layer] for r in rows], 3, '+-')} |")
    return lines


def runs_table(figures):
    lines = ["| pair | model | seed | status | updates | stopped by | best valid BLEU | wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in figures:
        status = f["status"] + (f" ({f['reason']})" if f["reason"] else "")
        lines.append(f"| {f['pair']} | {f['arch']} | {f['seed']} | {status} | {f.get('updates', '')} "
                     f"| {f.get('stopped_by', '') if f['status'] == 'ok' else ''} | {f.get('best_valid_bleu', '')} "
                     f"| {f['wall_s']:.0f} |")
    return lines


def _discrete_module(name):
    """examples/discrete/NAME.py as a module (a script folder, not a package: loaded by path,
    leaving sys.path alone)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, "discrete", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_tables(args, size, runs, meta):
    """WORK/tables.md (both tables, HNAS u, the runs) and WORK/runs.json; copies them to --report."""
    from fairseq_dnas.analysis.files import atomic_path
    from fairseq_dnas.commands.bleu_table import table as bleu_table

    translation_table = _discrete_module("translation_table")

    work = work_root(args)
    figures = [run_figures(r) for r in runs]
    ok = [r for r in runs if r.status == "ok"]
    text = [f"# Multi30k, {args.size} size: {len(ok)} of {len(runs)} runs finished", "",
            f"Stopping rule: {meta['stopping_rule']}. Runs that failed or did not finish are listed "
            "at the end and left out of every table.", ""]
    pairs = {r.pair for r in runs}
    if "de-en" in pairs:
        de_en = [os.path.join(r.folder, f"{label}.bleu.json") for _, label in TEST_SETS for r in ok
                 if r.pair == "de-en"]
        text += ["## de-en: UNAS / DNAS / HNAS encoders", ""]
        text += ([bleu_table(de_en, PAIRS["de-en"][2])] if de_en else ["(no de-en run finished)"]) + [""]
        text += hnas_table(figures) + [""]
    if "en-de" in pairs:
        view = _ok_view(work, "en-de", runs)
        text += ["## en-de: the thesis's Table 6.2 / 6.4 form (test2016)", ""]
        text += translation_table.translation_table(view, "test2016") + [""]
        analysis = meta.get("stream_analysis", "not run")
        text += [f"CoNLL-2000 probe and Figure 6.2 / Table 6.3 (stream_analysis.py): {analysis}", ""]
        if analysis in ("ok", "done already"):  # a stopped analysis may have probed some models only
            text += translation_table.probe_table(view) + [""]
        if os.path.isfile(os.path.join(work, "en-de", "streams", "table63.md")):
            text += ["Figure 6.2 and Table 6.3: `en-de/streams/` (tsne-embeddings.png, table63.md).", ""]
    text += ["## Every run", ""] + runs_table(figures) + [""]
    meta = dict(meta, runs=figures, finished=len(ok), total=len(runs))
    for folder in [work] + ([args.report] if args.report else []):
        os.makedirs(folder, exist_ok=True)
        with atomic_path(os.path.join(folder, "tables.md")) as tmp:
            open(tmp, "w").write("\n".join(text))
        with atomic_path(os.path.join(folder, "runs.json")) as tmp:
            json.dump(meta, open(tmp, "w"), indent=1)
    if args.report:
        for name in ("table63.md", "tsne-embeddings.png", "probe.jsonl"):
            path = os.path.join(work, "en-de", "streams", name)
            if os.path.isfile(path):
                shutil.copy(path, os.path.join(args.report, name))
    print("\n".join(text))
    return figures


# ------------------------------------------------------------ commands


def stopping_rule(size):
    return (f"validation BLEU (greedy) every {size.validate} updates of {size.batch_tokens} target tokens "
            f"from update {size.validate_after} on; "
            f"stop after {size.patience} validations without improvement or at {size.max_update} updates; "
            f"score the best checkpoint")


def load_status(runs, work):
    """Statuses of an earlier `run` (runs.json), for `table`; a run with every output is ok."""
    path = os.path.join(work, "runs.json")
    meta = json.load(open(path)) if os.path.isfile(path) else {}
    old = {(f["pair"], f["arch"], f["seed"]): f for f in meta.get("runs", [])}
    for r in runs:
        f = old.get((r.pair, r.arch, r.seed), {})
        r.status, r.reason, r.wall_s = f.get("status", "not started"), f.get("reason", ""), f.get("wall_s", 0.0)
        if r.finished() and r.status != "failed":
            r.status = "ok"
    return {k: v for k, v in meta.items() if k not in ("runs", "finished", "total")}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("prepare", "run", "table"))
    p.add_argument("--size", choices=sorted(SIZES), default="gpu")
    p.add_argument("--data", help="prepared data (default data/gpu-multi30k/SIZE): the folder to carry")
    p.add_argument("--work", help="runs, logs and tables (default checkpoints/gpu-multi30k/SIZE)")
    p.add_argument("--report", help="also copy tables.md, runs.json and the stream pictures here (e.g. $OUT)")
    p.add_argument("--models", help="only these, e.g. de-en:transformer,en-de:transformer_discrete "
                   "(default: all six; for trials and the tests)")
    p.add_argument("--budget-s", type=int, help="wall-clock budget of `run` in seconds (default: the size's)")
    p.add_argument("--jobs", type=int, help="runs at once (default: the size's)")
    p.add_argument("--dry-run", action="store_true", help="print the checks' result and every command; run nothing")
    args = p.parse_args(argv)
    size = SIZES[args.size]
    if args.jobs:
        size = Size(**dict(size.__dict__, jobs=args.jobs))
    budget_s = args.budget_s or size.budget_s
    t0 = time.time()
    try:
        if args.command == "prepare":
            return prepare(args, size)
        check_data(args)
        runs = plan(args, size)
        if args.command == "table":
            meta = load_status(runs, work_root(args))
            write_tables(args, size, runs, dict(meta, size=args.size, stopping_rule=stopping_rule(size)))
            return 0
        try:
            device = check_device(size)
        except Fail as err:
            if not args.dry_run:
                raise
            device = f"(here: {err}; a real run stops at this check)"
        todo = [r for r in runs if not r.finished()]
        say(f"{args.size}: {len(runs)} runs ({len(runs) - len(todo)} finished already), {size.jobs} at once on "
            f"{device}, budget {budget_s} s; stopping rule: {stopping_rule(size)}")
        if args.dry_run:
            for r in todo:
                for s in r.steps:
                    if not os.path.isfile(s.done):
                        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(s.env.items()))
                        print(f"# {r.name}: {s.name}\n{env} {' '.join(map(shlex.quote, s.command))}"
                              + (f" > {s.stdout}" if s.stdout else ""))
            return 0
        for r in runs:
            r.status = "ok" if r.finished() else "not started"
        run_all(runs, size, t0, budget_s)
        analysis = stream_analysis(args, size, runs, t0, budget_s)
        say(f"stream analysis: {analysis}")
        meta = {"size": args.size, "device": device, "settings": size.__dict__, "stopping_rule": stopping_rule(size),
                "budget_s": budget_s, "elapsed_s": round(time.time() - t0, 1), "stream_analysis": analysis}
        write_tables(args, size, runs, meta)
        bad = [r for r in runs if r.status != "ok"]
        for r in bad:
            say(f"NOT IN THE TABLES: {r.name}: {r.status}{' (' + r.reason + ')' if r.reason else ''}")
        analysis_ok = analysis in ("ok", "done already") or not any(r.pair == "en-de" for r in runs)
        if not analysis_ok:
            say(f"NOT IN THE TABLES: the probe and Figure 6.2 / Table 6.3 ({analysis})")
        say(f"{len(runs) - len(bad)}/{len(runs)} runs in the tables, {time.time() - t0:.0f} s; "
            f"tables: {work_root(args)}/tables.md, every figure: runs.json")
        return 0 if not bad and analysis_ok else 3
    except Fail as err:
        print(f"[{NAME}] error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
