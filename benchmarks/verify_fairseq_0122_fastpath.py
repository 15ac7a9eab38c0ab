#!/usr/bin/env python
"""Manual check: under PyPI fairseq 0.12.2 a *loaded* DNAS/HNAS model still
runs the DNAS/HNAS math, not fairseq's softmax fast path.

Why: fairseq 0.12.2's ``TransformerEncoderLayerBase`` has an inference fast
path ("BetterTransformer", ``torch._transformer_encoder_layer_fwd``, plain
softmax attention). It switches on when a state dict is loaded
(``_load_from_state_dict`` sets ``load_to_BT``) and the model is in eval mode,
if ``can_use_fastpath`` is true (post-norm, relu/gelu) and torch >= 1.12. It
skips ``self_attn`` entirely, so a subclass that only swaps the attention
module would silently evaluate plain softmax after ``fairseq-generate`` loads
it. ``DNASTransformerEncoderLayer`` pins ``can_use_fastpath`` to False. This
script shows, on real fairseq 0.12.2 code:

  (a) the trap is real: fairseq's own ``transformer``, saved and reloaded
      through fairseq's checkpoint reader, takes the fast path in eval mode
      (and it computes the same as fairseq's softmax attention);
  (b) ``transformer_dnas`` / ``transformer_hnas`` loaded the same way never
      take it, and their encoder output equals a float64 recomputation of
      Algorithm 1 (fairseq_dnas/reference.py) and differs from the same weights in
      the plain ``transformer``;
  (c) the guard is what makes the difference: the same DNAS layer with the
      ``can_use_fastpath`` property removed takes the fast path and outputs
      plain softmax attention;
plus ``import fairseq_dnas.plugin`` registers every architecture, the torch.load
compatibility patch (fairseq_patches.checkpoint_load) stays out of the way on torch < 2.6,
and a loaded model also gives Algorithm 1 on inputs long enough to take the
plugin's long-sequence attention kernel on this (old) torch.

It is a manual verification, not part of CI (the repository's env has
ve-fairseq 0.12.3 on Python 3.11, which has no fast path). PyPI fairseq
0.12.2 does not import on Python >= 3.11, and its sdist lacks the sources of
its torch C++ extensions (libbase/libnat), so build its wheel in a venv
without torch. Setup (Python 3.10, outside the repo; ~2 GB, ~5 min on 2 cores,
torch 1.12.1 is one ~750 MB wheel from PyPI):

    PY=/path/to/python3.10; ENV=/work/runs/py310; W=/work/runs/fs0122
    $PY -m venv $W/buildenv
    $W/buildenv/bin/pip install "numpy<2" "cython<3" setuptools wheel
    $W/buildenv/bin/pip download --no-deps -d $W/dl fairseq==0.12.2
    $W/buildenv/bin/pip wheel --no-deps --no-build-isolation -w $W/wheels \\
        $W/dl/fairseq-0.12.2.tar.gz
    $PY -m venv $ENV
    $ENV/bin/pip install torch==1.12.1 "numpy<2" "cython<3" cffi regex sacrebleu \\
        tqdm bitarray hydra-core==1.0.7 omegaconf==2.0.6 pytest
    $ENV/bin/pip install --no-deps $W/wheels/fairseq-0.12.2-*.whl

Run (from the repository root; the plugin is taken from PYTHONPATH):

    PYTHONPATH=$PWD $ENV/bin/python benchmarks/verify_fairseq_0122_fastpath.py

Takes about 20 s on 2 CPU cores. Prints PASS/FAIL per check and a summary; exit
code 0 when every check passes, 1 when one fails, 2 when the environment is
not fairseq 0.12.2 with torch >= 1.12.
"""

import argparse
import logging
import os
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(ROOT, "fairseq_dnas")

TINY = [
    "--encoder-layers", "2", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "2",
    "--dropout", "0",
]
EXPECTED_ARCHS = [
    "transformer_dnas", "transformer_hnas", "transformer_gigaword",
    *(f"transformer_{s}_{p}" for s in ("dnas", "hnas")
      for p in ("iwslt_de_en", "vaswani_wmt_en_de_big", "gigaword")),
]


class Report:
    def __init__(self):
        self.results = []

    def check(self, name, ok, detail=""):
        self.results.append((name, bool(ok)))
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  [{detail}]" if detail else ""), flush=True)
        return ok

    def summary(self):
        failed = [n for n, ok in self.results if not ok]
        print(f"\nSUMMARY: {len(self.results) - len(failed)}/{len(self.results)} checks passed"
              + (": ALL PASS" if not failed else ", FAILED: " + "; ".join(failed)))
        return 1 if failed else 0


