"""Tier 3: the two-stream models (J. Kinley, 2020) through fairseq's commands:
translation (fairseq-train, fairseq-generate with beam search,
fairseq-interactive), sentence classification (--task sentence_prediction +
fairseq_dnas/commands/sentence_classify.py), the multiview task on a tiny generated
arithmetic dataset (infix and prefix views, thesis Section 5.2), and bad
flags refused in one line by the plain fairseq-train command."""

import json
import os
import random
import re
import subprocess
import sys

import pytest
import torch
from helpers import BIN, ROOT, TINY, USER_DIR, WORDS, run, write_parallel_data

TRANSLATION_ARCHS = ["transformer_discrete_tiny", pytest.param("transformer_two_stream_tiny", marks=pytest.mark.full)]
# One of each kind in the default tier, the other variant in the full tier (docs/testing.md).
CLASSIFIER_ARCHS = ["roberta_discrete_thesis", pytest.param("roberta_two_stream_thesis", marks=pytest.mark.full)]
MULTIVIEW_ARCHS = ["roberta_two_stream_multiview_thesis",
                   pytest.param("roberta_discrete_multiview_thesis", marks=pytest.mark.full)]
CLASSIFY = ["-m", "fairseq_dnas.commands.sentence_classify"]
COMMON = ["--user-dir", USER_DIR, "--cpu", "--optimizer", "adam", "--lr", "2e-3", "--no-progress-bar",
          "--log-interval", "5", "--seed", "1", "--no-epoch-checkpoints"]
# Two layers instead of the thesis's six: seconds on a CPU.
SMALL_ENCODER = ["--encoder-layers", "2"]
SPACE = "\u2581"


def _lines(path, lines):
    with open(path, "w") as f:
        f.writelines(line + "\n" for line in lines)


# --- translation ----------------------------------------------------------------


@pytest.fixture(scope="module")
def translation(tmp_path_factory):
    """(data, checkpoint_of): checkpoint_of(arch) trains that arch on first use."""
    root = tmp_path_factory.mktemp("two_stream_mt")
    write_parallel_data(root / "raw")
    data = root / "bin"
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", root / "raw/train",
         "--validpref", root / "raw/valid", "--testpref", root / "raw/test", "--destdir", data,
         "--joined-dictionary", "--workers", "1"])
    checkpoints = {}

    def checkpoint_of(arch):
        if arch not in checkpoints:
            save = root / arch
            proc = run(["fairseq-train", data, "--arch", arch, *TINY, *COMMON, "--max-tokens", "1000",
                        "--max-epoch", "3", "--save-dir", save])
            assert "done training" in proc.stdout + proc.stderr
            checkpoints[arch] = save / "checkpoint_last.pt"
        return checkpoints[arch]

    return data, checkpoint_of


@pytest.mark.parametrize("arch", TRANSLATION_ARCHS)
def test_translation_trains_and_decodes_with_beam_search(arch, translation):
    data, checkpoint_of = translation
    checkpoint = checkpoint_of(arch)
    proc = run(["fairseq-generate", data, "--user-dir", USER_DIR, "--cpu", "--path", checkpoint,
                "--beam", "4", "--batch-size", "8", "--required-batch-size-multiple", "1"])
    hypotheses = re.findall(r"^H-(\d+)\t\S+\t(.*)$", proc.stdout, re.M)
    assert sorted(int(i) for i, _ in hypotheses) == list(range(25))
    assert "BLEU4" in proc.stdout + proc.stderr
    proc = run(["fairseq-interactive", data, "--user-dir", USER_DIR, "--cpu", "--path", checkpoint,
                "--beam", "4", "--source-lang", "src", "--target-lang", "tgt"], input="w1 w2 w3 w4\nw5 w6\n")
    assert len(re.findall(r"^H-\d+\t", proc.stdout, re.M)) == 2
    # The checkpoint is the two-stream model with its sampler.
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert state["cfg"]["model"].discrete_sampler == ("gumbel" if "discrete" in arch else "soft")
    assert "encoder.layers.0.self_attn.model_v_proj.weight" in state["model"]


