"""Explaining away (Definition 1, Theorem 2): attention capture, column sums
against the float64 reference, and fairseq_dnas/commands/explaining_away.py end to end."""

import csv
import json
import math
import os

import numpy as np
import pytest
import torch
from analysis_fixtures import tiny_data, tiny_runs
from helpers import ROOT, build_model, random_tokens, run
from fairseq_dnas.reference import reference_probs

from fairseq_dnas.analysis.capture import attention_sites, call_kwargs, head_probs
from fairseq_dnas.analysis.column_sums import ColumnStats, column_sums
from fairseq_dnas.analysis.explaining_away import ColumnSumRecorder

COMMAND = ["-m", "fairseq_dnas.commands.explaining_away"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --- capture and column sums, in-process on tiny random models ----------------


def _sharpen(model, factor):
    """Scale the query projections so that attention gets very peaked (UNAS
    then explains keys away), without touching the attention math."""
    with torch.no_grad():
        for site in attention_sites(model):
            site.module.q_proj.weight.mul_(factor)
    return model


def _batch(model, src_lengths=(5, 12, 8), tgt_lengths=(4, 6, 2)):
    d = model.encoder.dictionary
    src = random_tokens(src_lengths, max(src_lengths), d, left_pad=True, seed=1)
    tgt = random_tokens(tgt_lengths, max(tgt_lengths), d, left_pad=False, seed=2)
    return {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1), "prev_output_tokens": tgt}


