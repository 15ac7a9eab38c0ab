#!/usr/bin/env python
"""The README's experiment: pretrain UNAS, DNAS and HNAS encoders of one size,
fine-tune each on SST-2 and CoLA with several seeds, score every fine-tuned
model on the test file (SST-2: GLUE's dev = test.tsv; CoLA: dev.tsv), and
write the table (OUT/table.md), u per layer of the HNAS encoder (OUT/figure4/,
the paper's Figure 4) and the explaining-away histograms of the three
pretrained encoders on the held-out pretraining text (OUT/explaining_away/).
One JSON line per finished run in OUT/results.jsonl, one per scored model in
OUT/scores.jsonl (safe to re-run: finished runs are skipped; --report-only
makes the table and pictures from what is there).

    PYTHONPATH=$PWD .venv/bin/python examples/masked_lm/experiment.py --out checkpoints/masked_lm/experiment

The commands are the recipe's own (pretrain.sh / finetune.sh with DRY_RUN=1
print them); they run here in one Python process, so fairseq is imported once
(its start-up takes minutes on a busy 2-core machine).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

from fairseq_dnas.stats import mean_se

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ARCHS = ("roberta", "roberta_dnas", "roberta_hnas")
TASKS = ("sst2", "cola")


def recipe_command(script, env):
    out = subprocess.run(["bash", os.path.join(HERE, script)], env={**os.environ, **env, "DRY_RUN": "1", "DEVICE": "cpu"},
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"[experiment] {script} refused: {out.stderr.strip()}")
    argv = shlex.split(out.stdout.strip())
    return argv[argv.index("train") + 1:]  # after run_fairseq.py train


def train_in_process(argv, log):
    from fairseq import checkpoint_utils
    from fairseq_cli.train import cli_main

    # fairseq keeps the best validation score of a process on a function
    # attribute; a fresh run must not inherit the previous run's (it would
    # decide checkpoint_best.pt and print best_* from another task).
    if hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best

    sys.argv = ["fairseq-train", *argv]
    t0 = time.time()
    print(f"[experiment] fairseq-train {' '.join(shlex.quote(a) for a in argv)}", file=log, flush=True)
    cli_main()
    return time.time() - t0


def done(results, **key):
    return any(all(r.get(k) == v for k, v in key.items()) for r in results)


TEST_FILES = {"sst2": ("SST-2", "test.tsv"), "cola": ("CoLA", "dev.tsv")}  # GLUE's dev sets (shared/data/glue)
METRIC = {"sst2": ("accuracy", "SST-2 accuracy (%)", 100.0), "cola": ("mcc", "CoLA MCC", 1.0)}
LABEL = {"roberta": "UNAS (roberta)", "roberta_dnas": "DNAS (roberta_dnas)", "roberta_hnas": "HNAS (roberta_hnas)"}


def mean_se_range(values):
    """(mean, standard error of the mean, min, max) of a list; se is 0 for one value."""
    return (*mean_se(values, single=0.0), min(values), max(values))


def summarize(results, scores):
    """One row per encoder: masked-LM validation perplexity and seconds per
    update of its pretraining, and per task the test metric of every
    fine-tuning seed with mean, standard error and range."""
    rows = []
    for arch in ARCHS:
        pre = [r for r in results if r["stage"] == "pretrain" and r["arch"] == arch]
        row = {"arch": arch, "pretrain_seeds": [r["seed"] for r in pre],
               "valid_ppl": [r["valid_ppl"] for r in pre],
               "seconds_per_update": [r["seconds"] / r["updates"] for r in pre]}
        for task in TASKS:
            key, _, scale = METRIC[task]
            runs = sorted((s["seed"], scale * s[key]) for s in scores if s["arch"] == arch and s["task"] == task)
            row[task] = {"seeds": [seed for seed, _ in runs], "values": [v for _, v in runs]}
            if runs:
                row[task].update(zip(("mean", "se", "min", "max"), mean_se_range([v for _, v in runs])))
        rows.append(row)
    return rows


def separated(a, b):
    """True when the seed ranges of two cells do not overlap (the difference
    exceeds the spread between seeds)."""
    return bool(a.get("values")) and bool(b.get("values")) and (a["min"] > b["max"] or b["min"] > a["max"])


def markdown_table(rows):
    def cell(t):
        if not t.get("values"):
            return "not run"
        return f"{t['mean']:.2f} +- {t['se']:.2f} ({t['min']:.2f} to {t['max']:.2f}, n={len(t['values'])})"

    lines = ["| encoder | masked-LM valid ppl | s / update | " + " | ".join(METRIC[t][1] for t in TASKS) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in TASKS) + " |"]
    for r in rows:
        ppl = ", ".join(f"{p:.1f}" for p in r["valid_ppl"]) or "not run"
        sec = ", ".join(f"{x:.2f}" for x in r["seconds_per_update"]) or "-"
        lines.append(f"| {LABEL[r['arch']]} | {ppl} | {sec} | " + " | ".join(cell(r[t]) for t in TASKS) + " |")
    lines.append("")
    base = rows[0]
    for r in rows[1:]:
        for t in TASKS:
            if r[t].get("values") and base[t].get("values"):
                diff = r[t]["mean"] - base[t]["mean"]
                verdict = "exceeds" if separated(r[t], base[t]) else "does not exceed"
                lines.append(f"- {LABEL[r['arch']]} vs UNAS, {METRIC[t][1]}: {diff:+.2f}; {verdict} the spread "
                             "between fine-tuning seeds (ranges " + ("do not overlap" if separated(r[t], base[t])
                                                                      else "overlap") + ")")
    return "\n".join(lines) + "\n"


def read_jsonl(path):
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def append_jsonl(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def score_runs(args, results, scores_path):
    """Score every fine-tuned model not scored yet on its task's test file."""
    from fairseq_dnas.commands import sentence_classify

    scores = read_jsonl(scores_path)
    for r in results:
        if r["stage"] != "finetune" or any(s["checkpoint"] == r["checkpoint"] for s in scores):
            continue
        folder, name = TEST_FILES[r["task"]]
        out = r["checkpoint"] + ".score.json"
        status = sentence_classify.main(["score", r["checkpoint"], os.path.join(args.glue_dir, folder, name),
                                         "--data", f"{args.data}/{r['task']}", "--json", out])
        if status != 0:
            sys.exit(f"[experiment] scoring {r['checkpoint']} failed")
        with open(out) as f:
            s = json.load(f)
        row = {k: r[k] for k in ("arch", "task", "seed", "checkpoint")}
        row.update({k: s[k] for k in ("n", "accuracy", "accuracy_ci95", "mcc", "mcc_ci95")})
        append_jsonl(scores_path, row)
        scores.append(row)
    return scores