def test_hub_interface_translates_with_one_hot_attention(translation):
    from fairseq.models.transformer import TransformerModel

    import fairseq_dnas.plugin  # noqa: F401  (fairseq_dnas is imported already, so --user-dir alone would not)
    from fairseq_dnas.analysis.capture import capture_two_stream

    data, checkpoint_of = translation
    path = checkpoint_of("transformer_discrete_tiny")
    hub = TransformerModel.from_pretrained(str(path.parent), checkpoint_file=path.name, data_name_or_path=str(data),
                                           user_dir=USER_DIR, source_lang="src", target_lang="tgt")
    assert type(hub.models[0]).__name__ == "TransformerTwoStreamModel"
    with capture_two_stream(hub.models[0]) as records:
        out = hub.translate("w1 w2 w3 w4 w5", beam=2)
    assert isinstance(out, str) and out.strip()
    # Beam search ran every site (incremental decoder steps included); S one-hot throughout.
    assert {site.kind for site, _ in records} == {"encoder_self", "decoder_self", "decoder_cross"}
    assert all(set(a["model_S"].unique().tolist()) <= {0.0, 1.0} for _, a in records)


# --- sentence classification ----------------------------------------------------


def _sentences(n, rng):
    """Label 1 iff w0 occurs: learnable, so accuracy means something."""
    rows = []
    for _ in range(n):
        words = [rng.choice(WORDS[1:12]) for _ in range(rng.randint(3, 9))]
        label = rng.random() < 0.5
        if label:
            words[rng.randrange(len(words))] = WORDS[0]
        rows.append((" ".join(words), int(label)))
    return rows


@pytest.fixture(scope="module")
def classification(tmp_path_factory):
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("two_stream_sp")
    rng = random.Random(0)
    splits = {"train": _sentences(200, rng), "valid": _sentences(30, rng), "test": _sentences(40, rng)}
    text = root / "text"
    text.mkdir()
    _lines(text / "corpus.txt", [s for rows in splits.values() for s, _ in rows])
    spm.SentencePieceTrainer.train(input=str(text / "corpus.txt"), model_prefix=str(root / "sp"),
                                   model_type="word", vocab_size=13, bos_id=-1, eos_id=-1, minloglevel=2)
    for split, rows in splits.items():
        _lines(text / f"{split}.pieces", [" ".join(SPACE + w for w in s.split()) for s, _ in rows])
        _lines(text / f"{split}.label", [str(y) for _, y in rows])
    _lines(root / "test.tsv", [f"{s}\t{y}" for s, y in splits["test"]])
    data = root / "bin"
    run(["fairseq-preprocess", "--only-source", "--trainpref", text / "train.pieces", "--validpref",
         text / "valid.pieces", "--destdir", data / "input0", "--workers", "1"])
    run(["fairseq-preprocess", "--only-source", "--trainpref", text / "train.label", "--validpref",
         text / "valid.label", "--destdir", data / "label", "--workers", "1"])
    return root, data


@pytest.mark.parametrize("arch", CLASSIFIER_ARCHS)
def test_sentence_prediction_trains_and_sentence_classify_scores(arch, classification, tmp_path):
    root, data = classification
    proc = run(["fairseq-train", data, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                "--num-classes", "2", "--init-token", "0", "--max-positions", "64", "--arch", arch,
                *SMALL_ENCODER, *COMMON, "--batch-size", "16", "--max-epoch", "3", "--save-dir", tmp_path])
    assert "done training" in proc.stdout + proc.stderr
    checkpoint = tmp_path / "checkpoint_last.pt"
    score = run([sys.executable, *CLASSIFY, "score", checkpoint, root / "test.tsv", "--spm", root / "sp.model",
                 "--json", tmp_path / "score.json"])
    with open(tmp_path / "score.json") as f:
        result = json.load(f)
    assert result["n"] == 40 and 0 <= result["accuracy"] <= 1, score.stdout
    # classify gives the labels score counted.
    out = tmp_path / "labels.txt"
    (tmp_path / "test.txt").write_text("".join(line.split("\t")[0] + "\n"
                                               for line in (root / "test.tsv").read_text().splitlines()))
    run([sys.executable, *CLASSIFY, "classify", checkpoint, tmp_path / "test.txt", "-o", out,
         "--spm", root / "sp.model"])
    gold = [line.split("\t")[1] for line in (root / "test.tsv").read_text().splitlines()]
    predicted = [line.split("\t")[0] for line in out.read_text().splitlines()]
    assert sum(p == g for p, g in zip(predicted, gold)) / 40 == pytest.approx(result["accuracy"], abs=1e-12)


