"""Tier 3: tiny end-to-end runs through fairseq's command-line tools.

fairseq-preprocess -> fairseq-train --user-dir fairseq_dnas --arch ... ->
fairseq-generate / fairseq-interactive / --restore-file / hub interface, and
the proof that the scheme really runs once a checkpoint is loaded.
"""

import os
import re

import pytest
import torch
from helpers import TINY, USER_DIR, random_tokens, run, write_parallel_data
from fairseq_dnas.reference import reference_self_attention

TRAIN = [
    "--user-dir", USER_DIR, *TINY, "--cpu", "--optimizer", "adam", "--lr", "2e-3",
    "--max-tokens", "1000", "--no-progress-bar", "--log-interval", "5", "--seed", "1",
    "--no-epoch-checkpoints",
]
ARCHS = ["transformer_dnas", "transformer_hnas"]


@pytest.fixture(scope="session")
def data_bin(tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw")
    write_parallel_data(raw)
    dest = raw / "bin"
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
         "--destdir", dest, "--joined-dictionary", "--workers", "1"])
    return dest


@pytest.fixture(scope="session")
def checkpoints(data_bin, tmp_path_factory):
    """arch -> checkpoint directory, each trained for 3 short epochs."""
    out = {}
    for arch in ARCHS + ["transformer"]:
        save = tmp_path_factory.mktemp(arch)
        extra = ["--hybrid-init", "0.3"] if arch == "transformer_hnas" else []
        proc = run(["fairseq-train", data_bin, "--arch", arch, *TRAIN, *extra,
                    "--max-epoch", "3", "--save-dir", save])
        assert "done training" in proc.stdout + proc.stderr
        out[arch] = save
    return out


def _hypotheses(stdout):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", stdout, re.M)}


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_translates_every_test_sentence(arch, data_bin, checkpoints):
    proc = run(["fairseq-generate", data_bin, "--user-dir", USER_DIR, "--cpu",
                "--path", checkpoints[arch] / "checkpoint_best.pt", "--beam", "3",
                "--batch-size", "8", "--required-batch-size-multiple", "1"])
    hyps = _hypotheses(proc.stdout)
    assert sorted(hyps) == list(range(25))  # 25 test sentences, 25 = 3 * 8 + 1
    assert all(h.strip() for h in hyps.values())


@pytest.mark.parametrize("arch", ARCHS)
def test_interactive_and_restore_file(arch, data_bin, checkpoints):
    proc = run(["fairseq-interactive", data_bin, "--user-dir", USER_DIR, "--cpu",
                "--path", checkpoints[arch] / "checkpoint_best.pt", "--beam", "2",
                "--source-lang", "src", "--target-lang", "tgt"],
               input="w1 w2 w3 w4\nw5 w6 w7\nw8 w9 w10 w11 w12\n")
    assert len(_hypotheses(proc.stdout)) == 3
    # Continue training from the last checkpoint (same directory, one more epoch).
    proc = run(["fairseq-train", data_bin, "--arch", arch, *TRAIN, "--max-epoch", "4",
                "--save-dir", checkpoints[arch]])
    log = proc.stdout + proc.stderr
    assert "Loaded checkpoint" in log and re.search(r"epoch 004 \|", log)


def test_hub_interface_loads_and_translates(data_bin, checkpoints):
    from fairseq.models.transformer import TransformerModel

    hub = TransformerModel.from_pretrained(
        str(checkpoints["transformer_hnas"]), checkpoint_file="checkpoint_best.pt",
        data_name_or_path=str(data_bin), user_dir=USER_DIR,
        source_lang="src", target_lang="tgt",
    )
    assert type(hub.models[0]).__name__ == "TransformerDNASModel"
    out = hub.translate("w1 w2 w3 w4 w5", beam=2)
    assert isinstance(out, str) and out.strip()


def _load(path):
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)])
    return models[0].eval(), cfg, task


