"""What the plugin changes in fairseq (fairseq_dnas/fairseq_patches):
importing the torch-only parts changes nothing; ``--user-dir`` and the
explicit ``install()`` install every patch of the table; each switch turns
its patch off; installing twice wraps once; and every plugin flag error ends
a plain ``fairseq-train`` in one line.

Process state is what these tests are about, so each case runs in a process
of its own: a fresh interpreter where the import order matters (fairseq not
imported yet), else a fork of the test fork server (fairseq imported first).
"""

import os
import subprocess
import sys
import textwrap

import pytest

import fork_server
from helpers import BIN, ROOT, USER_DIR, WORDS, build_model, tiny_args
from helpers import run as run_command

from fairseq_dnas.fairseq_patches import LOAD_CHECKPOINT_LAYERS, PATCHES, add_load_checkpoint_layer

TORCH_ONLY = ("fairseq_dnas", "fairseq_dnas.nn", "fairseq_dnas.attention", "fairseq_dnas.hf", "fairseq_dnas.errors")

# Imported by every probe: how to find a table symbol and tell fairseq's own
# object from a replacement, without trusting the plugin's own marks alone.
PROBE_HEAD = textwrap.dedent('''
    import importlib, json, sys, types

    def resolve(path):
        parts = path.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for name in parts[cut:]:
                obj = getattr(obj, name)
            return obj
        raise ImportError(path)

    def unbound(path):
        """The object itself (a classmethod's function: its bound method is new at each access)."""
        obj = resolve(path)
        return getattr(obj, "__func__", obj)

    def is_original(path, obj):
        if path == "sys.excepthook":
            return obj is sys.__excepthook__
        if isinstance(obj, types.ModuleType):
            return sys.modules.get(obj.__name__) is obj
        f = getattr(obj, "__func__", obj)
        return (getattr(f, "_fairseq_dnas_patch", None) is None
                and not (getattr(f, "__module__", None) or "").startswith("fairseq_dnas"))

    def symbols():
        from fairseq_dnas.fairseq_patches import PATCHES  # the table (importing it installs nothing)
        return sorted({s for p in PATCHES for s in p.symbols})

    def state():
        """{symbol: original?}, and the layers of Trainer.load_checkpoint."""
        out = {s: is_original(s, resolve(s)) for s in symbols()}
        from fairseq.trainer import Trainer
        layers = sorted(getattr(Trainer.load_checkpoint, "_fairseq_dnas_layers", {}))
        return out, layers
''')


def _python(body, env=None, fresh=False):
    """Run PROBE_HEAD + body; returns its last stdout line as JSON."""
    import json
    import tempfile

    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(PROBE_HEAD + textwrap.dedent(body))
    try:
        if fork_server.ENABLED and not fresh:
            proc = fork_server.run(f.name, [], env=env, timeout=300)
        else:
            proc = subprocess.run([sys.executable, f.name], env=env, capture_output=True, text=True, timeout=300)
    finally:
        os.remove(f.name)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------- isolation

@pytest.mark.parametrize("fairseq_first", [True, False], ids=["fairseq-imported-before", "fairseq-imported-after"])
def test_importing_the_torch_only_parts_leaves_fairseq_untouched(fairseq_first):
    result = _python(f'''
        modules = {list(TORCH_ONLY)!r}
        if {fairseq_first!r}:
            import fairseq, fairseq.trainer, fairseq.checkpoint_utils, fairseq.data
            before = {{s: unbound(s) for s in symbols()}}
        for name in modules:
            importlib.import_module(name)
        fairseq_imported_by_them = "fairseq" in sys.modules and not {fairseq_first!r}
        if not {fairseq_first!r}:
            before = None
        originals, layers = state()
        same = before is None or all(unbound(s) is before[s] for s in before)
        from fairseq.models import ARCH_MODEL_REGISTRY
        print(json.dumps({{"originals": originals, "layers": layers, "same": same,
                          "fairseq_imported_by_them": fairseq_imported_by_them,
                          "plugin_side": sorted(m for m in sys.modules if m.split(".")[:2] in
                                                (["fairseq_dnas", "models"], ["fairseq_dnas", "tasks"],
                                                 ["fairseq_dnas", "modules"], ["fairseq_dnas", "plugin"])),
                          "registered": "transformer_dnas" in ARCH_MODEL_REGISTRY}}))
    ''', fresh=not fairseq_first)
    changed = [s for s, original in result["originals"].items() if not original]
    assert not changed, f"importing {TORCH_ONLY} changed {changed}"
    assert result["same"] and result["layers"] == []
    assert not result["fairseq_imported_by_them"]
    assert result["plugin_side"] == [] and not result["registered"]