# --- multiview ------------------------------------------------------------------


def expression(depth, rng):
    """(infix tokens, prefix tokens, value mod 5) of a random expression over
    {0..4} with + and * (thesis Section 5.2)."""
    if depth == 0:
        n = rng.randrange(5)
        return [str(n)], [str(n)], n
    a, b = expression(rng.randrange(depth), rng), expression(rng.randrange(depth), rng)
    op = rng.choice("+*")
    value = (a[2] + b[2]) % 5 if op == "+" else (a[2] * b[2]) % 5
    return ["(", *a[0], op, *b[0], ")"], ["(", op, *a[1], *b[1], ")"], value


def write_multiview(folder, sizes=(("train", 160), ("valid", 24)), with_second_view=True, seed=0):
    rng = random.Random(seed)
    text = folder / "text"
    text.mkdir(parents=True)
    for split, n in sizes:
        rows = [expression(rng.randint(1, 2), rng) for _ in range(n)]
        _lines(text / f"{split}.infix", [" ".join(r[0]) for r in rows])
        _lines(text / f"{split}.prefix", [" ".join(r[1]) for r in rows])
        _lines(text / f"{split}.label", [str(r[2]) for r in rows])
    data = folder / "bin"

    def binarize(ext, dest, *extra):
        run(["fairseq-preprocess", "--only-source", "--trainpref", text / f"train.{ext}", "--validpref",
             text / f"valid.{ext}", "--destdir", data / dest, "--workers", "1", *extra])

    binarize("infix", "input0")
    if with_second_view:
        binarize("prefix", "input1", "--srcdict", data / "input0" / "dict.txt")
    binarize("label", "label")
    return data


MULTIVIEW_TRAIN = ["--task", "sentence_prediction_multiview", "--criterion", "sentence_prediction_multiview",
                   "--num-classes", "5", "--init-token", "0", "--max-positions", "64", *SMALL_ENCODER, *COMMON,
                   "--batch-size", "16"]


@pytest.mark.parametrize("arch", MULTIVIEW_ARCHS)
def test_multiview_task_trains_both_views_on_one_model_stream(arch, tmp_path):
    data = write_multiview(tmp_path / "data")
    proc = run(["fairseq-train", data, "--arch", arch, *MULTIVIEW_TRAIN, "--max-epoch", "2",
                "--save-dir", tmp_path / "save"])
    log = proc.stdout + proc.stderr
    assert "done training" in log and "accuracy_view1" in log and "loss_view1" in log, log[-3000:]
    state = torch.load(tmp_path / "save" / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    a, b = "encoder.sentence_encoder.layers.1.", "encoder.second_view_encoder.layers.1."
    # One model stream: the same weights under both views' names; two controllers: different ones.
    for name in ("model_fc1.weight", "self_attn.model_v_proj.weight", "model_final_layer_norm.weight"):
        assert torch.equal(state[a + name], state[b + name]), name
    for name in ("fc1.weight", "self_attn.q_proj.weight"):
        assert not torch.equal(state[a + name], state[b + name]), name
    heads = {k.split(".")[1] for k in state if k.startswith("classification_heads.")}
    assert heads == {"sentence_classification_head", "sentence_classification_head_view1"}


def test_multiview_loss_is_the_sum_of_the_two_views_cross_entropies(tmp_path):
    """The criterion's loss against the two heads' cross-entropies computed by hand."""
    from fairseq import options, tasks

    import fairseq_dnas.plugin  # noqa: F401

    data = write_multiview(tmp_path / "data", sizes=(("train", 20), ("valid", 6)))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data), "--arch", "roberta_two_stream_multiview_thesis",
                                                *MULTIVIEW_TRAIN, "--dropout", "0", "--attention-dropout", "0"])
    task = tasks.setup_task(args)
    task.load_dataset("valid")
    model = task.build_model(args).eval()
    criterion = task.build_criterion(args)
    sample = task.dataset("valid").collater([task.dataset("valid")[i] for i in range(6)])
    loss, size, log = criterion(model, sample)
    target = sample["target"].view(-1)
    want = 0.0
    for view, (key, head) in enumerate([("net_input", "sentence_classification_head"),
                                        ("net_input1", "sentence_classification_head_view1")]):
        logits = model(**sample[key], classification_head_name=head, view=view)[0]
        want = want + torch.nn.functional.cross_entropy(logits, target, reduction="sum")
    assert size == 6
    torch.testing.assert_close(loss, want)
    assert not torch.equal(sample["net_input"]["src_tokens"], sample["net_input1"]["src_tokens"])


