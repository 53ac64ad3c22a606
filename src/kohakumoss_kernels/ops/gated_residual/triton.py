"""gated_residual in Triton: x + gate[s] * y, a tile of ROWS rows per program; the backward sums
d(gate) per sample in registers with per-program partials (see sample_sums and norm_modulate)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import sample_sums as ss
from ...triton_utils import backward_configs, next_pow2, persistent_programs, pick, size_bucket, tile_configs
from ...triton_utils import supports as supports


@triton.jit
def _fwd(X, Y, GATE, TS, OUT, T, d, ROWS: tl.constexpr, BLOCK: tl.constexpr):
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


@triton.jit
def _bwd(
    DOUT, Y, GATE, TS, DY, P, D, FIRST, LAST, T, d, tiles_per_prog, ROWS: tl.constexpr, BLOCK: tl.constexpr
):
    pid = tl.program_id(0)
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    cmask = cols < d
    loc = rid[:, None] * d + cols[None, :]
    start = pid.to(tl.int64) * tiles_per_prog * ROWS
    end = tl.minimum(start + tiles_per_prog * ROWS, T)
    n = tl.cdiv(end - start, ROWS)
    first = tl.load(TS + start, mask=n > 0, other=0).to(tl.int64)
    cur = first
    seg = pid * 0
    acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    row = start
    rmask = rid < end - row
    mask = rmask[:, None] & cmask[None, :]
    do_next = tl.load(DOUT + row * d + loc, mask=mask, other=0.0)
    y_next = tl.load(Y + row * d + loc, mask=mask, other=0.0)
    s_next = tl.load(TS + row + rid, mask=rmask, other=-1).to(tl.int64)
    for _ in range(0, n):
        do = do_next.to(tl.float32)
        y = y_next.to(tl.float32)
        s = s_next  # -1: a row past the chunk (its contributions are zero)
        cur_row, cur_mask = row, mask
        row += ROWS  # issue the next tile's loads first
        rmask = rid < end - row
        mask = rmask[:, None] & cmask[None, :]
        do_next = tl.load(DOUT + row * d + loc, mask=mask, other=0.0)
        y_next = tl.load(Y + row * d + loc, mask=mask, other=0.0)
        s_next = tl.load(TS + row + rid, mask=rmask, other=-1).to(tl.int64)
        g = tl.load(GATE + tl.maximum(s, 0)[:, None] * d + cols[None, :], mask=cur_mask, other=0.0)
        tl.store(DY + cur_row * d + loc, (g.to(tl.float32) * do).to(DY.dtype.element_ty), mask=cur_mask)
        c = do * y
        if tl.sum(((s != cur) & (s >= 0)).to(tl.int32), axis=0) == 0:
            acc += c
        else:  # a sample boundary inside this tile: row by row
            for i in tl.static_range(ROWS):
                sel = rid == i
                si = tl.sum(tl.where(sel, s, 0), axis=0)
                if (si != cur) & (si >= 0):
                    ss.flush(acc, P, D, pid, 0, 1, cur, seg, d, cols, cmask)
                    acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                    seg += 1
                    cur = si
                acc += tl.where(sel[:, None], c, 0.0)
    ss.close(acc, P, pid, 0, 1, seg, d, cols, cmask)
    ss.mark(FIRST, LAST, pid, n, first, cur, seg)


class _GatedResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, gate, token_sample):
        x, y, gate, ts = x.contiguous(), y.contiguous(), gate.contiguous(), token_sample.contiguous()
        T, d = x.shape
        out = torch.empty_like(x)
        block = next_pow2(d)

        def launch(cfg):
            rows, warps = cfg
            _fwd[(triton.cdiv(T, rows),)](x, y, gate, ts, out, T, d, ROWS=rows, BLOCK=block, num_warps=warps)

        if T:
            key = (d, x.dtype, size_bucket(T), x.device)
            launch(pick("gated_residual.fwd", key, tile_configs(block, max_per_thread=64), launch))
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
        block = next_pow2(d)
        bufs = {}

        def launch(cfg):
            rows, warps, per_sm = cfg
            tiles = triton.cdiv(T, rows)
            grid = persistent_programs(y, tiles, per_sm)
            p, first, last, acc = ss.buffers(grid, gate.shape[0], 1, d, y.device)
            _bwd[(grid,)](
                dout,
                y,
                gate,
                ts,
                dy,
                p,
                acc,
                first,
                last,
                T,
                d,
                triton.cdiv(tiles, grid),
                ROWS=rows,
                BLOCK=block,
                num_warps=warps,
            )
            bufs["b"] = (p, first, last, acc)

        key = (d, y.dtype, size_bucket(T), y.device)
        launch(pick("gated_residual.bwd", key, backward_configs(block), launch))
        return dx, dy, ss.finish(*bufs["b"], gate.dtype)[:, 0], None


def gated_residual(
    x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, token_sample: torch.Tensor
) -> torch.Tensor:
    return _GatedResidual.apply(x, y, gate, token_sample)
