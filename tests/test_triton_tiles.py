"""The Triton kernels' tiles: every variant compiles for an H100, the tuner
(benchmarks/triton_tiles.py) writes a file the kernels read, and a bad file is
refused with a message that says what to fix.

Without a GPU the tuner runs under Triton's interpreter (its timings mean
nothing there; what is tested is that it times every candidate, checks their
results and writes what FAIRSEQ_DNAS_TRITON_TILES reads).
"""

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

tile_table = pytest.importorskip(
    "fairseq_dnas.attention.triton.tiles", reason="triton is not installed (scripts/install.sh installs it)"
)


def _run(args, env=None, timeout=600):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=dict(os.environ, **(env or {})),
                          capture_output=True, text=True, timeout=timeout)


NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU test_triton.py compiles and runs the kernels")
# every kernel a call can launch, and the flags each is specialized on
KERNELS = {"column_lse": ("HAS_BIAS",), "forward": ("HYBRID", "DROPOUT"), "backward_preprocess": ("HYBRID",),
           "backward_kv": ("HYBRID", "DROPOUT", "SINKHORN"), "backward_q": ("HYBRID", "DROPOUT", "SINKHORN"),
           "bias_gradient": (), "normalizer_ds": ()}


def _compile(cases, *extra):
    """benchmarks/triton_spills.py on ``cases`` (``--short 0``: the long
    kernels at every length, as the tests here pass): the kernels compiled for
    sm_90 as the JIT specializes the forward and backward of DNAS and HNAS,
    dropout 0 and 0.1, Sinkhorn 1 and 3 rounds (no GPU needed: Triton's
    NVIDIA backend runs on the CPU). The interpreter runs code that the
    compiler rejects (e.g. a non-constexpr global), so this closes that gap.
    Returns the (case, kernel, flags) of every line and the summary line."""
    res = _run(["benchmarks/triton_spills.py", "--cases", cases, *extra],
               env=dict(TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1"), timeout=3000)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    seen = set()
    for line in res.stdout.splitlines():
        if line.startswith(("fp16:", "bf16:", "fp32:")):  # "fp16:64 forward 128x32/8w/2s HYBRID=0 DROPOUT=1: ..."
            case, kernel, _, *flags = line.split(": ")[0].split()
            seen.add((case, kernel, tuple(sorted(f for f in flags if f != "-"))))
    return seen, res.stdout.strip().splitlines()[-1]


def _expected(cases):
    """Every flag combination of every kernel, per case."""
    return {(case, kernel, tuple(sorted(f"{f}={v}" for f, v in zip(flags, values))))
            for case in cases.split(",") for kernel, flags in KERNELS.items()
            for values in itertools.product((0, 1), repeat=len(flags))}


@NO_GPU
def test_kernels_compile_for_an_h100_within_the_tile_rule():
    """The representative case (fp16, head size 64: the recipes'), every
    kernel and flag combination, with and without dropout: compiles for
    sm_90 with at most 64 bytes of register spills, 99 KB of shared memory
    and a loop at most 1.3 times as long with dropout as without (the
    script's exit status; docs/performance.md), and the report reads each
    cubin."""
    seen, summary = _compile("fp16:64", "--max-dropout-ratio", "1.3", "--short", "0", "--lean", "0")
    assert seen == _expected("fp16:64"), sorted(seen ^ _expected("fp16:64"))
    assert "with a stack (register spills), the largest" in summary and "wgmma" in summary, summary
    assert "dropout makes a loop at most" in summary, summary


@pytest.mark.full
@NO_GPU
def test_every_case_compiles_for_an_h100_within_the_tile_rule():
    """The rest of the sweep: bf16/fp32 at head size 64 and fp16/bf16/fp32 at
    128, 130 variants (about 5 CPU minutes); fp16:64, the 26 others, is the
    default tier's test above."""
    cases = "bf16:64,fp32:64,fp16:128,bf16:128,fp32:128"
    seen, summary = _compile(cases, "--short", "0", "--lean", "0")
    assert seen == _expected(cases), sorted(seen ^ _expected(cases))
    assert f"compiled {len(_expected(cases))} variants" in summary, summary


def _tune(tmp_path, *extra):
    out = tmp_path / "tiles.json"
    env = {} if torch.cuda.is_available() else dict(TRITON_INTERPRET="1")
    res = _run(["benchmarks/triton_tiles.py", "--cases", "fp32:32", "--hidden", "32", "--lengths", "20",
                "--tokens", "40", "--rounds", "1", "--json", str(out), *extra], env=env)
    return res, out


@pytest.mark.parametrize("kernels", [
    # default tier: one kernel tuned (the mechanism); full tier: a second one
    # beside it (the file keeps both, the kernels read both, the rest untouched)
    ("column",),
    pytest.param(("column", "backward_kv"), marks=pytest.mark.full),
])
def test_tuner_times_every_candidate_and_the_kernels_read_its_file(tmp_path, kernels):
    res, out = _tune(tmp_path, "--kernels", ",".join(kernels))
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    tiles = data["tiles"]["float32:64"]  # head size 32 shares the <= 64 entry
    assert set(tiles) == set(kernels)
    for kernel in tiles:
        timed = data["measured"]["fp32:32"][kernel]
        tiles_step, stages_step = timed["steps"]
        # step 1: the current tile and every candidate, timed on all 4 workloads
        # (DNAS/HNAS x dropout 0/0.1) and checked against the current tile
        previous = tuple(timed["previous"])
        expected = {previous} | {(*t, tile_table.STAGES) for t in _candidates()[kernel]}
        assert set(tiles_step["relative_time"]) == {"%dx%d/%dw/%ds" % t for t in expected}
        assert tiles_step["relative_time"][tiles_step["baseline"]] == 1.0
        assert tiles_step["baseline"] == "%dx%d/%dw/%ds" % previous
        assert len(tiles_step["median_seconds"]) == 4
        assert all(len(v) == len(expected) for v in tiles_step["median_seconds"].values())
        # step 2: the winner with 1 to 4 pipeline stages
        assert stages_step["baseline"] == tiles_step["chosen"]
        assert len(stages_step["relative_time"]) == 4
        assert tiles[kernel] == timed["tile"]
        assert stages_step["chosen"] == "%dx%d/%dw/%ds" % tuple(tiles[kernel])
    assert "REJECTED" not in res.stderr and "skipped" not in res.stderr
    # the kernels take the file's tiles (with their stages), and only those
    probe = ("from fairseq_dnas.attention.triton import tiles as F; import json; "
             "print(json.dumps({k: list(v) for k, v in F.GPU_TILES['float32', 64].items()}))")
    res = _run(["-c", probe], env=dict(TRITON_INTERPRET="0", FAIRSEQ_DNAS_TRITON_TILES=str(out)))
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout)
    for kernel in kernels:
        assert got[kernel] == tiles[kernel], kernel
    assert got["forward"] == list(tile_table.GPU_TILES["float32", 64]["forward"])  # not tuned: unchanged


def _tuner():
    import triton_tiles  # benchmarks/ (tests/conftest.py puts it on sys.path)

    return triton_tiles


def _candidates():
    return _tuner().CANDIDATES


def test_a_current_tile_that_does_not_launch_gives_way(monkeypatch):
    """On a GPU with less shared memory than an H100 the built-in tile may not
    launch: the first candidate that runs everywhere becomes the baseline,
    and a tile that failed on any workload is never chosen."""
    tuner = _tuner()
    current, fits, faster, flaky = (128, 128, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 2)
    times = {"a": {current: None, fits: 2.0, faster: 1.0, flaky: 0.5},
             "b": {current: None, fits: 4.0, faster: 3.0, flaky: None}}
    loads = [("a", "a"), ("b", "b")]  # (name, inputs): the fake timer takes the inputs as its key
    monkeypatch.setattr(tuner, "time_candidates", lambda kernel, table, cands, inputs, *rest: times[inputs])
    args = type("Args", (), dict(rounds=1, min_gain=0.02))
    table, measured = {"forward": current}, dict(steps=[])
    best = tuner.pick(args, "forward", table, [current, fits, faster, flaky], loads, None, measured)
    assert best == faster and table["forward"] == faster
    step = measured["steps"][0]
    assert step["baseline"] == "64x64/4w/2s" and step["chosen"] == "64x32/4w/2s"
    assert step["relative_time"] == {"64x64/4w/2s": 1.0, "64x32/4w/2s": round((0.5 * 0.75) ** 0.5, 4)}


def test_tuner_refuses_bad_arguments(tmp_path):
    res, out = _tune(tmp_path, "--kernels", "forwrd")
    assert res.returncode == 2 and "unknown --kernels ['forwrd']" in res.stderr
    assert not out.exists()
    res, out = _tune(tmp_path, "--kernels", "sinkhorn_ds")
    assert res.returncode == 2 and "add --sinkhorn 3" in res.stderr
    assert not out.exists()
    res = _run(["benchmarks/triton_tiles.py", "--cases", "fp16:48", "--json", str(out)])
    assert res.returncode == 2 and "head size 32, 64 or 128" in res.stderr


@pytest.mark.parametrize("content, message", [
    ("{not json", "cannot read it as JSON"),
    ('{"half:64": {}}', 'expected an object with a "tiles" object'),
    ('{"tiles": {"half:96": {}}}', "unknown case 'half:96'"),
    ('{"tiles": {"half:64": {"forwrd": [64, 32, 4]}}}', "unknown kernel 'forwrd'"),
    ('{"tiles": {"half:64": {"forward": [64, 48, 4]}}}', "blocks powers of two >= 16"),
    ('{"tiles": {"half:64": {"forward": [64, 32, 3]}}}', "warps 1, 2, 4, 8 or 16"),
    ('{"tiles": {"half:64": {"forward": [64, 32, 4, 7]}}}', "stages 1 to 6"),
])
def test_a_bad_tiles_file_says_what_to_fix(tmp_path, content, message):
    path = tmp_path / "tiles.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="benchmarks/triton_tiles.py") as err:
        tile_table.read_tiles(str(path))
    assert message in str(err.value) and str(path) in str(err.value)


def test_a_bad_tiles_file_stops_the_import(tmp_path):
    path = tmp_path / "tiles.json"
    path.write_text('{"tiles": {"half:64": {"forward": [64, 32]}}}')
    res = _run(["-c", "import fairseq_dnas.attention.triton.long"],
               env=dict(TRITON_INTERPRET="0", FAIRSEQ_DNAS_TRITON_TILES=str(path)))
    assert res.returncode != 0 and "FAIRSEQ_DNAS_TRITON_TILES=" in res.stderr
    assert "[64, 32] is not [BLOCK_M, BLOCK_N, warps(, stages)]" in res.stderr


# --- the lean kernels' sweep (--lean): the compiler's survivors, timed; a deadline --------------------------


def _lean_candidates_file(tmp_path):
    path = tmp_path / "candidates.json"
    path.write_text(json.dumps(dict(triton="3.6.0", case="fp16:64", pruned=[],
                                    candidates={"lean_column": [[128, 64, 4, 2]],
                                                "lean_backward_hnas": [[32, 128, 8, 2]]})))
    return path


@pytest.mark.full  # two kernels tuned under the interpreter (about 25 s on 2 loaded cores)
def test_lean_sweep_times_the_survivors_and_writes_a_tiles_file(tmp_path):
    """--lean times each entry of the candidates file on the workloads that run it
    (under the interpreter: the interpreter's tile and one other stage count)
    and writes a file FAIRSEQ_DNAS_TRITON_TILES reads, with the candidates'
    Triton version beside this one's."""
    res, out = _tune(tmp_path, "--lean", "--candidates", str(_lean_candidates_file(tmp_path)))
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["candidates"]["triton"] == "3.6.0" and data["unfinished"] == []
    assert set(data["tiles"]["float32:64"]) == {"lean_column", "lean_backward_hnas"}
    column, backward = (data["measured"]["fp32:32"][k]["steps"][0] for k in ("lean_column", "lean_backward_hnas"))
    assert len(column["median_seconds"]) == 2  # DNAS and HNAS at dropout 0
    assert len(backward["median_seconds"]) == 1  # HNAS only
    assert len(backward["relative_time"]) == 2
    assert tile_table.read_tiles(str(out))["float32", 64]["lean_backward_hnas"] == tuple(
        data["tiles"]["float32:64"]["lean_backward_hnas"])


def test_lean_sweep_deadline_and_bad_arguments(tmp_path, capsys):
    """Past --deadline-s no kernel starts (the file lists them as unfinished);
    a missing candidates file or an unknown lean kernel is a one-line error."""
    import triton_tiles  # benchmarks/ (tests/conftest.py puts it on sys.path)

    args = triton_tiles.parse_args(["--lean", "--candidates", str(_lean_candidates_file(tmp_path)),
                                    "--json", "x.json", "--deadline-s", "5"])
    assert args.lengths == triton_tiles.LEAN_LENGTHS and args.deadline_s == 5
    report, unfinished = triton_tiles.tune_lean(args, "fp16", 64, torch.device("cpu"),
                                                list(args.lean_candidates), start=-1e9)
    assert report == {} and unfinished == ["lean_column", "lean_backward_hnas"]
    for argv, message in [(["--candidates", str(tmp_path / "none.json")], "cannot read its candidates"),
                          (["--candidates", str(_lean_candidates_file(tmp_path)), "--kernels", "forward"],
                           "unknown --kernels"),
                          (["--candidates", str(_lean_candidates_file(tmp_path)), "--deadline-s", "0"],
                           "--deadline-s must be > 0")]:
        with pytest.raises(SystemExit) as e:
            triton_tiles.parse_args(["--lean", "--json", "x.json", *argv])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_lean_candidates_include_the_occupancy_tiles():
    """The sweep's candidates: 4 warps, 3 stages and tiles for two blocks an SM
    in every lean entry, a 128-key column pass; each a valid tile."""
    cands = tile_table.LEAN_CANDIDATES
    assert set(cands) == {k for k in tile_table.GPU_TILES["half", 64] if k.startswith("lean_")}
    for entry, tiles in cands.items():
        assert any(w == 4 for _, _, w, _ in tiles) and any(s == 3 for *_, s in tiles), entry
        assert any(m * n <= 64 * 64 for m, n, _, _ in tiles), entry  # small enough for two blocks an SM
        assert all(m >= 16 and n >= 16 and w in (4, 8) and 1 <= s <= 4 for m, n, w, s in tiles)
    assert any(n == 128 for _, n, _, _ in cands["lean_column"])


def test_committed_lean_candidates_were_pruned_under_the_gpu_records_triton():
    """benchmarks/lean_tile_candidates.json (what triton_tiles.py --lean times by
    default) was written under the Triton version of the newest GPU record of
    the lean kernels, from tiles.LEAN_CANDIDATES, with a survivor for every
    lean entry and the current tile among them."""
    import re
    record = open(os.path.join(ROOT, "docs", "results", "2026-11-28-h200-lean-kernels.md")).read()
    gpu_triton = re.search(r"Triton (\d+\.\d+\.\d+)", record).group(1)
    with open(os.path.join(ROOT, "benchmarks", "lean_tile_candidates.json")) as f:
        data = json.load(f)
    assert data["triton"] == gpu_triton and data["case"] == "fp16:64"
    assert set(data["candidates"]) == set(tile_table.LEAN_CANDIDATES)
    for entry, kept in data["candidates"].items():
        assert kept and all(tuple(t) in tile_table.LEAN_CANDIDATES[entry] for t in kept), entry
        current = tile_table.GPU_TILES["half", 64][entry]
        assert [*current, tile_table.STAGES][:4] in kept, entry  # today's tile competes
    pruned = {(p["entry"], tuple(p["tile"])) for p in data["pruned"]}
    kept = {(e, tuple(t)) for e, ts in data["candidates"].items() for t in ts}
    assert pruned | kept == {(e, t) for e, ts in tile_table.LEAN_CANDIDATES.items() for t in ts}
