#!/usr/bin/env python
"""The lean Triton kernels (attention/triton/lean.py) against the long ones
and SDPA on a GPU, in one command with a time budget: which set is faster,
per (dtype, head size, scheme, length band), and is the lean set exact there.

Two parts, in this order:

- ``exact``: the lean kernels against the float64 math on the GPU
  (``selfcheck.compare``: padding, forward and the q, k, v (u) gradients,
  dropout with the kernels' own mask), float16 and bfloat16 x head size 64
  and 128 x DNAS, HNAS x dropout off, on.
- ``time``: one forward + backward of the kernels alone, no padding, B x T =
  16,384 tokens, H = 1,024 / head size: for each dtype (fp16, bf16), head size
  (64, 128), scheme (DNAS, HNAS), attention dropout (0, 0.1) and T (1024,
  4096, 512, 2048: the lengths of the targets first), the lean set, the long
  set and SDPA (``scaled_dot_product_attention``, the same dropout). Each is
  timed with CUDA events (median of --rounds steps, after the warm-up that
  compiles) and profiled (torch profiler, --profile-steps steps): the GPU time
  of each kernel, their sum ("GPU ms", what the choice compares) and the
  launches a step.

Robust by construction: every configuration runs inside its own ``try``
(an error is a row, and the run goes on); every row is printed as a JSON
line and appended to OUT/lean.jsonl as it is measured, and OUT/lean.json and
OUT/lean.md are rewritten after every configuration, so that whatever stops the command
leaves complete files for what was measured. --budget-s bounds the time:
configurations that would start after it are recorded as skipped.

OUT/lean.json holds the rows and ``chosen``: per (input kind, head size class,
scheme, length band) the set with the smaller GPU time summed over the
dtypes and dropouts measured, in the form ``selection.read_lean_table``
reads (``selection.LEAN_CHOSEN`` is that table, filled from a dated record).
OUT/lean.md is the same as markdown tables.

    python benchmarks/gpu_lean.py --out gpu-lean                 # on a GPU (about 2-3 minutes on an H200)
    python benchmarks/gpu_lean.py --out gpu-lean --budget-s 100 --lengths 1024,4096
    python benchmarks/gpu_lean.py --dry-run                      # the plan, on any machine
    python benchmarks/gpu_lean.py --out /tmp/lean --stand-in     # without a GPU: Triton's interpreter, tiny sizes
    python benchmarks/gpu_lean.py --render lean.log --out DIR    # lean.json and lean.md from a run's stdout

``--stand-in`` runs the same code on CPU tensors under Triton's interpreter
(float16 and float32, head size 16, T 40): it proves the command runs end to
end and writes its files; its times measure the interpreter, not a GPU.
Exit status 1 if a configuration disagrees with float64 or fails, 0 otherwise
(configurations skipped for the budget are reported, not failures).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


GPU_PLAN = dict(dtypes=("float16", "bfloat16"), heads=(64, 128), schemes=("dnas", "hnas"), dropouts=(0.0, 0.1),
                lengths=(1024, 4096, 512, 2048), tokens=16384, width=1024)
STAND_IN_PLAN = dict(dtypes=("float16",), heads=(16,), schemes=("dnas", "hnas"), dropouts=(0.0, 0.1),
                     lengths=(40,), tokens=40, width=32)
# The exactness part's first configurations (the targets' dtype and head size,
# and bfloat16 at the other head size); the rest run after the timing part.
EXACT_FIRST = (("float16", 64), ("bfloat16", 128), ("float16", 16))
SETS = ("lean", "long", "sdpa")
# Matrix products a score element costs in forward + backward, the algorithm's count at equal efficiency:
# FlashAttention's 7 (S = QK^T, O = PV; backward S again, dV, dP, dQ, dK), DNAS 9, HNAS 11.
MATMULS = {"sdpa": 7, "dnas": 9, "hnas": 11}
BUDGET_S = 150  # default: with imports and the last configuration, under 200 s on an H200


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="folder for lean.jsonl, lean.json and lean.md (created; without it: stdout only)")
    p.add_argument("--render", metavar="LOG", help="only write lean.json and lean.md into --out from the stdout "
                                                  "of a run (e.g. gpu_session.sh's lean.log)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S,
                   help=f"seconds after which no new configuration starts (default {BUDGET_S})")
    p.add_argument("--rounds", type=int, help="timed steps a case, median (default 10; stand-in 1)")
    p.add_argument("--profile-steps", type=int, help="profiled steps a case (default 3; stand-in 1)")
    p.add_argument("--lengths", help="comma-separated T (default 1024,4096,512,2048; stand-in 40)")
    p.add_argument("--dtypes", help="comma-separated from float16,bfloat16,float32 (default float16,bfloat16)")
    p.add_argument("--heads", help="comma-separated head sizes (default 64,128)")
    p.add_argument("--schemes", help="comma-separated from dnas,hnas (default both)")
    p.add_argument("--dropouts", help="comma-separated attention dropout probabilities (default 0,0.1)")
    p.add_argument("--no-exact", action="store_true", help="skip the exactness part")
    p.add_argument("--stand-in", action="store_true",
                   help="no GPU: run on CPU under Triton's interpreter at tiny sizes (proves the command runs)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit (any machine)")
    args = p.parse_args(argv)
    plan = dict(STAND_IN_PLAN if args.stand_in else GPU_PLAN)
    try:
        if args.lengths:
            plan["lengths"] = tuple(int(x) for x in args.lengths.split(",") if x)
        if args.heads:
            plan["heads"] = tuple(int(x) for x in args.heads.split(",") if x)
        if args.dropouts:
            plan["dropouts"] = tuple(float(x) for x in args.dropouts.split(",") if x)
    except ValueError:
        p.error("--lengths and --heads take comma-separated integers (e.g. --lengths 1024,4096), "
                "--dropouts numbers (e.g. 0,0.1)")
    if args.schemes:
        plan["schemes"] = tuple(x for x in args.schemes.split(",") if x)
    if not plan["schemes"] or any(x not in ("dnas", "hnas") for x in plan["schemes"]):
        p.error(f"--schemes takes dnas and/or hnas; got {args.schemes!r}")
    if not plan["dropouts"] or any(not 0.0 <= x < 1.0 for x in plan["dropouts"]):
        p.error(f"--dropouts takes probabilities in [0, 1); got {args.dropouts!r}")
    if args.dtypes:
        plan["dtypes"] = tuple(x for x in args.dtypes.split(",") if x)
    bad = [d for d in plan["dtypes"] if d not in ("float16", "bfloat16", "float32")]
    if bad or not plan["dtypes"]:
        p.error(f"--dtypes takes float16, bfloat16 or float32; got {args.dtypes!r}")
    if any(h < 16 or h > 128 for h in plan["heads"]) or any(t < 2 for t in plan["lengths"]):
        p.error("--heads take 16 to 128 and --lengths at least 2")
    args.rounds = args.rounds or (1 if args.stand_in else 10)
    args.profile_steps = args.profile_steps or (1 if args.stand_in else 3)
    if args.rounds < 1 or args.profile_steps < 1 or args.budget_s <= 0:
        p.error("--rounds, --profile-steps and --budget-s take positive numbers")
    if args.render and not args.out:
        p.error("--render LOG needs --out FOLDER (where lean.json and lean.md go)")
    if args.render and not os.path.isfile(args.render):
        p.error(f"--render: no file {args.render}")
    args.plan = plan
    return args


def exact_configs(plan, device):
    """The lean set's configurations of the exactness part: (first, rest),
    ``EXACT_FIRST``'s (dtype, head size) pairs before the timing part, the
    others after it."""
    import torch

    from fairseq_dnas.attention import selfcheck

    dtypes = [d for d in plan["dtypes"] if not (device == "cpu" and d == "bfloat16")]  # the interpreter's bf16 dot
    heads = sorted({64 if h <= 64 else 128 for h in plan["heads"]}) if device != "cpu" else [16]
    pairs = [(d, h) for d in dtypes for h in heads]
    first = [pair for pair in pairs if pair in EXACT_FIRST] or pairs[:1]

    def configs(chosen):
        return [selfcheck.Config(device, getattr(torch, d), h, scheme, dropout, 1, True, False, "lean")
                for d, h in chosen for scheme in plan["schemes"] for dropout in (False, True)]
    return configs(first), configs([pair for pair in pairs if pair not in first])


def time_configs(plan):
    """(dtype, head, scheme, dropout, T) of the timing part, the targets' cases first:
    fp16 before bf16, head size 64 before 128, and within them T in the plan's order."""
    return [(d, h, scheme, p, t) for d in plan["dtypes"] for h in plan["heads"] for p in plan["dropouts"]
            for scheme in plan["schemes"] for t in plan["lengths"]]