def _captured_calls(model, batch):
    """Every attention call of one forward: (site, kwargs, observed output)."""
    calls, handles = [], []
    for site in attention_sites(model):
        def hook(module, args, kwargs, output, site=site):
            calls.append((site, call_kwargs(args, kwargs), output[0].detach()))
        handles.append(site.module.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        for h in handles:
            h.remove()
    return calls


def _reference(module, kwargs, scheme, query_pad, key_pad, causal=False):
    """float64 probabilities from the module's own projections (Algorithm 1)."""
    x, kv = kwargs["query"].double(), kwargs["key"].double()
    t_q, b, c = x.shape
    t_k = kv.shape[0]
    h, d = module.num_heads, module.head_dim

    def proj(lin, y):
        return y @ lin.weight.double().T + lin.bias.double()

    q = (proj(module.q_proj, x) * module.scaling).view(t_q, b, h, d).permute(1, 2, 0, 3)
    k = proj(module.k_proj, kv).view(t_k, b, h, d).permute(1, 2, 0, 3)
    s = q @ k.transpose(-1, -2)
    if causal:  # the decoder's future mask: query i sees keys j <= i
        s = s.masked_fill(torch.ones(t_q, t_k, dtype=torch.bool).triu(1), -1e300)
    u = getattr(module, "hybrid_weight", None)
    return reference_probs(s, scheme, key_pad, query_pad, None if u is None else u.double(),
                           getattr(module, "sinkhorn_iters", 1))


def _masks(site, batch, model):
    src = batch["src_tokens"].eq(model.encoder.padding_idx)
    tgt = batch["prev_output_tokens"].eq(model.decoder.padding_idx)
    return {"encoder_self": (src, src), "decoder_self": (tgt, tgt), "decoder_cross": (tgt, src)}[site.kind]


@pytest.mark.parametrize("arch", ["transformer", "transformer_dnas", "transformer_hnas"])
def test_captured_probabilities_match_the_reference(arch):
    """Every attention module (encoder, decoder self, cross), with padding on
    both sides: per-head probabilities and column sums over real queries
    against the float64 reference; the re-run reproduces the model's output."""
    model = _sharpen(build_model(arch, ["--hybrid-init", "0.3"] if arch.endswith("hnas") else []), 3.0)
    batch = _batch(model)
    calls = _captured_calls(model, batch)
    assert {s.kind for s, _, _ in calls} == {"encoder_self", "decoder_self", "decoder_cross"}
    for site, kwargs, observed in calls:
        out, probs = head_probs(site.module, kwargs)
        torch.testing.assert_close(out, observed, atol=2e-5, rtol=1e-4)
        query_pad, key_pad = _masks(site, batch, model)
        ref = _reference(site.module, kwargs, site.scheme, query_pad, key_pad,
                         causal=site.kind == "decoder_self")  # (B, H, T_q, T_k)
        real = ~query_pad[:, None, :, None] & ~key_pad[:, None, None, :]
        got = probs.transpose(0, 1).double()
        torch.testing.assert_close(got * real, ref, atol=2e-6, rtol=0)
        sums, scaled = column_sums(probs, query_pad, key_pad)
        ref_sums = ref.sum(dim=2).transpose(0, 1)  # (H, B, T_k)
        ref_sums = ref_sums[:, ~key_pad].numpy()
        np.testing.assert_allclose(sums, ref_sums, atol=1e-5, rtol=1e-5)
        n_keys = (~key_pad).sum(1)[None, :, None].expand(probs.shape[0], -1, key_pad.shape[1])
        np.testing.assert_allclose(scaled, sums * n_keys[:, ~key_pad].numpy(), rtol=1e-12)


def test_hnas_components_mix_to_the_model_attention():
    model = build_model("transformer_hnas", ["--hybrid-init", "0.3"])
    with torch.no_grad():  # different u per head
        for m in model.encoder.attention_modules():
            m.hybrid_logit.copy_(torch.tensor([-2.0, -0.5, 0.5, 2.0]))
    batch = _batch(model)
    real_q = batch["src_tokens"].ne(model.encoder.padding_idx)[None, :, :, None]
    calls = [c for c in _captured_calls(model, batch) if c[0].kind == "encoder_self"]
    for site, kwargs, _ in calls:
        _, mix = head_probs(site.module, kwargs)
        _, p_d = head_probs(site.module, kwargs, scheme="dnas")
        _, p_u = head_probs(site.module, kwargs, scheme="unas")
        u = site.module.hybrid_weight.detach()[:, None, None, None]
        # (fairseq's UNAS leaves padded query rows non-zero; they are never used)
        torch.testing.assert_close(mix * real_q, (u * p_d + (1 - u) * p_u) * real_q, atol=1e-6, rtol=0)
        assert site.module.scheme == "hnas"  # restored after computing components
        assert not site.module.skip_embed_dim_check


def test_theorem_2_and_explaining_away_on_peaked_attention():
    """With very peaked scores UNAS explains keys away; DNAS keeps every key
    at T * sum_i pi_ij >= 1 (Theorem 2), HNAS at >= u."""
    stats = {}
    for arch in ("transformer", "transformer_dnas", "transformer_hnas"):
        model = _sharpen(build_model(arch, ["--hybrid-init", "0.3"] if arch.endswith("hnas") else []), 100.0)
        with ColumnSumRecorder(model) as rec, torch.no_grad():
            model(**_batch(model, src_lengths=(20, 31, 9, 25), tgt_lengths=(5, 3, 7, 2)))
        stats[arch] = rec.stats
    unas = [st.summary() for (kind, _, _), st in stats["transformer"].items() if kind == "encoder_self"]
    assert all(s["fraction_explained_away"] > 0.05 for s in unas)
    for (kind, layer, comp), st in stats["transformer_dnas"].items():
        if kind == "encoder_self":
            assert comp == "dnas" and st.summary()["min_T_times_sum"] >= 1 - 1e-5
            assert st.summary()["explained_away"] == 0
    hnas = stats["transformer_hnas"]
    for layer in range(2):
        assert hnas[("encoder_self", layer, "mixture")].summary()["min_T_times_sum"] >= 0.3 - 1e-5
        assert hnas[("encoder_self", layer, "dnas")].summary()["min_T_times_sum"] >= 1 - 1e-5
        assert hnas[("encoder_self", layer, "unas")].summary()["fraction_explained_away"] > 0.05


def test_column_sums_do_not_depend_on_batch_mates():
    """Padding is excluded: a sentence alone gives the same sums as in a batch."""
    model = build_model("transformer_dnas")
    batch = _batch(model)

    def collect(b):
        with ColumnSumRecorder(model) as rec, torch.no_grad():
            model(**b)
        return {k: (st.n.sum(), st.min_scaled.min(), st.counts.sum(0)) for k, st in rec.stats.items()}

    together = {}
    for i in range(3):
        one = {"src_tokens": batch["src_tokens"][i:i + 1], "src_lengths": batch["src_lengths"][i:i + 1],
               "prev_output_tokens": batch["prev_output_tokens"][i:i + 1]}
        # strip the padding columns of a single sentence
        keep_s = one["src_tokens"].ne(model.encoder.padding_idx)[0]
        keep_t = one["prev_output_tokens"].ne(model.decoder.padding_idx)[0]
        one["src_tokens"] = one["src_tokens"][:, keep_s]
        one["prev_output_tokens"] = one["prev_output_tokens"][:, keep_t]
        for k, (n, m, counts) in collect(one).items():
            n0, m0, c0 = together.get(k, (0, np.inf, 0))
            together[k] = (n0 + n, min(m0, m), c0 + counts)
    batched = collect(batch)
    assert together.keys() == batched.keys()
    for k in batched:
        assert together[k][0] == batched[k][0]
        assert together[k][1] == pytest.approx(batched[k][1], rel=1e-5)
        # histogram bins are 0.05 wide in log space: at most a few keys may
        # sit on a bin edge and move by float32 rounding
        assert np.abs(together[k][2] - batched[k][2]).sum() <= 2


def test_column_stats_summary_is_exact():
    rng = np.random.default_rng(0)
    sums = np.exp(rng.uniform(-40, 2, size=(3, 500)))
    sums[1, :7] = 0.0  # float32 underflow
    scaled = sums * 17
    st = ColumnStats(3)
    st.add(sums[:, :200], scaled[:, :200])
    st.add(sums[:, 200:], scaled[:, 200:])
    s = st.summary()
    assert s["keys"] == 1500 and s["zero_sums"] == 7
    assert s["explained_away"] == int((sums < 1e-8).sum())
    assert s["min_T_times_sum"] == scaled.min() == 0.0
    finite = np.log(sums[sums > 0])
    assert s["min_log_sum"] == pytest.approx(finite.min()) and s["max_log_sum"] == pytest.approx(finite.max())
    assert s["median_log_sum"] == pytest.approx(np.median(np.log(np.where(sums > 0, sums, 1e-300))), abs=0.05)
    assert st.counts.sum() == 1500 - 7


# --- the script on tiny trained checkpoints ---------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tiny_runs(tmp_path_factory)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory)


def test_script_compares_unas_dnas_hnas(runs, data, tmp_path):
    import fairseq_dnas.plugin  # noqa: F401
    from fairseq import checkpoint_utils

    out = tmp_path / "ea"
    paths = [runs[n]["dir"] / "checkpoint_last.pt" for n in ("unas", "dnas", "hnas")]
    proc = run(["python", *COMMAND, "--path", *paths, "--data", data, "--out", out,
                "--labels", "U", "D", "H", "--batch-size", "7"])
    for kind in ("encoder_self", "decoder_cross", "decoder_self"):
        with open(out / f"{kind}.png", "rb") as f:
            assert f.read(8) == PNG_MAGIC
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    enc = [r for r in rows if r["attention"] == "encoder_self"]
    # valid has 30 sentences; every real source position of every head is a key
    ds_tokens = sum(len(line.split()) + 1 for line in open(os.path.join(os.path.dirname(data), "valid.src")))
    for r in enc:
        assert int(r["keys"]) == 4 * ds_tokens  # 4 heads
    assert {(r["model"], r["component"]) for r in enc} == {
        ("U", "unas"), ("D", "dnas"), ("H", "mixture"), ("H", "dnas"), ("H", "unas")}
    for r in enc:
        if r["component"] == "dnas":
            assert float(r["min_T_times_sum"]) >= 1 - 1e-5  # Theorem 2
    # HNAS rows carry the checkpoint's u
    hnas, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(paths[2])])
    u = hnas[0].hybrid_weights()
    for r in enc:
        if r["model"] == "H":
            layer_u = u[int(r["layer"])]
            assert float(r["hybrid_u_mean"]) == pytest.approx(sum(layer_u) / 4, abs=1e-4)
            assert [float(x) for x in r["hybrid_u_per_head"].split()] == pytest.approx(layer_u, abs=1e-4)
    assert {r["attention"] for r in rows} == {"encoder_self", "decoder_self", "decoder_cross"}
    assert all(r["scheme"] == "unas" for r in rows if r["attention"] != "encoder_self")
    # histograms.csv holds the numbers behind the pictures
    with open(out / "histograms.csv") as f:
        hist = list(csv.DictReader(f))
    for r in rows:
        n = sum(int(h["count"]) for h in hist if h["model"] == r["model"] and h["attention"] == r["attention"]
                and int(h["layer"]) == int(r["layer"]) + 1 and h["component"] == r["component"])
        assert n == int(r["keys"])
    summary = json.loads((out / "summary.json").read_text())
    assert [m["sentences"] for m in summary["models"]] == [30, 30, 30]
    assert "H" in proc.stdout and "mixture" in proc.stdout  # the printed table


