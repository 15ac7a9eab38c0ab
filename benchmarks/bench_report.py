"""benchmarks/benchmark.py's summary: the targets of docs/performance.md
checked against a result, the Markdown tables, and results of several runs
merged."""

import json

TARGETS = {
    "module_128_dnas_time": 1.3,
    "module_128_hnas_time": 1.6,
    "model_dnas_time": 1.03,
    "model_hnas_time": 1.05,
    "long_dnas_memory": 1.2,
    "long_hnas_memory": 1.2,
    "long_exact": 1e-5,
}
# The GPU targets (docs/performance.md#targets; against fairseq's attention, or SDPA for the
# kernels alone, in the same run): the module's worst case over every
# length, dropout and dtype; the kernels alone at B 8, H 16, T 1024, D 64,
# fp16, dropout 0, for each Triton kernel set timed there (long; short runs only at T <= 128).
CUDA_TARGETS = {
    "module_dnas_time": 1.25,
    "module_hnas_time": 1.5,
    "module_dnas_memory": 1.0,
    "module_hnas_memory": 1.0,
    "exact_float32": 1e-5,
    "model_dnas_time": 1.03,
    "model_hnas_time": 1.05,
    "generate_dnas_time": 1.03,
    "generate_hnas_time": 1.03,
    "kernels_dnas_kernel_time": 2.0,
    "kernels_dnas_wall_time": 2.5,
    "kernels_hnas_kernel_time": 2.6,
    "kernels_hnas_wall_time": 3.0,
}
KERNELS_TARGET_LENGTH = 1024


def _device(res):
    runs = [res.get("settings", {})] + res.get("runs", [])
    return "cuda" if any(r.get("device") == "cuda" for r in runs) else "cpu"


def cuda_target_report(res):
    """The GPU issue's targets: the worst case of every module setting."""
    out = []

    def add(name, measured, where):
        if measured is not None:
            limit = CUDA_TARGETS[name]
            out.append({"target": name, "limit": limit, "measured": measured, "met": measured <= limit,
                        "where": where})

    mod = [r for r in res.get("module", []) if "skipped" not in r]
    for scheme in ("dnas", "hnas"):
        rows = [r for r in mod if r["case"] == scheme]
        for key, what in (("time_ratio", "time"), ("memory_ratio", "memory")):
            if rows:
                w = max(rows, key=lambda r: r[key])
                add(f"module_{scheme}_{what}", w[key], f"worst of {len(rows)} cases: T={w['length']}, "
                    f"attention dropout {w['dropout']}, {w.get('dtype', 'fp32')}")
    errs = [r["max_abs_error"] for r in mod if "max_abs_error" in r and r["case"] in ("dnas", "hnas")]
    if errs:
        add("exact_float32", max(errs), "float32 copy of each module vs the float64 reference, every length")
    for r in res.get("model", []):
        if r["model"] != "transformer" and r["attention_dropout"] == 0.1:
            add(f"model_{r['model'].split('_')[1]}_time", r["time_ratio"], "half precision, attention dropout 0.1")
    for r in res.get("generate", []):
        if r["model"] != "transformer":
            add(f"generate_{r['model'].split('_')[1]}_time", r["time_ratio"], "beam 4, half precision")
    for r in res.get("kernels", []):
        if ("skipped" in r or r["case"] == "sdpa" or r["length"] != KERNELS_TARGET_LENGTH
                or r["dropout"] != 0.0):
            continue
        scheme, version = r["case"].split()
        where = f"{version} kernels alone, T={r['length']}, fp16, dropout 0, against SDPA"
        add(f"kernels_{scheme}_kernel_time", r["kernel_ratio"], where)
        add(f"kernels_{scheme}_wall_time", r["wall_ratio"], where)
    return out


def target_report(res, long_lengths):
    if _device(res) == "cuda":
        return cuda_target_report(res)
    out = []

    def add(name, measured, where):
        if measured is None:
            return
        target = TARGETS[name]
        out.append({"target": name, "limit": target, "measured": measured, "met": measured <= target,
                    "where": where})

    mod = [r for r in res.get("module", []) if "skipped" not in r]
    first = min((r["length"] for r in mod), default=None)
    for scheme in ("dnas", "hnas"):
        at = [r for r in mod if r["case"] == scheme and r["length"] == first and r["dropout"] == 0.0]
        if at:
            add(f"module_{128}_{scheme}_time", at[0]["time_ratio"], f"T={first}, attention dropout 0")
        longs = [r for r in mod if r["case"] == scheme and r["length"] in long_lengths]
        if longs:
            add(f"long_{scheme}_memory", max(r["memory_ratio"] for r in longs),
                "worst of T=" + ",".join(str(r["length"]) for r in longs))
    errs = [r["max_abs_error"] for r in mod if r["length"] in long_lengths and "max_abs_error" in r
            and r["case"] in ("dnas", "hnas")]
    if errs:
        add("long_exact", max(errs), "max |out - float64 reference|, dnas/hnas at the long lengths")
    for r in res.get("model", []):
        if r["model"] != "transformer" and r["attention_dropout"] == 0.1:
            add(f"model_{r['model'].split('_')[1]}_time", r["time_ratio"], "attention dropout 0.1 (preset)")
    return out


