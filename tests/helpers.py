"""Shared helpers: build tiny fairseq models in-process, make tiny data, run CLIs."""

import os
import random
import subprocess
import sys
from pathlib import Path

import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.tasks.translation import TranslationTask

import fork_server

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
USER_DIR = os.path.join(ROOT, "fairseq_dnas")
BIN = os.path.dirname(sys.executable)  # fairseq-* console scripts of this venv

TINY = [
    "--encoder-layers", "2", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "2",
]
WORDS = [f"w{i}" for i in range(40)]


def tiny_args(arch, extra=()):
    # What --user-dir does, also when fairseq_dnas was imported before (then
    # fairseq's import_user_module only logs "already imported").
    import fairseq_dnas.plugin  # noqa: F401

    parser = options.get_training_parser()
    return options.parse_args_and_arch(
        parser, ["unused-data", "--arch", arch, "--user-dir", USER_DIR, *TINY, *extra]
    )


def tiny_dictionary():
    d = Dictionary()
    for w in WORDS:
        d.add_symbol(w)
    return d


def build_model(arch, extra=(), args=None):
    """A tiny model of ``arch`` in eval mode (dropout off unless asked for)."""
    args = args or tiny_args(arch, ["--dropout", "0", *extra])
    d = tiny_dictionary()
    task = TranslationTask(args, d, d)
    return task.build_model(args).eval()


def random_tokens(lengths, total, dictionary, left_pad=True, seed=0):
    """(B, T) source tokens ending in </s>, padded on the left or right."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), total), dictionary.pad(), dtype=torch.long)
    for b, n in enumerate(lengths):
        body = torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=g)
        row = torch.cat([body, torch.tensor([dictionary.eos()])])
        if left_pad:
            tokens[b, total - n:] = row
        else:
            tokens[b, :n] = row
    return tokens


def write_parallel_data(folder, sizes=(("train", 300), ("valid", 30), ("test", 25)), seed=0):
    """Tiny copy-the-first-words task in raw text: <split>.src / <split>.tgt."""
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    for split, n in sizes:
        with open(os.path.join(folder, f"{split}.src"), "w") as s, open(
            os.path.join(folder, f"{split}.tgt"), "w"
        ) as t:
            for _ in range(n):
                words = [rng.choice(WORDS[:20]) for _ in range(rng.randint(3, 12))]
                s.write(" ".join(words) + "\n")
                t.write(" ".join(words[:3]) + "\n")


def run(cmd, cwd=None, input=None, check=True, env=None):
    """Run a fairseq CLI (by name, from this venv), ``[sys.executable,
    script.py, ...]`` or ``[sys.executable, "-m", module, ...]`` and return
    the CompletedProcess. Both run in a fork of
    the test fork server (tests/fork_server.py: the imports paid once),
    unless FAIRSEQ_DNAS_TEST_FORK=0."""
    if not os.path.isabs(cmd[0]) and os.path.exists(os.path.join(BIN, cmd[0])):
        cmd = [os.path.join(BIN, cmd[0]), *cmd[1:]]
    cmd = [str(c) for c in cmd]
    env = {**os.environ, **(env or {})}
    if fork_server.ENABLED and os.path.dirname(cmd[0]) == BIN and os.path.basename(cmd[0]).startswith("fairseq-"):
        proc = fork_server.run(cmd[0], cmd[1:], cwd=cwd, input=input, env=env)
    elif fork_server.ENABLED and cmd[0] == sys.executable and len(cmd) > 1 and cmd[1].endswith(".py"):
        proc = fork_server.run(cmd[1], cmd[2:], cwd=cwd, input=input, env=env)
    elif fork_server.ENABLED and cmd[0] == sys.executable and len(cmd) > 2 and cmd[1] == "-m":
        proc = fork_server.run(cmd[2], cmd[3:], cwd=cwd, input=input, env=env, module=cmd[2])
    else:
        proc = subprocess.run(cmd, cwd=cwd, input=input, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def train_tiny_translation(root, prefix, archs=("transformer_tiny", "transformer_discrete_tiny")):
    """Binarize ``prefix``.{train,valid,test}.{src,tgt} (one joined
    dictionary) into root/bin and train each of ``archs`` one epoch on CPU:
    {'data': root/bin, 'ckpt': {arch: its checkpoint_last.pt}}."""
    root = Path(root)
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{prefix}train",
         "--validpref", f"{prefix}valid", "--testpref", f"{prefix}test", "--destdir", root / "bin",
         "--joined-dictionary", "--workers", "1"])
    ckpt = {}
    for arch in archs:
        run(["fairseq-train", root / "bin", "--arch", arch, "--user-dir", USER_DIR, "--cpu", "--optimizer", "adam",
             "--lr", "2e-3", "--max-tokens", "1000", "--max-epoch", "1", "--no-progress-bar", "--seed", "1",
             "--no-epoch-checkpoints", "--save-dir", root / arch])
        ckpt[arch] = root / arch / "checkpoint_last.pt"
    return {"data": root / "bin", "ckpt": ckpt}
