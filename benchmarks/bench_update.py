#!/usr/bin/env python
"""One training update of the whole model, the figure a user of a DNAS/HNAS
encoder pays: BART and RoBERTa against their softmax selves, in one run.

Cases (``--cases``, default both):

- ``bart``: ``bart_dnas_large`` and ``bart_hnas_large`` against fairseq's
  ``bart_large``, source lengths 512, 1,024 and 2,048 (``--src-lens``),
  target 128 (``--tgt-len``); label-smoothed cross-entropy (0.1) on a
  synthetic batch (``bench_model.synthetic_batch``: source left-padded, lengths
  in [L/2, L], the first sentence at full length); ``--max-source-positions``
  is raised to the longest source.
- ``roberta``: ``roberta_dnas_base`` and ``roberta_hnas_base`` against
  ``roberta_base``, blocks of T 512 (``--roberta-len``), fairseq's masked_lm
  criterion (``bench_roberta.masked_batch``).

One update = forward, backward and the Adam step (``bench_roberta.update``:
fused Adam on CUDA). The three models of a case hold the same weights (HNAS:
u at its init) and are timed in the same interleaved rounds after warm-up;
the ratio is the median over rounds of the model's time over the baseline's
in that round: process CPU time on CPU (the steadier measure on a shared
machine; the wall-clock ratio is beside it), wall clock on CUDA. CUDA runs
the models in float16 (as ``fairseq-train --fp16`` does), CPU in float32.

``attention_share``: the encoder self-attention modules' part of one update
(forward and backward, projections included: the part a DNAS/HNAS encoder
replaces), from the torch profiler. A range (``record_function``) covers each
module's forward; the backward nodes of the operators run inside it are found
by their sequence numbers (``autograd::engine::evaluate_function: ...``).
Shares are of the profiled update's time: the operators' elapsed time on
their thread on CPU, the GPU kernels' time on CUDA (``profiled_*_ms``, the
median of ``--profile-steps`` updates, each term on its own). ``baseline_attention_share`` is the same
for the softmax model; with the baseline's share s and the kernels alone at
x SDPA, the update costs about 1 + s (x - 1).

Output: a Markdown table and, per row, a JSON line on stdout; ``--json OUT``:
``{"machine", "settings", "rows"}``, rewritten after every case, one row per
(model, source length): ``{"part": "model", "arch", "baseline", "src_len",
"ratio", "attention_share", ...}`` with the ms fields beside.
On CUDA at full size it prints each of ``TARGETS`` as met or missed.
``--deadline-s``: no case starts after it (the ones left are rows with
``"skipped": true``).

    python benchmarks/bench_update.py --quick                       # tiny sizes, CPU, seconds
    python benchmarks/bench_update.py --device cuda --json update.json   # full size, fp16 (H100/H200)
    OMP_NUM_THREADS=1 python benchmarks/bench_update.py --size base --cases bart --src-lens 1024 \\
        --batch 1 --tgt-len 128 --threads 1 --rounds 3 --warmup 1  # a bart-base-shaped step on one core

Exit status 2 for bad arguments, 1 when a DNAS/HNAS model gives its
baseline's output (the scheme did not run).
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

import bench_common as common

# The models' helpers (bench_model, bench_roberta, bench_hf: fairseq and the whole benchmark) are imported
# where they are used, so that --help, --dry-run and bad arguments answer at once.

# (arch, source length) -> the limit of the ratio on CUDA (fp16, H100/H200); printed as met or not there
TARGETS = {("bart_dnas_large", 1024): 1.12, ("bart_hnas_large", 1024): 1.20,
           ("roberta_dnas_base", 512): 1.10, ("roberta_hnas_base", 512): 1.15}
ATTENTION_RANGE = "encoder_self_attention"
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
# model name -> arch pattern (SIZE: large/base for bart, base for roberta)
BART = {"bart": "bart_{size}", "bart_dnas": "bart_dnas_{size}", "bart_hnas": "bart_hnas_{size}"}
ROBERTA_NAMES = {"roberta": "roberta", "roberta_dnas": "roberta_dnas", "roberta_hnas": "roberta_hnas"}
TINY = ["--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "2"]
TINY_ROBERTA = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                "--encoder-attention-heads", "4"]


def encoder_attention_modules(model):
    """The encoder layers' self-attention modules (BART: ``model.encoder``;
    RoBERTa: the ``TransformerEncoder`` in ``model.encoder.sentence_encoder``)."""
    encoder = getattr(model.encoder, "sentence_encoder", model.encoder)
    return [layer.self_attn for layer in encoder.layers]


class AttentionRanges:
    """While active, each forward of the given modules runs inside a profiler
    range named ``ATTENTION_RANGE`` (opened by a pre-hook, closed by a hook)."""

    def __init__(self, modules):
        self.modules, self.handles, self.open = modules, [], []

    def __enter__(self):
        for m in self.modules:
            self.handles.append(m.register_forward_pre_hook(self._enter))
            self.handles.append(m.register_forward_hook(self._exit))
        return self

    def _enter(self, module, args):
        r = torch.profiler.record_function(ATTENTION_RANGE)
        r.__enter__()
        self.open.append(r)

    def _exit(self, module, args, output):
        self.open.pop().__exit__(None, None, None)

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []


def event_time(e, device):
    """An event's time with its children's, in microseconds: the elapsed time
    on its thread on CPU, its GPU kernels' time on CUDA."""
    return e.device_time_total if device == "cuda" else e.cpu_time_total


