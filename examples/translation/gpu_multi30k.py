#!/usr/bin/env python
"""Both Multi30k tables, trained to a stopping rule on one GPU, a table at a time.

    python examples/translation/gpu_multi30k.py prepare --size gpu     # on CPU, beforehand (about 2 minutes)
    python examples/translation/gpu_multi30k.py run --size gpu [--budget-s S] [--report DIR] [--continue-from DIR]
    python examples/translation/gpu_multi30k.py run --size gpu --dry-run   # the plan and every command
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

Planned for the time a command has (--budget-s): the runs of one pair are a
wave, run at once; a wave starts only when its worst case (every run to
MAX_UPDATE) fits in the time left, at the speed measured by this command's
runs, read from an earlier command's speed.json, or else the size's stated
assumption. While a wave runs, its projected end is recomputed from the
measured rate; when it would overrun the deadline, the wave's highest seed
is stopped (every model keeps the same number of seeds) so that the rest
finish. The en-de wave's analysis runs as soon as its runs are done.

Results as they come: after every change of a run's status, the report
folder (--report, else the work folder) holds runs.json (every run with its
status; every finished run with its figures), tables.md (the tables of what
finished), speed.json (what this command measured) and runs.tar.gz (every
run's logs and small result files, no checkpoints), each replaced
atomically, and driver.log, written line by line. A command killed at any
moment leaves a report that says exactly what finished.

Safe to re-run: every run has its own folder (WORK/<pair>/runs/<arch>-seed<N>),
a finished step is not redone, an interrupted training resumes from its last
checkpoint. --continue-from REPORT takes an earlier report (from another
machine): its finished runs are unpacked from runs.tar.gz and not redone,
and its speed.json plans this command. A run that fails (non-zero exit: out
of memory, fairseq's FloatingPointError on NaN; or a non-finite validation
loss) is reported in runs.json and on the console and left out of the tables.
"""

import argparse
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

EXAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(EXAMPLES)
NAME = "gpu_multi30k"
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
    log_interval: int  # updates between fairseq's progress lines (the speed is measured from them)
    faith_examples: int
    probe_words: int  # CoNLL-2000 training words for the probe
    tsne_words: int  # words in the t-SNE picture (Figure 6.2)
    device: str  # gpu | cpu
    jobs: int  # runs at once
    threads: int  # CPU threads per run
    budget_s: int  # the whole `run` command (default; --budget-s)
    reserve_s: int  # kept after the last wave for the tables
    # The plan's speed before this command or an earlier one has measured it (stated
    # assumptions, replaced by measured figures as soon as there are any):
    assumed: Dict[str, float] = field(default_factory=dict)


SIZES = {
    # 3 + 3 layers x 256 (train.sh's SIZE=small, 7.6M parameters), dropout
    # 0.3, label smoothing 0.1, 8,192 target tokens an update (73 updates
    # an epoch on the 29,000 pairs): at most 2,000 updates (27 epochs),
    # validation every 100 after the warmup, patience 5. 18 runs: two waves
    # (a pair each) of 9 at once. The assumed speed (before a measurement) is
    # explained in docs/results/2026-11-28-gpu-multi30k-plan.md.
    "gpu": Size(model="small", seeds=(1, 2, 3), max_train_pairs=0, max_valid_pairs=0, max_test_pairs=0,
                vocab=8000, conll_sentences=0, batch_tokens=8192, lr=1.5e-3, warmup=400, dropout=0.3,
                max_update=2000, validate=100, validate_after=400, patience=5, log_interval=25, faith_examples=500,
                probe_words=60000, tsne_words=1000,
                device="gpu", jobs=9, threads=1, budget_s=1800, reserve_s=15,
                assumed=dict(jobs=9, ms_per_update=100.0, validation_s=6.0, startup_s=20.0, translate_s=40.0,
                             faith_s=20.0, analysis_s=120.0)),
    # The CPU form: all six models, one seed, the thesis's classification
    # width (train.sh's SIZE=mini) on a slice, so that the test suite runs
    # the whole code path in minutes (80 updates: enough for the models to
    # end sentences, so that validation has a BLEU and beam search stops early).
    "tiny": Size(model="mini", seeds=(1,), max_train_pairs=600, max_valid_pairs=20, max_test_pairs=12,
                 vocab=1000, conll_sentences=200, batch_tokens=1024, lr=3e-3, warmup=20, dropout=0.1,
                 max_update=80, validate=20, validate_after=60, patience=1, log_interval=10, faith_examples=4,
                 probe_words=800, tsne_words=100,
                 device="cpu", jobs=3, threads=1, budget_s=900, reserve_s=15,
                 assumed=dict(jobs=2, ms_per_update=500.0, validation_s=4.0, startup_s=10.0, translate_s=12.0,
                              faith_s=10.0, analysis_s=150.0)),
}