def shape_of(plan, head, length):
    """(B, H) of a timing case: B x T = the plan's tokens, H x head size = its width."""
    return max(1, plan["tokens"] // length), max(1, plan["width"] // head)


class Results:
    """The rows, written as they come: one JSON line each on stdout (after a
    first line with part "meta"; ``--render`` rebuilds the files from such a
    log), and with an output folder OUT/lean.jsonl appended (flushed) and
    OUT/lean.json and OUT/lean.md rewritten whole (through a temporary file
    and a rename, so that a reader never sees half a file)."""

    def __init__(self, out, meta):
        self.out, self.meta, self.rows = None if out is None else Path(out), meta, []
        self.t0 = time.monotonic()
        print(json.dumps(dict(part="meta", **meta)), flush=True)
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "lean.jsonl").write_text("")

    def add(self, **row):
        row["elapsed_s"] = round(time.monotonic() - self.t0, 1)  # progress: seconds since the start
        self.rows.append(row)
        line = json.dumps(row)
        print(line, flush=True)
        if self.out is not None:
            with open(self.out / "lean.jsonl", "a") as f:
                f.write(line + "\n")
            self.write()

    def write(self, complete=False):
        if self.out is not None:
            write_files(self.out, dict(self.meta, complete=complete, rows=self.rows, chosen=choose(self.rows)))


