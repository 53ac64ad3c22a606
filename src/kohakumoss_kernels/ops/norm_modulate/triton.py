"""norm_modulate in Triton: rms_norm(x) * (1 + scale[s]) + shift[s], a tile of ROWS rows per program.

Rows are held as C chunks of W columns (row_chunks: d = 3072 is 3 x 1024, no padding to 4096). The
backward walks a chunk of rows per program, one row at a time (the next row's loads issued first), and
sums d(scale), d(shift) per sample in registers; per-program partials are added by sample_sums.finish.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...backends import pdl
from ...backends import row_chunks as rc
from ...backends import sample_sums as ss
from ...backends.triton_utils import backward_configs, next_pow2, pick, row_configs, row_key, row_launch
from ...backends.triton_utils import supports as supports


@triton.jit
def _norm_modulate_fwd(
    X, SHIFT, SCALE, TS, Y, RSTD, ACC, ACC_N, T, d, eps, ROWS: tl.constexpr, W: tl.constexpr, C: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.wait_inputs(PDL)
    # one int64 base per tile, int32 offsets within it: per-element int64 offsets cost registers
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rid = tl.arange(0, ROWS)
    rmask = rid < T - row0
    m0, m1, m2 = rc.masks(rmask[:, None], d, W, C)
    loc = rid[:, None] * d + tl.arange(0, W)[None, :]
    s = tl.load(TS + row0 + rid, mask=rmask, other=0).to(tl.int32)
    x0, x1, x2 = rc.load(X + row0 * d, loc, m0, m1, m2, W, C)
    x0, x1, x2 = x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32)
    rstd = 1.0 / tl.sqrt(rc.row_sum(x0 * x0, x1 * x1, x2 * x2, C) / d + eps)
    r = rstd[:, None]
    poff = s[:, None] * d + tl.arange(0, W)[None, :]
    c0, c1, c2 = rc.load(SCALE, poff, m0, m1, m2, W, C)
    h0, h1, h2 = rc.load(SHIFT, poff, m0, m1, m2, W, C)
    y0 = x0 * r * (1.0 + c0.to(tl.float32)) + h0.to(tl.float32)
    y1 = x1 * r * (1.0 + c1.to(tl.float32)) + h1.to(tl.float32)
    y2 = x2 * r * (1.0 + c2.to(tl.float32)) + h2.to(tl.float32)
    rc.store(Y + row0 * d, loc, y0, y1, y2, m0, m1, m2, W, C)
    tl.store(RSTD + row0 + rid, rstd, mask=rmask)
    ss.zero_acc(ACC, ACC_N, W)


@triton.jit
def _load_row(X, DY, DRES, RSTD, TS, row, end, d, W: tl.constexpr, C: tl.constexpr, HAS_RES: tl.constexpr):
    """Row `row` (masked past the chunk's end): x, dy and the residual's gradient (HAS_RES; else x again,
    unused), each as C chunks, then rstd and the row's sample (-1 past the end)."""
    ok = row < end
    m0, m1, m2 = rc.masks(ok, d, W, C)
    loc = tl.arange(0, W)[None, :]
    x0, x1, x2 = rc.load(X + row * d, loc, m0, m1, m2, W, C)
    g0, g1, g2 = rc.load(DY + row * d, loc, m0, m1, m2, W, C)
    if HAS_RES:
        r0, r1, r2 = rc.load(DRES + row * d, loc, m0, m1, m2, W, C)
    else:
        r0, r1, r2 = x0, x1, x2
    rstd = tl.load(RSTD + row, mask=ok, other=0.0)
    s = tl.load(TS + row, mask=ok, other=-1).to(tl.int64)
    return x0, x1, x2, g0, g1, g2, r0, r1, r2, rstd, s


@triton.jit
def _sums_out(a0, a1, a2, P, D, pid, k, cur, seg, d, W: tl.constexpr, C: tl.constexpr, CLOSE: tl.constexpr):
    """One parameter's chunked sums [1, W] x C: flushed at a sample boundary, or closed at the chunk's end."""
    cols = tl.arange(0, W)
    for i in tl.static_range(C):
        acc = a0
        if i == 1:
            acc = a1
        if i == 2:
            acc = a2
        at = cols + i * W
        if CLOSE:
            ss.close(acc, P, pid, k, 2, seg, d, at, at < d)
        else:
            ss.flush(acc, P, D, pid, k, 2, cur, seg, d, at, at < d)


@triton.jit
def _norm_modulate_bwd(
    DY, X, SCALE, TS, RSTD, DX, DRES, HAS_RES: tl.constexpr, P, D, FIRST, LAST, T, d, tiles_per_prog,
    NEED_SUMS: tl.constexpr, ROWS: tl.constexpr, W: tl.constexpr, C: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.wait_inputs(PDL)
    # ROWS is 1 (backward_rows): the row's sample is one scalar, a boundary test without a reduction
    pid = tl.program_id(0)
    start, end, n, first = ss.chunk(TS, pid, tiles_per_prog, T, 1)
    cur = first
    seg = pid * 0
    a0 = tl.zeros([1, W], dtype=tl.float32)  # d(scale) per chunk
    a1 = tl.zeros([1, W], dtype=tl.float32)
    a2 = tl.zeros([1, W], dtype=tl.float32)
    b0 = tl.zeros([1, W], dtype=tl.float32)  # d(shift) per chunk
    b1 = tl.zeros([1, W], dtype=tl.float32)
    b2 = tl.zeros([1, W], dtype=tl.float32)
    loc = tl.arange(0, W)[None, :]
    row = start
    nx0, nx1, nx2, ng0, ng1, ng2, nr0, nr1, nr2, nrstd, ns = _load_row(
        X, DY, DRES, RSTD, TS, row, end, d, W, C, HAS_RES
    )
    for _ in range(0, n):
        x0, x1, x2 = nx0.to(tl.float32), nx1.to(tl.float32), nx2.to(tl.float32)
        g0, g1, g2 = ng0.to(tl.float32), ng1.to(tl.float32), ng2.to(tl.float32)
        r0, r1, r2 = nr0, nr1, nr2
        rstd = nrstd
        s = ns  # -1: a row past the chunk (its contributions are zero)
        cur_row = row
        row += 1  # issue the next row's loads first
        nx0, nx1, nx2, ng0, ng1, ng2, nr0, nr1, nr2, nrstd, ns = _load_row(
            X, DY, DRES, RSTD, TS, row, end, d, W, C, HAS_RES
        )
        m0, m1, m2 = rc.masks(s >= 0, d, W, C)
        c0, c1, c2 = rc.load(SCALE + tl.maximum(s, 0).to(tl.int32) * d, loc, m0, m1, m2, W, C)
        h0, h1, h2 = x0 * rstd, x1 * rstd, x2 * rstd
        e0 = g0 * (1.0 + c0.to(tl.float32))
        e1 = g1 * (1.0 + c1.to(tl.float32))
        e2 = g2 * (1.0 + c2.to(tl.float32))
        k = (rc.row_sum(e0 * h0, e1 * h1, e2 * h2, C) / d)[:, None]
        o0 = rstd * (e0 - h0 * k)
        o1 = rstd * (e1 - h1 * k)
        o2 = rstd * (e2 - h2 * k)
        if HAS_RES:  # fork: the gradient x got through its other use (prefetched with the row), added here
            o0 += r0.to(tl.float32)
            o1 += r1.to(tl.float32)
            o2 += r2.to(tl.float32)
        rc.store(DX + cur_row * d, loc, o0, o1, o2, m0, m1, m2, W, C)
        if NEED_SUMS:  # d(scale), d(shift) per sample: none for a frozen modulation
            if (s != cur) & (s >= 0):  # a new sample's first row: the sums so far are the previous one's
                _sums_out(a0, a1, a2, P, D, pid, 0, cur, seg, d, W, C, False)
                _sums_out(b0, b1, b2, P, D, pid, 1, cur, seg, d, W, C, False)
                a0, a1, a2 = a0 * 0.0, a1 * 0.0, a2 * 0.0
                b0, b1, b2 = b0 * 0.0, b1 * 0.0, b2 * 0.0
                seg += 1
                cur = s
            a0 += g0 * h0
            a1 += g1 * h1
            a2 += g2 * h2
            b0 += g0
            b1 += g1
            b2 += g2
    if NEED_SUMS:
        _sums_out(a0, a1, a2, P, D, pid, 0, cur, seg, d, W, C, True)
        _sums_out(b0, b1, b2, P, D, pid, 1, cur, seg, d, W, C, True)
        ss.mark(FIRST, LAST, pid, n, first, cur, seg)


def backward_rows(d: int) -> list[tuple[int, int, int]]:
    """The backward's launch configs: one row per step (the kernel's form), at least 2 columns of each
    chunk per thread (32 warps over a 1024-wide chunk would give 1)."""
    w, _ = rc.row_chunks(d)
    out = []
    for _, warps, per_sm in backward_configs(next_pow2(d)):
        cfg = (1, warps, per_sm)
        if cfg not in out and (w >= 64 * warps or warps == 1):
            out.append(cfg)
    return out


class _NormModulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shift, scale, token_sample, eps, fork):
        x = x.contiguous()
        shift, scale, ts = shift.contiguous(), scale.contiguous(), token_sample.contiguous()
        T, d = x.shape
        y = torch.empty_like(x)
        rstd = torch.empty(T, device=x.device, dtype=torch.float32)
        ctx.acc, acc_args = ss.forward_acc(any(ctx.needs_input_grad[1:3]), scale.shape[0], 2, x)
        launch = row_launch(
            _norm_modulate_fwd, T, d, x, shift, scale, ts, y, rstd, *acc_args, T, d, eps, width=rc.width(d),
            **pdl.options(x),
        )  # fmt: skip
        if T:
            launch(pick("norm_modulate.fwd", row_key(x, T, d), row_configs(d), launch))
        ctx.save_for_backward(x, scale, ts, rstd)
        ctx.shift_dtype = shift.dtype
        return (y, x.view_as(x)) if fork else y

    @staticmethod
    def backward(ctx, dy, dres=None):
        x, scale, ts, rstd = ctx.saved_tensors
        T, d = x.shape
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        if not T:
            z = torch.zeros_like(scale)
            return dx, z.to(ctx.shift_dtype), z, None, None, None
        res = (dx, 0) if dres is None else (dres.contiguous(), 1)
        args = (dy, x, scale, ts, rstd, dx, *res)
        need_sums = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]  # a trained modulation
        launch = ss.PerSampleBackward(
            _norm_modulate_bwd, args, x, scale.shape[0], 2, need_sums, scale.dtype, rc.width(d), ss.take(ctx)
        )
        # each variant its own pick: the fork reads one more tensor, no sums need fewer registers
        name = "norm_modulate.bwd" + ("" if dres is None else "_fork") + ("" if need_sums else "_nosums")
        launch.run(pick(name, row_key(x, T, d), backward_rows(d), launch))
        out = launch.sums  # [B, (scale, shift), d]
        if out is None:
            return dx, None, None, None, None, None
        return dx, out[:, 1].to(ctx.shift_dtype), out[:, 0], None, None, None


def norm_modulate(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    token_sample: torch.Tensor,
    eps: float = 1e-6,
    fork: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    return _NormModulate.apply(x, shift, scale, token_sample, eps, fork)