def test_script_max_sentences_and_encoder_only(runs, data, tmp_path):
    out = tmp_path / "ea"
    run(["python", *COMMAND, "--path", runs["dnas"]["dir"] / "checkpoint_last.pt", "--data", data,
         "--out", out, "--subset", "test", "--max-sentences", "5", "--no-decoder"])
    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert {r["attention"] for r in rows} == {"encoder_self"}
    words = [len(line.split()) + 1 for line in open(os.path.join(os.path.dirname(data), "test.src"))][:5]
    assert all(int(r["keys"]) == 4 * sum(words) for r in rows)
    assert not (out / "decoder_cross.png").exists()


@pytest.mark.parametrize("case", ["missing_split", "empty_split", "missing_checkpoint", "missing_data"])
def test_script_bad_input(case, runs, data, tmp_path):
    out = tmp_path / "ea"
    ckpt = runs["unas"]["dir"] / "checkpoint_last.pt"
    args = {"missing_split": ["--path", ckpt, "--data", data, "--subset", "nosuch"],
            "empty_split": ["--path", ckpt, "--data", data, "--subset", "empty"],
            "missing_checkpoint": ["--path", tmp_path / "none.pt", "--data", data],
            "missing_data": ["--path", ckpt, "--data", tmp_path / "nodata"]}[case]
    message = {"missing_split": "split 'nosuch' not found", "empty_split": "split 'empty'",
               "missing_checkpoint": "checkpoint not found", "missing_data": "data folder not found"}[case]
    proc = run(["python", *COMMAND, *args, "--out", out], check=False)
    assert proc.returncode == 1
    assert message in proc.stderr
    if case == "missing_split":
        assert "splits found: empty, test, train, valid" in proc.stderr
    if case == "empty_split":
        assert "is empty (0 sentences)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()  # nothing half-written


def test_epsilon_is_the_papers():
    from fairseq_dnas.analysis.column_sums import EPSILON

    assert EPSILON == 1e-8 and math.log(EPSILON) == pytest.approx(-18.42, abs=0.01)
