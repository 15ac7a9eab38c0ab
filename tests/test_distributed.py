"""Data-parallel training on CPU: examples/gigaword/train.sh with NPROC=2
starts two processes under torchrun (gloo). Each rank must train on different
batches, and both must hold identical parameters after every update."""

import json
import os
import subprocess
import textwrap

import torch
from recipe_data import make_binarized

from helpers import ROOT

# A --user-dir plugin that wraps the recipe's task and records, per rank, the
# sample ids of every training step and the parameters at every validation.
PROBE = textwrap.dedent('''
    import json, os
    import torch
    import fairseq_dnas.plugin  # noqa: F401  (models and translation_rouge)
    from fairseq.tasks import register_task
    from fairseq_dnas.tasks.translation_rouge import TranslationRougeConfig, TranslationRougeTask

    OUT = os.environ["PROBE_DIR"]

    def flat(model):
        return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])

    @register_task("translation_rouge_probe", dataclass=TranslationRougeConfig)
    class Probe(TranslationRougeTask):
        def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
            rank = torch.distributed.get_rank()
            with open(f"{OUT}/rank{rank}.steps", "a") as f:
                f.write(json.dumps({"update": update_num, "ids": sample["id"].tolist(),
                                    "params": flat(model).sum().item(),
                                    "world": torch.distributed.get_world_size()}) + "\\n")
            if update_num == 0:
                torch.save(flat(model), f"{OUT}/rank{rank}.init.pt")
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

        def begin_valid_epoch(self, epoch, model):
            super().begin_valid_epoch(epoch, model)
            torch.save(flat(model), f"{OUT}/rank{torch.distributed.get_rank()}.final.pt")
''')


def _steps(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_two_cpu_processes_see_different_batches_and_stay_identical(tmp_path):
    data = make_binarized(str(tmp_path / "data"))
    plugin = tmp_path / "probe_plugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text(PROBE)
    probe = tmp_path / "probe"
    probe.mkdir()
    env = {**os.environ, "PROBE_DIR": str(probe), "USER_DIR": str(plugin), "DATA": data,
           "ARCH": "transformer_dnas", "SIZE": "tiny", "DEVICE": "cpu", "NPROC": "2",
           "BATCH_SENTENCES": "32", "MAX_UPDATE": "8", "LR": "1e-3", "WARMUP_UPDATES": "2",
           "EVAL_ROUGE": "1", "EVAL_ROUGE_SENTENCES": "0", "LOG_INTERVAL": "1",
           "VALIDATE_INTERVAL_UPDATES": "100", "SAVE_DIR": str(tmp_path / "ckpt")}
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "examples/gigaword/train.sh"), "--task", "translation_rouge_probe"],
        env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "16 sentences x 2 x update-freq 1 = 32 per update" in out
    out = (tmp_path / "ckpt" / "train.log").read_text()  # fairseq's log (the console shows progress)
    assert "bsz=32" in out  # fairseq sums the two ranks' batches in its logs
    assert "rouge1" in out  # validation ROUGE summed over both ranks

    rank0, rank1 = _steps(probe / "rank0.steps"), _steps(probe / "rank1.steps")
    assert [s["update"] for s in rank0] == [s["update"] for s in rank1] == list(range(8))
    assert all(s["world"] == 2 for s in rank0 + rank1)
    for a, b in zip(rank0, rank1):
        assert a["ids"] and b["ids"] and not set(a["ids"]) & set(b["ids"]), (a, b)
        assert a["params"] == b["params"]  # identical parameters before every update
    seen = [i for s in rank0 + rank1 for i in s["ids"]]
    assert len(seen) == len(set(seen)) == 8 * 32  # no sentence twice within the epoch

    init0, final0 = torch.load(probe / "rank0.init.pt"), torch.load(probe / "rank0.final.pt")
    final1 = torch.load(probe / "rank1.final.pt")
    assert torch.equal(final0, final1)
    assert not torch.equal(init0, final0)  # training did change them

    # Re-running a finished training is safe: it is skipped, not extended.
    # (fairseq itself would resume, take one update past --max-update and
    # validate and save again.)
    steps_before = len(_steps(probe / "rank0.steps"))
    last = tmp_path / "ckpt" / "checkpoint_last.pt"
    mtime = last.stat().st_mtime_ns
    again = subprocess.run(
        ["bash", os.path.join(ROOT, "examples/gigaword/train.sh"), "--task", "translation_rouge_probe"],
        env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert "has 8 updates (MAX_UPDATE=8): training is done, skipping" in again.stderr
    assert len(_steps(probe / "rank0.steps")) == steps_before
    assert last.stat().st_mtime_ns == mtime