class FastPathSpy:
    """Counts calls of ``torch._transformer_encoder_layer_fwd`` (fairseq looks
    the name up on ``torch`` at call time, so rebinding it there is enough)."""

    def __init__(self):
        self.calls = 0

    def __enter__(self):
        self.real = torch._transformer_encoder_layer_fwd

        def spy(*args, **kwargs):
            self.calls += 1
            return self.real(*args, **kwargs)

        torch._transformer_encoder_layer_fwd = spy
        return self

    def __exit__(self, *exc):
        torch._transformer_encoder_layer_fwd = self.real


def write_dictionaries(data_dir, words=40):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(words):
        d.add_symbol(f"w{i}")
    for lang in ("src", "tgt"):
        d.save(os.path.join(data_dir, f"dict.{lang}.txt"))
    return d


def build(data_dir, arch, extra=()):
    """(model, args) built the way fairseq-train builds it."""
    from fairseq import options, tasks

    import fairseq_dnas.plugin  # noqa: F401  (what --user-dir does, also when fairseq_dnas is already imported)

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        data_dir, "--arch", arch, "--user-dir", USER_DIR, "-s", "src", "-t", "tgt",
        "--optimizer", "adam", "--lr", "1e-3", *TINY, *extra,
    ])
    task = tasks.setup_task(args)
    return task.build_model(args), args


def sharpen(model, seed):
    """Random but peaked encoder attention (larger q weights) and, for HNAS, a
    different u per head, so DNAS, HNAS and softmax give clearly different
    outputs from a freshly initialised model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.encoder.layers:
            attn = layer.self_attn
            attn.q_proj.weight.mul_(4.0)
            attn.k_proj.weight.mul_(2.0)
            logit = getattr(attn, "hybrid_logit", None)
            if logit is not None:
                logit.copy_(torch.randn(logit.shape, generator=g) * 1.5)


def save_checkpoint(model, args, path):
    """A checkpoint in the layout of fairseq 0.12's ``Trainer.state_dict``."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    cfg = convert_namespace_to_omegaconf(args)
    state = {
        "args": None,
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [{
            "criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
            "lr_scheduler_state": {"best": None}, "num_updates": 0,
        }],
        "task_state": {},
        "extra_state": {"metrics": {}, "previous_training_time": 0},
    }
    checkpoint_utils.torch_persistent_save(state, path)


def load(path):
    """Through fairseq's reader, as fairseq-generate / the hub interface do."""
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path])
    return models[0].eval(), cfg, task


