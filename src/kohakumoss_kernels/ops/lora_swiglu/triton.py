"""lora_swiglu in Triton: the gate/up LoRA term added inside SwiGLU's own kernels.

Unfused (lora_linear, then swiglu) the LoRA up product is a [T, 2H] tensor written for the frozen GEMM to
accumulate onto, a rank-r GEMM that only moves memory (~90 us per block at 1 MP on the H200), and the
backward reads the [T, 2H] gradient once more for scale * dgu @ up (~84 us). Here:
Forward:  hs = scale * x down^T;  y = x W^T + b (the frozen GEMM alone);  [a | b'] = y + hs up^T per tile
          (tl.dot with K = r, in registers);  out = silu(a) * b'.
Backward: row tiles walking their columns: a, b' recomputed, dgu = [da | db] written, and in the same pass
          sq = scale * dgu up (fp32 partials over S column splits, summed after);
          gx = sq down;  gx += dgu W (in place);  g_down = sq^T x;  g_up = dgu^T hs (as lora_linear's addmm).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ...cast_cache import cast
from ...triton_utils import interpreting, next_pow2, pick, size_bucket, sm_count
from ...triton_utils import supports as supports
from ..lora_linear.addmm import master_grad, scaled_rows


@triton.jit
def _lora_swiglu_fwd(
    Y, HS, UP, OUT, T, H, R, BM: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr, PREC: tl.constexpr
):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    rr = tl.arange(0, BR)
    rmask, cmask, rrmask = rows < T, cols < H, rr < R
    hs = tl.load(HS + rows[:, None] * R + rr[None, :], mask=rmask[:, None] & rrmask[None, :], other=0.0)
    umask = cmask[:, None] & rrmask[None, :]
    ug = tl.load(UP + cols[:, None] * R + rr[None, :], mask=umask, other=0.0)
    uu = tl.load(UP + (H + cols)[:, None] * R + rr[None, :], mask=umask, other=0.0)
    mask = rmask[:, None] & cmask[None, :]
    off = rows[:, None] * (2 * H) + cols[None, :]
    a = tl.load(Y + off, mask=mask, other=0.0).to(tl.float32) + tl.dot(hs, tl.trans(ug), input_precision=PREC)
    b = tl.load(Y + off + H, mask=mask, other=0.0).to(tl.float32) + tl.dot(
        hs, tl.trans(uu), input_precision=PREC
    )
    out = a * tl.sigmoid(a) * b
    tl.store(OUT + rows[:, None] * H + cols[None, :], out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _lora_swiglu_bwd(
    DOUT, Y, HS, UP, DY, SQ, T, H, R, cols_per_split, scale,
    BM: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    split = tl.program_id(1)
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rr = tl.arange(0, BR)
    rmask, rrmask = rows < T, rr < R
    hs = tl.load(HS + rows[:, None] * R + rr[None, :], mask=rmask[:, None] & rrmask[None, :], other=0.0)
    sq = tl.zeros([BM, BR], dtype=tl.float32)
    start = split * cols_per_split
    stop = tl.minimum(start + cols_per_split, H)
    for n0 in range(start, stop, BN):
        cols = n0 + tl.arange(0, BN)
        cmask = cols < stop
        umask = cmask[:, None] & rrmask[None, :]
        ug = tl.load(UP + cols[:, None] * R + rr[None, :], mask=umask, other=0.0)
        uu = tl.load(UP + (H + cols)[:, None] * R + rr[None, :], mask=umask, other=0.0)
        mask = rmask[:, None] & cmask[None, :]
        off = rows[:, None] * (2 * H) + cols[None, :]
        do = tl.load(DOUT + rows[:, None] * H + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        a = tl.load(Y + off, mask=mask, other=0.0).to(tl.float32) + tl.dot(
            hs, tl.trans(ug), input_precision=PREC
        )
        b = tl.load(Y + off + H, mask=mask, other=0.0).to(tl.float32) + tl.dot(
            hs, tl.trans(uu), input_precision=PREC
        )
        sig = tl.sigmoid(a)
        da = (do * b * sig * (1.0 + a * (1.0 - sig))).to(DY.dtype.element_ty)
        db = (do * a * sig).to(DY.dtype.element_ty)
        tl.store(DY + off, da, mask=mask)
        tl.store(DY + off + H, db, mask=mask)
        # the gradient as stored (rounded) times up: what the unfused path's GEMM reads
        sq += tl.dot(da, ug, input_precision=PREC) + tl.dot(db, uu, input_precision=PREC)
    smask = rmask[:, None] & rrmask[None, :]
    tl.store(SQ + (split * T + rows)[:, None] * BR + rr[None, :], sq * scale, mask=smask)


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # fp32 inputs exact, as the reference's matmuls


def _configs(fwd: bool) -> list[tuple[int, int, int]]:
    """(BM, BN, num_warps) candidates, the default first; tl.dot needs 16 or more in each."""
    if interpreting():
        return [(16, 16, 1)]
    if fwd:
        return [(64, 64, 4), (32, 128, 4), (64, 128, 8), (128, 64, 8), (32, 64, 4)]
    return [(32, 64, 4), (64, 64, 4), (32, 128, 4), (16, 128, 4), (64, 128, 8)]


def _key(y: torch.Tensor, r: int) -> tuple:
    return (y.shape[1] // 2, r, y.dtype, size_bucket(y.shape[0]), y.device)


def swiglu_with_lora(y: torch.Tensor, hs: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(a) * b for [a | b] = y + hs up^T; y [T, 2H], hs [T, r], up [2H, r], all contiguous."""
    T, n = y.shape
    H, r = n // 2, hs.shape[1]
    out = torch.empty(T, H, device=y.device, dtype=y.dtype)
    if not T:
        return out
    br, prec = max(16, next_pow2(r)), _precision(y.dtype)

    def launch(cfg: tuple) -> None:
        bm, bn, warps = cfg
        _lora_swiglu_fwd[(triton.cdiv(T, bm), triton.cdiv(H, bn))](
            y, hs, up, out, T, H, r, BM=bm, BN=bn, BR=br, PREC=prec, num_warps=warps
        )

    launch(pick("lora_swiglu.fwd", _key(y, r), _configs(True), launch))
    return out


