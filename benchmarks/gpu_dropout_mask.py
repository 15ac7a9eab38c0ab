#!/usr/bin/env python
"""The attention-dropout mask of the GPU kernels against the mask Triton's
interpreter computes on the CPU, bit for bit (one of the GPU figures of docs/performance.md).

The CPU tests prove the interpreter's mask is the documented Philox bytes and
that the GPU's inline PTX, modelled from the PTX ISA, keeps the same ones
(tests/test_triton_safety.py); this compares what the GPU actually draws.

    python benchmarks/gpu_dropout_mask.py            # on a CUDA machine; exit 1 if any mask differs
    python benchmarks/gpu_dropout_mask.py --interpreter masks.pt   # on any machine (Triton's interpreter)
    python benchmarks/gpu_dropout_mask.py --reference masks.pt                       # GPU against that file

It computes ``dropout_mask`` on the GPU for a few shapes, seeds (one with high
32 bits set) and drop probabilities, then the same in a child process under
``TRITON_INTERPRET=1`` on CPU tensors, and compares them element by element.
"""

import argparse
import json
import os
import subprocess
import sys

import torch

# (shape (B, H, T_q, T_k), seed, p): ragged tiles, a square block, T_q != T_k, a seed above 2^32
CASES = [
    ((2, 3, 37, 53), 1234, 0.1),
    ((1, 2, 128, 130), 7, 0.5),
    ((2, 2, 200, 64), (1 << 40) + 99, 0.25),
    ((1, 1, 17, 300), 2**62 + 5, 0.9),
]


def masks(device):
    from fairseq_dnas.attention.triton.dropout import dropout_mask

    out = []
    for shape, seed, p in CASES:
        s = torch.tensor([seed], dtype=torch.int64, device=device)
        out.append(dropout_mask(s, shape, p).cpu())
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--interpreter", metavar="FILE",
                        help="compute the masks on CPU tensors (run with TRITON_INTERPRET=1) and save them to FILE; "
                             "needs no GPU")
    source.add_argument("--reference", metavar="FILE",
                        help="compare the GPU's masks with FILE (written by --interpreter) instead of computing "
                             "them in a child process")
    args = parser.parse_args(argv)
    if args.interpreter:
        # Triton reads the variable when the kernels are defined: before masks() imports them.
        os.environ["TRITON_INTERPRET"] = "1"
        torch.save(masks("cpu"), args.interpreter)
        return 0
    if not torch.cuda.is_available():
        print("gpu_dropout_mask.py: torch sees no CUDA device; run it on a GPU machine "
              "(or --interpreter FILE on any machine)", file=sys.stderr)
        return 1
    gpu = masks("cuda")
    if args.reference:
        # The interpreter of another Triton (Triton 3.6's cannot run this kernel: its
        # interpreter fails on the key loop's bound), e.g. the CPU machine's 3.9.
        path = args.reference
    else:
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "interpreter_masks.pt")
        env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
        subprocess.run([sys.executable, __file__, "--interpreter", path], check=True, env=env)
    cpu = torch.load(path)
    rows, bad = [], 0
    for (shape, seed, p), g, c in zip(CASES, gpu, cpu):
        differ = int((g != c).sum())
        bad += differ
        rows.append(dict(shape=list(shape), seed=seed, p=p, elements=g.numel(),
                         kept_fraction=round(float(g.float().mean()), 4), differ=differ))
        print(f"shape {shape} seed {seed} p {p}: {g.numel()} elements, kept {float(g.float().mean()):.4f}, "
              f"differ {differ}")
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cases=rows)))
    print("same mask bit for bit" if bad == 0 else f"MASKS DIFFER in {bad} elements")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