def write_files(out, data):
    """OUT/lean.json and OUT/lean.md of ``data`` (meta, complete, rows, chosen)."""
    for name, text in (("lean.json", json.dumps(data, indent=1)), ("lean.md", markdown(data))):
        tmp = Path(out) / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, Path(out) / name)


def render(log, out):
    """lean.json and lean.md from the stdout of a run (its JSON lines; other
    lines skipped): what ``gpu_session.sh``'s lean.log holds."""
    meta, rows, complete = {}, [], False
    for line in Path(log).read_text().splitlines():
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("part") == "meta":
            meta = {k: v for k, v in row.items() if k != "part"}
        elif row.get("part") == "done":
            complete = True
        elif "part" in row:
            rows.append(row)
    Path(out).mkdir(parents=True, exist_ok=True)
    write_files(out, dict(meta, complete=complete, rows=rows, chosen=choose(rows)))
    return rows


def head_class(head):
    return 64 if head <= 64 else 128


def choose(rows):
    """``selection.read_lean_table``'s entries: per (kind, head class, scheme,
    band) the set (lean or long) with the smaller GPU time summed over the
    cases where both were measured, with those sums; never 'lean' where an
    exactness row of that kind, head class and scheme failed (``exact``
    False)."""
    from fairseq_dnas.attention import selection

    inexact = {("float32" if r["dtype"] == "float32" else "half", head_class(r["head"]), r["scheme"])
               for r in rows if r.get("part") == "exact" and not r.get("ok")}
    timed = {}
    for r in rows:
        if r.get("part") == "time" and r.get("gpu_ms") is not None:
            timed[(r["dtype"], r["head"], r["scheme"], r["dropout"], r["T"], r["set"])] = r["gpu_ms"]
    sums = {}
    for (dtype, head, scheme, dropout, t, name), ms in timed.items():
        if name != "lean" or (dtype, head, scheme, dropout, t, "long") not in timed:
            continue
        key = ("float32" if dtype == "float32" else "half", head_class(head), scheme, selection.lean_band(t))
        entry = sums.setdefault(key, [0.0, 0.0, 0])
        entry[0] += ms
        entry[1] += timed[(dtype, head, scheme, dropout, t, "long")]
        entry[2] += 1
    return [dict(kind=k[0], head=k[1], scheme=k[2], band=k[3],
                 set="lean" if lean < long and k[:3] not in inexact else "long", exact=k[:3] not in inexact,
                 lean_gpu_ms=round(lean, 4), long_gpu_ms=round(long, 4), lean_x_long=round(lean / long, 3),
                 cases=n)
            for k, (lean, long, n) in sorted(sums.items())]