def pictures(args, results):
    """Figure 4 (u per layer of the HNAS encoder) and the explaining-away
    histograms of the three pretrained encoders on the held-out text."""
    pre = {r["arch"]: r["checkpoint"] for r in results if r["stage"] == "pretrain"}
    py = sys.executable
    if "roberta_hnas" in pre:
        os.makedirs(os.path.join(args.out, "figure4"), exist_ok=True)
        subprocess.run([py, "-m", "fairseq_dnas.commands.plot_hybrid_weights", pre["roberta_hnas"],
                        "--labels", "HNAS encoder after pretraining",
                        "--out", os.path.join(args.out, "figure4", "hybrid_weights.png"),
                        "--csv", os.path.join(args.out, "figure4", "hybrid_weights.csv")], check=True)
    archs = [a for a in ARCHS if a in pre]
    if archs:
        subprocess.run([py, "-m", "fairseq_dnas.commands.explaining_away",
                        "--path", *[pre[a] for a in archs], "--labels", *[LABEL[a].split()[0] for a in archs],
                        "--data", f"{args.data}/pretrain", "--subset", "valid",
                        "--out", os.path.join(args.out, "explaining_away")], check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="checkpoints/masked_lm/experiment")
    p.add_argument("--data", default="data/masked_lm/bin")
    p.add_argument("--glue-dir", default=os.environ.get("GLUE_DIR", "../shared/data/glue"))
    p.add_argument("--size", default="small")
    p.add_argument("--pretrain-seed", type=int, default=1)
    p.add_argument("--pretrain-updates", type=int, default=1200)
    p.add_argument("--pretrain-batch", type=int, default=32)
    p.add_argument("--pretrain-lr", default="1e-3")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="fine-tuning tasks to run")
    p.add_argument("--finetune-seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--finetune-updates", type=int, default=300)
    p.add_argument("--finetune-lr", default="1e-4")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--report-only", action="store_true", help="no training: score, table and pictures from OUT")
    p.add_argument("--no-pictures", action="store_true")
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    import fairseq_dnas.plugin  # noqa: F401
    from fairseq_dnas import fairseq_patches

    fairseq_patches.install(only=["file_checks"])
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, "results.jsonl")
    results = read_jsonl(results_path)
    if not args.report_only:
        train_all(args, results, results_path, torch)
    scores = score_runs(args, results, os.path.join(args.out, "scores.jsonl"))
    table = markdown_table(summarize(results, scores))
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    if not args.no_pictures:
        pictures(args, results)
    print(f"[experiment] done: {args.out}/table.md", flush=True)