class Fail(Exception):
    """A one-line error for the user; str() says what to change."""


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
        # Validation reads bin/ too, and nothing reads the vocabulary listing.
        for name in (f"text/train.{src}", f"text/train.{tgt}", f"spm/train.{src}", f"spm/train.{tgt}",
                     f"text/valid.{src}", f"text/valid.{tgt}", f"spm/valid.{src}", f"spm/valid.{tgt}",
                     "spm/sentencepiece.vocab"):
            if os.path.exists(os.path.join(out, name)):
                os.remove(os.path.join(out, name))
    for split in ("train", "test"):
        _conll_slice(os.path.join(conll, f"{split}.txt"), os.path.join(root, "conll2000", f"{split}.txt"),
                     size.conll_sentences)
    with open(os.path.join(root, "size.txt"), "w") as f:
        f.write(args.size + "\n")
    total = folder_bytes(root)
    say(f"ready: {root}, {total / 2**20:.1f} MiB: copy this folder with the repository to the GPU machine")
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
                   f"run scripts/install.sh (on a GPU machine without internet: install the wheels downloaded beforehand, "
                   f"examples/translation/README.md#converged-tables-on-one-gpu)")
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
                   f"first (on CPU), and copy that folder to this machine")
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
    work: str  # the work folder: runs.json names run folders relative to it
    status: str = "not started"  # ok | running | failed | stopped by the budget | stopped by the plan | not started
    reason: str = ""
    wall_s: float = 0.0
    step_s: Dict[str, float] = field(default_factory=dict)  # each step's wall time in this command
    stop_reason: str = ""  # set when the plan stops the run so that the others finish
    ran_here: bool = False  # started by this command (its logs measure this machine)
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
                                 VALIDATE_INTERVAL_UPDATES=str(size.validate), LOG_INTERVAL=str(size.log_interval),
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
                                steps, work))
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
    """Runs run's unfinished steps one after the other (a thread per run); sets status and reason,
    and each step's wall time (run.step_s, for the speed record)."""
    start = time.time()
    run.status = "running"
    os.makedirs(os.path.dirname(run.log), exist_ok=True)
    with open(run.log, "a") as log:
        for step in run.steps:
            if os.path.isfile(step.done):
                continue
            if run.stop_reason or stop.is_set() or time.time() >= deadline:
                run.status, run.reason = _stopped(run, f"before {step.name}")
                break
            log.write(f"[{NAME}] {step.name}: {' '.join(map(shlex.quote, step.command))}\n")
            log.flush()
            out = open(step.stdout + ".tmp", "w") if step.stdout else log
            step_start = time.time()
            run.proc = subprocess.Popen(step.command, env=dict(os.environ, **step.env), stdout=out, stderr=log,
                                        cwd=REPO, start_new_session=True)
            code = run.proc.wait()
            run.proc = None
            run.step_s[step.name] = round(time.time() - step_start, 1)
            if step.stdout:
                out.close()
                if code == 0:
                    os.replace(step.stdout + ".tmp", step.stdout)
            if run.stop_reason or stop.is_set() or (code != 0 and time.time() >= deadline):
                run.status, run.reason = _stopped(run, f"during {step.name}")
                break
            if code != 0:
                run.status, run.reason = "failed", f"{step.name} exited with status {code} (log: {run.log})"
                break
            if step.name == "train":
                if _finite_training(run):
                    run.status, run.reason = "failed", _finite_training(run)
                    break
                if run.arch == "transformer_hnas":  # u travels with the run's small files, not its checkpoint
                    from fairseq_dnas.loading import read_hybrid_weights

                    u = read_hybrid_weights(os.path.join(run.folder, "checkpoint_best.pt")).means
                    with open(os.path.join(run.folder, "u.json"), "w") as f:
                        json.dump([round(x, 4) for x in u], f)
        else:
            run.status = "ok"
    run.wall_s += time.time() - start


def _stopped(run, when):
    if run.stop_reason:
        return "stopped by the plan", f"{when}: {run.stop_reason}"
    return "stopped by the budget", when


def _stop(run):
    proc = run.proc
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------ speed and plan


