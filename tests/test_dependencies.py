"""The appendix's dependency experiment (J. Kinley, 2020, Figure 4.1):
examples/discrete/parentheses.py (the language), dependencies_eval.py
(precision and recall), transformer_lm_discrete_single (causal discrete
attention) with the receptive-field penalty, and dependencies.sh end to end."""

import json
import os
import random
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, USER_DIR

import dependencies_eval as E  # examples/discrete/, on the path by tests/conftest.py
import parentheses as P

SCRIPT = os.path.join(ROOT, "examples", "discrete", "parentheses.py")
DRIVER = os.path.join(ROOT, "examples", "discrete", "dependencies.sh")


# --- the language ------------------------------------------------------------


def generate(folder, seed, n=300, length=30):
    P.main([str(folder), "--train", str(n), "--valid", "7", "--test", "9", "--length", str(length),
            "--seed", str(seed)])
    return {ext: (folder / f"train{ext}").read_text() for ext in (".txt", ".dep")}


def reference_starts(words):
    """s_t by a backwards scan for the last number before w_t (independent of the generator's loop)."""
    out = []
    for t in range(len(words)):
        n = next((k for k in range(t - 1, -1, -1) if words[k].isdigit()), None)
        out.append(0 if n is None else n + 1)
    return out


def test_sequences_are_balanced_shallow_and_numbers_are_the_depth(tmp_path):
    generate(tmp_path, seed=3)
    for split, count in (("train", 300), ("valid", 7), ("test", 9)):
        lines = (tmp_path / f"{split}.txt").read_text().splitlines()
        deps = (tmp_path / f"{split}.dep").read_text().splitlines()
        assert len(lines) == len(deps) == count
        for line, dep in zip(lines, deps):
            words = line.split(" ")
            assert len(words) == 30 and set(words) <= set(P.VOCABULARY)
            depth = 0
            for w in words:
                if w.isdigit():
                    assert int(w) == depth  # a number is the nesting level where it stands
                depth += (w == "(") - (w == ")")
                assert 0 <= depth <= 4  # never a ")" without its "(", never deeper than 4
            assert depth == 0  # every "(" closed
            assert [int(x) for x in dep.split()] == reference_starts(words)


def test_the_generator_reaches_every_depth_and_word():
    rng = random.Random(0)
    seqs = [P.sequence(30, 4, rng) for _ in range(500)]
    assert {w for s in seqs for w in s} == set(P.VOCABULARY)
    assert max(max(P.depths(s)) for s in seqs) == 4


def test_the_generator_is_deterministic_by_seed(tmp_path):
    a = generate(tmp_path / "a", seed=5)
    b = generate(tmp_path / "b", seed=5)
    c = generate(tmp_path / "c", seed=6)
    assert a == b and a[".txt"] != c[".txt"]


def test_short_lengths_still_close_every_parenthesis():
    rng = random.Random(1)
    for length in (2, 3, 5, 8):
        for _ in range(200):
            s = P.sequence(length, 4, rng)
            assert len(s) == length and P.depths(s + ["0"])[-1] == 0