def render_markdown(res):
    """The benchmark's Markdown tables (as in docs/results/) from a result dict."""
    lines = []
    mod = res.get("module")
    if mod:
        lines += ["| dtype | T | batch | attn dropout | case | path | fwd+bwd ms | x fairseq | peak MiB "
                  "| x fairseq | max abs err |", "|" + " --- |" * 11]
        for r in mod:
            dt = r.get("dtype", "fp32")
            if "skipped" in r:
                lines.append(f"| {dt} | {r['length']} | {r['batch']} | {r['dropout']} | {r['case']} | - | "
                             f"skipped: {r['skipped']} | | | | |")
                continue
            err = f"{r['max_abs_error']:.1e}" if "max_abs_error" in r else "-"
            lines.append(f"| {dt} | {r['length']} | {r['batch']} | {r['dropout']} | {r['case']} | {r.get('path', '-')} "
                         f"| {r['median_ms']:.1f} | {r['time_ratio']:.2f} | {r['peak_mib']:.1f} "
                         f"| {r['memory_ratio']:.2f} | {err} |")
        lines.append("")
    cross = res.get("crossover")
    if cross:
        lengths = sorted({r["length"] for r in cross})
        cases = [c for c in dict.fromkeys(r["case"] for r in cross) if c != "fairseq"]
        lines += ["| case | " + " | ".join(f"T={t}" for t in lengths) + " |", "|" + " --- |" * (len(lengths) + 1)]
        for c in cases:
            cells = [next((f"{r['time_ratio']:.2f}" for r in cross if r["case"] == c and r["length"] == t), "-")
                     for t in lengths]
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        lines.append("")
    model = res.get("model")
    if model:
        lines += ["| model | attn dropout | s / update | x transformer | target words/s |", "|" + " --- |" * 5]
        for r in model:
            lines.append(f"| {r['model']} | {r['attention_dropout']} | {r['median_update_s']:.2f} "
                         f"| {r['time_ratio']:.3f} | {r['target_words_per_s']:.1f} |")
        lines.append("")
    gen = res.get("generate")
    if gen:
        lines += ["| model | sentences/s | time x transformer |", "|" + " --- |" * 3]
        for r in gen:
            lines.append(f"| {r['model']} | {r['sentences_per_s']:.2f} | {r['time_ratio']:.3f} |")
        lines.append("")
    if res.get("kernels"):
        from bench_kernels import render

        lines += render(res["kernels"])
    if res.get("targets"):
        lines += ["| target | limit | measured | met | where |", "|" + " --- |" * 5]
        for t in res["targets"]:
            lines.append(f"| {t['target']} | {t['limit']} | {t['measured']:.3g} | {'yes' if t['met'] else 'NO'} "
                         f"| {t['where']} |")
        lines.append("")
    loads = [r["foreign_cpu"] for sec in ("module", "crossover", "model", "generate") for r in res.get(sec, [])
             if "foreign_cpu" in r]
    if loads:
        lines.append(f"CPU time of other processes during the timed rounds: {100 * min(loads):.0f}% to "
                     f"{100 * max(loads):.0f}% of the machine.")
    return "\n".join(lines) + "\n"


def merge_results(paths):
    """One result dict from --json files of runs with different --sections."""
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                runs.append(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"benchmark: cannot read {path}: {e}")
    res = {"machine": runs[0]["machine"], "runs": [r.get("settings", {}) for r in runs]}
    for name in ("module", "crossover", "model", "generate", "kernels"):
        found = next((r[name] for r in runs if r.get(name)), None)
        if found is not None:
            res[name] = found
    lengths = sorted({r["length"] for r in res.get("module", [])})
    quick = any(r.get("settings", {}).get("quick") for r in runs)
    res["targets"] = target_report(res, [t for t in lengths if t >= (2048 if not quick else lengths[-1])])
    return res
