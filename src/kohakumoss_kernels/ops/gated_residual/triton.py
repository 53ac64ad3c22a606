"""gated_residual in Triton: x + gate[s] * y, a tile of ROWS rows per program; the backward sums
d(gate) per sample in registers with per-program partials (see sample_sums and norm_modulate)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...backends import pdl
from ...backends import sample_sums as ss
from ...backends.triton_utils import pick, row_configs, row_key, row_launch
from ...backends.triton_utils import supports as supports


@triton.jit
def _gated_residual_fwd(
    X, Y, GATE, TS, OUT, ACC, ACC_N, T, d, ROWS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    pdl.wait_inputs(PDL)
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rid < T - row0
    mask = rmask[:, None] & (cols < d)[None, :]
    loc = rid[:, None] * d + cols[None, :]
    s = tl.load(TS + row0 + rid, mask=rmask, other=0).to(tl.int64)
    x = tl.load(X + row0 * d + loc, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + row0 * d + loc, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + s[:, None] * d + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + row0 * d + loc, (x + g * y).to(OUT.dtype.element_ty), mask=mask)
    ss.zero_acc(ACC, ACC_N, BLOCK)


@triton.jit
def _load_tile(DOUT, Y, TS, row, end, rid, loc, cmask, d):
    """The tile of rows from `row` (masked to the chunk's end): its mask, dout, y, samples (-1 past it)."""
    rmask = rid < end - row
    mask = rmask[:, None] & cmask[None, :]
    do = tl.load(DOUT + row * d + loc, mask=mask, other=0.0)
    y = tl.load(Y + row * d + loc, mask=mask, other=0.0)
    s = tl.load(TS + row + rid, mask=rmask, other=-1).to(tl.int64)
    return mask, do, y, s


@triton.jit
def _gated_residual_bwd(
    DOUT, Y, GATE, TS, DY, P, D, FIRST, LAST, T, d, tiles_per_prog, NEED_SUMS: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.wait_inputs(PDL)
    pid = tl.program_id(0)
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    cmask = cols < d
    loc = rid[:, None] * d + cols[None, :]
    start, end, n, first = ss.chunk(TS, pid, tiles_per_prog, T, ROWS)
    cur = first
    seg = pid * 0
    acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    row = start
    mask, do_next, y_next, s_next = _load_tile(DOUT, Y, TS, row, end, rid, loc, cmask, d)
    for _ in range(0, n):
        do = do_next.to(tl.float32)
        y = y_next.to(tl.float32)
        s = s_next  # -1: a row past the chunk (its contributions are zero)
        cur_row, cur_mask = row, mask
        row += ROWS  # issue the next tile's loads first
        mask, do_next, y_next, s_next = _load_tile(DOUT, Y, TS, row, end, rid, loc, cmask, d)
        g = tl.load(
            GATE + tl.maximum(s, 0).to(tl.int32)[:, None] * d + cols[None, :], mask=cur_mask, other=0.0
        )
        tl.store(DY + cur_row * d + loc, (g.to(tl.float32) * do).to(DY.dtype.element_ty), mask=cur_mask)
        c = do * y  # d(gate) per sample: none for a frozen modulation (NEED_SUMS)
        acc, unused1, unused2, cur, seg = ss.add_tile(
            acc, acc, acc, c, c, c, s, cur, seg, rid, P, D, pid, d, cols, cmask, 1, ROWS, BLOCK, NEED_SUMS
        )
    ss.close_chunk(acc, acc, acc, P, FIRST, LAST, pid, n, first, cur, seg, d, cols, cmask, 1, NEED_SUMS)


class _GatedResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, gate, token_sample):
        x, y, gate, ts = x.contiguous(), y.contiguous(), gate.contiguous(), token_sample.contiguous()
        T, d = x.shape
        out = torch.empty_like(x)
        ctx.acc, acc_args = ss.forward_acc(ctx.needs_input_grad[2], gate.shape[0], 1, x)
        launch = row_launch(_gated_residual_fwd, T, d, x, y, gate, ts, out, *acc_args, T, d, **pdl.options(x))
        if T:
            launch(pick("gated_residual.fwd", row_key(x, T, d), row_configs(d), launch))
        ctx.save_for_backward(y, gate, ts)
        ctx.x_dtype = x.dtype
        return out

    @staticmethod
    def backward(ctx, dout):
        y, gate, ts = ctx.saved_tensors
        T, d = y.shape
        dout = dout.contiguous()
        dy = torch.empty_like(y)
        dx = dout if dout.dtype == ctx.x_dtype else dout.to(ctx.x_dtype)
        if not T:
            return dx, dy, torch.zeros_like(gate), None
        need_sums = ctx.needs_input_grad[2]  # a trained modulation
        args = (dout, y, gate, ts, dy)
        launch = ss.PerSampleBackward(
            _gated_residual_bwd, args, y, gate.shape[0], 1, need_sums, gate.dtype, acc=ss.take(ctx)
        )
        name = "gated_residual.bwd" + ("" if need_sums else "_nosums")
        launch.run(pick(name, row_key(y, T, d), launch.configs(), launch))
        out = launch.sums
        return dx, dy, None if out is None else out[:, 0], None


def gated_residual(
    x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, token_sample: torch.Tensor
) -> torch.Tensor:
    return _GatedResidual.apply(x, y, gate, token_sample)
