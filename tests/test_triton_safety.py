"""Tier 1: the Triton kernels on inputs the fairseq module never passes, and
their guards (``attention/triton/``: ``long.py``, ``sinkhorn.py``, ``dropout.py``, ``launch.py``, ``tiles.py``).

- q, k, v with any strides (views of one packed projection, transposed
  layouts, an expanded key with stride 0): forward and gradients against
  float64 autograd through the same views (the kernels once wrote gradients
  with the inputs' strides and ran out of bounds);
- the dropout mask: one function of (seed, batch * head, row, key), the same
  in the forward and both backward kernels and for every tile shape, at the
  documented rate, p = 1 gives zeros;
- int64 offsets, the grid, the device: the decision logic, and the int64
  code run on small tensors;
- float16 numerics with a large mean query (dk's cancellation).

Sizes are tiny: everything runs under Triton's interpreter on CPU.
"""

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, padding_mask

from fairseq_dnas.attention import functional as AF

long = pytest.importorskip(
    "fairseq_dnas.attention.triton.long", reason="triton is not installed (scripts/install.sh installs it)"
)
from fairseq_dnas.attention.triton import column, launch, sinkhorn  # noqa: E402
from fairseq_dnas.attention.triton import dropout as triton_dropout  # noqa: E402
from fairseq_dnas.attention.triton import tiles as tile_table  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
T, B, H, D = 19, 2, 2, 16  # two 16-row tiles under the interpreter, the second ragged
LENGTHS = (19, 7)


def _reference(q, k, v, u, kmask, qmask, keep=None, p=0.0, sinkhorn_iters=1):
    """DNAS (u None) or HNAS output in float64, differentiable in q, k, v, u."""
    km, qm = AF.broadcast_masks(kmask, qmask)
    s = q @ k.transpose(-1, -2)
    probs = (AF.dnas_probs(s, km, qm, sinkhorn_iters) if u is None
             else AF.hnas_probs(s, u, km, qm, sinkhorn_iters))
    if keep is not None:
        probs = probs * keep.double() / (1.0 - triton_dropout.effective_dropout_p(p))
    return probs @ v


def _attention(q, k, v, u, mask, **kw):
    return long.triton_attention(q, k, v, hybrid_weight=u, key_padding_mask=mask,
                                         query_padding_mask=mask, **kw)


def _packed_chunks(x):
    """(T, B, 3 H D) projection -> three (B, H, T, D) views, strides (3HD, D, 3BHD, 1)."""
    return [y.reshape(T, B, H, D).permute(1, 2, 0, 3) for y in x.chunk(3, dim=-1)]


def _indexed(x):
    """(B, T, 3, H, D) -> x[:, :, i] as (B, H, T, D)."""
    return [x[:, :, i].permute(0, 2, 1, 3) for i in range(3)]


def _transposed(x):
    """(3, B, H, D, T) stored feature-major: the time stride is 1."""
    return [y.transpose(-1, -2) for y in x.unbind(0)]


def _expanded_key(x):
    """q, v (B, H, T, D) and a key shared by every head: (B, 1, T, D) expanded, head stride 0."""
    q, k0, v = x.split([H, 1, H], dim=1)
    return [q, k0.expand(B, H, T, D), v]


LAYOUTS = {
    "packed": (_packed_chunks, (T, B, 3 * H * D)),
    "indexed": (_indexed, (B, T, 3, H, D)),
    "transposed": (_transposed, (3, B, H, D, T)),
    "expanded_key": (_expanded_key, (B, 2 * H + 1, T, D)),
}


@pytest.mark.parametrize("layout, scheme, p", [("packed", "dnas", 0.0), ("indexed", "hnas", 0.0),
                                               ("transposed", "dnas", 0.0), ("expanded_key", "hnas", 0.0),
                                               ("packed", "hnas", 0.2)])