@dataclass
class Speed:
    """What a run costs, for the plan: seconds and milliseconds on this machine with JOBS runs sharing it."""

    jobs: int  # runs sharing the device when ms_per_update was measured
    ms_per_update: float  # one training update of one run
    validation_s: float  # one validation (greedy BLEU) with its checkpoint writes
    startup_s: float  # fairseq-train's start before the first update
    translate_s: float  # one test set: generate.sh (fairseq's start, beam search, BLEU)
    faith_s: float  # the faithfulness metric of one en-de model
    analysis_s: float  # the CoNLL-2000 probe and pictures of the en-de wave
    source: str  # measured here | read from FILE | assumed

    def ms_at(self, jobs):
        """Per-run update time with JOBS runs sharing: slower with more, never assumed faster with fewer."""
        return self.ms_per_update * max(1.0, jobs / max(1, self.jobs))


SPEED_FIELDS = ("jobs", "ms_per_update", "validation_s", "startup_s", "translate_s", "faith_s", "analysis_s")


def assumed_speed(size):
    return Speed(source="assumed (no measurement yet)", **{k: size.assumed[k] for k in SPEED_FIELDS})


def read_speed(path, size):
    """An earlier command's speed.json (its measured figures; the rest assumed)."""
    prior = assumed_speed(size)
    data = json.load(open(path)).get("measured", {})
    if not data:
        return prior
    if data.get("size") != size.model:
        raise Fail(f"{path} was measured with SIZE={data.get('size')}, not {size.model}: pass the speed.json "
                   f"of this size, or none")
    values = {k: data.get(k, getattr(prior, k)) for k in SPEED_FIELDS}
    return Speed(source=f"measured by an earlier command ({path})", **values)


def n_validations(size):
    return max(0, (size.max_update - size.validate_after) // size.validate + 1)


def after_train_s(size, pair, speed):
    """The steps after training: beam search of the test sets, and for en-de the metric."""
    tests = len(TEST_SETS) if pair == "de-en" else 1
    return tests * speed.translate_s + (speed.faith_s if pair == "en-de" else 0.0)


def worst_run_s(size, pair, speed, jobs):
    """A run's wall time if it trains to MAX_UPDATE (patience can only make it shorter)."""
    return (speed.startup_s + size.max_update * speed.ms_at(jobs) / 1000 + n_validations(size) * speed.validation_s
            + after_train_s(size, pair, speed))


def worst_wave_s(size, pair, n_runs, speed):
    """A wave of N_RUNS runs of PAIR, SIZE.jobs at a time, and for en-de the analysis after it."""
    jobs = max(1, min(size.jobs, n_runs))
    rounds = math.ceil(n_runs / jobs)
    return rounds * worst_run_s(size, pair, speed, jobs) + (speed.analysis_s if pair == "en-de" else 0.0)


RECENT = 4  # log intervals that make "the rate now" of a run


def log_progress(folder):
    """What train.log says so far: updates, validations, the run's update time, each validation's
    seconds, the checkpoint writing seconds, and fairseq's own training time once it has finished.

    fairseq logs updates/s over each log interval. An interval after which no validation ran measures
    training alone: the median of those is the update time. An interval with a validation took longer by
    about that validation (with its checkpoint writes): its time less its updates at the pure rate."""
    path = os.path.join(folder, "train.log")
    out = {"updates": 0, "validations": 0, "ms_per_update": None, "recent_ms_per_update": None,
           "validation_s": [], "write_s": [], "intervals": 0, "train_s": None}
    if not os.path.isfile(path):
        return out
    intervals, last, validated = [], 0, False  # (seconds, updates, a validation ran in it)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if "train_inner" in line and "num_updates=" in line:
                m, n = re.search(r"\bups=([\d.]+)", line), re.search(r"\bnum_updates=(\d+)", line)
                if m and n and float(m.group(1)) > 0 and int(n.group(1)) > last:
                    count = int(n.group(1)) - last
                    intervals.append((count / float(m.group(1)), count, validated))
                if n:
                    last = max(last, int(n.group(1)))
                validated = False
            elif "begin validation on" in line:
                validated = True
            elif "valid on 'valid' subset" in line:
                out["validations"] += 1
                n = re.search(r"\| num_updates (\d+)", line)
                if n:
                    last = max(last, int(n.group(1)))
            elif "Saved checkpoint" in line:
                w = re.search(r"writing took ([\d.]+) seconds", line)
                if w:
                    out["write_s"].append(float(w.group(1)))
            elif "done training in" in line:
                t = re.search(r"done training in ([\d.]+) seconds", line)
                if t:
                    out["train_s"] = float(t.group(1))
    out["updates"], out["intervals"] = last, len(intervals)
    pure = [sec / count for sec, count, v in intervals[1:] if not v]  # the first holds the warm-up
    if pure:
        out["ms_per_update"] = 1000.0 * statistics.median(pure)
        # The rate now: while other runs start (CUDA contexts, data loading) the first minute is slower.
        out["recent_ms_per_update"] = 1000.0 * statistics.median(pure[-RECENT:])
        per = statistics.median(pure)
        out["validation_s"] = [max(0.0, sec - count * per) for sec, count, v in intervals[1:] if v]
    return out


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _translated_rate(folder):
    """Sentences per second of the beam searches (fairseq-generate's own 'Translated ...' line)."""
    rates = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith((".generate.err", ".generate.log")):
            for line in open(os.path.join(folder, name), encoding="utf-8", errors="replace"):
                m = re.search(r"Translated [\d,]+ sentences .*?\(([\d.]+) sentences/s", line)
                if m:
                    rates.append(float(m.group(1)))
    return rates


class Meter:
    """This command's measurements: the runs' logs and the driver's step timings, as Speed and as the
    record speed.json keeps them."""

    def __init__(self, size, prior):
        self.size, self.prior, self.jobs, self.analysis_s = size, prior, 0, None

    def note_sharing(self, active):
        self.jobs = max(self.jobs, len(active))

    def measured(self, runs):
        here = [r for r in runs if r.ran_here]
        progress = {r.name: log_progress(r.folder) for r in here}
        ms = _median([p["ms_per_update"] for p in progress.values()])
        val = _median([v for p in progress.values() for v in p["validation_s"]])
        # fairseq-train's start and end around its own "done training in" time
        startup = [max(0.0, r.step_s["train"] - progress[r.name]["train_s"]) for r in here
                   if "train" in r.step_s and progress[r.name]["train_s"] is not None]
        translate = _median([s for r in here for k, s in r.step_s.items() if k.startswith("translate")])
        faith = _median([r.step_s.get("faithfulness") for r in here])
        out = {"size": self.size.model, "jobs": self.jobs or None, "ms_per_update": ms, "validation_s": val,
               "startup_s": _median(startup), "translate_s": translate, "faith_s": faith,
               "analysis_s": self.analysis_s,
               "checkpoint_write_s": _median([w for p in progress.values() for w in p["write_s"]]),
               "sentences_per_s": _median([x for r in here for x in _translated_rate(r.folder)]),
               "runs_measured": sum(1 for p in progress.values() if p["ms_per_update"])}
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items() if v is not None}

    def speed(self, runs):
        """Measured figures where there are any, the prior's elsewhere."""
        got = self.measured(runs)
        if "ms_per_update" not in got:
            return self.prior
        values = {k: got.get(k, getattr(self.prior, k)) for k in SPEED_FIELDS}
        return Speed(source="measured by this command", **values)


