"""QK-norm + RoPE in Triton: per-head RMSNorm (with weight) and the half-split rotation in one pass.

One token (all heads) per program forward; the backward walks a chunk of tokens per program and
writes a partial weight gradient per program, summed afterwards (deterministic).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...triton_utils import reduce_programs
from ...triton_utils import supports as supports


@triton.jit
def _fwd(X, W, COS, SIN, OUT, RSTD, H, half, eps, HAS_W: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BH)[:, None]
    cols = tl.arange(0, BD)[None, :]
    mask = (heads < H) & (cols < half)
    base = t * H * 2 * half + heads * 2 * half + cols
    x1 = tl.load(X + base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + base + half, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * half) + eps)
    n1 = x1 * rstd[:, None]
    n2 = x2 * rstd[:, None]
    if HAS_W:
        n1 = n1 * tl.load(W + cols, mask=cols < half, other=0.0).to(tl.float32)
        n2 = n2 * tl.load(W + half + cols, mask=cols < half, other=0.0).to(tl.float32)
    n1 = n1.to(OUT.dtype.element_ty).to(tl.float32)  # the reference rounds between norm and rope
    n2 = n2.to(OUT.dtype.element_ty).to(tl.float32)
    c = tl.load(COS + t * half + cols, mask=cols < half, other=0.0)
    s = tl.load(SIN + t * half + cols, mask=cols < half, other=0.0)
    tl.store(OUT + base, (n1 * c - n2 * s).to(OUT.dtype.element_ty), mask=mask)
    tl.store(OUT + base + half, (n2 * c + n1 * s).to(OUT.dtype.element_ty), mask=mask)
    tl.store(RSTD + t * H + tl.arange(0, BH), rstd, mask=tl.arange(0, BH) < H)


@triton.jit
def _bwd(
    DY,
    X,
    W,
    COS,
    SIN,
    RSTD,
    DX,
    DW,
    T,
    H,
    half,
    rows_per_prog,
    HAS_W: tl.constexpr,
    BH: tl.constexpr,
    BD: tl.constexpr,
):
    pid = tl.program_id(0)
    heads = tl.arange(0, BH)[:, None]
    cols = tl.arange(0, BD)[None, :]
    mask = (heads < H) & (cols < half)
    w1 = tl.full([1, BD], 1.0, tl.float32)
    w2 = tl.full([1, BD], 1.0, tl.float32)
    if HAS_W:
        w1 = tl.load(W + cols, mask=cols < half, other=0.0).to(tl.float32)
        w2 = tl.load(W + half + cols, mask=cols < half, other=0.0).to(tl.float32)
    dw1 = tl.zeros([BH, BD], dtype=tl.float32)
    dw2 = tl.zeros([BH, BD], dtype=tl.float32)
    start = pid.to(tl.int64) * rows_per_prog
    n = tl.minimum(start + rows_per_prog, T) - start
    for i in range(0, n):
        t = start + i
        base = t * H * 2 * half + heads * 2 * half + cols
        dy1 = tl.load(DY + base, mask=mask, other=0.0).to(tl.float32)
        dy2 = tl.load(DY + base + half, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(X + base, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(X + base + half, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(COS + t * half + cols, mask=cols < half, other=0.0)
        s = tl.load(SIN + t * half + cols, mask=cols < half, other=0.0)
        rstd = tl.load(RSTD + t * H + tl.arange(0, BH), mask=tl.arange(0, BH) < H, other=0.0)[:, None]
        dn1 = dy1 * c + dy2 * s
        dn2 = dy2 * c - dy1 * s
        xh1 = x1 * rstd
        xh2 = x2 * rstd
        g1 = dn1 * w1
        g2 = dn2 * w2
        dot = (tl.sum(g1 * xh1, axis=1) + tl.sum(g2 * xh2, axis=1))[:, None] / (2 * half)
        tl.store(DX + base, (rstd * (g1 - xh1 * dot)).to(DX.dtype.element_ty), mask=mask)
        tl.store(DX + base + half, (rstd * (g2 - xh2 * dot)).to(DX.dtype.element_ty), mask=mask)
        dw1 += dn1 * xh1
        dw2 += dn2 * xh2
    if HAS_W:
        tl.store(DW + pid * 2 * half + tl.arange(0, BD), tl.sum(dw1, axis=0), mask=tl.arange(0, BD) < half)
        tl.store(
            DW + pid * 2 * half + half + tl.arange(0, BD), tl.sum(dw2, axis=0), mask=tl.arange(0, BD) < half
        )


class _QKNormRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, cos, sin, eps):
        x = x.contiguous()
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        T, H, D = x.shape
        out = torch.empty_like(x)
        rstd = torch.empty(T, H, device=x.device, dtype=torch.float32)
        bh, bd = triton.next_power_of_2(H), triton.next_power_of_2(D // 2)
        if T:
            _fwd[(T,)](
                x,
                weight if weight is not None else x,
                cos,
                sin,
                out,
                rstd,
                H,
                D // 2,
                eps,
                HAS_W=weight is not None,
                BH=bh,
                BD=bd,
                num_warps=4,
            )
        ctx.save_for_backward(x, weight, cos, sin, rstd)
        return out

    @staticmethod
    def backward(ctx, dy):
        x, weight, cos, sin, rstd = ctx.saved_tensors
        T, H, D = x.shape
        dx = torch.empty_like(x)
        grid = reduce_programs(x, T)
        dw = torch.zeros(grid, D, device=x.device, dtype=torch.float32)
        bh, bd = triton.next_power_of_2(H), triton.next_power_of_2(D // 2)
        if T:
            _bwd[(grid,)](
                dy.contiguous(),
                x,
                weight if weight is not None else x,
                cos,
                sin,
                rstd,
                dx,
                dw,
                T,
                H,
                D // 2,
                triton.cdiv(T, grid),
                HAS_W=weight is not None,
                BH=bh,
                BD=bd,
                num_warps=4,
            )
        return dx, (dw.sum(0).to(weight.dtype) if weight is not None else None), None, None, None


def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    return _QKNormRope.apply(x, weight, cos, sin, eps)