def train_all(args, results, results_path, torch):
    common = {"SIZE": args.size, "CPU_THREADS": str(args.threads), "FAIRSEQ_DNAS_CHECKED_PYTHON": sys.executable,
              "PYTHON": sys.executable}

    def record(row):
        results.append(row)
        append_jsonl(results_path, row)
        print(f"[experiment] {json.dumps(row)}", flush=True)

    for arch in ARCHS:
        save = os.path.join(args.out, f"pretrain-{arch}-seed{args.pretrain_seed}")
        if done(results, stage="pretrain", arch=arch, seed=args.pretrain_seed):
            continue
        argv = recipe_command("pretrain.sh", {**common, "ARCH": arch, "SEED": str(args.pretrain_seed),
                                              "DATA": f"{args.data}/pretrain", "SAVE_DIR": save,
                                              "MAX_UPDATE": str(args.pretrain_updates),
                                              "BATCH_SEQUENCES": str(args.pretrain_batch), "LR": args.pretrain_lr})
        seconds = train_in_process(argv, sys.stdout)
        state = torch.load(os.path.join(save, "checkpoint_last.pt"), map_location="cpu", weights_only=False)
        val_loss = float(state["extra_state"]["val_loss"])  # masked-LM loss in bits per masked token
        record({"stage": "pretrain", "arch": arch, "seed": args.pretrain_seed, "size": args.size,
                "updates": args.pretrain_updates, "batch": args.pretrain_batch, "seconds": round(seconds, 1),
                "valid_loss_bits": val_loss, "valid_ppl": 2 ** val_loss, "checkpoint": os.path.join(save, "checkpoint_last.pt")})

    for task in args.tasks:
        for arch in ARCHS:
            pretrained = os.path.join(args.out, f"pretrain-{arch}-seed{args.pretrain_seed}", "checkpoint_last.pt")
            for seed in args.finetune_seeds:
                if done(results, stage="finetune", arch=arch, task=task, seed=seed):
                    continue
                save = os.path.join(args.out, f"{task}-{arch}-seed{seed}")
                argv = recipe_command("finetune.sh", {**common, "ARCH": arch, "SEED": str(seed), "TASK": task,
                                                      "DATA": f"{args.data}/{task}", "PRETRAINED": pretrained,
                                                      "SAVE_DIR": save, "MAX_UPDATE": str(args.finetune_updates),
                                                      "LR": args.finetune_lr})
                seconds = train_in_process(argv, sys.stdout)
                record({"stage": "finetune", "arch": arch, "task": task, "seed": seed, "size": args.size,
                        "updates": args.finetune_updates, "seconds": round(seconds, 1),
                        "checkpoint": os.path.join(save, "checkpoint_last.pt")})


if __name__ == "__main__":
    main()