def project_end(run, size, speed, jobs, now):
    """When RUN would end if it trains to MAX_UPDATE: at its own rate now (the median of its last log
    intervals without a validation) where it has one, else at SPEED with JOBS sharing."""
    p = log_progress(run.folder)
    ms = p["recent_ms_per_update"] or speed.ms_at(jobs)
    left_updates = max(0, size.max_update - p["updates"])
    left_valid = max(0, n_validations(size) - p["validations"])
    startup = speed.startup_s if p["updates"] == 0 else 0.0
    return now + startup + left_updates * ms / 1000 + left_valid * speed.validation_s + after_train_s(size, run.pair,
                                                                                                      speed)


def seed_to_stop(active, pending, size, speed, now, deadline):
    """(seed, why) when the measured speed says the running wave would end after the deadline: its
    highest seed, so that every model keeps as many seeds and the others finish; else (None, '').
    Only on a measured speed, and never the last seed."""
    if not speed.source.startswith("measured"):
        return None, ""
    training = [r for r in active if "train" not in r.step_s]
    ends = [project_end(r, size, speed, len(active), now) for r in training]
    seeds = sorted({r.seed for r in active + pending if not r.stop_reason})
    if not ends or max(ends) <= deadline or len(seeds) < 2:
        return None, ""
    return seeds[-1], (f"measured {speed.ms_per_update:.0f} ms an update with {speed.jobs} runs sharing: the wave "
                       f"would end {max(ends) - deadline:.0f} s after the deadline, so seed {seeds[-1]} of every "
                       f"model is stopped and the others finish")


def waves(runs):
    """The runs to do, a wave per pair, in the pairs' order."""
    out = []
    for pair in PAIRS:
        todo = [r for r in runs if r.pair == pair and r.status == "not started"]
        if todo:
            out.append((pair, todo))
    return out