# ------------------------------------------------------- installed by what

ALL_SYMBOLS = sorted({s for p in PATCHES for s in p.symbols})


def test_the_table_names_each_patch_once_with_its_switch_and_versions():
    names = [p.name for p in PATCHES]
    assert len(set(names)) == len(names)
    for patch in PATCHES:
        assert patch.env == f"FAIRSEQ_DNAS_PATCH_{patch.name.upper()}"
        assert patch.symbols and patch.why and "0.12" in patch.written_against


def test_user_dir_installs_every_patch_of_the_table():
    """What fairseq's --user-dir does (fairseq.utils.import_user_module), in
    a process that is a fairseq command (the command-line patches too)."""
    result = _python(f'''
        import argparse
        sys.argv[0] = "fairseq-train"
        from fairseq import utils
        utils.import_user_module(argparse.Namespace(user_dir={USER_DIR!r}))
        from fairseq.models import ARCH_MODEL_REGISTRY
        from fairseq.tasks import TASK_REGISTRY
        originals, layers = state()
        print(json.dumps({{"originals": originals, "layers": layers,
                          "registered": ["transformer_hnas" in ARCH_MODEL_REGISTRY, "roberta_hnas" in
                                         ARCH_MODEL_REGISTRY, "translation_rouge" in TASK_REGISTRY]}}))
    ''')
    assert result["originals"] == {s: False for s in ALL_SYMBOLS}
    assert result["layers"] == sorted(LOAD_CHECKPOINT_LAYERS)
    assert result["registered"] == [True, True, True]


def test_user_dir_after_a_torch_only_import_registers_the_plugin():
    """fairseq imports nothing for a --user-dir whose package is already
    imported; the package's __path__ hears that check and imports
    ``fairseq_dnas.plugin``, what --user-dir asks for. Without --user-dir
    nothing is registered."""
    result = _python(f'''
        import argparse
        import fairseq_dnas.nn
        from fairseq import utils
        from fairseq.models import ARCH_MODEL_REGISTRY
        before = "transformer_hnas" in ARCH_MODEL_REGISTRY
        utils.import_user_module(argparse.Namespace(user_dir=None))
        without = "transformer_hnas" in ARCH_MODEL_REGISTRY
        utils.import_user_module(argparse.Namespace(user_dir={USER_DIR!r}))
        print(json.dumps([before, without, "transformer_hnas" in ARCH_MODEL_REGISTRY, state()[0]]))
    ''')
    before, without, registered, originals = result
    assert not before and not without and registered
    command_line = {s for p in PATCHES if p.command_line for s in p.symbols} - {
        s for p in PATCHES if not p.command_line for s in p.symbols}
    assert originals == {s: s in command_line for s in ALL_SYMBOLS}  # a plain Python process


@pytest.mark.parametrize("command_line", [True, False])
def test_the_explicit_call_installs_every_patch(command_line):
    result = _python(f'''
        from fairseq_dnas import fairseq_patches
        names = fairseq_patches.install(command_line={command_line!r})
        print(json.dumps([names, *state()]))
    ''')
    names, originals, layers = result
    wanted = [p for p in PATCHES if command_line or not p.command_line]
    assert names == [p.name for p in wanted]
    patched = {s for p in wanted for s in p.symbols}
    assert originals == {s: s not in patched for s in ALL_SYMBOLS}
    assert layers == sorted(p for p in LOAD_CHECKPOINT_LAYERS if p in names)


# ------------------------------------------------------------ the switches

@pytest.mark.parametrize("off", [p.name for p in PATCHES] + ["all"])
def test_each_switch_turns_its_patch_off(off):
    env = {"FAIRSEQ_DNAS_PATCHES": "0"} if off == "all" else {f"FAIRSEQ_DNAS_PATCH_{off.upper()}": "0"}
    result = _python('''
        from fairseq_dnas import fairseq_patches
        names = fairseq_patches.install(command_line=True)
        print(json.dumps([names, *state()]))
    ''', env=env)
    names, originals, layers = result
    on = [p for p in PATCHES if off not in ("all", p.name)]
    assert names == [p.name for p in on]
    patched = {s for p in on for s in p.symbols}
    assert originals == {s: s not in patched for s in ALL_SYMBOLS}
    assert layers == sorted(p.name for p in on if p.name in LOAD_CHECKPOINT_LAYERS)


