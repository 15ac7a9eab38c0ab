#!/usr/bin/env python
"""The README's experiment: pretrain UNAS, DNAS and HNAS encoders of one size,
fine-tune each on SST-2 and CoLA with several seeds, score them; one JSON
line per finished run in OUT/results.jsonl (safe to re-run: finished runs
are skipped).

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
    from fairseq_cli.train import cli_main

    sys.argv = ["fairseq-train", *argv]
    t0 = time.time()
    print(f"[experiment] fairseq-train {' '.join(shlex.quote(a) for a in argv)}", file=log, flush=True)
    cli_main()
    return time.time() - t0


def done(results, **key):
    return any(all(r.get(k) == v for k, v in key.items()) for r in results)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="checkpoints/masked_lm/experiment")
    p.add_argument("--data", default="data/masked_lm/bin")
    p.add_argument("--size", default="small")
    p.add_argument("--pretrain-seed", type=int, default=1)
    p.add_argument("--pretrain-updates", type=int, default=600)
    p.add_argument("--pretrain-batch", type=int, default=16)
    p.add_argument("--pretrain-lr", default="1e-3")
    p.add_argument("--finetune-seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--finetune-updates", type=int, default=150)
    p.add_argument("--finetune-lr", default="2e-4")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    import fairseq_dnas  # noqa: F401
    from fairseq_dnas import file_checks

    file_checks.install()
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, "results.jsonl")
    results = [json.loads(line) for line in open(results_path)] if os.path.exists(results_path) else []
    common = {"SIZE": args.size, "CPU_THREADS": str(args.threads), "FAIRSEQ_DNAS_CHECKED_PYTHON": sys.executable,
              "PYTHON": sys.executable}

    def record(row):
        results.append(row)
        with open(results_path, "a") as f:
            f.write(json.dumps(row) + "\n")
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

    for task in TASKS:
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
    print("[experiment] all runs done", flush=True)


if __name__ == "__main__":
    main()