def share_of_ranges(events, device, step_name="update"):
    """(attention share, attention us, update us) from the profiler's
    ``events`` of one update run inside a range ``step_name``: the
    ``ATTENTION_RANGE`` ranges (forward) and the backward nodes whose
    sequence numbers belong to operators inside them."""
    step = [e for e in events if e.name == step_name]
    if len(step) != 1:
        raise RuntimeError(f"attention share: expected one '{step_name}' range in the profile, found {len(step)}")
    ranges = [e for e in events if e.name == ATTENTION_RANGE]
    if not ranges:
        raise RuntimeError("attention share: no encoder self-attention range in the profile (hooks not run)")
    seqs, stack = set(), list(ranges)
    while stack:
        e = stack.pop()
        if getattr(e, "sequence_nr", -1) >= 0:
            seqs.add(e.sequence_nr)
        stack.extend(e.cpu_children)
    forward = sum(event_time(e, device) for e in ranges)
    backward = sum(event_time(e, device) for e in events
                   if e.name.startswith(BACKWARD_PREFIX) and e.sequence_nr in seqs)
    total = event_time(step[0], device)
    if device == "cuda":  # the backward runs on autograd's thread, outside the update's range: every kernel
        # counts, once: through the host-side operator that launched it (the profiler also lists each kernel
        # as a device-side event of its own, which is not added again)
        from torch.autograd import DeviceType

        total = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CPU)
    if total <= 0:
        raise RuntimeError(f"attention share: the profiled update took no {'GPU ' if device == 'cuda' else ''}time")
    return (forward + backward) / total, forward + backward, total


def attention_share(run, model, device, steps):
    """(share, attention us, update us) of ``run`` (an update of ``model``):
    the medians over ``steps`` profiled updates, each profiled alone."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    got = []
    for _ in range(steps):
        with AttentionRanges(encoder_attention_modules(model)), profile(activities=activities) as prof:
            with torch.profiler.record_function("update"):
                run()
            common.synchronize()
        got.append(share_of_ranges(prof.events(), device))
    return tuple(statistics.median(g[i] for g in got) for i in range(3))


def bart_models(args, extra):
    """({name: (model, criterion)}, {name: arch}, dictionary): the three BARTs
    of ``BART`` with the same weights, positions for the longest source."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    from bench_model import build_models

    archs = {name: pattern.format(size=args.size) for name, pattern in BART.items()}
    positions = ["--max-source-positions", str(max(1024, *args.src_lens)),
                 "--max-target-positions", str(max(1024, args.tgt_len))]
    models, task, d = build_models(args, archs, [*extra, *positions], args.vocab)
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    return {name: (m, crit) for name, (m, _) in models.items()}, archs, d


def roberta_models(args, extra):
    from bench_roberta import build as build_roberta

    models, d = build_roberta("base", args.vocab, args.roberta_len, extra)
    return models, {n: f"{a}_base" for n, a in ROBERTA_NAMES.items()}, d


def sample_of(args, family, d, length):
    """A batch of ``args.batch_for(length)`` sequences for the family's task."""
    from bench_model import synthetic_batch
    from bench_roberta import masked_batch

    if family == "bart":
        return synthetic_batch(d, args.batch_for(length), length, args.tgt_len)
    return masked_batch(d, args.batch_for(length), length)


def check_schemes_run(models, sample, baseline):
    """The DNAS/HNAS models' eval outputs differ from the baseline's (same
    weights): proof that their scheme ran. Returns the largest differences."""
    with torch.no_grad():
        out = {}
        for name, (m, _) in models.items():
            m.eval()
            out[name] = m(**sample["net_input"])[0].float()
            m.train()
    differs = {n: (o - out[baseline]).abs().max().item() for n, o in out.items()}
    if not all(v > 0 for n, v in differs.items() if n != baseline):
        sys.exit(f"bench_update.py: a DNAS/HNAS model gives {baseline}'s output: the scheme did not run ({differs})")
    return differs