def markdown(data) -> str:
    rows = data["rows"]
    lines = [f"# Lean against long kernels and SDPA: {data.get('device', '?')}", "",
             f"{data.get('versions', '')}; started {data.get('started', '?')}; "
             f"{'complete' if data.get('complete') else 'in progress or cut short'}", ""]
    exact_rows = [r for r in rows if r["part"] == "exact"]
    if exact_rows:
        lines += ["## Exactness of the lean kernels against float64", "",
                  "| dtype | head size | scheme | dropout | T | output error (tol) | gradient error (tol) | result |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in exact_rows:
            if r.get("error"):
                lines.append(f"| {r['dtype']} | {r['head']} | {r['scheme']} | {r['dropout']} | {r.get('T', '-')} "
                             f"| - | - | ERROR {r['error'][:120]} |")
            else:
                lines.append(f"| {r['dtype']} | {r['head']} | {r['scheme']} | {r['dropout']} | {r['T']} "
                             f"| {r['forward_error']:.1e} ({r['forward_tol']:g}) | {r['grad_error']:.1e} "
                             f"{r['grad_name']} ({r['grad_tol']:g}) | {'ok' if r['ok'] else 'DISAGREES'} |")
        lines.append("")
    timed = {(r["dtype"], r["head"], r["scheme"], r["dropout"], r["T"], r["set"]): r
             for r in rows if r["part"] == "time"}
    cases = sorted({k[:5] for k in timed if k[5] != "sdpa"}, key=lambda k: (k[0], k[1], k[2], k[3], k[4]))
    if cases:
        lines += ["## Forward + backward, GPU time (sum of the kernels, ms) and x SDPA", "",
                  "| dtype | head size | scheme | dropout | T | B x H | SDPA | long (x SDPA) | lean (x SDPA) "
                  "| lean / long | launches long / lean | event ms SDPA / long / lean |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

        def cell(r, base=None):
            if r is None:
                return "-"
            if r.get("error"):
                return "ERROR"
            if r.get("gpu_ms") is None:
                return "skipped" if r.get("skipped") else "-"
            ratio = f" ({r['gpu_ms'] / base:.2f}x)" if base else ""
            return f"{r['gpu_ms']:.3f}{ratio}"

        for key in cases:
            got = {name: timed.get(key + (name,)) for name in ("lean", "long")}
            got["sdpa"] = timed.get((key[0], key[1], "-", key[3], key[4], "sdpa"))
            base = got["sdpa"]["gpu_ms"] if got["sdpa"] and got["sdpa"].get("gpu_ms") else None
            ok = [got[n] for n in ("lean", "long") if got[n] and got[n].get("gpu_ms")]
            ratio = f"{got['lean']['gpu_ms'] / got['long']['gpu_ms']:.3f}" if len(ok) == 2 else "-"
            any_row = next(r for r in got.values() if r)
            launches = " / ".join(f"{got[n]['launches']:g}" if got[n] and got[n].get("launches") is not None
                                  else "-" for n in ("long", "lean"))
            events = " / ".join(f"{got[n]['event_ms']:.3f}" if got[n] and got[n].get("event_ms") else "-"
                                for n in SETS[::-1])
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {any_row.get('B', '-')} x "
                         f"{any_row.get('H', '-')} | {cell(got['sdpa'])} | {cell(got['long'], base)} "
                         f"| {cell(got['lean'], base)} | {ratio} | {launches} | {events} |")
        lines.append("")
    if data.get("chosen"):
        lines += ["## The set the clock chose (selection.LEAN_CHOSEN's entries)", "",
                  "| kind | head size | scheme | band (T up to) | set | lean / long | cases |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in data["chosen"]:
            lines.append(f"| {c['kind']} | {c['head']} | {c['scheme']} | {c['band']} | {c['set']} "
                         f"| {c['lean_x_long']:.3f} | {c['cases']} |")
        lean = [c for c in data["chosen"] if c["set"] == "lean"]
        lines += ["", "As `selection.LEAN_CHOSEN` (with this run's dated record named beside it):", "", "```python",
                  "LEAN_CHOSEN = {" + ", ".join(f"({c['kind']!r}, {c['head']}, {c['scheme']!r}, {c['band']}): 'lean'"
                                                for c in lean) + "}", "```", ""]
    kernel_rows = [r for r in rows if r["part"] == "time" and r.get("kernels")]
    if kernel_rows:
        lines += ["## Each kernel's GPU time a step (ms, profiler)", "",
                  "| dtype | head size | scheme | dropout | T | set | kernel | launches | ms |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in kernel_rows:
            for name, (launches, ms) in r["kernels"].items():
                if ms <= 0:  # the stand-in's torch operations (no GPU time)
                    continue
                lines.append(f"| {r['dtype']} | {r['head']} | {r['scheme']} | {r['dropout']} | {r['T']} | {r['set']} "
                             f"| {name[:60]} | {launches:g} | {ms:.4f} |")
        lines.append("")
    other = [r for r in rows if r["part"] in ("error", "skipped")]
    if other:
        lines += ["## Errors and skipped configurations", ""]
        lines += [f"- {json.dumps(r)}" for r in other]
        lines.append("")
    return "\n".join(lines)


def synchronize(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(step, device, rounds):
    """Median milliseconds of one call of ``step``: CUDA events on a GPU, the
    host clock on CPU (the stand-in)."""
    import torch

    times = []
    for _ in range(rounds):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def profiled(step, device, steps):
    """{kernel: [launches a step, ms a step]} from the torch profiler (on CPU,
    the stand-in: torch's CPU operations, which Triton's interpreter is not)."""
    from gpu_quick import per_kernel
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    activity = ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    kinds = DeviceType.CUDA if device == "cuda" else DeviceType.CPU
    return {name: [round(n, 2), round(ms, 5)] for name, (n, ms) in per_kernel(prof.events(), steps, kinds).items()}


def make_step(name, scheme, q, k, v, u, g, p):
    """One forward + backward of a set on these inputs."""
    import torch

    inputs = (q, k, v, u) if scheme == "hnas" and name != "sdpa" else (q, k, v)
    if name == "sdpa":
        def forward():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p)
    else:
        from fairseq_dnas.attention import selection

        attention = selection.attention_function(name)

        def forward():
            return attention(q, k, v, hybrid_weight=u if scheme == "hnas" else None, dropout_p=p)
    return lambda: torch.autograd.grad(forward(), inputs, g)


def run_exact(results, configs, deadline):
    from fairseq_dnas.attention import selection, selfcheck

    for config in configs:
        row = dict(part="exact", dtype=str(config.dtype).replace("torch.", ""), head=config.head_dim,
                   scheme=config.scheme, dropout=config.dropout)
        if time.monotonic() > deadline:
            results.add(**dict(row, part="skipped", what="exact", skipped=True))
            continue
        start = time.monotonic()
        try:
            size = selfcheck.sizes(config)
            result = selfcheck.compare(config, selection.attention_function("lean"), **size)
            results.add(**row, T=size["length"], forward_error=result.forward_error, forward_tol=result.forward_tol,
                        grad_error=result.grad_error, grad_name=result.grad_name, grad_tol=result.grad_tol,
                        error=result.error, ok=bool(result.ok), seconds=round(time.monotonic() - start, 1))
        except Exception as e:  # noqa: BLE001 (a row, and the run goes on)
            results.add(**row, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                        ok=False, seconds=round(time.monotonic() - start, 1))


def tflops(scheme, b, h, t, head, ms):
    """TFLOP/s of one forward + backward: MATMULS[scheme] products of 2 x head
    flops at each of the B x H x T x T score elements, over ``ms``."""
    return MATMULS[scheme] * 2 * head * b * h * t * t / (ms * 1e-3) / 1e12


def kernel_lines(rows):
    """'lean: ' lines of the timed kernels: GPU ms, TFLOP/s, x SDPA per
    (dtype, head, dropout, T, scheme, set)."""
    sdpa = {(r["dtype"], r["head"], r["dropout"], r["T"]): r["gpu_ms"] for r in rows
            if r["part"] == "time" and r["set"] == "sdpa" and r.get("gpu_ms")}
    lines = []
    for r in rows:
        if r["part"] != "time" or not r.get("gpu_ms"):
            continue
        base = sdpa.get((r["dtype"], r["head"], r["dropout"], r["T"]))
        ratio = f"x{r['gpu_ms'] / base:.2f} SDPA" if base else "x? SDPA"
        lines.append(f"lean: {r['dtype']} head {r['head']} dropout {r['dropout']:g} T {r['T']} "
                     f"{r['set']} {r['scheme']}: {r['gpu_ms']:.3f} ms, {r['tflops']:.0f} TFLOP/s, {ratio}")
    return lines


def run_time(results, plan, device, deadline, rounds, profile_steps):
    import torch

    sdpa_done = set()
    for dtype_name, head, scheme, p, t in time_configs(plan):
        b, h = shape_of(plan, head, t)
        late = time.monotonic() > deadline  # decided once a case, so that its sets are timed together or not at all
        for name in SETS:
            row = dict(part="time", dtype=dtype_name, head=head, scheme=scheme, dropout=p, T=t, B=b, H=h, set=name)
            if name == "sdpa":  # the same for both schemes: timed once
                if (dtype_name, head, p, t) in sdpa_done:
                    continue
                sdpa_done.add((dtype_name, head, p, t))
                row["scheme"] = "-"
            if late:
                results.add(**dict(row, part="skipped", skipped=True))
                continue
            start = time.monotonic()
            try:
                gen = torch.Generator(device=device).manual_seed(0)  # drawn where they are used: no copies
                dtype = getattr(torch, dtype_name)
                q, k, v, g = (torch.randn((b, h, t, head), generator=gen, device=device).to(dtype) for _ in range(4))
                q, k, v = (x.requires_grad_() for x in (q, k, v))
                u = torch.full((h,), 0.5, device=device, requires_grad=True)
                step = make_step(name, scheme, q, k, v, u, g, p)
                step()  # compiles on first use
                synchronize(device)
                first_s = time.monotonic() - start
                step()
                ms = median_ms(step, device, rounds)
                kernels = profiled(step, device, profile_steps)
                if device == "cuda":
                    gpu = sum(ms_ for _, ms_ in kernels.values())
                    launches = round(sum(n for n, _ in kernels.values()), 2)
                else:  # the stand-in has no GPU kernels: its host time stands in
                    gpu, launches = ms, None
                flops_of = "sdpa" if name == "sdpa" else scheme
                results.add(**row, event_ms=round(ms, 4), gpu_ms=round(gpu, 4), launches=launches,
                            tflops=round(tflops(flops_of, b, h, t, head, gpu), 2),
                            kernels=kernels, first_call_s=round(first_s, 2),
                            seconds=round(time.monotonic() - start, 1))
            except Exception as e:  # noqa: BLE001 (a row, and the run goes on)
                results.add(**row, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                            seconds=round(time.monotonic() - start, 1))
            finally:
                q = k = v = g = u = step = None
                if device == "cuda":
                    try:
                        torch.cuda.empty_cache()
                    except Exception:  # noqa: BLE001 (a broken context shows in the next rows' errors)
                        pass


def plan_lines(args):
    plan = args.plan
    device = "cpu" if args.stand_in else "cuda"
    lines = [f"gpu_lean.py plan ({'stand-in: CPU, Triton interpreter' if args.stand_in else 'GPU'}; "
             f"budget {args.budget_s:g} s, {args.rounds} timed and {args.profile_steps} profiled steps a case)"]
    if not args.no_exact:
        first, rest = exact_configs(plan, device)
        lines.append(f"exact: {len(first) + len(rest)} configurations of the lean kernels against float64 "
                     f"(padding, forward and gradients); {len(first)} first, {len(rest)} after the timing part")
        lines += [f"  {c.describe()}" for c in first + rest]
    cases = time_configs(plan)
    lines.append(f"time: {len(cases)} cases x lean, long (and SDPA once per dtype, head size, dropout, T), "
                 f"forward + backward, no padding, {plan['tokens']} tokens, width {plan['width']}")
    for d, h, scheme, p, t in cases:
        b, heads = shape_of(plan, h, t)
        lines.append(f"  {d} head {h} {scheme} dropout {p} T {t} (B {b} x H {heads})")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        rows = render(args.render, args.out)
        print(f"gpu_lean.py: {len(rows)} rows from {args.render}; wrote {Path(args.out) / 'lean.json'} and lean.md")
        return 0
    if args.stand_in:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are defined: before they are imported
    import torch

    if args.dry_run:
        from fairseq_dnas.attention.triton import lean, long  # noqa: F401 (what the parts run; fails here if renamed)

        print("\n".join(plan_lines(args)))
        return 0
    if not args.stand_in and not torch.cuda.is_available():
        print("gpu_lean.py: torch sees no CUDA device; run it on a GPU machine (or --stand-in, or --dry-run)",
              file=sys.stderr)
        return 2
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    device = "cpu" if args.stand_in else "cuda"
    import triton

    from fairseq_dnas.attention import selection
    from fairseq_dnas.attention.triton import lean  # noqa: F401 (import errors stop here, before any file)

    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter: times are not a GPU's)"
    meta = dict(device=name, versions=f"torch {torch.__version__}, triton {triton.__version__}, "
                                      f"CUDA {torch.version.cuda}",
                started=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), budget_s=args.budget_s,
                plan={k: list(v) if isinstance(v, tuple) else v for k, v in args.plan.items()},
                rounds=args.rounds, profile_steps=args.profile_steps, lean_bands=list(selection.LEAN_BANDS))
    results = Results(args.out, meta)
    print("\n".join(plan_lines(args)), flush=True)
    first, rest = exact_configs(args.plan, device) if not args.no_exact else ([], [])
    run_exact(results, first, deadline)
    run_time(results, args.plan, device, deadline, args.rounds, args.profile_steps)
    run_exact(results, rest, deadline)
    results.write(complete=True)
    print(json.dumps(dict(part="done", seconds=round(time.monotonic() - t0, 1))), flush=True)
    rows = results.rows
    exact_rows = [r for r in rows if r["part"] == "exact"]
    timed = [r for r in rows if r["part"] == "time" and r.get("gpu_ms") is not None]
    errors = [r for r in rows if r.get("error")]
    skipped = [r for r in rows if r["part"] == "skipped"]
    bad = [r for r in exact_rows if not r.get("ok")]
    print("\n".join(kernel_lines(rows)), flush=True)
    print(f"lean: exact {len(exact_rows) - len(bad)} of {len(exact_rows)} ok; timed {len(timed)} cases, "
          f"{len(skipped)} skipped (budget {args.budget_s:g} s), {len(errors)} errors; "
          f"{time.monotonic() - t0:.0f} s" + (f"; wrote {Path(args.out) / 'lean.json'} and lean.md" if args.out
                                              else "; --render this output for lean.json and lean.md"),
          flush=True)
    return 1 if bad or errors else 0


if __name__ == "__main__":
    sys.exit(main())
