"""Interrupted training resumes exactly (issue 11, part 1).

examples/gigaword/train.sh on a tiny CPU model, killed with SIGKILL in the
middle of an epoch after a checkpoint_last.pt exists, then restarted with the
same command, must end with the same parameters (HNAS weights included) as the
same run left alone: bitwise. And a kill while checkpoint_last.pt is being
written must leave the previous checkpoint_last.pt loadable.
"""

import os
import signal
import sys
import subprocess
import textwrap

import pytest
import torch
from recipe_data import make_binarized

from helpers import ROOT

TRAIN = os.path.join(ROOT, "examples", "gigaword", "train.sh")
# 320 training pairs / 16 per update = 20 updates an epoch; checkpoints at
# updates 8, 16, 24 and at the end (30): the run crosses an epoch boundary,
# and the kill lands between checkpoints, inside epoch 1.
SETTINGS = {"SIZE": "tiny", "DEVICE": "cpu", "NPROC": "1", "CPU_THREADS": "1", "SEED": "3",
            "BATCH_SENTENCES": "16", "MAX_SENTENCES_PER_PROC": "16", "MAX_UPDATE": "30",
            "LR": "1e-3", "WARMUP_UPDATES": "4", "VALIDATE_INTERVAL_UPDATES": "8",
            "EVAL_ROUGE": "0", "LOG_INTERVAL": "1"}
# Smaller than SIZE=tiny (flags after train.sh override the preset); dropout
# stays on, so the random state matters.
SMALL = ["--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "32",
         "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
         "--encoder-attention-heads", "4", "--decoder-attention-heads", "2", "--dropout", "0.2"]
# A --user-dir plugin: the recipe's task, plus a SIGKILL of the training
# process once KILL_AT updates are done, once (a marker file remembers it), so
# that the restart is exactly the same command and the kill lands exactly
# where the test wants it (a timer would race a 60-updates-a-second model).
KILLER = textwrap.dedent('''
    import os, signal
    import fairseq_dnas  # noqa: F401  (models, translation_rouge, checkpoint fixes)
    from fairseq.tasks import register_task
    from fairseq_dnas.tasks.translation_rouge import TranslationRougeConfig, TranslationRougeTask

    @register_task("translation_rouge_killed_once", dataclass=TranslationRougeConfig)
    class KilledOnce(TranslationRougeTask):
        def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
            marker = os.environ.get("KILL_MARKER")
            if marker and update_num == int(os.environ["KILL_AT"]) and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
''')


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_binarized(str(tmp_path_factory.mktemp("resume_data")))


@pytest.fixture(scope="module")
def killer(tmp_path_factory):
    plugin = tmp_path_factory.mktemp("killer") / "killer_plugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text(KILLER)
    return str(plugin)


