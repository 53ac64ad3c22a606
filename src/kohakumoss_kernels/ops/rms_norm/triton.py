"""RMSNorm in Triton.

Forward: a tile of ROWS rows per program (the whole row in registers). Backward: a few programs per
SM, each walking its chunk of row tiles with the next tile's loads issued before the current tile is
reduced; the weight gradient is one partial sum per program, summed afterwards (deterministic, no
atomics). (ROWS, num_warps) is picked per width by timing a few candidates once (triton_utils.pick).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...backends import pdl
from ...backends import sample_sums as ss
from ...backends.triton_utils import (
    backward_configs,
    next_pow2,
    persistent_programs,
    pick,
    register_budget,
    row_configs,
    row_key,
    row_launch,
)
from ...backends.triton_utils import supports as supports


@triton.jit
def _rms_norm_fwd(
    X, W, Y, RSTD, T, d, eps, HAS_W: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.wait_inputs(PDL)
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rid < T - row0
    mask = rmask[:, None] & (cols < d)[None, :]
    loc = rid[:, None] * d + cols[None, :]  # int32 offsets inside the tile; the row base is one scalar
    x = tl.load(X + row0 * d + loc, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / d + eps)
    y = x * rstd[:, None]
    if HAS_W:
        y = y * tl.load(W + cols, mask=cols < d, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + row0 * d + loc, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row0 + rid, rstd, mask=rmask)


@triton.jit
def _rms_norm_bwd(
    DY, X, W, RSTD, DX, DW, T, d, tiles_per_prog, HAS_W: tl.constexpr, NEED_DW: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.wait_inputs(PDL)
    pid = tl.program_id(0)
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    cmask = cols < d
    loc = rid[:, None] * d + cols[None, :]
    w = tl.full([1, BLOCK], 1.0, tl.float32)
    if HAS_W:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    dw = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    start = pid.to(tl.int64) * tiles_per_prog * ROWS
    end = tl.minimum(start + tiles_per_prog * ROWS, T)
    n = tl.cdiv(end - start, ROWS)
    row = start
    rmask = rid < end - row
    mask = rmask[:, None] & cmask[None, :]
    x_next = tl.load(X + row * d + loc, mask=mask, other=0.0)
    dy_next = tl.load(DY + row * d + loc, mask=mask, other=0.0)
    rstd_next = tl.load(RSTD + row + rid, mask=rmask, other=0.0)
    for _ in range(0, n):
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        rstd = rstd_next[:, None]
        cur_row, cur_mask = row, mask
        row += ROWS  # issue the next tile's loads before this tile's reductions
        rmask = rid < end - row
        mask = rmask[:, None] & cmask[None, :]
        x_next = tl.load(X + row * d + loc, mask=mask, other=0.0)
        dy_next = tl.load(DY + row * d + loc, mask=mask, other=0.0)
        rstd_next = tl.load(RSTD + row + rid, mask=rmask, other=0.0)
        xhat = x * rstd
        g = dy * w
        dx = rstd * (g - xhat * (tl.sum(g * xhat, axis=1) / d)[:, None])
        tl.store(DX + cur_row * d + loc, dx.to(DX.dtype.element_ty), mask=cur_mask)
        if NEED_DW:  # a frozen weight (LoRA training) needs no gradient: no sums, no partials
            dw += dy * xhat
    if NEED_DW:
        tl.store(DW + pid.to(tl.int64) * d + cols, tl.sum(dw, axis=0), mask=cmask)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        T, d = x2.shape
        y = torch.empty_like(x2)
        rstd = torch.empty(T, device=x.device, dtype=torch.float32)
        w = weight.contiguous() if weight is not None else x2
        launch = row_launch(
            _rms_norm_fwd, T, d, x2, w, y, rstd, T, d, eps, HAS_W=weight is not None, **pdl.options(x)
        )
        if T:
            launch(pick("rms_norm.fwd", row_key(x, T, d), row_configs(d), launch))
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape = shape
        return y.reshape(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        T, d = x2.shape
        dy2 = dy.reshape(T, d).contiguous()
        dx = torch.empty_like(x2)
        block = next_pow2(d)
        has_w = weight is not None
        need_dw = has_w and ctx.needs_input_grad[1]
        grads = {}

        def launch(cfg):  # launched even for T == 0, so the weight gradient is written (zeros)
            rows, warps, per_sm = cfg
            tiles = triton.cdiv(T, rows)
            grid = persistent_programs(x2, tiles, per_sm)
            part = torch.empty(grid, d, device=x2.device, dtype=torch.float32) if need_dw else rstd
            _rms_norm_bwd[(grid,)](
                dy2,
                x2,
                weight if has_w else x2,
                rstd,
                dx,
                part,
                T,
                d,
                triton.cdiv(tiles, grid),
                HAS_W=has_w,
                NEED_DW=need_dw,
                ROWS=rows,
                BLOCK=block,
                num_warps=warps,
                **register_budget(x2, warps, per_sm),
                **pdl.options(x2),
            )
            # the partials' sum inside the picked launch: more programs per SM, more partials to add
            grads["dw"] = ss.sum_rows(part, weight.dtype) if need_dw else None

        name = "rms_norm.bwd" if need_dw else "rms_norm.bwd_nodw"  # another kernel: its own pick
        launch(pick(name, row_key(x2, T, d), backward_configs(block), launch))
        return dx.reshape(ctx.shape), grads["dw"], None


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    return _RMSNorm.apply(x, weight, eps)