def test_the_command_line(tmp_path):
    help_text = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, check=True).stdout
    assert "--max-depth" in help_text and "parenthesis language" in help_text
    bad = subprocess.run([sys.executable, SCRIPT, str(tmp_path), "--length", "1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--length" in bad.stderr


# --- precision and recall ----------------------------------------------------


def test_dependency_of_a_sequence_by_hand():
    # input positions: 0 </s>, 1 "(", 2 "1", 3 "(", 4 ")", 5 ")"  (words w_0..w_4)
    words = ["(", "1", "(", ")", ")"]
    starts = P.dependency_starts(words)
    # w_0, w_1: no number before -> from </s>; w_2.. after the number w_1 (input position 2)
    assert starts == [0, 0, 2, 2, 2]
    assert P.dependency(starts, 1) == {0, 1} and P.dependency(starts, 4) == {2, 3, 4}
    mask = E.dependency_mask([starts], 6)[0]
    assert mask[4].tolist() == [False, False, True, True, True, False]


def test_precision_and_recall_by_hand():
    truth = torch.zeros(1, 3, 5, dtype=torch.bool)
    fields = torch.zeros(1, 3, 5, dtype=torch.bool)
    truth[0, 0, [0]] = True          # |D| 1
    truth[0, 1, [0, 1]] = True       # |D| 2
    truth[0, 2, [1, 2, 3]] = True    # |D| 3
    fields[0, 0, [0]] = True         # 1 of 1 right
    fields[0, 1, [1]] = True         # 1 of 1 right, misses 0
    fields[0, 2, [0, 1, 3, 4]] = True  # 2 of 4 right, misses 2
    r = E.precision_recall(fields, truth)
    assert r["precision"] == pytest.approx(4 / 6)  # hits 1 + 1 + 2 over fields 1 + 1 + 4
    assert r["recall"] == pytest.approx(4 / 6)  # over dependencies 1 + 2 + 3
    assert r["precision_macro"] == pytest.approx((1 + 1 + 0.5) / 3)
    assert r["recall_macro"] == pytest.approx((1 + 0.5 + 2 / 3) / 3)
    assert r["mean_field_size"] == pytest.approx(2) and r["predictions"] == 3
    assert E.precision_recall(truth, truth)["precision"] == 1.0
    # Without the sink: position 0 leaves the third field (not in its
    # dependency) and stays in the first (in it): hits 4 over fields 1 + 1 + 3.
    kept = E.without_sink(fields, truth)
    assert kept[0, 2].tolist() == [False, True, False, True, True] and kept[0, 0, 0]
    assert E.precision_recall(kept, truth)["precision"] == pytest.approx(4 / 5)
    assert E.precision_recall(kept, truth)["recall"] == r["recall"]


# --- the model: causal discrete attention ------------------------------------


def lm(tmp_path, *extra, arch="transformer_lm_discrete_single_tiny"):
    import fairseq_dnas.plugin  # noqa: F401
    from fairseq import options, tasks

    (tmp_path / "dict.txt").write_text("".join(f"{w} 1\n" for w in P.VOCABULARY))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(tmp_path), "--task", "language_modeling", "--arch", arch,
                                                "--user-dir", USER_DIR, "--tokens-per-sample", "32",
                                                "--dropout", "0", *extra])
    task = tasks.setup_task(args)
    return task.build_model(args), task


def test_thesis_sizes(tmp_path):
    model, _ = lm(tmp_path, arch="transformer_lm_discrete_single_thesis")
    layers = model.decoder.layers
    assert len(layers) == 4 and layers[0].fc1.weight.shape == (256, 64)
    assert layers[0].self_attn.num_heads == 2 and layers[0].self_attn.sampler == "gumbel"
    assert all(layer.encoder_attn is None for layer in layers)


@pytest.mark.parametrize("mode", ["relaxed-fused", "relaxed-kept", "straight-through", "argmax"])
def test_no_position_attends_to_the_future(tmp_path, mode):
    """Forward: the kept S is 0 above the diagonal, and outputs up to t do not
    change with the words after t; gradient: no output at t has a gradient
    in the embedding of a later position."""
    model, task = lm(tmp_path, *(["--gumbel-hard"] if mode == "straight-through" else []))
    model.train(mode != "argmax")
    mods = [layer.self_attn for layer in model.decoder.layers]
    torch.manual_seed(0)
    x = torch.randint(task.source_dictionary.nspecial, len(task.source_dictionary), (3, 12))
    x[:, 0] = task.source_dictionary.eos()
    keep = mode != "relaxed-fused"
    for m in mods:
        m.keep_sample, m.kept_sample = keep, None
    if mode == "relaxed-fused":
        assert mods[0]._fused(False, 1)  # the fused training kernel is what runs here
    emb = model.decoder.embed_tokens
    captured = []
    handle = emb.register_forward_hook(lambda mod, inp, out: captured.append(out.retain_grad() or out))
    try:
        torch.manual_seed(1)
        out, _ = model(x)
    finally:
        handle.remove()
    if keep:
        for m in mods:
            assert torch.triu(m.kept_sample, diagonal=1).abs().max() == 0
    t = 5
    out[:, t].sum().backward()
    grad = captured[0].grad  # (B, T, C)
    assert grad[:, : t + 1].abs().sum() > 0
    assert grad[:, t + 1:].abs().max() == 0
    if mode == "argmax":
        y = x.clone()
        y[:, t + 1:] = task.source_dictionary.nspecial  # other future words
        with torch.no_grad():
            assert torch.equal(model(y)[0][:, : t + 1], out[:, : t + 1].detach())


