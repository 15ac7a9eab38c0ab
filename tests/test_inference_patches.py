"""The three fairseq patches for trustworthy evaluation
(fairseq_dnas/fairseq_patches: inference_batches, ngram_block,
restore_file), each against plain fairseq (its switch off) on a tiny
translation model trained for a few updates on CPU:

- every test sentence is generated and validated whatever
  ``--required-batch-size-multiple`` says (fairseq drops the last batch);
- ``--no-repeat-ngram-size`` / ``no_repeat_ngram_size`` blocks repeats in
  fairseq-generate and the hub's ``sample()`` (fairseq's Python fallback
  blocked nothing);
- a ``--restore-file`` naming a missing file is one line and exit status 1;
  the default ``checkpoint_last.pt`` still starts fresh, then resumes.
"""

import os
import re
from collections import Counter

import numpy
import pytest

from helpers import USER_DIR, run, write_parallel_data

OFF = {"inference_batches": {"FAIRSEQ_DNAS_PATCH_INFERENCE_BATCHES": "0"},
       "ngram_block": {"FAIRSEQ_DNAS_PATCH_NGRAM_BLOCK": "0"},
       "restore_file": {"FAIRSEQ_DNAS_PATCH_RESTORE_FILE": "0"}}
ENV = {"OMP_NUM_THREADS": "1"}
TRAIN = ["--arch", "transformer_tiny", "--user-dir", USER_DIR, "--cpu", "--optimizer", "adam", "--lr", "2e-3",
         "--batch-size", "16", "--no-progress-bar", "--seed", "1", "--no-epoch-checkpoints"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """21 test sentences, 5 valid ones; a transformer_tiny trained 3 updates."""
    root = tmp_path_factory.mktemp("inference")
    write_parallel_data(root / "raw", sizes=(("train", 48), ("valid", 5), ("test", 21)))
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", root / "raw/train",
         "--validpref", root / "raw/valid", "--testpref", root / "raw/test", "--destdir", root / "bin",
         "--joined-dictionary", "--workers", "1"])
    run(["fairseq-train", root / "bin", *TRAIN, "--max-update", "3", "--disable-validation",
         "--save-dir", root / "ckpt"], env=ENV)
    return {"root": root, "data": root / "bin", "ckpt": root / "ckpt" / "checkpoint_last.pt"}


def _generate(tiny, extra, env=None):
    proc = run(["fairseq-generate", tiny["data"], "--user-dir", USER_DIR, "--path", tiny["ckpt"], "--cpu",
                "--gen-subset", "test", *extra], env={**ENV, **(env or {})})
    return [line.split("\t")[2].split() for line in proc.stdout.splitlines() if line.startswith("H-")]


# --------------------------------------------------------- inference_batches

@pytest.mark.parametrize("patched", [True, pytest.param(False, marks=pytest.mark.full)], ids=["patched", "fairseq"])
def test_generate_writes_every_test_sentence_whatever_the_batch_multiple(tiny, patched):
    """21 sentences, --batch-size 16, fairseq's default multiple 8: fairseq
    writes 16 hypotheses (the batch of 5 is dropped) and exits 0."""
    hyps = _generate(tiny, ["--batch-size", "16", "--beam", "1"], env=None if patched else OFF["inference_batches"])
    assert len(hyps) == (21 if patched else 16)


@pytest.mark.full
def test_validate_scores_every_sentence(tiny):
    """fairseq-validate reports the sentences it scored (its 'bsz' is their sum)."""
    for env, wanted in ((None, 21), (OFF["inference_batches"], 16)):
        proc = run(["fairseq-validate", tiny["data"], "--user-dir", USER_DIR, "--path", tiny["ckpt"], "--cpu",
                    "--task", "translation", "--valid-subset", "test", "--batch-size", "16"], env={**ENV, **(env or {})})
        sentences = re.findall(r"\| bsz ([0-9.]+)", proc.stdout + proc.stderr)
        assert sentences and float(sentences[-1]) == wanted, (proc.stdout + proc.stderr)[-2000:]


@pytest.mark.full
def test_validation_inside_train_sees_the_last_batch(tiny, tmp_path):
    """5 validation sentences, --batch-size 16, multiple 8: fairseq's only
    validation batch (5 sentences) is dropped, so validation scores nothing."""
    for env, wanted in ((None, "5"), (OFF["inference_batches"], None)):
        save = tmp_path / ("on" if env is None else "off")
        proc = run(["fairseq-train", tiny["data"], *TRAIN, "--max-update", "1", "--save-dir", save],
                   env={**ENV, **(env or {})}, check=env is None)
        log = proc.stdout + proc.stderr
        valid = re.findall(r"valid on 'valid' subset .*?\| bsz ([0-9.]+)", log)
        if wanted is None:
            assert not valid, log[-2000:]
        else:
            assert valid and float(valid[-1]) == float(wanted), log[-2000:]


def test_training_batches_stay_fairseqs():
    """Outside an inference command fairseq's batch_by_size is unchanged (it
    drops the tail); inside, the tail comes back as one more batch."""
    from fairseq.data import data_utils

    from fairseq_dnas.fairseq_patches import install
    from fairseq_dnas.fairseq_patches.inference_batches import inference

    install(only=["inference_batches"])
    sizes = numpy.full(21, 4, dtype=numpy.int64)
    args = dict(num_tokens_fn=None, num_tokens_vec=sizes, max_sentences=16, required_batch_size_multiple=8)
    training = data_utils.batch_by_size(numpy.arange(21), **args)
    assert [len(b) for b in training] == [16]
    with inference():
        batches = data_utils.batch_by_size(iter(range(21)), **args)
    assert [len(b) for b in batches] == [16, 5]
    assert sorted(numpy.concatenate(batches).tolist()) == list(range(21))


