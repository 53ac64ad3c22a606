"""Session 12 scratch: the per-sample finish's variants (same partials, same output) timed on the device."""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "src")
from kohakumoss_kernels import sample_sums as ss  # noqa: E402
from kohakumoss_kernels.triton_utils import device_ms  # noqa: E402


@triton.jit
def _fin_onetile(P, FIRST, LAST, D, OUT, G, d, K: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    s = tl.program_id(0)
    k = tl.program_id(1)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < d
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    f = tl.load(FIRST + g, mask=gmask, other=-1)
    la = tl.load(LAST + g, mask=gmask, other=-1)
    base = (g.to(tl.int64)[:, None] * 2 * K + k) * d + cols[None, :]
    acc = tl.load(P + base, mask=(f == s)[:, None] & cmask[None, :], other=0.0)
    acc += tl.load(P + base + K * d, mask=(la == s)[:, None] & cmask[None, :], other=0.0)
    at = (s.to(tl.int64) * K + k) * d + cols
    total = tl.load(D + at, mask=cmask, other=0.0) + tl.sum(acc, axis=0)
    tl.store(OUT + at, total.to(OUT.dtype.element_ty), mask=cmask)


@triton.jit
def _fin_unmasked(P, FIRST, LAST, D, OUT, G, d, K: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    s = tl.program_id(0)
    k = tl.program_id(1)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < d
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        gmask = g < G
        f = tl.load(FIRST + g, mask=gmask, other=-1)
        la = tl.load(LAST + g, mask=gmask, other=-1)
        base = (g.to(tl.int64)[:, None] * 2 * K + k) * d + cols[None, :]
        m = gmask[:, None] & cmask[None, :]
        p0 = tl.load(P + base, mask=m, other=0.0)
        p1 = tl.load(P + base + K * d, mask=m, other=0.0)
        acc += tl.where((f == s)[:, None], p0, 0.0) + tl.where((la == s)[:, None], p1, 0.0)
    at = (s.to(tl.int64) * K + k) * d + cols
    total = tl.load(D + at, mask=cmask, other=0.0) + tl.sum(acc, axis=0)
    tl.store(OUT + at, total.to(OUT.dtype.element_ty), mask=cmask)


@triton.jit
def _fin_cols(P, FIRST, LAST, D, OUT, G, S, d, K: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    """One program per (parameter, column block): every partial row loaded once, then summed per sample."""
    k = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < d
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    f = tl.load(FIRST + g, mask=gmask, other=-1)
    la = tl.load(LAST + g, mask=gmask, other=-1)
    base = (g.to(tl.int64)[:, None] * 2 * K + k) * d + cols[None, :]
    m = gmask[:, None] & cmask[None, :]
    p0 = tl.load(P + base, mask=m & (f >= 0)[:, None], other=0.0)
    p1 = tl.load(P + base + K * d, mask=m & (la >= 0)[:, None], other=0.0)
    for s in range(0, S):
        at = (s * K + k) * d + cols
        part = tl.sum(tl.where((f == s)[:, None], p0, 0.0) + tl.where((la == s)[:, None], p1, 0.0), axis=0)
        total = tl.load(D + at, mask=cmask, other=0.0) + part
        tl.store(OUT + at, total.to(OUT.dtype.element_ty), mask=cmask)


def main():
    dev = "cuda"
    timer = device_ms
    if os.environ.get("TRITON_INTERPRET") == "1":
        dev = "cpu"

        def timer(fn, reps=1):
            fn()
            return 0.0
    for G, S, K, d in [(264, 2, 2, 3072), (264, 2, 3, 3072), (264, 8, 2, 3072), (528, 2, 2, 3072)]:
        if dev == "cpu":
            G, d = 6, 40
        g = torch.Generator(device=dev).manual_seed(0)
        p = torch.randn(G, 2, K, d, device=dev, generator=g)
        rows = torch.arange(G, device=dev)
        first = (rows * S // G).long()
        last = torch.where(rows % 7 == 3, torch.clamp(first + 1, max=S - 1), torch.full_like(first, -1))
        acc = torch.randn(S, K, d, device=dev, generator=g)
        ref = ss.finish(p, first, last, acc, torch.float32)
        out = torch.empty_like(ref)
        bg = triton.next_power_of_2(G)
        variants = {"shipped": lambda: ss.finish(p, first, last, acc, torch.float32)}
        for bc in (8, 16, 32):
            variants[f"onetile c{bc}"] = (lambda bc=bc: _fin_onetile[(S, K, triton.cdiv(d, bc))](p, first, last, acc, out, G, d, K=K, BLOCK_G=bg, BLOCK_C=bc, num_warps=4))
            variants[f"cols c{bc}"] = (lambda bc=bc: _fin_cols[(K, triton.cdiv(d, bc))](p, first, last, acc, out, G, S, d, K=K, BLOCK_G=bg, BLOCK_C=bc, num_warps=4))
        for bgg, bc in ((64, 64), (128, 32), (32, 128)):
            variants[f"unmasked {bgg}x{bc}"] = (lambda bgg=bgg, bc=bc: _fin_unmasked[(S, K, triton.cdiv(d, bc))](p, first, last, acc, out, G, d, K=K, BLOCK_G=bgg, BLOCK_C=bc, num_warps=4))
        print(f"G={G} S={S} K={K} d={d}", flush=True)
        for name, fn in variants.items():
            out.fill_(float("nan"))
            try:
                t = timer(fn, reps=20) * 1e3
                ok = name == "shipped" or torch.allclose(out, ref, atol=1e-4)
                print(f"  {name:18} {t:6.1f} us  {'ok' if ok else 'WRONG'}", flush=True)
            except Exception as e:
                print(f"  {name:18} error {type(e).__name__}: {str(e)[:150]}", flush=True)
        z = timer(lambda: torch.zeros(S, K, d, device=dev), reps=20) * 1e3
        print(f"  zeros({S},{K},{d}) {z:.1f} us", flush=True)


if __name__ == "__main__":
    main()
