"""residual_norm_modulate in Triton: r = x + gate[s] * y and h = rms_norm(r) * (1 + scale[s]) + shift[s]
in one read of x and y; the backward sums d(gate), d(shift), d(scale) per sample (see norm_modulate)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...triton_utils import reduce_programs, row_block
from ...triton_utils import supports as supports


@triton.jit
def _fwd(X, Y, GATE, SHIFT, SCALE, TS, R, H, RSTD, d, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    s = tl.load(TS + row).to(tl.int64)
    x = tl.load(X + row * d + cols, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + row * d + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + s * d + cols, mask=mask, other=0.0).to(tl.float32)
    r = (x + g * y).to(R.dtype.element_ty)  # the residual stream is kept in the model dtype
    tl.store(R + row * d + cols, r, mask=mask)
    r = r.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(r * r, axis=0) / d + eps)
    sc = tl.load(SCALE + s * d + cols, mask=mask, other=0.0).to(tl.float32)
    sh = tl.load(SHIFT + s * d + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(H + row * d + cols, (r * rstd * (1.0 + sc) + sh).to(H.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def _bwd(
    DR,
    DH,
    R,
    Y,
    GATE,
    SCALE,
    TS,
    RSTD,
    DX,
    DY,
    DGATE,
    DSHIFT,
    DSCALE,
    T,
    d,
    rows_per_prog,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    start = pid.to(tl.int64) * rows_per_prog
    n = tl.minimum(start + rows_per_prog, T) - start
    cur = tl.load(TS + start, mask=n > 0, other=0).to(tl.int64)
    acc_g = tl.zeros([BLOCK], dtype=tl.float32)
    acc_sc = tl.zeros([BLOCK], dtype=tl.float32)
    acc_sh = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, n):
        row = start + i
        s = tl.load(TS + row).to(tl.int64)
        if s != cur:
            tl.atomic_add(DGATE + cur * d + cols, acc_g, mask=mask)
            tl.atomic_add(DSCALE + cur * d + cols, acc_sc, mask=mask)
            tl.atomic_add(DSHIFT + cur * d + cols, acc_sh, mask=mask)
            acc_g = tl.zeros([BLOCK], dtype=tl.float32)
            acc_sc = tl.zeros([BLOCK], dtype=tl.float32)
            acc_sh = tl.zeros([BLOCK], dtype=tl.float32)
            cur = s
        off = row * d + cols
        r = tl.load(R + off, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + off, mask=mask, other=0.0).to(tl.float32)
        dh = tl.load(DH + off, mask=mask, other=0.0).to(tl.float32)
        dr = tl.load(DR + off, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        sc = tl.load(SCALE + s * d + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(GATE + s * d + cols, mask=mask, other=0.0).to(tl.float32)
        rhat = r * rstd
        gn = dh * (1.0 + sc)
        dr += rstd * (gn - rhat * (tl.sum(gn * rhat, axis=0) / d))
        tl.store(DX + off, dr.to(DX.dtype.element_ty), mask=mask)
        tl.store(DY + off, (g * dr).to(DY.dtype.element_ty), mask=mask)
        acc_g += dr * y
        acc_sc += dh * rhat
        acc_sh += dh
    if n > 0:
        tl.atomic_add(DGATE + cur * d + cols, acc_g, mask=mask)
        tl.atomic_add(DSCALE + cur * d + cols, acc_sc, mask=mask)
        tl.atomic_add(DSHIFT + cur * d + cols, acc_sh, mask=mask)


class _ResidualNormModulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, gate, shift, scale, token_sample, eps):
        x, y = x.contiguous(), y.contiguous()
        gate, shift, scale, ts = (t.contiguous() for t in (gate, shift, scale, token_sample))
        T, d = x.shape
        r, h = torch.empty_like(x), torch.empty_like(x)
        rstd = torch.empty(T, device=x.device, dtype=torch.float32)
        block, warps = row_block(d)
        if T:
            _fwd[(T,)](x, y, gate, shift, scale, ts, r, h, rstd, d, eps, BLOCK=block, num_warps=warps)
        ctx.save_for_backward(r, y, gate, scale, ts, rstd)
        ctx.dtypes = (x.dtype, shift.dtype)
        return r, h

    @staticmethod
    def backward(ctx, dr, dh):
        r, y, gate, scale, ts, rstd = ctx.saved_tensors
        T, d = r.shape
        dx, dy = torch.empty_like(r), torch.empty_like(y)
        dgate, dshift, dscale = (
            torch.zeros(gate.shape, device=r.device, dtype=torch.float32) for _ in range(3)
        )
        grid = reduce_programs(r, T)
        block, warps = row_block(d)
        if T:
            _bwd[(grid,)](
                dr.contiguous(),
                dh.contiguous(),
                r,
                y,
                gate,
                scale,
                ts,
                rstd,
                dx,
                dy,
                dgate,
                dshift,
                dscale,
                T,
                d,
                triton.cdiv(T, grid),
                BLOCK=block,
                num_warps=warps,
            )
        x_dtype, shift_dtype = ctx.dtypes
        return (
            dx.to(x_dtype),
            dy,
            dgate.to(gate.dtype),
            dshift.to(shift_dtype),
            dscale.to(scale.dtype),
            None,
            None,
        )


def residual_norm_modulate(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    token_sample: torch.Tensor,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _ResidualNormModulate.apply(x, y, gate, shift, scale, token_sample, eps)