@pytest.mark.parametrize("init,lo,hi", [("bert", 0.015, 0.025), ("pytorch", 0.05, 0.1)])
def test_param_init_sets_the_weights_scale(init, lo, hi, tmp_path):
    """--param-init pytorch: every Linear and Embedding re-drawn by its own
    reset_parameters (Linear std 1/sqrt(3 fan_in) = 0.072 at 64 inputs;
    Embedding N(0, 1), padding row 0) instead of fairseq's N(0, 0.02); both
    views' encoders still share one model stream."""
    from fairseq import options, tasks

    import fairseq_dnas.plugin  # noqa: F401

    data = write_multiview(tmp_path / "data", sizes=(("train", 8), ("valid", 4)))
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--arch", "roberta_two_stream_multiview_thesis", *MULTIVIEW_TRAIN, "--param-init", init])
    model = tasks.setup_task(args).build_model(args)
    enc = model.encoder.sentence_encoder
    for weight in (enc.layers[0].self_attn.q_proj.weight, enc.layers[0].fc1.weight):
        assert lo < weight.std().item() < hi, (init, weight.shape, weight.std())
    embed = enc.embed_tokens.weight
    assert torch.equal(embed[enc.padding_idx], torch.zeros_like(embed[0]))
    assert (0.5 < embed.std().item() < 1.5) == (init == "pytorch")
    second = model.encoder.second_view_encoder
    assert second.layers[0].model_fc1 is enc.layers[0].model_fc1


# --- bad flags, through the plain fairseq-train command ---------------------------