def tokens_and_lengths(d, lengths=(6, 13, 9), total=13, seed=0):
    """Left-padded (fairseq's default for sources) (B, T) tokens ending in </s>."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), total), d.pad(), dtype=torch.long)
    for b, n in enumerate(lengths):
        body = torch.randint(d.nspecial, len(d), (n - 1,), generator=g)
        tokens[b, total - n:] = torch.cat([body, torch.tensor([d.eos()])])
    return tokens, tokens.ne(d.pad()).sum(1)


def encode(model, tokens, lengths):
    """Encoder output (T, B, C) and the fast-path call count during it."""
    with torch.no_grad(), FastPathSpy() as spy:
        out = model.encoder(tokens, src_lengths=lengths)["encoder_out"][0]
    return out, spy.calls


def encode_with_reference(model, tokens, lengths):
    """The same model with every encoder self-attention replaced by the
    float64 reference (instance-level ``forward``; torch 1.12 forward hooks
    cannot see keyword arguments). Returns (output, reference calls)."""
    from fairseq_dnas.reference import reference_self_attention

    calls = [0]

    def make_forward(module):
        def forward(query, key=None, value=None, key_padding_mask=None, **_):
            calls[0] += 1
            return reference_self_attention(module, query, key_padding_mask).to(query.dtype), None
        return forward

    mods = model.encoder.attention_modules()
    for m in mods:
        m.forward = make_forward(m)
    try:
        out, fast = encode(model, tokens, lengths)
    finally:
        for m in mods:
            del m.forward
    return out, calls[0], fast


def plain_twin(model, cfg, task):
    """fairseq's own ``transformer`` with the same weights (no hybrid weights),
    loaded through ``load_state_dict`` as a checkpoint would be."""
    from fairseq.models.transformer import TransformerModel

    plain = TransformerModel.build_model(cfg.model, task)
    state = {k: v for k, v in model.state_dict().items() if "hybrid_logit" not in k}
    plain.load_state_dict(state, strict=True)
    return plain.eval()


def max_diff(a, b, real):
    return (a[real].double() - b[real].double()).abs().max().item()


def check_environment():
    import fairseq
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

    fast_path_in_fairseq = "_transformer_encoder_layer_fwd" in open(
        sys.modules[TransformerEncoderLayerBase.__module__].__file__).read()
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, fairseq "
          f"{fairseq.__version__} ({os.path.dirname(fairseq.__file__)})")
    ok = (fairseq.__version__ == "0.12.2" and fast_path_in_fairseq
          and hasattr(torch, "_transformer_encoder_layer_fwd"))
    if not ok:
        print("This check needs PyPI fairseq 0.12.2 (whose encoder layer has the "
              "BetterTransformer fast path) and torch >= 1.12; see --help for the setup.")
    return ok


def check_import(report):
    import fairseq_dnas.plugin  # noqa: F401
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils
    from fairseq.models import ARCH_MODEL_REGISTRY

    missing = [a for a in EXPECTED_ARCHS if a not in ARCH_MODEL_REGISTRY]
    report.check("import fairseq_dnas.plugin registers every architecture", not missing,
                 f"missing: {missing}" if missing else f"{len(EXPECTED_ARCHS)} archs")
    shim_wanted = hasattr(torch.serialization, "safe_globals")
    untouched = checkpoint_utils.torch is torch and distributed_utils.torch is torch
    report.check(
        "fairseq_patches.checkpoint_load leaves fairseq's torch.load alone on torch < 2.6",
        shim_wanted or untouched,
        f"torch.serialization.safe_globals {'exists' if shim_wanted else 'absent'}; "
        f"fairseq.checkpoint_utils.torch is torch: {checkpoint_utils.torch is torch}",
    )


def check_plain_transformer(report, work):
    """(a) The trap: fairseq's own transformer takes the fast path once loaded."""
    model, args = build(work, "transformer")
    sharpen(model, seed=1)
    path = os.path.join(work, "transformer.pt")
    save_checkpoint(model, args, path)
    loaded, _, task = load(path)
    layers = list(loaded.encoder.layers)
    report.check("plain transformer: load_to_BT set on every encoder layer by loading",
                 all(l.load_to_BT for l in layers) and not any(l.load_to_BT for l in model.encoder.layers))
    tokens, lengths = tokens_and_lengths(task.source_dictionary)
    real = tokens.ne(task.source_dictionary.pad()).T
    fast_out, fast_calls = encode(loaded, tokens, lengths)
    report.check("plain transformer (loaded, eval): fairseq 0.12.2 takes the fast path",
                 fast_calls == len(layers), f"{fast_calls} fast-path calls for {len(layers)} layers")
    # The fast path is fairseq's softmax attention: switch it off and compare.
    for l in layers:
        l.load_to_BT = False
    slow_out, slow_calls = encode(loaded, tokens, lengths)
    d = max_diff(fast_out, slow_out, real)
    report.check("plain transformer: fast path = fairseq's softmax attention path",
                 slow_calls == 0 and d < 1e-4, f"max |fast - slow| = {d:.2e} on real tokens")


def check_long_input(report, work, arch, tol):
    """Inputs longer than the plugin's dense-path limit (FAIRSEQ_DNAS_DENSE_MAX_LEN,
    192 by default) take another attention kernel in eval mode; it must run
    and give Algorithm 1 on this torch too."""
    model, args = build(work, arch)
    sharpen(model, seed=3)
    path = os.path.join(work, f"{arch}_long.pt")
    save_checkpoint(model, args, path)
    loaded, _, task = load(path)
    d = task.source_dictionary
    tokens, lengths = tokens_and_lengths(d, lengths=(260, 201), total=260)
    real = tokens.ne(d.pad()).T
    out, fast_calls = encode(loaded, tokens, lengths)
    ref_out, ref_calls, _ = encode_with_reference(loaded, tokens, lengths)
    diff = max_diff(out, ref_out, real)
    report.check(f"{arch}: 260-token input (loaded, eval) = float64 reference",
                 fast_calls == 0 and ref_calls == len(loaded.encoder.layers) and diff <= tol,
                 f"max diff {diff:.2e} (tol {tol:g}), {fast_calls} fast-path calls")