def _train(data, killer, arch, save_dir, kill_at=None):
    env = {**os.environ, **SETTINGS, "DATA": data, "ARCH": arch, "SAVE_DIR": str(save_dir),
           "USER_DIR": killer, "KILL_MARKER": "", "KILL_AT": str(kill_at)}
    if kill_at is not None:
        env["KILL_MARKER"] = str(save_dir) + ".killed"
    cmd = ["bash", TRAIN, *SMALL, "--task", "translation_rouge_killed_once"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _state(path):
    import fairseq_dnas  # noqa: F401  (fairseq checkpoints under torch >= 2.6)
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(str(path))


# DNAS: killed inside epoch 1 (checkpoint at 8); HNAS: inside epoch 2
# (checkpoint at 16, the data iterator restarts mid-epoch 2).
@pytest.mark.parametrize("arch,kill_at", [("transformer_dnas", 12), ("transformer_hnas", 21)])
def test_killed_run_resumes_to_the_same_parameters_bitwise(data, killer, tmp_path, arch, kill_at):
    alone = _train(data, killer, arch, tmp_path / "alone")
    assert alone.returncode == 0, (alone.stdout + alone.stderr)[-4000:]
    # The console (not a terminal here) shows the progress, a line every 5%
    # (LOG_INTERVAL=1: each of the 30 updates is a 3.3% step), and the
    # validations; fairseq's whole log is in train.log only.
    progress = [line for line in alone.stderr.splitlines() if line.startswith("[train] update ")]
    assert 15 <= len(progress) <= 30 and progress[-1].startswith("[train] update 30/30 (100%) loss "), \
        alone.stderr[-3000:]
    assert "[train] validation at update 8: loss " in alone.stderr
    assert "train_inner" not in alone.stdout + alone.stderr
    assert "num_updates=30" in (tmp_path / "alone" / "train.log").read_text()

    killed = _train(data, killer, arch, tmp_path / "killed", kill_at)
    assert killed.returncode != 0 and os.path.exists(str(tmp_path / "killed") + ".killed")
    saved_at = _state(tmp_path / "killed" / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"]
    assert saved_at == kill_at // 8 * 8, saved_at  # the last checkpoint before the kill
    resumed = _train(data, killer, arch, tmp_path / "killed", kill_at)  # the same command again
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    assert f"checkpoint_last.pt ({saved_at} of {SETTINGS['MAX_UPDATE']} updates)" in resumed.stderr

    a = _state(tmp_path / "alone" / "checkpoint_last.pt")
    b = _state(tmp_path / "killed" / "checkpoint_last.pt")
    for state in (a, b):
        assert state["optimizer_history"][-1]["num_updates"] == int(SETTINGS["MAX_UPDATE"])
    assert a["model"].keys() == b["model"].keys()
    hybrid = [name for name in a["model"] if "hybrid" in name]
    assert bool(hybrid) == (arch == "transformer_hnas"), hybrid
    largest = max((a["model"][n].double() - b["model"][n].double()).abs().max().item() for n in a["model"])
    print(f"\n{arch}: killed after {kill_at} updates (checkpoint_last.pt at {saved_at}), resumed to "
          f"{SETTINGS['MAX_UPDATE']}: {len(a['model'])} tensors ({len(hybrid)} hybrid-weight tensors), "
          f"largest difference to the uninterrupted run {largest:.3g}")
    different = [n for n in a["model"] if not torch.equal(a["model"][n], b["model"][n])]
    assert not different, f"{len(different)} tensors differ (largest {largest:.3g}): {different[:5]}"
    # The Adam moments and the learning-rate schedule too.
    opt_a, opt_b = a["last_optimizer_state"]["state"], b["last_optimizer_state"]["state"]
    assert opt_a.keys() == opt_b.keys()
    for key, moments in opt_a.items():
        for name, value in moments.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt_b[key][name])), (key, name)
    assert a["optimizer_history"][-1]["lr_scheduler_state"] == b["optimizer_history"][-1]["lr_scheduler_state"]


# Copies ``new`` over ``last`` with the PathManager that fairseq's
# save_checkpoint uses, and SIGKILLs itself when half of the bytes are written
# (whichever way the copy writes: os.sendfile or chunks through copyfileobj).
COPY_AND_DIE = textwrap.dedent('''
    import os, shutil, signal, sys
    new, last, which = sys.argv[1:]
    if which == "plugin":
        import fairseq_dnas  # noqa: F401  (installs the atomic copy)
    from fairseq import checkpoint_utils
    manager = checkpoint_utils.PathManager
    if which == "fairseq":
        manager = getattr(manager, "wrapped", manager)
    half = os.path.getsize(new) // 2

    def sendfile(out_fd, in_fd, offset, count):
        os.write(out_fd, os.pread(in_fd, half, 0))
        os.kill(os.getpid(), signal.SIGKILL)

    def copyfileobj(fin, fout, length=0):
        fout.write(fin.read(half))
        fout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    os.sendfile, shutil.copyfileobj = sendfile, copyfileobj
    manager.copy(new, last, overwrite=True)
''')


def _fake_checkpoint(path, num_updates):
    torch.save({"model": {"w": torch.arange(200_000, dtype=torch.float32) + num_updates},
                "optimizer_history": [{"num_updates": num_updates, "optimizer_name": "Adam",
                                       "lr_scheduler_state": {"best": None}}],
                "extra_state": {"train_iterator": {"epoch": 1}}, "args": None}, path)


@pytest.mark.parametrize("which", ["plugin", "fairseq"])
def test_kill_while_writing_checkpoint_last_keeps_the_previous_one(tmp_path, which):
    new, last = tmp_path / "checkpoint_2_16.pt", tmp_path / "checkpoint_last.pt"
    _fake_checkpoint(last, 8)
    _fake_checkpoint(new, 16)
    proc = subprocess.run([sys.executable, "-c", COPY_AND_DIE, str(new), str(last), which],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    if which == "fairseq":
        # What this guards against: fairseq's own in-place copy leaves half a file.
        assert last.stat().st_size < new.stat().st_size
        with pytest.raises(Exception):
            _state(last)
        return
    state = _state(last)  # the previous checkpoint, whole
    assert state["optimizer_history"][-1]["num_updates"] == 8
    assert torch.equal(state["model"]["w"], torch.arange(200_000, dtype=torch.float32) + 8)