def _plain_train(*args):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    return subprocess.run([os.path.join(BIN, "fairseq-train"), *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=300)


def _one_error_line(proc, message):
    err = proc.stderr
    assert proc.returncode == 1, (proc.returncode, err[-3000:])
    assert "Traceback" not in err + proc.stdout, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.rstrip().splitlines()[-1] == errors[0], err[-3000:]
    assert message in errors[0], errors[0]


@pytest.mark.parametrize("flags, message", [
    (["--gumbel-temperature", "0"], "--gumbel-temperature must be a finite number > 0"),
    pytest.param(["--gumbel-anneal", "2,0.5"], "--gumbel-anneal takes START,END,UPDATES", marks=pytest.mark.full),
    pytest.param(["--sinkhorn-iters", "3"], "--sinkhorn-iters 3 only changes --discrete-scheme dnas",
                 marks=pytest.mark.full),
])
def test_bad_translation_flags_end_in_one_line(flags, message, translation, tmp_path):
    data, _ = translation
    proc = _plain_train(data, "--arch", "transformer_discrete_tiny", *TINY, *COMMON, "--max-tokens", "1000",
                        "--max-epoch", "1", "--save-dir", tmp_path, *flags)
    _one_error_line(proc, message)


def test_multiview_without_its_second_input_ends_in_one_line(tmp_path):
    data = write_multiview(tmp_path / "data", sizes=(("train", 8), ("valid", 4)), with_second_view=False)
    proc = _plain_train(data, "--arch", "roberta_two_stream_multiview_thesis", *MULTIVIEW_TRAIN,
                        "--max-epoch", "1", "--save-dir", tmp_path / "save")
    _one_error_line(proc, f"{data / 'input1'} is missing")


def test_multiview_arch_on_the_single_view_task_ends_in_one_line(tmp_path):
    data = write_multiview(tmp_path / "data", sizes=(("train", 8), ("valid", 4)))
    proc = _plain_train(data, "--arch", "roberta_two_stream_multiview_thesis", "--task", "sentence_prediction",
                        "--criterion", "sentence_prediction", "--num-classes", "5", "--max-positions", "64", *COMMON, "--batch-size", "4", "--max-epoch", "1",
                        "--save-dir", tmp_path / "save")
    _one_error_line(proc, "use --task sentence_prediction_multiview")


# --- pretrained with masked_lm, then fine-tuned ---------------------------------


@pytest.mark.parametrize("arch", [pytest.param("roberta_discrete_single_thesis", marks=pytest.mark.full),
                                  "roberta_discrete_thesis"])
def test_classifier_fine_tunes_from_its_masked_lm_checkpoint(arch, classification, tmp_path):
    """Pretrain the encoder with --task masked_lm, fine-tune it with
    --restore-file: every encoder weight starts from the pretrained one (after
    two updates at lr 1e-5 it is within 1e-4 of it, where the 4 pretraining
    updates at 2e-3 moved weights by about 1e-2 from the initialization)."""
    from fairseq import checkpoint_utils

    import fairseq_dnas.plugin  # noqa: F401  (checkpoints load under torch >= 2.6)

    root, data = classification
    pre, fine = tmp_path / "mlm", tmp_path / "cls"
    run(["fairseq-train", data / "input0", "--task", "masked_lm", "--criterion", "masked_lm", "--arch", arch,
         *SMALL_ENCODER, "--tokens-per-sample", "32", "--sample-break-mode", "eos", *COMMON,
         "--batch-size", "16", "--max-update", "4", "--save-dir", pre])
    proc = run(["fairseq-train", data, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                "--num-classes", "2", "--init-token", "0", "--max-positions", "32", "--arch", arch,
                *SMALL_ENCODER, *COMMON[:-1], "--lr", "1e-5", "--batch-size", "16", "--max-update", "2",
                "--restore-file", pre / "checkpoint_last.pt", "--reset-optimizer", "--reset-dataloader",
                "--reset-meters", "--save-dir", fine])
    assert "Loaded checkpoint" in proc.stdout + proc.stderr
    pretrained = checkpoint_utils.load_checkpoint_to_cpu(str(pre / "checkpoint_last.pt"))["model"]
    tuned = checkpoint_utils.load_checkpoint_to_cpu(str(fine / "checkpoint_last.pt"))["model"]
    layers = [n for n in pretrained if n.startswith("encoder.sentence_encoder.layers.")]
    assert layers and all(n in tuned for n in layers)
    if arch == "roberta_discrete_thesis":
        assert any(".model_" in n for n in layers)  # the model stream's weights are carried too
    assert max(float((tuned[n].float() - pretrained[n].float()).abs().max()) for n in layers) < 1e-4
    assert "classification_heads.sentence_classification_head.out_proj.weight" in tuned


# --- each stream has its own embeddings (thesis Section 4.2) ------------------------


def _in_process(arch, tmp_path, extra=()):
    """(model in training mode with dropout 0, loss function) of ``arch`` on
    default settings: translation on tiny random tokens; RoBERTa and
    multiview on the generated arithmetic set (the multiview task; a
    single-view classifier reads view 0)."""
    from fairseq import options, tasks
    from helpers import build_model, random_tokens, tiny_dictionary

    import fairseq_dnas.plugin  # noqa: F401

    if arch.startswith("transformer"):
        model = build_model(arch, list(extra)).train()
        d = tiny_dictionary()
        src, prev = random_tokens([6, 4], 6, d), random_tokens([5, 5], 5, d, seed=2)
        return model, lambda: model(src, torch.tensor([6, 4]), prev)[0].log_softmax(-1).sum()
    data = write_multiview(tmp_path / "data", sizes=(("train", 60), ("valid", 6)))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data), "--arch", arch, *MULTIVIEW_TRAIN, "--dropout", "0",
                                                "--attention-dropout", "0", *extra])
    task = tasks.setup_task(args)
    task.load_dataset("valid")
    model = task.build_model(args).train()
    criterion = task.build_criterion(args)
    sample = task.dataset("valid").collater([task.dataset("valid")[i] for i in range(6)])
    if "multiview" in arch:
        return model, lambda: criterion(model, sample)[0]
    head = "sentence_classification_head"
    return model, lambda: model(**sample["net_input"], classification_head_name=head)[0].log_softmax(-1).sum()