@pytest.mark.parametrize("arch", ARCHS)
def test_loaded_model_runs_the_scheme_not_softmax(arch, checkpoints):
    """After loading, in eval mode: the encoder output differs from the same
    weights in fairseq's plain transformer and equals the reference."""
    from fairseq.models.transformer import TransformerModel

    model, cfg, task = _load(checkpoints[arch] / "checkpoint_best.pt")
    d = task.source_dictionary
    tokens = random_tokens([6, 13, 9], 13, d, left_pad=True)
    lengths = tokens.ne(d.pad()).sum(1)
    out = model.encoder(tokens, src_lengths=lengths)["encoder_out"][0]

    plain = TransformerModel.build_model(cfg.model, task).eval()
    state = {k: v for k, v in model.state_dict().items() if "hybrid_logit" not in k}
    plain.load_state_dict(state, strict=True)
    plain_out = plain.encoder(tokens, src_lengths=lengths)["encoder_out"][0]

    # The same loaded model with every encoder attention recomputed by the
    # float64 reference of Algorithm 1 (hooks replace each module's output).
    handles = []
    for m in model.encoder.attention_modules():
        def hook(module, args, kwargs, output):
            x, mask = kwargs["query"], kwargs["key_padding_mask"]
            return reference_self_attention(module, x, mask).to(x.dtype), output[1]
        handles.append(m.register_forward_hook(hook, with_kwargs=True))
    try:
        ref_out = model.encoder(tokens, src_lengths=lengths)["encoder_out"][0]
    finally:
        for h in handles:
            h.remove()

    real = tokens.ne(d.pad()).T  # (T, B)
    torch.testing.assert_close(out[real], ref_out[real], atol=1e-5, rtol=0)
    assert (out[real] - plain_out[real]).abs().max() > 1e-3
    if arch == "transformer_hnas":  # trained, so u moved away from 0.3
        u = torch.tensor(model.hybrid_weights())
        assert ((u >= 0) & (u <= 1)).all() and (u - 0.3).abs().max() > 1e-4


def test_plain_transformer_checkpoint_fine_tunes_as_hnas(data_bin, checkpoints, tmp_path):
    """The paper's BERT-initialized setting: start HNAS from plain weights."""
    proc = run(["fairseq-train", data_bin, "--arch", "transformer_hnas", *TRAIN,
                "--hybrid-init", "0.1", "--max-epoch", "1", "--save-dir", tmp_path,
                "--restore-file", checkpoints["transformer"] / "checkpoint_best.pt",
                "--reset-optimizer", "--reset-dataloader", "--reset-meters",
                "--reset-lr-scheduler"])
    assert "Loaded checkpoint" in proc.stdout + proc.stderr
    model, _, _ = _load(tmp_path / "checkpoint_last.pt")
    plain, _, _ = _load(checkpoints["transformer"] / "checkpoint_best.pt")
    assert model.hybrid_weights() is not None
    # The decoder started from the plain weights and trained on: it moved, but
    # from there (not from a random init).
    w_new = model.decoder.layers[0].fc1.weight
    w_old = plain.decoder.layers[0].fc1.weight
    assert (w_new - w_old).abs().max() < 0.1 < w_old.abs().max() * 2


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--decoder-attention-scheme", "dnas"], "incremental"),
        (["--sinkhorn-iters", "0"], "--sinkhorn-iters must be an integer >= 1"),
        (["--hybrid-init", "2"], r"--hybrid-init must lie in \(0, 1\)"),
        (["--encoder-attention-scheme", "softmax"], "invalid choice"),
    ],
)
def test_bad_settings_exit_non_zero_with_a_message(flags, message, data_bin, tmp_path):
    proc = run(["fairseq-train", data_bin, "--arch", "transformer_hnas", *TRAIN,
                "--max-epoch", "1", "--save-dir", tmp_path, *flags], check=False)
    assert proc.returncode != 0
    assert re.search(message, proc.stderr + proc.stdout)
    assert not os.path.exists(tmp_path / "checkpoint_last.pt")


class Payload:
    """An arbitrary class: weights-only loading must refuse it."""


def test_torch_load_elsewhere_is_not_weakened(tmp_path):
    import fairseq_dnas.plugin  # noqa: F401  (installs the fairseq checkpoint fix)

    path = tmp_path / "untrusted.pt"
    torch.save({"x": Payload()}, path)
    with pytest.raises(Exception, match="weights_only|Unsupported global"):
        torch.load(path)
    from fairseq import checkpoint_utils

    with pytest.raises(Exception, match="refused to unpickle"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