def time_case(args, family, src_len, models, archs, sample):
    from bench_hf import timed_rounds  # wall and CPU time, interleaved
    from bench_roberta import update  # forward, backward, Adam step (fused on CUDA)

    baseline = next(iter(models))
    differs = check_schemes_run(models, sample, baseline)
    runs = {name: update(m, c, sample) for name, (m, c) in models.items()}
    common.log(f"{family} at {src_len} tokens: {len(sample['target'])} sequences an update, "
               f"{args.rounds} rounds, {torch.get_num_threads()} threads")
    with common.CpuLoad() as load:
        times = timed_rounds(runs, args.warmup, args.rounds, baseline)
    shares = {name: attention_share(runs[name], m, args.device, args.profile_steps) for name, (m, _) in models.items()}
    cpu = args.device == "cpu"
    rows = []
    for name in models:
        if name == baseline:
            continue
        t, b = times[name], times[baseline]
        rows.append({
            "part": "model", "arch": archs[name], "baseline": archs[baseline], "src_len": src_len,
            "tgt_len": args.tgt_len if family == "bart" else None, "batch": len(sample["target"]),
            "ratio": t["cpu_ratio"] if cpu else t["ratio"], "wall_ratio": t["ratio"],
            "attention_share": shares[name][0], "baseline_attention_share": shares[baseline][0],
            "ms": 1e3 * (t["cpu_median_s"] if cpu else t["median_s"]),
            "baseline_ms": 1e3 * (b["cpu_median_s"] if cpu else b["median_s"]),
            "wall_ms": 1e3 * t["median_s"], "baseline_wall_ms": 1e3 * b["median_s"],
            # the profiler's own times (CPU: elapsed on the thread; CUDA: GPU kernels), the share's terms
            "profiled_attention_ms": shares[name][1] / 1e3, "profiled_update_ms": shares[name][2] / 1e3,
            "baseline_profiled_attention_ms": shares[baseline][1] / 1e3,
            "baseline_profiled_update_ms": shares[baseline][2] / 1e3,
            "measure": "cpu time" if cpu else "wall clock", "dtype": "float32" if cpu else "float16",
            "rounds": args.rounds, "profile_steps": args.profile_steps, "max_abs_diff_to_baseline": differs[name],
            "foreign_cpu_fraction": load.foreign_fraction})
    return rows


def cases(args):
    """(family, src_len) in the order they run."""
    out = []
    for family in args.cases:
        lens = args.src_lens if family == "bart" else [args.roberta_len]
        out += [(family, n) for n in lens]
    return out