def _is_controller(name):
    """The controller's parameters: the layers' fairseq-named ones (the
    model stream's are ``model_*``) and its own embeddings ``controller_*``."""
    return (".layers." in name and ".model_" not in name) or ".controller_" in name


def _gradients_through_s(model, loss_fn, params):
    """(d loss / d p, the same through S alone) for each p of ``params``:
    d loss / d S_l at every attention's S (read at its attention_tap), then
    sum_l (d loss / d S_l) . (d S_l / d p). Exact for the Gumbel sampler,
    whose S_l no other S depends on (the controller's states are computed
    from A, not S)."""
    from fairseq_dnas.modules.two_stream_attention import AttentionTap

    samples = []
    handles = [m.register_forward_hook(lambda mod, args, out: samples.append(args[1]))
               for m in model.modules() if isinstance(m, AttentionTap)]
    try:
        torch.manual_seed(3)
        loss = loss_fn()
    finally:
        for h in handles:
            h.remove()
    full = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    d_s = torch.autograd.grad(loss, samples, retain_graph=True, allow_unused=True)
    d_s = [torch.zeros_like(s) if g is None else g for s, g in zip(samples, d_s)]
    through_s = torch.autograd.grad(samples, params, grad_outputs=d_s, allow_unused=True)
    zero = lambda g, p: torch.zeros_like(p) if g is None else g  # noqa: E731
    return [zero(g, p) for g, p in zip(full, params)], [zero(g, p) for g, p in zip(through_s, params)]


@pytest.mark.parametrize("arch", ["transformer_discrete_tiny", "roberta_discrete_thesis",
                                  "roberta_discrete_multiview_thesis"])