def test_any_input_strides_forward_and_gradients(layout, scheme, p):
    """Views of one base tensor: the kernels read each view with its strides
    and write each gradient into a buffer of its own; autograd takes them
    back to the base. Against float64 autograd through the same views (with
    dropout: with the kernels' materialized mask)."""
    views, shape = LAYOUTS[layout]
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(shape, generator=g, dtype=torch.float64) * 1.5).to(DEVICE)
    x = base.float().requires_grad_()
    xd = base.clone().requires_grad_()
    u = torch.tensor([0.3, 0.8], device=DEVICE, requires_grad=True) if scheme == "hnas" else None
    ud = None if u is None else u.detach().double().requires_grad_()
    mask = padding_mask(LENGTHS, T, True).to(DEVICE)
    q, k, v = views(x)
    assert not all(t.is_contiguous() for t in (q, k, v))
    seed = _seed(31)
    keep = triton_dropout.dropout_mask(seed, (B, H, T, T), p) if p else None
    out = _attention(q, k, v, u, mask, dropout_p=p, seed=seed)
    ref = _reference(*views(xd), ud, mask, mask, keep=keep, p=p)
    if p:  # the mask drops something: a kernel without dropout would miss the reference
        assert 0 < (~keep).sum() < keep.numel()
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
    dout = torch.randn(out.shape, generator=g).to(DEVICE)
    ins, ref_ins = ((x, u), (xd, ud)) if u is not None else ((x,), (xd,))
    grads = torch.autograd.grad(out, ins, dout)
    ref_grads = torch.autograd.grad(ref, ref_ins, dout.double())
    for name, a, b in zip(("base", "u"), grads, ref_grads):
        atol = 1e-5 * max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a.double(), b, atol=atol, rtol=0, msg=lambda m, name=name: f"d{name}: {m}")


def test_sinkhorn_writes_gradients_with_their_own_strides():
    """The Sinkhorn ds kernel adds into dq and dk: with their strides, not the inputs'."""
    views, shape = LAYOUTS["packed"]
    g = torch.Generator().manual_seed(1)
    base = (torch.randn(shape, generator=g, dtype=torch.float64) * 1.5).to(DEVICE)
    x, xd = base.float().requires_grad_(), base.clone().requires_grad_()
    mask = padding_mask(LENGTHS, T, False).to(DEVICE)
    out = _attention(*views(x), None, mask, sinkhorn_iters=2)
    ref = _reference(*views(xd), None, mask, mask, sinkhorn_iters=2)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
    dout = torch.randn(out.shape, generator=g).to(DEVICE)
    (a,), (b,) = torch.autograd.grad(out, (x,), dout), torch.autograd.grad(ref, (xd,), dout.double())
    torch.testing.assert_close(a.double(), b, atol=1e-5 * max(1.0, float(b.abs().max())), rtol=0)


CRASH = """
import torch
from fairseq_dnas.attention.kernels import attend
T, B, H, D = 19, 2, 2, 16
x = torch.randn(T, B, 3 * H * D, requires_grad=True)
q, k, v = (y.reshape(T, B, H, D).permute(1, 2, 0, 3) for y in x.chunk(3, dim=-1))
out, _ = attend(q, k, v, scheme="dnas", path="triton")
out.sum().backward()
print("finite" if torch.isfinite(x.grad).all() else "not finite")
"""