def _lm_sample(d):
    """A batch of 4 random sentences of 10 words for a language model: </s> w_0 .. w_9 -> w_0 .. w_9 </s>."""
    torch.manual_seed(0)
    words = torch.randint(d.nspecial, len(d), (4, 10))
    src = torch.cat([torch.full((4, 1), d.eos()), words], 1)
    tgt = torch.cat([words, torch.full((4, 1), d.eos())], 1)
    return {"id": torch.arange(4), "nsentences": 4, "ntokens": tgt.numel(),
            "net_input": {"src_tokens": src, "src_lengths": torch.full((4,), 11)}, "target": tgt}


def test_the_penalty_reads_a_decoder_only_lm(tmp_path):
    """cross_entropy_rf_penalty on a language model: the decoder stack is
    read, the loss gains C times the mean field size, and the penalty has a
    gradient."""
    from fairseq_dnas.criterions.receptive_field_penalty import CRITERION_REGISTRY, penalty_stacks

    model, task = lm(tmp_path)
    model.train()
    sample = _lm_sample(task.source_dictionary)
    stacks = penalty_stacks(model, sample, classification=False)
    assert len(stacks) == 1 and stacks[0][0] == [layer.self_attn for layer in model.decoder.layers]
    cls = CRITERION_REGISTRY["cross_entropy_rf_penalty"]
    base = CRITERION_REGISTRY["cross_entropy"](task, sentence_avg=False)
    on, off = cls(task, base, 0.1, "final"), cls(task, base, 0.0, "final")
    torch.manual_seed(3)
    loss_on, size, log = on(model, sample)
    torch.manual_seed(3)
    loss_off, _, _ = off(model, sample)
    mean_field = log["receptive_field_penalty"] / log["rf_nsentences"]
    assert 1.0 <= mean_field <= 11.0  # between only itself and every position up to t
    assert float((loss_on - loss_off).detach()) == pytest.approx(0.1 * mean_field * size, rel=1e-4)
    q = model.decoder.layers[0].self_attn.q_proj.weight
    grad = torch.autograd.grad(loss_on - loss_off, q)[0]
    assert grad.abs().sum() > 0


# --- end to end --------------------------------------------------------------