# ---------------------------------------------------------------- ngram_block

def _repeated_bigrams(hyps):
    return sum(n - 1 for h in hyps for n in Counter(zip(h, h[1:])).values() if n > 1)


def test_the_blocker_bans_the_token_that_would_repeat_a_generated_ngram():
    """The beam search's buffer at step 3: bos, 5, 6, 5, then padding. With
    n = 2 the next 6 would repeat the bigram (5, 6): only it is banned.
    fairseq's fallback compares the buffer's padded end and bans nothing."""
    import torch
    from fairseq.ngram_repeat_block import NGramRepeatBlock

    from fairseq_dnas.fairseq_patches import install

    install(only=["ngram_block"])
    tokens = torch.tensor([[2, 5, 6, 5, 1, 1, 1, 1]])
    lprobs = torch.zeros(1, 10)
    NGramRepeatBlock(2, use_extension=False)(tokens, lprobs, bsz=1, beam_size=1, step=3)
    assert torch.isinf(lprobs[0]).nonzero().flatten().tolist() == [6]
    fairseq_lprobs = torch.zeros(1, 10)
    NGramRepeatBlock._no_repeat_ngram.__wrapped__(NGramRepeatBlock(2, use_extension=False), tokens,
                                                  fairseq_lprobs, 1, 1, 3)
    assert not torch.isinf(fairseq_lprobs).any()


@pytest.mark.parametrize("patched", [pytest.param(True, marks=pytest.mark.full),
                                     pytest.param(False, marks=pytest.mark.full)], ids=["patched", "fairseq"])
def test_no_repeat_ngram_size_blocks_repeats_in_fairseq_generate(tiny, patched):
    flags = ["--batch-size", "32", "--beam", "4", "--min-len", "12", "--max-len-b", "16"]
    env = None if patched else OFF["ngram_block"]
    plain = _repeated_bigrams(_generate(tiny, flags, env=env))
    blocked = _repeated_bigrams(_generate(tiny, [*flags, "--no-repeat-ngram-size", "2"], env=env))
    assert plain > 20  # a barely trained model repeats itself
    if patched:
        assert blocked == 0
    else:
        assert blocked == plain  # fairseq's fallback blocks nothing


@pytest.mark.full
def test_no_repeat_ngram_size_applies_in_the_hub_sample(tiny):
    """The hub's sample() (what examples/bart/summarize.py calls with
    no_repeat_ngram_size=3, fairseq's CNN/DailyMail setting)."""
    from fairseq.models.transformer import TransformerModel

    import fairseq_dnas.plugin  # noqa: F401

    hub = TransformerModel.from_pretrained(str(tiny["ckpt"].parent), checkpoint_file="checkpoint_last.pt",
                                           data_name_or_path=str(tiny["data"]), user_dir=USER_DIR,
                                           source_lang="src", target_lang="tgt").eval()
    with open(tiny["root"] / "raw" / "test.src") as f:
        sources = [line.strip() for line in f][:8]
    settings = dict(beam=4, min_len=12, max_len_b=16)
    plain = [h.split() for h in hub.sample(sources, **settings)]
    blocked = [h.split() for h in hub.sample(sources, no_repeat_ngram_size=3, **settings)]
    assert _repeated_bigrams(plain) > 5
    trigrams = [Counter(zip(h, h[1:], h[2:])) for h in blocked]
    assert all(n == 1 for c in trigrams for n in c.values())


# --------------------------------------------------------------- restore_file

def test_a_missing_restore_file_is_one_line(tiny, tmp_path):
    missing = tmp_path / "bart.large" / "model.pt"
    cmd = ["fairseq-train", tiny["data"], *TRAIN, "--max-update", "1", "--disable-validation",
           "--restore-file", missing, "--save-dir", tmp_path / "save"]
    proc = run(cmd, check=False, env=ENV)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {missing}: no such checkpoint (--restore-file)"), last
    assert not (tmp_path / "save" / "checkpoint_last.pt").exists()


@pytest.mark.full
def test_without_the_patch_fairseq_trains_from_scratch(tiny, tmp_path):
    proc = run(["fairseq-train", tiny["data"], *TRAIN, "--max-update", "1", "--disable-validation",
                "--restore-file", tmp_path / "missing.pt", "--save-dir", tmp_path / "save"],
               check=False, env={**ENV, **OFF["restore_file"]})
    assert proc.returncode == 0 and "No existing checkpoint found" in proc.stdout + proc.stderr


@pytest.mark.full
def test_the_default_restore_file_starts_fresh_then_resumes(tiny, tmp_path):
    cmd = ["fairseq-train", tiny["data"], *TRAIN, "--disable-validation", "--save-dir", tmp_path / "save"]
    first = run([*cmd, "--max-update", "1"], env=ENV)
    assert "No existing checkpoint found" in first.stdout + first.stderr
    second = run([*cmd, "--max-update", "2"], env=ENV)
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 1 updates\)",
                     second.stdout + second.stderr), (second.stdout + second.stderr)[-2000:]