def check_scheme_model(report, work, arch, tol, extra=()):
    """(b) DNAS/HNAS: never the fast path; the output is Algorithm 1's."""
    model, args = build(work, arch, extra)
    sharpen(model, seed=2)
    name = arch + (" " + " ".join(extra) if extra else "")
    path = os.path.join(work, f"{arch}{len(extra)}.pt")
    save_checkpoint(model, args, path)
    loaded, cfg, task = load(path)
    layers = list(loaded.encoder.layers)
    report.check(f"{name}: loaded encoder layers have load_to_BT set, can_use_fastpath False",
                 all(l.load_to_BT for l in layers) and not any(l.can_use_fastpath for l in layers))
    dictionary = task.source_dictionary
    tokens, lengths = tokens_and_lengths(dictionary)
    real = tokens.ne(dictionary.pad()).T
    out, fast_calls = encode(loaded, tokens, lengths)
    report.check(f"{name} (loaded, eval): fast path never taken", fast_calls == 0,
                 f"{fast_calls} fast-path calls")
    ref_out, ref_calls, ref_fast = encode_with_reference(loaded, tokens, lengths)
    d_ref = max_diff(out, ref_out, real)
    report.check(f"{name}: encoder output = float64 Algorithm 1 reference",
                 ref_calls == len(layers) and ref_fast == 0 and d_ref <= tol,
                 f"max diff {d_ref:.2e} (tol {tol:g}), reference ran in {ref_calls}/{len(layers)} layers")
    plain = plain_twin(loaded, cfg, task)
    plain_out, plain_fast = encode(plain, tokens, lengths)
    d_plain = max_diff(out, plain_out, real)
    report.check(f"{name}: output differs from the same weights in fairseq's transformer",
                 plain_fast == len(layers) and d_plain > 1e-3,
                 f"max diff {d_plain:.2e}; the plain twin took the fast path in {plain_fast} layers")
    if arch == "transformer_hnas":
        u_saved = torch.tensor(model.hybrid_weights())
        u_loaded = torch.tensor(loaded.hybrid_weights())
        report.check(f"{name}: per-head u survives save/load",
                     torch.equal(u_saved, u_loaded) and u_loaded.std() > 0.05,
                     f"u = {[[round(x, 3) for x in row] for row in u_loaded.tolist()]}")


def check_without_guard(report, work):
    """(c) The guard is the difference: remove the property, and the loaded
    DNAS model silently runs softmax."""
    from fairseq_dnas.modules.dnas_encoder_layer import DNASTransformerEncoderLayer

    guard = DNASTransformerEncoderLayer.__dict__["can_use_fastpath"]
    delattr(DNASTransformerEncoderLayer, "can_use_fastpath")
    try:
        model, args = build(work, "transformer_dnas")
        sharpen(model, seed=2)
        path = os.path.join(work, "unguarded.pt")
        save_checkpoint(model, args, path)
        loaded, cfg, task = load(path)
        tokens, lengths = tokens_and_lengths(task.source_dictionary)
        real = tokens.ne(task.source_dictionary.pad()).T
        out, fast_calls = encode(loaded, tokens, lengths)
        plain_out, _ = encode(plain_twin(loaded, cfg, task), tokens, lengths)
    finally:
        DNASTransformerEncoderLayer.can_use_fastpath = guard
    n = len(loaded.encoder.layers)
    report.check("without the guard: loaded DNAS model takes the fast path", fast_calls == n,
                 f"{fast_calls} fast-path calls for {n} layers")
    # The same checkpoint with the guard back: the DNAS math, as in (b).
    guarded, _, _ = load(path)
    ref_out, ref_calls, ref_fast = encode_with_reference(guarded, tokens, lengths)
    d_plain, d_ref = max_diff(out, plain_out, real), max_diff(out, ref_out, real)
    report.check("without the guard: output is plain softmax, not DNAS",
                 ref_calls == n and ref_fast == 0 and d_plain < 1e-4 and d_ref > 1e-3,
                 f"max diff to the softmax twin {d_plain:.2e}, to the DNAS reference of "
                 f"the same checkpoint {d_ref:.2e}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tol", type=float, default=1e-5,
                        help="max abs difference allowed between the encoder output and "
                             "the float64 reference (default 1e-5)")
    parser.add_argument("--work-dir", default=None,
                        help="where to write the tiny dictionaries and checkpoints "
                             "(default: a temporary directory, removed afterwards)")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # fairseq's INFO lines would bury the report
    torch.manual_seed(0)

    report = Report()
    if not check_environment():
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or tmp
        os.makedirs(work, exist_ok=True)
        write_dictionaries(work)
        check_import(report)
        print(f"fast path: BT needs torch >= 1.12 (yes); nested tensors need torch >= 1.13.1 "
              f"({'yes' if hasattr(torch, '_nested_tensor_from_mask_left_aligned') else 'no'})")
        groups = [
            ("plain transformer", lambda: check_plain_transformer(report, work)),
            ("transformer_dnas", lambda: check_scheme_model(report, work, "transformer_dnas", args.tol)),
            ("transformer_dnas --sinkhorn-iters 3", lambda: check_scheme_model(
                report, work, "transformer_dnas", args.tol, ["--sinkhorn-iters", "3"])),
            ("transformer_hnas", lambda: check_scheme_model(report, work, "transformer_hnas", args.tol)),
            ("without the guard", lambda: check_without_guard(report, work)),
            ("transformer_dnas long input", lambda: check_long_input(
                report, work, "transformer_dnas", args.tol)),
            ("transformer_hnas long input", lambda: check_long_input(
                report, work, "transformer_hnas", args.tol)),
        ]
        for name, run_group in groups:
            try:
                run_group()
            except Exception as err:  # report it and go on with the other checks
                report.check(f"{name}: runs without error", False, f"{type(err).__name__}: {err}")
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
