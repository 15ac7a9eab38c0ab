"""Process CPU seconds (one thread) of beam-4 generation, interleaved rounds:
transformer, discrete_single (gather), discrete_product (one-hot product).
Run from benchmarks/: python /work/runs/bench/cpu_time_generate.py ROUNDS"""
import json, statistics, sys, time
import torch
import bench_discrete as B
from bench_model import build_models, generation_calls, synthetic_batch

torch.set_num_threads(1)
torch.manual_seed(0)
args = B.parser("").parse_args(["--size", "small", "--gen-batch", "8", "--src-len", "32", "--tgt-len", "32"])
B.set_device(B.parser(""), args)
models, task, d = build_models(args, B.GENERATE_ARCHS, [*B.SIZES[args.size], "--dropout", "0"], args.vocab)
calls = B.with_one_hot_product(generation_calls(models, d, synthetic_batch(d, 8, 32, 32, seed=3), 32))
names = list(calls)
for n in names:
    calls[n]()
times = {n: [] for n in names}
rounds = int(sys.argv[1])
for r in range(rounds):
    for i in range(len(names)):
        n = names[(i + r) % len(names)]
        t = time.process_time(); calls[n](); times[n].append(time.process_time() - t)
    print(r, {n: round(times[n][-1], 3) for n in names}, flush=True)
out = {}
for n in names:
    ratios = [a / b for a, b in zip(times[n], times["transformer"])]
    out[n] = {"median_cpu_s": statistics.median(times[n]), "min_cpu_s": min(times[n]),
              "median_ratio": statistics.median(ratios), "min_ratio": min(times[n]) / min(times["transformer"]),
              "cpu_s": times[n]}
    print(n, {k: v for k, v in out[n].items() if k != "cpu_s"})
json.dump({"settings": vars(args), "rounds": rounds, "torch": torch.__version__, "rows": out},
          open("/work/runs/bench/cpu-time-generate.json", "w"), indent=1)