def test_the_driver_end_to_end(tmp_path):
    """SIZE=quick at even smaller sizes: data, both models, result.json and the
    picture; a second run skips every step that is done."""
    out = tmp_path / "deps"
    env = {**os.environ, "OUT": str(out), "SIZE": "quick", "TRAIN": "40", "VALID": "8", "TEST": "6",
           "MAX_UPDATE": "2", "INTERVAL": "2", "BATCH": "16", "PROGRESS": "0", "PYTHON": sys.executable,
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", DRIVER], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    for key in ("precision", "recall", "test_perplexity"):
        assert isinstance(result[key], float)
    assert 0 <= result["precision"] <= 1 and 0 < result["recall"] <= 1 and result["test_perplexity"] > 1
    assert result["soft"]["sampler"] == "soft" and result["discrete"]["sampler"] == "gumbel"
    assert result["discrete"]["predictions"] == 6 * 30 and result["thesis"]["precision"] == 0.959
    assert result["discrete"]["precision"] <= result["discrete"]["precision_without_sink"] <= 1
    assert (out / "figure_4_1.png").read_bytes()[:4] == b"\x89PNG"
    assert "rf_penalty" in (out / "discrete" / "train.log").read_text()
    again = subprocess.run(["bash", DRIVER], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("training is finished, skipping") == 2 and "data ready" in again.stderr


def test_penalty_start_trains_on_the_base_criterion_until_that_update(tmp_path):
    """--receptive-field-penalty-start 5: at the update counts fairseq hands
    the model before 5 the loss is the base criterion's, bit for bit, with no
    rf_penalty logged; from 5 on the penalty is added."""
    from fairseq_dnas.criterions.receptive_field_penalty import CRITERION_REGISTRY
    from fairseq_dnas.errors import BadFlag

    model, task = lm(tmp_path)
    model.train()
    sample = _lm_sample(task.source_dictionary)
    base = CRITERION_REGISTRY["cross_entropy"](task, sentence_avg=False)
    late = CRITERION_REGISTRY["cross_entropy_rf_penalty"](task, base, 0.1, "final", start=5)
    for count, on in [(0, False), (4, False), (5, True), (9, True)]:
        model.set_num_updates(count)  # what fairseq's task.train_step does before the criterion
        assert model.num_updates == count
        torch.manual_seed(3)
        loss, size, log = late(model, sample)
        torch.manual_seed(3)
        plain, _, _ = base(model, sample)
        if on:
            mean_field = log["receptive_field_penalty"] / log["rf_nsentences"]
            assert mean_field >= 1.0
            # the penalized path leaves the fused kernel: the same noise, other rounding
            assert float((loss - plain).detach()) == pytest.approx(0.1 * mean_field * size, rel=1e-3)
        else:
            assert torch.equal(loss, plain) and "receptive_field_penalty" not in log
    del model.num_updates  # a model that does not record the count
    with pytest.raises(BadFlag, match="--receptive-field-penalty-start needs a model that records"):
        late(model, sample)


def _fake_run(root, name, seed, precision, start=None, soft=False):
    """A dependencies.sh OUT with a result.json and the training command."""
    out = root / name
    (out / "discrete").mkdir(parents=True)
    flags = f"--receptive-field-penalty 0.1 --max-update 6000 --seed {seed}"
    if start is not None:
        flags += f" --receptive-field-penalty-start {start}"
    (out / "discrete" / "train.cmd").write_text(f"python run_fairseq.py train data --adam-betas '(0.9, 0.98)' {flags}\n")
    figures = {"precision": precision, "recall": 0.5, "test_perplexity": 3.0, "mean_field_size": 2.0,
               "precision_without_sink": 1.0}
    if seed == 2:
        del figures["precision_without_sink"]  # a result written before the diagnostic
    result = {"discrete": figures, **({"soft": dict(figures, precision=0.25)} if soft else {})}
    (out / "result.json").write_text(json.dumps(result))
    return out


def test_dependencies_table_groups_runs_by_settings_over_seeds(tmp_path):
    import dependencies_table as DT

    runs = [_fake_run(tmp_path, "a", 1, 0.5, soft=True), _fake_run(tmp_path, "b", 2, 0.7),
            _fake_run(tmp_path, "c", 1, 0.9, start=3000)]
    text = DT.table(DT.collect([str(r) for r in runs]))
    rows = [line for line in text.splitlines() if line.startswith("| discrete") or line.startswith("| soft")]
    # seeds 1 and 2 at start 0 (absent flag = the criterion's default): mean 0.6,
    # standard error 0.1414 / sqrt(2) = 0.1; seed 1 at 3000 alone; the soft model of seed 1 alone
    assert rows == [
        "| discrete | 0.1 | 0 | final | 6000 | 2 (1, 2) | 0.600 +- 0.100 | 0.500 +- 0.000 | - | 3.000 +- 0.000 "
        "| 2.00 +- 0.00 |",
        "| discrete | 0.1 | 3000 | final | 6000 | 1 (1) | 0.900 | 0.500 | 1.000 | 3.000 | 2.00 |",
        "| soft | 0.1 | 0 | final | 6000 | 1 (1) | 0.250 | 0.500 | 1.000 | 3.000 | 2.00 |",
    ], text
    assert "| thesis (discrete) | 0.1 | - | final | - | - | **0.959** | **0.920** | - | - | - |" in text


def test_dependencies_table_refuses_an_unfinished_run_and_a_repeated_seed(tmp_path):
    import dependencies_table as DT

    table = os.path.join(ROOT, "examples", "discrete", "dependencies_table.py")
    done = _fake_run(tmp_path, "a", 1, 0.5)
    (tmp_path / "unfinished" / "discrete").mkdir(parents=True)
    proc = subprocess.run([sys.executable, table, str(done), str(tmp_path / "unfinished")], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("dependencies_table.py: error: ") and "result.json: missing" in proc.stderr
    again = _fake_run(tmp_path, "b", 1, 0.6)
    with pytest.raises(DT.BadFile, match="seed 1 twice"):
        DT.collect([str(done), str(again)])