def test_on_default_settings_the_controller_learns_only_through_s(arch, tmp_path):
    """Every controller parameter's gradient (its embeddings included) is
    its gradient through S alone, on default settings; with
    --share-stream-embeddings the shared token embeddings also reach the
    loss through h (so the two differ: the test can fail)."""
    model, loss_fn = _in_process(arch, tmp_path)
    named = [(n, p) for n, p in model.named_parameters() if _is_controller(n)]
    assert any("controller_embed_tokens" in n for n, _ in named)
    if arch.startswith("roberta"):  # learned positions, embedding LayerNorm (translation: sinusoidal, none)
        assert any("controller_embed_positions" in n for n, _ in named)
        assert any("controller_layernorm_embedding" in n for n, _ in named)
    full, through_s = _gradients_through_s(model, loss_fn, [p for _, p in named])
    for (name, _), a, b in zip(named, full, through_s):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4, msg=name)
    live = {n for (n, _), a in zip(named, full) if a.abs().sum() > 0}
    assert any("controller_embed_tokens" in n for n in live) and any("q_proj" in n for n in live)

    shared, loss_fn = _in_process(arch, tmp_path / "shared", ["--share-stream-embeddings"])
    assert not any(".controller_" in n for n, _ in shared.named_parameters())
    embed = shared.encoder.sentence_encoder.embed_tokens if arch.startswith("roberta") else shared.encoder.embed_tokens
    (full,), (through_s,) = _gradients_through_s(shared, loss_fn, [embed.weight])
    assert through_s.abs().sum() > 0 and not torch.allclose(full, through_s, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("arch", ["transformer_discrete_tiny", "transformer_two_stream_tiny", "roberta_discrete_thesis",
                                  "roberta_two_stream_thesis", "roberta_discrete_multiview_thesis",
                                  "roberta_two_stream_multiview_thesis"])
def test_no_controller_parameter_is_a_model_stream_parameter(arch, tmp_path):
    """On default settings, no tensor is both a controller parameter and a
    model-stream one (shared modules appear under several names); the
    multiview views share the model stream and not their controllers."""
    model, _ = _in_process(arch, tmp_path)
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    for group in names.values():
        kinds = {_is_controller(n) for n in group}
        assert len(kinds) == 1, group
    if "multiview" in arch:
        views = [model.encoder.sentence_encoder, model.encoder.second_view_encoder]
        assert views[0].embed_tokens is views[1].embed_tokens
        assert views[0].layers[0].model_fc1 is views[1].layers[0].model_fc1
        for name in ("controller_embed_tokens", "controller_embed_positions", "controller_layernorm_embedding"):
            assert getattr(views[0], name) is not getattr(views[1], name), name


def test_a_checkpoint_with_shared_stream_embeddings_loads_and_computes_the_same(tmp_path):
    """A state dict from before the streams had their own embeddings (no
    controller_* entries) loads into the default model (the controller's
    copied from the model stream's) and computes what the shared model computes."""
    shared, loss_shared = _in_process("roberta_discrete_thesis", tmp_path / "a", ["--share-stream-embeddings"])
    own, loss_own = _in_process("roberta_discrete_thesis", tmp_path / "b")
    state = shared.state_dict()
    assert not any(".controller_" in k for k in state)
    own.load_state_dict(state)  # fairseq's load_state_dict upgrades the state dict first
    shared.eval(), own.eval()
    with torch.no_grad():
        torch.testing.assert_close(loss_own(), loss_shared(), atol=1e-6, rtol=1e-6)


def test_multiview_penalty_criterion_sums_both_views_fields(tmp_path):
    """--criterion sentence_prediction_multiview_rf_penalty: the penalty reads
    each view's encoder on its own tokens at <s>; P_b sums the two views
    (each at least 1, <s> itself), and the loss gains C * sum_b P_b *
    sample_size / nsentences over the multiview criterion's own."""
    from fairseq import options, tasks

    from fairseq_dnas.criterions import receptive_field_penalty as RFC

    data = write_multiview(tmp_path / "data", sizes=(("train", 60), ("valid", 6)))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data), "--arch", "roberta_discrete_multiview_thesis",
                                                *MULTIVIEW_TRAIN, "--dropout", "0", "--attention-dropout", "0",
                                                "--criterion", "sentence_prediction_multiview_rf_penalty",
                                                "--receptive-field-penalty", "0.5"])
    task = tasks.setup_task(args)
    task.load_dataset("valid")
    model = task.build_model(args).train()
    criterion = task.build_criterion(args)
    assert type(criterion.base).__name__ == "SentencePredictionMultiviewCriterion"
    sample = task.dataset("valid").collater([task.dataset("valid")[i] for i in range(6)])
    stacks = RFC.penalty_stacks(model, sample, classification=True)
    assert [s[1] is sample[k]["src_tokens"] for s, k in zip(stacks, ("net_input", "net_input1"))] == [True, True]
    loss, size, log = criterion(model, sample)
    assert log["rf_nsentences"] == 6 and 2 * 6 <= log["receptive_field_penalty"] <= 2 * 6 * 64
    torch.testing.assert_close(loss.detach(), log["loss"] + 0.5 * log["receptive_field_penalty"] * size / 6,
                               atol=1e-4, rtol=0)
    model.eval()
    assert "receptive_field_penalty" not in criterion(model, sample)[2]  # validation: the base criterion alone