def run_waves(args, size, runs, t0, budget_s, meter, report):
    """Each pair's runs as a wave, started only when the wave's worst case fits before the deadline;
    a running wave that would overrun it gives up its highest seed. Calls REPORT after every change."""
    deadline = t0 + budget_s - size.reserve_s
    stop = threading.Event()
    active = []

    def interrupted(signum, frame):  # Ctrl-C or a kill: stop every running step (each has its own session)
        stop.set()
        for r in active:
            _stop(r)
        for r in active:
            if r.thread.is_alive():
                r.thread.join(timeout=10)
            if r.status == "running":
                r.status, r.reason = "stopped by the budget", "interrupted"
        report("interrupted")
        say("interrupted: running steps stopped; run the same command again to resume")
        sys.exit(130)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    for pair, todo in waves(runs):
        speed = meter.speed(runs)
        need = worst_wave_s(size, pair, len(todo), speed)
        left = deadline - time.time()
        if need > left:
            why = (f"the {pair} wave needs up to {need:.0f} s at {speed.ms_at(min(size.jobs, len(todo))):.0f} ms "
                   f"an update ({speed.source}); {max(0, left):.0f} s were left")
            for r in todo:
                r.reason = why
            say(f"plan: not starting {len(todo)} {pair} runs: {why}")
            report(f"{pair} not started")
            continue
        say(f"plan: {pair} wave of {len(todo)} runs, up to {need:.0f} s ({speed.source}); {left:.0f} s left")
        pending, last_line, last_drop, last_archive = list(todo), 0.0, time.time(), time.time()
        while pending or active:
            changed = False
            for r in [r for r in active if not r.thread.is_alive()]:
                active.remove(r)
                changed = True
                say(f"{r.name}: {r.status}{' (' + r.reason + ')' if r.reason else ''}, {r.wall_s:.0f} s"
                    + (f", {train_summary(r.folder).get('updates', '?')} updates" if r.status == "ok" else ""))
            while pending and len(active) < size.jobs and not stop.is_set():
                r = pending.pop(0)
                if r.stop_reason:
                    r.status, r.reason = "stopped by the plan", f"before train: {r.stop_reason}"
                    continue
                r.ran_here, r.status = True, "running"
                r.thread = threading.Thread(target=execute, args=(r, deadline, stop), daemon=True)
                r.thread.start()
                active.append(r)
                changed = True
                say(f"{r.name}: started (log: {r.log})")
            meter.note_sharing(active)
            now = time.time()
            if now >= deadline and active and not stop.is_set():
                say(f"budget: deadline reached; stopping {len(active)} running runs")
                stop.set()
            if stop.is_set():
                for r in active:
                    _stop(r)
            elif now - last_drop >= 60 and active:  # the measured rate's projection, once a minute at most
                speed = meter.speed(runs)
                drop, why = seed_to_stop(active, pending, size, speed, now, deadline)
                if drop is not None:
                    say(f"plan: {why}")
                    for r in active + pending:
                        if r.seed == drop:
                            r.stop_reason = why
                            _stop(r)
                    changed = True
                last_drop = now
            if now - last_line >= 30 and active:
                last_line = now
                done = sum(r.status == "ok" for r in runs)
                ups = ", ".join(f"{r.arch}-s{r.seed} {log_progress(r.folder)['updates']}" for r in active)
                say(f"{now - t0:.0f} s: {done}/{len(runs)} runs ok, {len(active)} running ({ups} updates), "
                    f"{len(pending)} waiting; {max(0, deadline - now):.0f} s to the deadline")
            if changed or now - last_archive >= 60:
                last_archive = now
                report("progress")
            time.sleep(0.5)
        if pair == "en-de":
            analysis_start = time.time()
            analysis = stream_analysis(args, size, runs, t0, budget_s)
            if analysis == "ok":
                meter.analysis_s = round(time.time() - analysis_start, 1)
            args.analysis = analysis
            say(f"stream analysis: {analysis}")
            report("analysis")


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
           "wall_s": round(run.wall_s, 1), "folder": os.path.relpath(run.folder, run.work)}
    if run.step_s:
        out["step_s"] = dict(run.step_s)
    if run.status != "ok":
        out.update({k: v for k, v in log_progress(run.folder).items() if k in ("updates", "validations")})
        return out  # a run that did not finish has no figures for the tables
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
    u = os.path.join(run.folder, "u.json")
    if run.arch == "transformer_hnas" and os.path.isfile(u):
        out["u_per_layer"] = json.load(open(u))
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


