"""Session 12 scratch: norm_modulate's forward with the tile's first sample's scale / shift rows loaded once
(other rows' gathered only where their sample differs) against the shipped chunked forward."""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "src")
from kohakumoss_kernels import row_chunks as rc  # noqa: E402
from kohakumoss_kernels.ops.norm_modulate import triton as nmt  # noqa: E402
from kohakumoss_kernels.triton_utils import device_ms  # noqa: E402


@triton.jit
def _param(PTR, s, s0, m0, m1, m2, d, W: tl.constexpr, C: tl.constexpr):
    cols = tl.arange(0, W)[None, :]
    o0, o1, o2 = rc.masks(tl.full([1, 1], 1, tl.int1), d, W, C)
    one = rc.load(PTR + s0 * d, cols, o0, o1, o2, W, C)  # [1, W]: one load, broadcast by tl.where
    same = (s == s0)[:, None]
    other = rc.load(PTR, s[:, None] * d + cols, m0 & ~same, m1 & ~same, m2 & ~same, W, C)
    return (tl.where(same, one[0], other[0]).to(tl.float32), tl.where(same, one[1], other[1]).to(tl.float32),
            tl.where(same, one[2], other[2]).to(tl.float32))


@triton.jit
def _fwd_tilerow(X, SHIFT, SCALE, TS, Y, RSTD, T, d, eps, ROWS: tl.constexpr, W: tl.constexpr, C: tl.constexpr):
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rid = tl.arange(0, ROWS)
    rmask = rid < T - row0
    m0, m1, m2 = rc.masks(rmask[:, None], d, W, C)
    loc = rid[:, None] * d + tl.arange(0, W)[None, :]
    s = tl.load(TS + row0 + rid, mask=rmask, other=0).to(tl.int32)
    s0 = tl.load(TS + row0).to(tl.int32)
    x0, x1, x2 = rc.load(X + row0 * d, loc, m0, m1, m2, W, C)
    x0, x1, x2 = x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32)
    rstd = (1.0 / tl.sqrt(rc.row_sum(x0 * x0, x1 * x1, x2 * x2, C) / d + eps))[:, None]
    c0, c1, c2 = _param(SCALE, s, s0, m0, m1, m2, d, W, C)
    h0, h1, h2 = _param(SHIFT, s, s0, m0, m1, m2, d, W, C)
    rc.store(Y + row0 * d, loc, x0 * rstd * (1.0 + c0) + h0, x1 * rstd * (1.0 + c1) + h1,
             x2 * rstd * (1.0 + c2) + h2, m0, m1, m2, W, C)
    tl.store(RSTD + row0 + rid, tl.sum(rstd, axis=1), mask=rmask)


def main():
    T, d, B, dev = 8704, 3072, 2, "cuda"
    timer = device_ms
    if os.environ.get("TRITON_INTERPRET") == "1":
        T, d, dev = 40, 96, "cpu"

        def timer(fn, reps=1):
            fn()
            return 0.0
    w, c = rc.row_chunks(d)
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(T, d, device=dev, dtype=torch.bfloat16, generator=g)
    scale = torch.randn(B, d, device=dev, dtype=torch.bfloat16, generator=g)
    shift = torch.randn(B, d, device=dev, dtype=torch.bfloat16, generator=g)
    ts = torch.repeat_interleave(torch.arange(B, device=dev), T // B)
    ts[T // 2 - 1] = 1  # a tile with two samples
    y, rstd = torch.empty_like(x), torch.empty(T, device=dev)

    def run(kernel, r, wp):
        return lambda: kernel[(triton.cdiv(T, r),)](x, shift, scale, ts, y, rstd, T, d, 1e-6, ROWS=r, W=w, C=c, num_warps=wp)

    run(nmt._norm_modulate_fwd, 2, 4)()
    ref = y.clone()
    run(_fwd_tilerow, 2, 4)()
    print("equal:", torch.equal(ref, y), flush=True)
    print("cfg        shipped  tilerow")
    for r, wp in [(1, 4), (1, 8), (2, 4), (2, 8), (4, 4), (4, 8), (4, 16), (8, 16)]:
        print(f"{(r, wp)!s:10} {timer(run(nmt._norm_modulate_fwd, r, wp), reps=20) * 1e3:7.1f}  {timer(run(_fwd_tilerow, r, wp), reps=20) * 1e3:7.1f}", flush=True)


if __name__ == "__main__":
    main()