@pytest.mark.full  # the same layout runs in-process above; this one survives a crash of the process
@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's process is the one that crashed")
def test_packed_projection_through_attend_does_not_crash_the_process():
    """The issue's reproduction, in a subprocess (the old kernels killed it with SIGSEGV)."""
    res = subprocess.run([sys.executable, "-c", CRASH], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "finite" in res.stdout.split(), (res.returncode, res.stderr[-2000:])


# --- dropout ---------------------------------------------------------------------


def _seed(value):
    return torch.tensor([value], dtype=torch.int64, device=DEVICE)


OTHER_TILES = dict(forward=(32, 32, 1), backward_kv=(16, 64, 1), backward_q=(64, 16, 1), column=(32, 16, 1))


def _mask_in_tiles(monkeypatch, seed, shape, p, tile):
    """``triton_dropout.dropout_mask`` drawn in (BLOCK_M, BLOCK_N) = ``tile`` (the
    column pass's entry of the tile table it reads)."""
    table = tile_table.INTERPRETER_TILES if tile_table.INTERPRETED else tile_table.GPU_TILES["half", 64]
    monkeypatch.setitem(table, "column", (*tile, *table["column"][2:]))
    return triton_dropout.dropout_mask(seed, shape, p)


def test_dropout_mask_does_not_depend_on_the_tiles(monkeypatch):
    """The mask is a function of (seed, batch * head, row, key) alone: drawn in
    tiles of 16 x 16, 32 x 64 and 64 x 32 it is the same, rows and heads differ."""
    shape, p = (2, 2, 37, 53), 0.3
    masks = [_mask_in_tiles(monkeypatch, _seed(5), shape, p, blk) for blk in ((16, 16), (32, 64), (64, 32))]
    assert torch.equal(masks[0], masks[1]) and torch.equal(masks[0], masks[2])
    m = masks[0]
    assert not torch.equal(m[0, 0], m[0, 1]) and not torch.equal(m[0, 0], m[1, 0])
    assert not torch.equal(m[0, 0, 0], m[0, 0, 1])
    assert not torch.equal(m, triton_dropout.dropout_mask(_seed(6), shape, p))


# The mask as dropout.py's docstring defines it, computed here without Triton: Philox4x32-7
# (Salmon et al. 2011; Triton's tl.philox and Random123's philox4x32 round), then the bytes.
_M32 = 0xFFFFFFFF


def _philox4x32_7(c0, c1, c2, c3, k0=0, k1=0):
    """r_0..r_3 of Philox4x32 with 7 rounds; numpy uint64 arrays holding 32-bit words."""
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for _ in range(7):
        p0, p2 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2  # exact: < 2**64
        c0, c1, c2, c3 = (p2 >> np.uint64(32)) ^ c1 ^ k0, p2 & np.uint64(_M32), (p0 >> np.uint64(32)) ^ c3 ^ k1, \
            p0 & np.uint64(_M32)
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & np.uint64(_M32), (k1 + np.uint64(0xBB67AE85)) & np.uint64(_M32)
    return c0, c1, c2, c3


def _documented_words_and_bytes(seed, shape):
    """For every (batch * head, i, j): the word r_{2a + h} that decides it and its byte 2 e + b,
    j % 16 = 8 h + 4 a + 2 e + b, counter (i ceil(T_k / 16) + j // 16, batch * head, seed's low
    and high 32 bits), key 0."""
    bsz, heads, tq, tk = shape
    bh, i, j = np.meshgrid(np.arange(bsz * heads), np.arange(tq), np.arange(tk), indexing="ij")
    bh, i, j = (x.astype(np.uint64) for x in (bh, i, j))
    groups = np.uint64(-(-tk // 16))
    seed = np.uint64(seed)
    r = _philox4x32_7((i * groups + j // np.uint64(16)) & np.uint64(_M32), bh, np.full_like(bh, seed & np.uint64(_M32)),
                      np.full_like(bh, seed >> np.uint64(32)))
    k = (j % np.uint64(16)).astype(np.int64)
    h, a, e, b = k >> 3, (k >> 2) & 1, (k >> 1) & 1, k & 1
    word = np.choose(2 * a + h, r)
    byte = (word >> (8 * (2 * e + b)).astype(np.uint64)) & np.uint64(0xFF)
    return word, e, b, byte.reshape(shape)


def test_dropout_mask_is_the_documented_philox_bytes():
    """dropout_mask (the kernels' own _keep, under the interpreter) equals the
    definition of dropout.py's docstring computed in numpy: Philox4x32-7
    with the documented counter and key, the documented byte of each key,
    dropped below t = round(256 p)."""
    shape, seed, p = (2, 3, 37, 53), 2**40 + 12345, 0.3
    *_, byte = _documented_words_and_bytes(seed, shape)
    expected = torch.from_numpy(byte >= triton_dropout.dropout_threshold(p))
    assert torch.equal(triton_dropout.dropout_mask(_seed(seed), shape, p).cpu(), expected)


# The instructions _dropped and _byte_pair run on the GPU (the interpreter cannot run inline
# PTX), modelled bit for bit from the PTX ISA: prmt.b32 (default mode), set.le.u32.f16x2 and
# setp.le.f16x2 + selp.b32 (comparisons of float16 values, subnormals kept).
def _prmt(a, b, selector):
    """prmt.b32 d, a, b, c: byte n of d is byte c[4n + 2 : 4n] of {b, a} (a = bytes 0-3), or that
    byte's sign bit replicated when c[4n + 3] is set."""
    src = [(a >> np.uint64(8 * n)) & np.uint64(0xFF) for n in range(4)] + \
          [(b >> np.uint64(8 * n)) & np.uint64(0xFF) for n in range(4)]
    out = np.zeros_like(a)
    for n in range(4):
        nibble = (selector >> (4 * n)) & 0xF
        byte = src[nibble & 7]
        if nibble & 8:
            byte = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
        out |= byte << np.uint64(8 * n)
    return out


def _f16(bits):
    return np.asarray(bits, dtype=np.uint64).astype(np.uint16).view(np.float16)


def _set_le_u32_f16x2(a, b):
    """set.le.u32.f16x2 d, a, b: each 16-bit half of d is 0xFFFF where a's half <= b's as float16."""
    out = np.zeros(np.broadcast(a, b).shape, dtype=np.uint64)
    for half in (0, 1):
        shift = np.uint64(16 * half)
        le = _f16((a >> shift) & np.uint64(0xFFFF)) <= _f16((b >> shift) & np.uint64(0xFFFF))
        out |= np.where(le, np.uint64(0xFFFF), np.uint64(0)) << shift
    return out


def _setp_le_f16x2(a, b):
    """setp.le.f16x2 p|q, a, b: p where a's low half <= b's as float16, q the same for the high halves."""
    return tuple(_f16((a >> np.uint64(s)) & np.uint64(0xFFFF)) <= _f16((b >> np.uint64(s)) & np.uint64(0xFFFF))
                 for s in (0, 16))


def test_dropout_gpu_instructions_compute_the_interpreters_mask():
    """_byte_pair's PRMT and both instruction sequences of _dropped, modelled
    from the PTX ISA, give the interpreter's decisions: every (t, byte) pair
    compares as the integers do (bytes are float16 subnormals), and on Philox
    words the PRMT puts bytes 2e and 2e + 1 into the low and high half that
    _dropped masks with (AND for a float16/bfloat16 pair, a select per
    float32 of a pair), so the GPU keeps exactly what dropout_mask publishes.
    Element k of a packed pair is half k, as Triton packs an inline-asm
    operand (element j + k into vector lane k, little-endian); under that
    convention the float32 pair's first value ($2) must take p, the low half."""
    # the instructions the model follows, with its operand order: threshold first, bytes second
    assert triton_dropout.BYTE_PAIR_PTX.value == "prmt.b32 $0, $1, 0, $2;"
    assert "set.le.u32.f16x2 m, $3, $2; and.b32 $0, $1, m;" in triton_dropout.DROP_HALF_PAIR_PTX.value
    assert "setp.le.f16x2 p|q, $5, $4; selp.b32 $0, $2, 0, p; selp.b32 $1, $3, 0, q;" in \
        triton_dropout.DROP_FLOAT_PAIR_PTX.value
    t = np.arange(1, 256, dtype=np.uint64)[:, None]  # the kernels run with 1 <= t <= 255
    z = np.arange(256, dtype=np.uint64)[None, :]
    mask = _set_le_u32_f16x2(t * np.uint64(0x10001), z | (z << np.uint64(16)))
    assert np.array_equal(mask == np.uint64(0xFFFFFFFF), z >= t)
    assert np.all((mask == 0) | (mask == np.uint64(0xFFFFFFFF)))
    low, high = _setp_le_f16x2(t * np.uint64(0x10001), z | (z << np.uint64(16)))
    assert np.array_equal(low, z >= t) and np.array_equal(high, z >= t)
    shape, seed, p = (1, 2, 21, 40), 77, 0.25
    word, e, b, byte = _documented_words_and_bytes(seed, shape)
    z = np.empty_like(word)
    for half in (0, 1):  # _byte_pair: prmt.b32 z, word, 0, BYTE_PAIR + 0x202 e
        z = np.where(e == half, _prmt(word, np.zeros_like(word), triton_dropout.BYTE_PAIR.value + 0x202 * half), z)
    half_b = (16 * b).astype(np.uint64)  # key b of a pair of neighbours: half b of z
    assert np.array_equal(((z >> half_b) & np.uint64(0xFFFF)).reshape(shape), byte)
    t_pair = np.uint64(triton_dropout.dropout_threshold(p) * 0x10001)
    expected = triton_dropout.dropout_mask(_seed(seed), shape, p).cpu()
    # float16/bfloat16 pair: and.b32 of the set.le.u32.f16x2 mask with two values (1.0 each here)
    ones = np.uint64(0x3C00 * 0x10001)
    kept = ((_set_le_u32_f16x2(t_pair, z) & ones) >> half_b) & np.uint64(0xFFFF) == np.uint64(0x3C00)
    assert torch.equal(torch.from_numpy(kept.reshape(shape)), expected)
    # float32 pair: setp.le.f16x2 p|q, then selp of the first value ($2) on p, the second ($3) on q
    p_low, q_high = _setp_le_f16x2(t_pair, z)
    kept = np.where(b == 0, p_low, q_high)
    assert torch.equal(torch.from_numpy(kept.reshape(shape)), expected)


@pytest.mark.parametrize("scheme", ["hnas", pytest.param("dnas", marks=pytest.mark.full)])
def test_dropout_same_mask_in_all_three_kernels_at_two_tile_shapes(scheme, monkeypatch):
    """Forward (out), kv (dk, dv) and q (dq) kernels against float64 autograd
    with the materialized mask, at the interpreter's 16 x 16 tiles and at
    tiles of other shapes in every kernel: any kernel drawing another mask
    would miss by far more than the tolerance."""
    tk = 37
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, H, n, D, generator=g, dtype=torch.float64) for n in (T, tk, tk))
    q, k = q * 1.5, k * 1.5
    u = torch.tensor([0.3, 0.8], dtype=torch.float64) if scheme == "hnas" else None
    qmask = padding_mask(LENGTHS, T, True).to(DEVICE)
    kmask = padding_mask((37, 30), tk, False).to(DEVICE)
    p, seed = 0.25, _seed(77)
    keep = triton_dropout.dropout_mask(seed, (B, H, T, tk), p)
    ref_ins = [x.to(DEVICE).requires_grad_() for x in (q, k, v)] + ([] if u is None else [u.to(DEVICE).requires_grad_()])
    ref = _reference(*ref_ins[:3], ref_ins[3] if u is not None else None, kmask, qmask, keep=keep, p=p)
    dout = torch.randn(ref.shape, generator=g).to(DEVICE)
    ref_grads = torch.autograd.grad(ref, ref_ins, dout.double())
    for tiles in ({}, OTHER_TILES):
        for kernel, tile in tiles.items():
            monkeypatch.setitem(tile_table.INTERPRETER_TILES, kernel, tile)
        ins = [x.detach().float().requires_grad_() for x in ref_ins]
        out = long.triton_attention(*ins[:3], hybrid_weight=ins[3] if u is not None else None,
                                            key_padding_mask=kmask, query_padding_mask=qmask,
                                            dropout_p=p, seed=seed)
        torch.testing.assert_close(out.double(), ref.detach(), atol=1e-5, rtol=0, msg=lambda m: f"{tiles}: {m}")
        for name, a, b in zip("qkvu", torch.autograd.grad(out, ins, dout), ref_grads):
            atol = 1e-5 * max(1.0, float(b.abs().max()))
            torch.testing.assert_close(a.double(), b, atol=atol, rtol=0,
                                       msg=lambda m, name=name: f"d{name} with tiles {tiles}: {m}")


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_rate_within_three_standard_errors(p, monkeypatch):
    """Over 2 x 2 x 128 x 256 decisions the drop rate is p_eff = round(256 p) / 256
    within 3 standard errors, overall and at each of the 16 positions a
    Philox call decides (a layout slip would repeat or skip bytes)."""
    shape = (2, 2, 128, 256)
    keep = _mask_in_tiles(monkeypatch, _seed(2024), shape, p, (64, 64))  # large tiles: a fast interpreter
    p_eff = triton_dropout.effective_dropout_p(p)
    assert abs(p_eff - p) <= 1 / 512
    dropped = (~keep).double()
    n = dropped.numel()
    se = (p_eff * (1 - p_eff) / n) ** 0.5
    assert abs(dropped.mean().item() - p_eff) < 3 * se, (dropped.mean().item(), p_eff, se)
    per_lane = dropped.reshape(-1, 16).mean(0)  # key j % 16 = 8 h + 4 a + 2 e + b: byte 2 e + b of r_{2a + h}
    se_lane = (p_eff * (1 - p_eff) / (n / 16)) ** 0.5
    # 16 lanes: allow 3.5 standard errors (a 3-sigma miss somewhere among 16 is not rare)
    assert (per_lane - p_eff).abs().max().item() < 3.5 * se_lane, per_lane
    # neighbouring keys (same Philox call) are independent: P(both dropped) = p_eff ** 2
    pair = (dropped[..., 0::2] * dropped[..., 1::2]).mean().item()
    assert abs(pair - p_eff**2) < 3 * (p_eff**2 * (1 - p_eff**2) / (n / 2)) ** 0.5, (pair, p_eff**2)


def test_dropout_threshold_rounds_p_to_multiples_of_1_256():
    assert triton_dropout.dropout_threshold(0.0) == 0
    assert triton_dropout.dropout_threshold(0.1) == 26  # p_eff = 0.1015625
    assert triton_dropout.dropout_threshold(0.999) == 255  # below 1: something is kept
    assert triton_dropout.dropout_threshold(1.0) == 256
    assert triton_dropout.effective_dropout_p(0.5) == 0.5
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="probability in"):
            long.triton_attention(*(torch.zeros(1, 1, 4, 16),) * 3, dropout_p=bad)


def test_dropout_p_one_gives_zeros_and_zero_gradients():
    """As torch.nn.functional.dropout(p=1): every probability dropped."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, T, D, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    u = torch.tensor([0.3, 0.8], device=DEVICE, requires_grad=True)
    out = _attention(q, k, v, u, padding_mask(LENGTHS, T, True).to(DEVICE), dropout_p=1.0, seed=_seed(1))
    assert torch.equal(out, torch.zeros_like(out))
    for grad in torch.autograd.grad(out, (q, k, v, u), torch.randn_like(out)):
        assert torch.equal(grad, torch.zeros_like(grad))


# --- offsets, grid, device ------------------------------------------------------------


def test_int64_offsets_are_chosen_from_the_largest_offset_a_tensor_reaches():
    """No memory is allocated: meta tensors carry shapes and strides only."""
    small = torch.empty((2, 12, 128, 64), device="meta")
    assert not launch.needs_int64(small, None)
    assert launch.needs_int64(small, torch.empty((2**31,), device="meta"))
    # a (B, H, T, D) view of a (T, B, H * D) projection with 2**31 elements: offsets T * B * H * D
    t, bsz, heads, d = 2**15, 2**4, 2**6, 2**6
    view = torch.empty((t, bsz, heads * d), device="meta").view(t, bsz, heads, d).permute(1, 2, 0, 3)
    assert launch.needs_int64(view)
    assert not launch.needs_int64(view[:, :, : t // 2])


def test_int64_code_path_gives_the_same_results(monkeypatch):
    """The INT64 variant of every kernel (forced on small tensors) equals the int32 one."""
    g = torch.Generator().manual_seed(4)
    t = 16  # one tile: only the offsets' type changes
    q, k, v = (torch.randn(B, H, t, D, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    u = torch.tensor([0.3, 0.8], device=DEVICE, requires_grad=True)
    mask = padding_mask((16, 9), t, True).to(DEVICE)
    kw = dict(dropout_p=0.2, seed=_seed(9), sinkhorn_iters=2)
    results = []
    for forced in (False, True):
        if forced:
            for module in (long, column, sinkhorn):
                monkeypatch.setattr(module, "needs_int64", lambda *tensors: True)
        out = _attention(q, k, v, u, mask, **kw)
        results.append((out, *torch.autograd.grad(out, (q, k, v, u), torch.ones_like(out))))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_grid_is_one_axis_with_room_for_any_batch():
    """B * H * blocks programs on axis 0 (2**31 - 1), not B on an axis of 65,535."""
    assert launch.grid(128, 64, 100_000, 16) == (2 * 100_000 * 16,)
    with pytest.raises(ValueError, match="split the batch"):
        launch.grid(2**20, 16, 2**12, 16)


def test_kernels_launch_on_the_inputs_device(monkeypatch):
    """torch.cuda.device(x.device) around the launches (a model on cuda:1
    without set_device); on CPU nothing is entered."""
    entered = []
    monkeypatch.setattr(torch.cuda, "device", lambda dev: entered.append(dev) or _Nothing())
    launch.on_device(torch.empty(1, device="meta"))
    assert entered == []

    class FakeCuda:
        device = torch.device("cuda", 1)

    launch.on_device(FakeCuda())
    assert entered == [torch.device("cuda", 1)]


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- float16 numerics ---------------------------------------------------------------


def test_float16_dk_with_a_large_mean_query(monkeypatch):
    """Queries with a large common mean (a q_proj bias): dk = sum_i ds q_i
    cancels the mean exactly in real arithmetic, but in float16 only up to
    the rounding of the two products dk_t and dc dk_x. The kv kernel
    subtracts the mean real query first; its error against float64 must be
    about the float16 rounding of dk itself, and far below the error without
    the centring (the interpreter's float16 tl.dot is exact)."""
    g = torch.Generator().manual_seed(0)
    mean = 16.0 * torch.randn(1, 1, 1, D, generator=g).sign()
    q = (torch.randn(1, H, 32, D, generator=g) * 0.5 + mean).half().to(DEVICE)
    k = (torch.randn(1, H, 32, D, generator=g) * 0.5).half().to(DEVICE)
    v = torch.randn(1, H, 32, D, generator=g).half().to(DEVICE)
    do = torch.randn(1, H, 32, D, generator=g).half().to(DEVICE)
    mask = padding_mask((27,), 32, True).to(DEVICE)
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    ref_dk = torch.autograd.grad(_reference(qd, kd, vd, None, mask, mask), kd, do.double())[0]
    seed = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    errors = {}
    query_mean = long.query_mean
    for center in (False, True):
        # without the centring: mu = 0 (the kv kernel then takes q itself)
        monkeypatch.setattr(long, "query_mean", query_mean if center else lambda q, qpad: torch.zeros(
            q.shape[0], q.shape[1], q.shape[3], dtype=torch.float32, device=q.device))
        out, o_d, c, r_d, r_u, _ = long._forward(q, k, v, None, mask, mask, 0.0, seed, 1)
        _, dk, _, _ = long._backward(do, q, k, v, None, mask, mask, 0.0, seed, out, o_d, c, r_d, r_u)
        errors[center] = (dk.double() - ref_dk).abs().max().item()
    rounding = torch.finfo(torch.float16).eps * ref_dk.abs().max().item()  # one ulp of the largest dk
    msg = f"max |dk - float64|: without centring {errors[False]:.2e}, with {errors[True]:.2e}, ulp {rounding:.2e}"
    assert errors[True] <= rounding and errors[True] < errors[False] / 5, msg
