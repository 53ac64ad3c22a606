"""gated_residual in Triton: x + gate[s] * y; the backward sums d(gate) per sample (see norm_modulate)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...triton_utils import reduce_programs, row_block
from ...triton_utils import supports as supports


@triton.jit
def _fwd(X, Y, GATE, TS, OUT, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    s = tl.load(TS + row).to(tl.int64)
    x = tl.load(X + row * d + cols, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + row * d + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + s * d + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + row * d + cols, (x + g * y).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _bwd(DOUT, Y, GATE, TS, DY, DGATE, T, d, rows_per_prog, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    start = pid.to(tl.int64) * rows_per_prog
    n = tl.minimum(start + rows_per_prog, T) - start
    cur = tl.load(TS + start, mask=n > 0, other=0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, n):
        row = start + i
        s = tl.load(TS + row).to(tl.int64)
        if s != cur:
            tl.atomic_add(DGATE + cur * d + cols, acc, mask=mask)
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            cur = s
        off = row * d + cols
        do = tl.load(DOUT + off, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + off, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(GATE + s * d + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DY + off, (g * do).to(DY.dtype.element_ty), mask=mask)
        acc += do * y
    if n > 0:
        tl.atomic_add(DGATE + cur * d + cols, acc, mask=mask)


class _GatedResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, gate, token_sample):
        x, y, gate, ts = x.contiguous(), y.contiguous(), gate.contiguous(), token_sample.contiguous()
        T, d = x.shape
        out = torch.empty_like(x)
        block, warps = row_block(d)
        if T:
            _fwd[(T,)](x, y, gate, ts, out, d, BLOCK=block, num_warps=warps)
        ctx.save_for_backward(y, gate, ts)
        ctx.x_dtype = x.dtype
        return out

    @staticmethod
    def backward(ctx, dout):
        y, gate, ts = ctx.saved_tensors
        T, d = y.shape
        dout = dout.contiguous()
        dy = torch.empty_like(y)
        dgate = torch.zeros(gate.shape, device=y.device, dtype=torch.float32)
        grid = reduce_programs(y, T)
        block, warps = row_block(d)
        if T:
            _bwd[(grid,)](
                dout, y, gate, ts, dy, dgate, T, d, triton.cdiv(T, grid), BLOCK=block, num_warps=warps
            )
        dx = dout if dout.dtype == ctx.x_dtype else dout.to(ctx.x_dtype)
        return dx, dy, dgate.to(gate.dtype), None


def gated_residual(
    x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, token_sample: torch.Tensor
) -> torch.Tensor:
    return _GatedResidual.apply(x, y, gate, token_sample)
