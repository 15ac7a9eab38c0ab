#!/usr/bin/env python
"""The attention-dropout mask of the GPU kernels against the mask Triton's
interpreter computes on the CPU, bit for bit (a GPU figure of issue 28).

The CPU tests prove the interpreter's mask is the documented Philox bytes and
that the GPU's inline PTX, modelled from the PTX ISA, keeps the same ones
(tests/test_triton_safety.py); this compares what the GPU actually draws.

    python benchmarks/gpu_dropout_mask.py            # on a CUDA machine; exit 1 if any mask differs
    TRITON_INTERPRET=1 python benchmarks/gpu_dropout_mask.py --interpreter masks.pt   # on any machine
    python benchmarks/gpu_dropout_mask.py --reference masks.pt                       # GPU against that file

It computes ``dropout_mask`` on the GPU for a few shapes, seeds (one with high
32 bits set) and drop probabilities, then the same in a child process under
``TRITON_INTERPRET=1`` on CPU tensors, and compares them element by element.
"""

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


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--interpreter":
        torch.save(masks("cpu"), sys.argv[2])
        return 0
    if not torch.cuda.is_available():
        sys.exit("gpu_dropout_mask.py: torch sees no CUDA device; run it on a GPU machine")
    gpu = masks("cuda")
    if len(sys.argv) == 3 and sys.argv[1] == "--reference":
        # The interpreter of another Triton (Triton 3.6's cannot run this kernel: its
        # interpreter fails on the key loop's bound), e.g. the CPU machine's 3.9.
        path = sys.argv[2]
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
