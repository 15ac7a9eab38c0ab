"""ROUGE during validation: the ``translation_rouge`` task (--eval-rouge)."""

import os
import sys

import pytest
from fairseq import checkpoint_utils, metrics, options, tasks
from recipe_data import make_binarized

import fairseq_dnas.plugin  # noqa: F401  (registers the task; torch.load fix for checkpoints)
from helpers import ROOT, TINY, USER_DIR, run

from fairseq_dnas.commands import rouge_eval
from fairseq_dnas.recipes import collect_hypotheses

GEN_ARGS = '{"beam": 2, "max_len_a": 0, "max_len_b": 8}'


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_binarized(str(tmp_path_factory.mktemp("rouge_data")))


def _task_and_model(data, extra):
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data, "--user-dir", USER_DIR, "--task", "translation_rouge", "--arch", "transformer_hnas",
        *TINY, "--eval-rouge", "--eval-rouge-args", GEN_ARGS,
        "--eval-rouge-remove-bpe", "sentencepiece", *extra])
    task = tasks.setup_task(args)
    task.load_dataset("valid")
    model = task.build_model(args).eval()
    return task, model, task.build_criterion(args)


def _valid_logs(task, model, criterion, batch_size):
    itr = task.get_batch_iterator(dataset=task.dataset("valid"), max_sentences=batch_size,
                                  required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
    return [task.valid_step(sample, model, criterion)[2] for sample in itr]


def test_only_the_first_n_validation_pairs_are_decoded_whatever_the_batching(data):
    task, model, criterion = _task_and_model(data, ["--eval-rouge-max-sentences", "7"])
    for batch_size in (4, 13):
        logs = _valid_logs(task, model, criterion, batch_size)
        assert sum(log["_rouge_n"] for log in logs) == 7
        # every batch carries the keys (workers sum them key by key)
        assert all({"_rouge_n", "_rouge1_sum", "_rouge2_sum", "_rougeL_sum"} <= set(log) for log in logs)


def test_logged_rouge_is_the_mean_over_all_batches_and_workers(data):
    task, model, criterion = _task_and_model(data, [])
    logs = _valid_logs(task, model, criterion, 8)
    n = sum(log["_rouge_n"] for log in logs)
    assert n == 30
    # Split the batches between two "workers": fairseq hands reduce_metrics
    # the logging outputs of every worker.
    with metrics.aggregate() as agg:
        task.reduce_metrics(logs[:2], criterion)
        task.reduce_metrics(logs[2:], criterion)
        values = agg.get_smoothed_values()
    for t in ("rouge1", "rouge2", "rougeL"):
        expected = 100 * sum(log[f"_{t}_sum"] for log in logs) / n
        assert values[t] == pytest.approx(round(expected, 2))
    assert not any(k.startswith("_") for k in values)  # sums stay out of the printed logs


@pytest.mark.parametrize("bad", ["{beam: 2}", "[2]"])
def test_bad_generation_args_are_refused(data, bad):
    with pytest.raises(ValueError, match="--eval-rouge-args must be a JSON object"):
        _task_and_model(data, ["--eval-rouge-args", bad])


def _fields(line):
    """'... | loss 3.2 | rouge1 41.5 | ...' -> {'loss': '3.2', 'rouge1': '41.5', ...}"""
    pairs = (part.strip().split(" ", 1) for part in line.split(" | "))
    return {p[0]: p[1] for p in pairs if len(p) == 2}


def test_training_logs_rouge_keeps_the_best_checkpoint_by_it_and_matches_rouge_eval(data, tmp_path):
    """fairseq-train logs rouge1/2/L at every validation and keeps the best
    checkpoint by rouge1; the last logged rouge1 equals fairseq_dnas/commands/rouge_eval.py
    on fairseq-generate's output for the same checkpoint and beam."""
    save = tmp_path / "ckpt"
    proc = run(["fairseq-train", data, "--user-dir", USER_DIR, "--task", "translation_rouge",
                "--arch", "transformer_hnas", *TINY, "--optimizer", "adam", "--lr", "3e-3",
                "--batch-size", "16", "--required-batch-size-multiple", "1", "--max-update", "60",
                "--validate-interval-updates", "20", "--save-interval-updates", "20",
                "--eval-rouge", "--eval-rouge-args", GEN_ARGS, "--eval-rouge-remove-bpe",
                "--best-checkpoint-metric", "rouge1", "--maximize-best-checkpoint-metric",
                "--save-dir", save, "--cpu", "--seed", "1", "--log-format", "simple", "--log-interval", "10",
                "--no-epoch-checkpoints"])
    log = proc.stdout + proc.stderr
    valid = [_fields(line) for line in log.splitlines() if "valid on 'valid' subset" in line]
    assert [int(v["num_updates"]) for v in valid] == [20, 40, 60], log[-3000:]
    assert all({"rouge1", "rouge2", "rougeL"} <= set(v) for v in valid)
    rouge1 = {int(v["num_updates"]): float(v["rouge1"]) for v in valid}
    train_lines = [line for line in log.splitlines() if "| train_inner |" in line]
    assert len(train_lines) == 6 and not any("rouge" in line for line in train_lines)
    assert all(0 <= r <= 100 for r in rouge1.values())
    assert rouge1[60] > rouge1[20]  # the toy task is learned: ROUGE rises
    best = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_best.pt"))
    assert best["extra_state"]["best"] == pytest.approx(max(rouge1.values()))

    gen = run(["fairseq-generate", data, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
               "--gen-subset", "valid", "--beam", "2", "--max-len-a", "0", "--max-len-b", "8",
               "--batch-size", "16", "--required-batch-size-multiple", "1", "--cpu"])
    hyps = collect_hypotheses.collect(gen.stdout.splitlines(keepends=True), 30)
    with open(os.path.join(os.path.dirname(data), "text", "valid.title")) as f:
        refs = [line.strip() for line in f]
    result = rouge_eval.evaluate(hyps, [refs], samples=1)
    assert result["stemmed"]["rouge1"]["fmeasure"]["mean"] == pytest.approx(rouge1[60], abs=0.006)