def plan_lines(args):
    dtype = "float16, wall clock" if args.device == "cuda" else "float32, process CPU time"
    lines = [f"bench_update.py plan ({args.device}: {dtype}; {args.warmup} warm-up and {args.rounds} timed "
             f"rounds a model{'; tiny models' if args.quick else ''}; attention dropout {args.attention_dropout:g})"]
    for family, n in cases(args):
        names = [p.format(size=args.size) for p in BART.values()] if family == "bart" else \
            [f"{a}_base" for a in ROBERTA_NAMES.values()]
        shape = f"{n} source + {args.tgt_len} target tokens" if family == "bart" else f"{n} tokens"
        lines.append(f"  {', '.join(names[1:])} against {names[0]}: {args.batch_for(n)} x {shape}")
    return lines


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the models run (default cpu, float32); cuda runs them in float16")
    p.add_argument("--cases", default="bart,roberta", help="comma-separated from bart, roberta (default both)")
    p.add_argument("--size", choices=("large", "base"), default="large",
                   help="BART's preset (default large; RoBERTa is always base)")
    p.add_argument("--quick", action="store_true",
                   help="tiny models (2+1 layers, hidden 32), length 32, target 8, 1 round, 1 profiled update: a smoke run")
    p.add_argument("--src-lens", help="BART source lengths (default 512,1024,2048; quick 32)")
    p.add_argument("--tgt-len", type=int, help="BART target length (default 128; quick 8)")
    p.add_argument("--roberta-len", type=int, help="RoBERTa block length (default 512; quick 32)")
    p.add_argument("--tokens", type=int,
                   help="source tokens an update; batch = tokens // length (default 8192 on cuda, 2048 on cpu, "
                        "quick 128)")
    p.add_argument("--batch", type=int, help="sequences an update (overrides --tokens)")
    p.add_argument("--vocab", type=int, help="dictionary size (default 50,265, BART's and RoBERTa's; quick 200)")
    p.add_argument("--attention-dropout", type=float, default=0.1,
                   help="the encoder's attention dropout (default 0.1, as the presets train)")
    p.add_argument("--rounds", type=int, help="timed rounds (default 10 on cuda, 5 on cpu; quick 1)")
    p.add_argument("--warmup", type=int, help="untimed updates a model first (default 3 on cuda, 1 on cpu; quick 1)")
    p.add_argument("--profile-steps", type=int,
                   help="profiled updates a model for attention's share, median (default 3; quick 1)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads")
    p.add_argument("--deadline-s", type=float, help="seconds after the start when no new case starts")
    p.add_argument("--json", metavar="OUT", help="write the rows here (rewritten after every case)")
    p.add_argument("--dry-run", action="store_true", help="print the cases and exit (any machine, any --device)")
    args = p.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    if not args.cases or set(args.cases) - {"bart", "roberta"}:
        p.error(f"--cases takes bart, roberta (comma-separated); got {','.join(args.cases) or 'nothing'}")
    try:
        args.src_lens = [int(x) for x in (args.src_lens or ("32" if args.quick else "512,1024,2048")).split(",")]
    except ValueError:
        p.error(f"--src-lens takes comma-separated integers; got {args.src_lens}")
    gpu = args.device == "cuda"
    q = args.quick
    defaults = dict(tgt_len=8 if q else 128, roberta_len=32 if q else 512, profile_steps=1 if q else 3,
                    tokens=128 if q else (8192 if gpu else 2048), vocab=200 if q else 50265,
                    rounds=1 if q else (10 if gpu else 5), warmup=1 if q else (3 if gpu else 1))
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("tgt_len", "roberta_len", "tokens", "vocab", "rounds", "profile_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} takes a positive integer; got {getattr(args, name)}")
    if args.batch is not None and args.batch < 1:
        p.error(f"--batch takes a positive integer; got {args.batch}")
    if args.warmup < 0 or any(n < 4 for n in args.src_lens) or args.tgt_len < 4:
        p.error("--warmup takes >= 0, every source length and --tgt-len >= 4")
    if not 0 <= args.attention_dropout < 1:
        p.error(f"--attention-dropout takes a probability in [0, 1); got {args.attention_dropout}")
    if not args.dry_run:  # common.DEVICE, read by the bench_* helpers
        if args.device == "cuda" and not torch.cuda.is_available():
            p.error("--device cuda: torch sees no CUDA device")
        common.DEVICE = torch.device(args.device)
    args.batch_for = lambda length: args.batch or max(1, args.tokens // length)
    return args


def write(path, args, rows):
    if path is None:
        return
    settings = {k: v for k, v in vars(args).items() if k != "batch_for"}
    with open(path + ".tmp", "w") as f:
        json.dump({"machine": common.machine(), "settings": settings, "rows": rows}, f, indent=1)
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print("\n".join(plan_lines(args)))
        return 0
    t0 = time.monotonic()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":  # the default CUDA path or nothing: a fallback would time another path
        from fairseq_dnas.attention import selfcheck

        warnings.simplefilter("error", selfcheck.TritonFallbackWarning)
    drop = ["--attention-dropout", str(args.attention_dropout)]
    rows, built = [], {}
    for family, n in cases(args):
        if args.deadline_s is not None and time.monotonic() - t0 > args.deadline_s:
            rows.append({"part": "model", "family": family, "src_len": n, "skipped": True})
            common.log(f"{family} at {n} tokens: skipped (deadline {args.deadline_s:g} s)")
            continue
        if family not in built:  # one set of models a family, for all its lengths
            built.clear()  # the other family's models go first (GPU memory)
            if args.device == "cuda":
                torch.cuda.empty_cache()
            make = bart_models if family == "bart" else roberta_models
            built[family] = make(args, [*((TINY if family == "bart" else TINY_ROBERTA) if args.quick else []),
                                        *drop])
        models, archs, d = built[family]
        new = time_case(args, family, n, models, archs, sample_of(args, family, d, n))
        for r in new:
            print(json.dumps(r), flush=True)
        rows += new
        write(args.json, args, rows)
    print("\n| model | baseline | source | ms / update | baseline ms | x baseline | attention share "
          "| baseline's share |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if not r.get("skipped"):
            print(f"| {r['arch']} | {r['baseline']} | {r['src_len']} | {r['ms']:.1f} | {r['baseline_ms']:.1f} | "
                  f"{r['ratio']:.3f} | {r['attention_share']:.1%} | {r['baseline_attention_share']:.1%} |")
    print(f"({'process CPU time, float32' if args.device == 'cpu' else 'wall clock, float16'}; "
          f"{time.monotonic() - t0:.0f} s)")
    for r in rows:
        limit = TARGETS.get((r.get("arch"), r["src_len"]))
        if limit is not None and not r.get("skipped") and args.device == "cuda" and not args.quick:
            print(f"target {r['arch']} at {r['src_len']}: x{r['ratio']:.3f} of {r['baseline']} (target {limit}): "
                  f"{'met' if r['ratio'] <= limit else 'MISSED'}")
    write(args.json, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