def swiglu_with_lora_backward(
    dout: torch.Tensor, y: torch.Tensor, hs: torch.Tensor, up: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgu [T, 2H], sq = scale * dgu up [T, r]) in y's dtype."""
    T, n = y.shape
    H, r = n // 2, hs.shape[1]
    dy = torch.empty_like(y)
    if not T:
        return dy, torch.zeros(0, r, device=y.device, dtype=y.dtype)
    br, prec = max(16, next_pow2(r)), _precision(y.dtype)
    partial: list[torch.Tensor] = []

    def launch(cfg: tuple) -> None:
        bm, bn, warps = cfg
        row_tiles = triton.cdiv(T, bm)
        # enough programs to keep every SM streaming: the columns split where the row tiles are few
        splits = max(1, min(triton.cdiv(H, bn), triton.cdiv(4 * sm_count(y.device), row_tiles)))
        per_split = triton.cdiv(triton.cdiv(H, splits), bn) * bn
        splits = triton.cdiv(H, per_split)
        p = torch.empty(splits, T, br, device=y.device, dtype=torch.float32)
        _lora_swiglu_bwd[(row_tiles, splits)](
            dout, y, hs, up, dy, p, T, H, r, per_split, float(scale),
            BM=bm, BN=bn, BR=br, PREC=prec, num_warps=warps,
        )  # fmt: skip
        partial[:] = [p]

    launch(pick("lora_swiglu.bwd", _key(y, r), _configs(False), launch))
    p = partial[0]
    sq = (p[0] if p.shape[0] == 1 else p.sum(0))[:, :r]
    return dy, sq.to(y.dtype).contiguous()


class _LoraSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, down, up, scale: float):
        dtype = x2.dtype
        down_c, up_c = cast(down, dtype), cast(up, dtype).contiguous()
        hs = scaled_rows(x2, down_c.t(), scale, lowrank=False).contiguous()
        y = F.linear(x2, weight, bias).contiguous()  # the frozen GEMM alone: nothing to accumulate onto
        out = swiglu_with_lora(y, hs, up_c)
        ctx.save_for_backward(x2, weight, down_c, up_c, hs, y)
        ctx.scale, ctx.masters = scale, (down, up)
        return out

    @staticmethod
    def backward(ctx, dout):
        x2, weight, down, up, hs, y = ctx.saved_tensors
        need_x, need_w, need_b, need_down, need_up = ctx.needs_input_grad[:5]
        dgu, sq = swiglu_with_lora_backward(dout.contiguous(), y, hs, up, ctx.scale)
        gx = gw = gb = g_down = g_up = None
        if need_x:
            gx = torch.mm(sq, down).addmm_(dgu, weight)
        if need_down:
            g_down = master_grad(ctx.masters[0], sq.t(), x2)
        if need_up:
            g_up = master_grad(ctx.masters[1], dgu.t(), hs)
        if need_w:
            gw = torch.mm(dgu.t(), x2)
        if need_b:
            gb = dgu.sum(0)
        return gx, gw, gb, g_down, g_up, None


def lora_swiglu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    lead = x.shape[:-1]
    out = _LoraSwiGLU.apply(x.reshape(-1, x.shape[-1]), weight, bias, down, up, float(scale))
    return out.reshape(*lead, out.shape[-1])
