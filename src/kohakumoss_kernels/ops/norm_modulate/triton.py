"""norm_modulate in Triton: rms_norm(x) * (1 + scale[s]) + shift[s], one row per program.

The backward walks a chunk of rows per program, summing d(scale) and d(shift) per sample in
registers and flushing them with one atomic add each time the sample changes (fp32 buffers).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...triton_utils import reduce_programs, row_block
from ...triton_utils import supports as supports


@triton.jit
def _fwd(X, SHIFT, SCALE, TS, Y, RSTD, d, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    s = tl.load(TS + row).to(tl.int64)
    x = tl.load(X + row * d + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / d + eps)
    sc = tl.load(SCALE + s * d + cols, mask=mask, other=0.0).to(tl.float32)
    sh = tl.load(SHIFT + s * d + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * (1.0 + sc) + sh
    tl.store(Y + row * d + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def _bwd(DY, X, SCALE, TS, RSTD, DX, DSHIFT, DSCALE, T, d, rows_per_prog, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    start = pid.to(tl.int64) * rows_per_prog
    n = tl.minimum(start + rows_per_prog, T) - start
    cur = tl.load(TS + start, mask=n > 0, other=0).to(tl.int64)
    acc_sc = tl.zeros([BLOCK], dtype=tl.float32)
    acc_sh = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, n):
        row = start + i
        s = tl.load(TS + row).to(tl.int64)
        if s != cur:
            tl.atomic_add(DSCALE + cur * d + cols, acc_sc, mask=mask)
            tl.atomic_add(DSHIFT + cur * d + cols, acc_sh, mask=mask)
            acc_sc = tl.zeros([BLOCK], dtype=tl.float32)
            acc_sh = tl.zeros([BLOCK], dtype=tl.float32)
            cur = s
        off = row * d + cols
        x = tl.load(X + off, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + off, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        sc = tl.load(SCALE + s * d + cols, mask=mask, other=0.0).to(tl.float32)
        xhat = x * rstd
        g = dy * (1.0 + sc)
        dx = rstd * (g - xhat * (tl.sum(g * xhat, axis=0) / d))
        tl.store(DX + off, dx.to(DX.dtype.element_ty), mask=mask)
        acc_sc += dy * xhat
        acc_sh += dy
    if n > 0:
        tl.atomic_add(DSCALE + cur * d + cols, acc_sc, mask=mask)
        tl.atomic_add(DSHIFT + cur * d + cols, acc_sh, mask=mask)


class _NormModulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shift, scale, token_sample, eps):
        x = x.contiguous()
        shift, scale, ts = shift.contiguous(), scale.contiguous(), token_sample.contiguous()
        T, d = x.shape
        y = torch.empty_like(x)
        rstd = torch.empty(T, device=x.device, dtype=torch.float32)
        block, warps = row_block(d)
        if T:
            _fwd[(T,)](x, shift, scale, ts, y, rstd, d, eps, BLOCK=block, num_warps=warps)
        ctx.save_for_backward(x, scale, ts, rstd)
        ctx.shift_dtype = shift.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, scale, ts, rstd = ctx.saved_tensors
        T, d = x.shape
        dx = torch.empty_like(x)
        dshift = torch.zeros(scale.shape, device=x.device, dtype=torch.float32)
        dscale = torch.zeros(scale.shape, device=x.device, dtype=torch.float32)
        grid = reduce_programs(x, T)
        block, warps = row_block(d)
        if T:
            _bwd[(grid,)](
                dy.contiguous(),
                x,
                scale,
                ts,
                rstd,
                dx,
                dshift,
                dscale,
                T,
                d,
                triton.cdiv(T, grid),
                BLOCK=block,
                num_warps=warps,
            )
        return dx, dshift.to(ctx.shift_dtype), dscale.to(scale.dtype), None, None


def norm_modulate(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    token_sample: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    return _NormModulate.apply(x, shift, scale, token_sample, eps)