# ----------------------------------------------------------- wrapped once

def test_installing_twice_wraps_once():
    result = _python('''
        from fairseq_dnas import fairseq_patches
        from fairseq_dnas.fairseq_patches import (atomic_copy, bpe_files, checkpoint_load, exact_resume,
                                                  file_checks, inference_batches, is_patched, ngram_block,
                                                  numpy_alias, restore_file)
        fairseq_patches.install(command_line=True)
        first = {s: unbound(s) for s in symbols()}
        fairseq_patches.install(command_line=True)
        for module in (checkpoint_load, atomic_copy, numpy_alias, exact_resume, bpe_files, inference_batches,
                       ngram_block, restore_file, file_checks):
            module.install()
        file_checks.install_excepthook()
        inner_patched = {}
        for s in symbols():
            obj = unbound(s)
            inner = getattr(obj, "__wrapped__", None) or getattr(obj, "wrapped", None)
            inner_patched[s] = inner is None or is_patched(inner)
        print(json.dumps({"same": all(unbound(s) is first[s] for s in first), "inner": inner_patched,
                          "layers": state()[1]}))
    ''')
    assert result["same"]
    assert result["inner"] == {s: False for s in ALL_SYMBOLS}  # each wraps fairseq's own object
    assert result["layers"] == sorted(LOAD_CHECKPOINT_LAYERS)


@pytest.mark.parametrize("first", ["exact_resume", "file_checks"])
def test_load_checkpoint_layers_run_in_the_tables_order_whatever_the_install_order(first):
    calls = []

    class FakeTrainer:
        def load_checkpoint(self, filename):
            calls.append("fairseq")
            return filename

    def layer(name):
        def run(load, trainer, *args, **kwargs):
            calls.append(name)
            return load(*args, **kwargs)
        return run

    names = [first, *(n for n in LOAD_CHECKPOINT_LAYERS if n != first)]
    for name in names:
        add_load_checkpoint_layer(FakeTrainer, name, layer(name))
    add_load_checkpoint_layer(FakeTrainer, first, layer("again"))  # a second install adds nothing
    assert FakeTrainer().load_checkpoint("x.pt") == "x.pt"
    assert calls == [*LOAD_CHECKPOINT_LAYERS, "fairseq"]


# ---------------------------------------------------- flag errors, one line

def _dicts(folder):
    os.makedirs(folder, exist_ok=True)
    for side in ("article", "title"):
        with open(os.path.join(folder, f"dict.{side}.txt"), "w") as f:
            f.writelines(f"{w} 1\n" for w in WORDS)
    return folder