def write_tables(args, size, runs, meta, meter=None, echo=False):
    """The report, written atomically each time: WORK/tables.md (the tables of the runs that finished,
    HNAS u, every run) and WORK/runs.json (every run with its status and, when it finished, its
    figures); in the report folder (--report, else WORK) also speed.json (what this command
    measured, for the next plan) and runs.tar.gz (every run's logs and small files, no checkpoints)."""
    from fairseq_dnas.analysis.files import atomic_path
    from fairseq_dnas.commands.bleu_table import table as bleu_table

    translation_table = _discrete_module("translation_table")

    work = work_root(args)
    figures = [run_figures(r) for r in runs]
    ok = [r for r in runs if r.status == "ok"]
    counts = {}
    for r in runs:
        counts[r.status] = counts.get(r.status, 0) + 1
    text = [f"# Multi30k, {args.size} size: {len(ok)} of {len(runs)} runs finished", "",
            "Runs: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) + ".", "",
            f"Stopping rule: {meta['stopping_rule']}. Runs that did not finish are listed at the end "
            "and left out of every table.", ""]
    pairs = {r.pair for r in runs}
    if "de-en" in pairs:
        de_en = [os.path.join(r.folder, f"{label}.bleu.json") for _, label in TEST_SETS for r in ok
                 if r.pair == "de-en"]
        text += ["## de-en: UNAS / DNAS / HNAS encoders", ""]
        text += ([bleu_table(de_en, PAIRS["de-en"][2])] if de_en else ["(no de-en run has finished)"]) + [""]
        text += hnas_table(figures) + [""]
    if "en-de" in pairs:
        view = _ok_view(work, "en-de", runs)
        text += ["## en-de: the thesis's Table 6.2 / 6.4 form (test2016)", ""]
        text += (translation_table.translation_table(view, "test2016") if any(r.pair == "en-de" for r in ok)
                 else ["(no en-de run has finished)"]) + [""]
        analysis = meta.get("stream_analysis", "not run")
        text += [f"CoNLL-2000 probe and Figure 6.2 / Table 6.3 (stream_analysis.py): {analysis}", ""]
        if analysis in ("ok", "done already"):  # a stopped analysis may have probed some models only
            text += translation_table.probe_table(view) + [""]
        if os.path.isfile(os.path.join(work, "en-de", "streams", "table63.md")):
            text += ["Figure 6.2 and Table 6.3: `en-de/streams/` (tsne-embeddings.png, table63.md).", ""]
    text += ["## Every run", ""] + runs_table(figures) + [""]
    speed = {}
    if meter is not None:
        speed = {"measured": meter.measured(runs), "plan_speed": meter.speed(runs).__dict__,
                 "device": meta.get("device", ""), "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        m = speed["measured"]
        if m.get("ms_per_update"):
            text += ["## Speed measured by this command", "",
                     f"{m['ms_per_update']:.0f} ms an update per run with {m.get('jobs')} runs sharing "
                     f"{meta.get('device', 'the device')}; a validation {m.get('validation_s', '-')} s "
                     f"(checkpoint writing {m.get('checkpoint_write_s', '-')} s of it); fairseq-train's start "
                     f"{m.get('startup_s', '-')} s; a test set's beam search {m.get('translate_s', '-')} s "
                     f"({m.get('sentences_per_s', '-')} sentences/s by fairseq's count): `speed.json`.", ""]
    meta = dict(meta, runs=figures, finished=len(ok), total=len(runs), speed=speed.get("measured", {}))
    report = args.report or work
    os.makedirs(report, exist_ok=True)
    # The archive and the speed first, runs.json last: when runs.json says a run finished, the archive
    # already holds its files, whenever the command is killed.
    with atomic_path(os.path.join(report, "runs.tar.gz")) as tmp:
        archive_runs(work, runs, tmp)
    if speed:
        with atomic_path(os.path.join(report, "speed.json")) as tmp:
            with open(tmp, "w") as f:
                json.dump(speed, f, indent=1)
    for folder in sorted({work, report}):
        os.makedirs(folder, exist_ok=True)
        with atomic_path(os.path.join(folder, "tables.md")) as tmp:
            with open(tmp, "w") as f:
                f.write("\n".join(text))
        with atomic_path(os.path.join(folder, "runs.json")) as tmp:
            with open(tmp, "w") as f:
                json.dump(meta, f, indent=1)
    if args.report:
        for name in ("table63.md", "tsne-embeddings.png", "probe.jsonl"):
            path = os.path.join(work, "en-de", "streams", name)
            if os.path.isfile(path):
                with atomic_path(os.path.join(args.report, name)) as tmp:
                    shutil.copy(path, tmp)
    if echo:
        print("\n".join(text), flush=True)
    return figures


def archive_runs(work, runs, path):
    """Every run's folder and log without checkpoints, relative to WORK, into the tar.gz PATH."""
    with tarfile.open(path, "w:gz") as tar:
        for r in runs:
            for top in (r.folder, r.log):
                if not os.path.exists(top):
                    continue
                names = ([top] if os.path.isfile(top) else
                         [os.path.join(top, n) for n in sorted(os.listdir(top))])
                for name in names:
                    if os.path.isfile(name) and not name.endswith((".pt", ".tmp")):
                        tar.add(name, arcname=os.path.relpath(name, work))
        log = os.path.join(work, "en-de", "logs", "stream_analysis.log")
        if os.path.isfile(log):
            tar.add(log, arcname=os.path.relpath(log, work))


def finished_in(report):
    """(pair, arch, seed) of the runs an earlier report lists as finished."""
    path = os.path.join(report, "runs.json")
    if not os.path.isfile(path):
        raise Fail(f"--continue-from {report}: no runs.json there (the --report folder of an earlier run)")
    return {(f["pair"], f["arch"], f["seed"]) for f in json.load(open(path)).get("runs", []) if f.get("status") == "ok"}


def continue_from(report, work, runs):
    """Unpacks the finished runs of an earlier report (REPORT/runs.json, REPORT/runs.tar.gz) into WORK,
    so that they are not redone; returns how many."""
    meta_path, archive = os.path.join(report, "runs.json"), os.path.join(report, "runs.tar.gz")
    if not (os.path.isfile(meta_path) and os.path.isfile(archive)):
        raise Fail(f"--continue-from {report}: no runs.json and runs.tar.gz there (the --report folder of an "
                   f"earlier run)")
    finished = finished_in(report)
    wanted = {os.path.relpath(r.folder, work): r for r in runs
              if (r.pair, r.arch, r.seed) in finished and not r.finished()}
    count = set()
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            top = os.path.dirname(member.name)
            if top in wanted and member.isfile():
                tar.extract(member, work, filter="data")
                count.add(top)
    return len([t for t in count if wanted[t].finished()])


# ------------------------------------------------------------ commands


def stopping_rule(size):
    return (f"validation BLEU (greedy) every {size.validate} updates of {size.batch_tokens} target tokens "
            f"from update {size.validate_after} on; "
            f"stop after {size.patience} validations without improvement or at {size.max_update} updates; "
            f"score the best checkpoint")


def load_status(runs, work):
    """Statuses of an earlier `run` (runs.json), for `table`; a run with every output is ok, one that was
    running when its command was killed is reported as interrupted."""
    path = os.path.join(work, "runs.json")
    meta = json.load(open(path)) if os.path.isfile(path) else {}
    old = {(f["pair"], f["arch"], f["seed"]): f for f in meta.get("runs", [])}
    for r in runs:
        f = old.get((r.pair, r.arch, r.seed), {})
        r.status, r.reason, r.wall_s = f.get("status", "not started"), f.get("reason", ""), f.get("wall_s", 0.0)
        if r.finished() and r.status != "failed":
            r.status = "ok"
        elif r.status == "running":
            r.status, r.reason = "stopped by the budget", "interrupted (its command was killed)"
    return {k: v for k, v in meta.items() if k not in ("runs", "finished", "total", "speed")}


class DriverLog:
    """The driver's own lines, also appended to REPORT/driver.log as they are said."""

    def __init__(self, path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.file = open(path, "a", buffering=1)

    def __call__(self, text):
        self.file.write(f"{time.strftime('%H:%M:%S')} [{NAME}] {text}\n")


_LOGS = []


def say(text):
    print(f"[{NAME}] {text}", file=sys.stderr, flush=True)
    for log in _LOGS:
        log(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("prepare", "run", "table"))
    p.add_argument("--size", choices=sorted(SIZES), default="gpu")
    p.add_argument("--data", help="prepared data (default data/gpu-multi30k/SIZE): the folder prepare writes")
    p.add_argument("--work", help="runs, logs and checkpoints (default checkpoints/gpu-multi30k/SIZE)")
    p.add_argument("--report", help="the report folder: runs.json, tables.md, speed.json, runs.tar.gz, driver.log "
                   "and the stream pictures, rewritten as runs finish (default: the work folder)")
    p.add_argument("--continue-from", metavar="REPORT", help="an earlier command's report folder: its finished runs "
                   "are not redone, its speed.json plans this command")
    p.add_argument("--speed", help="a speed.json to plan with (default: --continue-from's, else the size's "
                   "stated assumption)")
    p.add_argument("--models", help="only these, e.g. de-en:transformer,en-de:transformer_discrete "
                   "(default: all six; for trials and the tests)")
    p.add_argument("--budget-s", type=int, help="wall-clock budget of `run` in seconds (default: the size's)")
    p.add_argument("--jobs", type=int, help="runs at once (default: the size's)")
    p.add_argument("--dry-run", action="store_true", help="print the checks' result, the plan and every command; "
                   "run nothing")
    args = p.parse_args(argv)
    args.analysis = "not run"
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
        work = work_root(args)
        if args.command == "table":
            meta = load_status(runs, work)
            write_tables(args, size, runs, dict(meta, size=args.size, stopping_rule=stopping_rule(size)), echo=True)
            return 0
        speed_file = args.speed or (os.path.join(args.continue_from, "speed.json") if args.continue_from else None)
        prior = read_speed(speed_file, size) if speed_file and os.path.isfile(speed_file) else assumed_speed(size)
        if args.speed and not os.path.isfile(args.speed):
            raise Fail(f"--speed {args.speed}: no such file")
        try:
            device = check_device(size)
        except Fail as err:
            if not args.dry_run:
                raise
            device = f"(here: {err}; a real run stops at this check)"
        if not args.dry_run:
            _LOGS.append(DriverLog(os.path.join(args.report or work, "driver.log")))
        if args.continue_from and not args.dry_run:
            say(f"--continue-from {args.continue_from}: {continue_from(args.continue_from, work, runs)} "
                f"finished runs taken from it")
        carried = finished_in(args.continue_from) if args.continue_from and args.dry_run else set()
        for r in runs:
            r.status = "ok" if r.finished() or (r.pair, r.arch, r.seed) in carried else "not started"
        todo = [r for r in runs if r.status != "ok"]
        say(f"{args.size}: {len(runs)} runs ({len(runs) - len(todo)} finished already), up to {size.jobs} at once "
            f"on {device}, budget {budget_s} s; stopping rule: {stopping_rule(size)}")
        if args.dry_run:
            left = budget_s - size.reserve_s
            for pair, wave in waves(runs):
                need = worst_wave_s(size, pair, len(wave), prior)
                fits = need <= left
                say(f"plan: {pair} wave of {len(wave)} runs, up to {need:.0f} s at {prior.ms_at(len(wave)):.0f} ms "
                    f"an update ({prior.source}): {'starts' if fits else 'does not start'} with {left:.0f} s left")
                left -= need if fits else 0
            for r in todo:
                for s in r.steps:
                    if not os.path.isfile(s.done):
                        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(s.env.items()))
                        print(f"# {r.name}: {s.name}\n{env} {' '.join(map(shlex.quote, s.command))}"
                              + (f" > {s.stdout}" if s.stdout else ""))
            return 0
        meter = Meter(size, prior)

        def meta():
            return {"size": args.size, "device": device, "settings": size.__dict__,
                    "stopping_rule": stopping_rule(size), "budget_s": budget_s, "started": time.strftime(
                        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)), "elapsed_s": round(time.time() - t0, 1),
                    "stream_analysis": args.analysis}

        def report(event):
            try:
                write_tables(args, size, runs, meta(), meter)
            except Exception as err:  # a report that fails must not stop the runs; said, and tried again later
                say(f"report not written ({event}): {type(err).__name__}: {err}")

        report("start")
        run_waves(args, size, runs, t0, budget_s, meter, report)
        write_tables(args, size, runs, meta(), meter, echo=True)
        bad = [r for r in runs if r.status != "ok"]
        for r in bad:
            say(f"NOT IN THE TABLES: {r.name}: {r.status}{' (' + r.reason + ')' if r.reason else ''}")
        analysis_ok = args.analysis in ("ok", "done already") or not any(r.pair == "en-de" for r in runs)
        if not analysis_ok:
            say(f"NOT IN THE TABLES: the probe and Figure 6.2 / Table 6.3 ({args.analysis})")
        say(f"{len(runs) - len(bad)}/{len(runs)} runs in the tables, {time.time() - t0:.0f} s; "
            f"report: {args.report or work} (tables.md, runs.json, speed.json, runs.tar.gz)")
        return 0 if not bad and analysis_ok else 3
    except Fail as err:
        print(f"[{NAME}] error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