TRAIN = ["--source-lang", "article", "--target-lang", "title", "--optimizer", "adam", "--lr", "1e-3",
         "--batch-size", "8", "--max-update", "1", "--cpu", "--encoder-layers", "1", "--decoder-layers", "1",
         "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
         "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


def _assert_error_line(proc, *words):
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(w in last for w in words), last


def test_plain_fairseq_train_prints_a_bad_flag_in_one_line(tmp_path):
    """A real process, as a user types it: the README's example of a flag error."""
    data = _dicts(str(tmp_path / "bin"))
    proc = subprocess.run(
        [os.path.join(BIN, "fairseq-train"), data, "--user-dir", USER_DIR, "--arch", "transformer_hnas",
         "--hybrid-init", "0", "--save-dir", str(tmp_path / "save"), *TRAIN],
        env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    _assert_error_line(proc, "--hybrid-init must lie in (0, 1)", "0.0")
    assert not (tmp_path / "save" / "checkpoint_last.pt").exists()


@pytest.mark.parametrize("flags,words", [
    (["--arch", "transformer_hnas", "--sinkhorn-iters", "0"], ["--sinkhorn-iters must be an integer >= 1"]),
    (["--arch", "transformer_dnas", "--decoder-attention-scheme", "dnas"],
     ["--decoder-attention-scheme dnas is not possible", "Keep the decoder at 'unas'"]),
    # a scheme flag the encoder's scheme does not read (the architecture fills in every default, so
    # only a flag typed on the command line is refused)
    (["--arch", "transformer_dnas", "--hybrid-init", "0.3"],
     ["--hybrid-init 0.3 does nothing with a dnas encoder", "applies to hnas only", "--encoder-attention-scheme hnas"]),
    (["--arch", "transformer_dnas", "--hybrid-weight-per", "layer"],
     ["--hybrid-weight-per layer does nothing with a dnas encoder"]),
    (["--arch", "transformer_hnas", "--encoder-attention-scheme", "unas", "--sinkhorn-iters", "3"],
     ["--sinkhorn-iters 3 does nothing with a unas encoder", "applies to dnas and hnas only"]),
    (["--arch", "transformer_hnas", "--task", "translation_rouge", "--eval-rouge", "--eval-rouge-args", "[4]"],
     ["--eval-rouge-args must be a JSON object"]),
    (["--arch", "transformer_hnas", "--task", "translation_rouge", "--eval-rouge",
      "--eval-rouge-max-sentences", "-1"], ["--eval-rouge-max-sentences must be >= 0"]),
])
def test_every_plugin_flag_error_is_one_line(tmp_path, flags, words):
    data = _dicts(str(tmp_path / "bin"))
    proc = run_command(["fairseq-train", data, "--user-dir", USER_DIR, *flags, "--save-dir", str(tmp_path / "save"),
                        *TRAIN], check=False, env={"OMP_NUM_THREADS": "1"})
    _assert_error_line(proc, *words)


def test_a_missing_data_folder_or_batch_size_is_one_line(tmp_path):
    """fairseq ends these in a FileNotFoundError traceback from the task, and
    an AssertionError traceback from fairseq_cli's check of the batch size."""
    missing = str(tmp_path / "no-such-bin")
    proc = run_command(["fairseq-train", missing, "--user-dir", USER_DIR, "--arch", "transformer_hnas",
                        "--save-dir", str(tmp_path / "save"), *TRAIN], check=False, env={"OMP_NUM_THREADS": "1"})
    _assert_error_line(proc, f"{missing}: no such data folder", "fairseq-preprocess")
    unbatched = [a for i, a in enumerate(TRAIN) if "--batch-size" not in TRAIN[max(0, i - 1):i + 1]]
    proc = run_command(["fairseq-train", missing, "--user-dir", USER_DIR, "--arch", "transformer_hnas",
                        "--save-dir", str(tmp_path / "save"), *unbatched], check=False, env={"OMP_NUM_THREADS": "1"})
    _assert_error_line(proc, "Must specify batch size either with --max-tokens or --batch-size")
    assert not list(tmp_path.glob("save/*.pt"))


def test_hnas_flags_given_on_the_command_line_still_build_and_reload(tmp_path):
    """--hybrid-init and --hybrid-weight-per with HNAS train, and the checkpoint (which keeps
    the note of the flags given) loads into fairseq-generate's model again."""
    args = tiny_args("transformer_hnas", ["--hybrid-init", "0.25", "--hybrid-weight-per", "layer"])
    assert args.dnas_flags_given == ["--hybrid-init", "--hybrid-weight-per"]
    model = build_model("transformer_hnas", args=args)
    assert model.hybrid_weights() == [[pytest.approx(0.25)] * 4, [pytest.approx(0.25)] * 4]
    dnas = tiny_args("transformer_dnas")
    assert not hasattr(dnas, "dnas_flags_given") and dnas.hybrid_init == 0.5  # defaults are not "given"
    build_model("transformer_dnas", args=dnas)


def test_roberta_flag_error_is_one_line(tmp_path):
    data = str(tmp_path / "mlm")
    os.makedirs(data)
    with open(os.path.join(data, "dict.txt"), "w") as f:
        f.writelines(f"{w} 1\n" for w in WORDS)
    proc = run_command(["fairseq-train", data, "--user-dir", USER_DIR, "--task", "masked_lm", "--arch",
                        "roberta_hnas_small", "--hybrid-init", "1.5", "--criterion", "masked_lm", "--optimizer",
                        "adam", "--lr", "1e-3", "--batch-size", "4", "--max-update", "1", "--cpu",
                        "--tokens-per-sample", "16", "--save-dir", str(tmp_path / "save")],
                       check=False, env={"OMP_NUM_THREADS": "1"})
    _assert_error_line(proc, "--hybrid-init must lie in (0, 1)")
