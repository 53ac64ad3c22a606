"""lora_linear as cuBLAS calls with the LoRA terms folded into the frozen GEMMs' outputs, in place.

Forward:  hs = scale * x down^T  (alpha, kept for the backward);  y = x W^T + b;  y += hs up^T  (in place)
          or, `lora_first` (backend addmm_lora_first): y = b + hs up^T;  y += x W^T (in place)
Backward: sq = scale * gy up;   gx = sq down;  gx += gy W  (in place)        (one pass, no separate add)
          g_up = gy^T hs;   g_down = sq^T x;   gW = gy^T x (only when W trains)
In place because out-of-place `torch.addmm(C, a, b)` on CUDA first copies C into a new result (a read and
a write of [T, out] before the GEMM reads it again); eager autograd would also write the LoRA part of gx
and the base part separately and add them: two more passes over a [T, I] tensor per linear.
The two forward orders move the same bytes; `lora_first` reads the [T, out] sum inside the big
(compute-bound) GEMM's epilogue instead of in the rank-r GEMM (memory-bound): the tuner picks per shape.
down and up come in their own dtype (fp32 masters) and are cast here (or taken from the forward's
cast_cache window, cast all at once); their gradients leave in that
dtype straight from cuBLAS (bf16 products, fp32 output) and `scale` rides the GEMMs' alpha: per LoRA
linear five fewer small kernels (a cast of each gradient, a transposed copy, two scalings) than autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...runtime import grad_sink
from ...runtime.cast_cache import cast
from ...weights import fp8, int8, mxfp8
from ...weights.stored_weight import WEIGHT_KINDS

WEIGHTS = WEIGHT_KINDS  # a tensor, or an fp8 / int8 / MXFP8 weight: `lora_out` and `input_grad` branch on it


def scaled_rows(a: torch.Tensor, b: torch.Tensor, scale: float, lowrank: bool) -> torch.Tensor:
    """scale * a @ b for a rank-r product, the scale as cuBLAS's alpha (no separate scaling kernel)."""
    if lowrank:
        from .lowrank import rows_mm

        return rows_mm(a, b, scale)
    # beta=0: the uninitialised output is never read (torch.addmm's documented contract)
    return torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device).addmm_(
        a, b, beta=0, alpha=scale
    )


def weight_grad(
    a_t: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, lowrank: bool = False
) -> torch.Tensor:
    """a_t @ b, the gradient of a parameter stored in `dtype`: on CUDA cuBLAS writes fp32 from bf16/fp16
    products directly (no cast kernel after it). a_t is usually a transposed view."""
    if lowrank:
        from . import lowrank as lr

        return lr.mm(a_t, b).to(dtype)
    if a_t.dtype == dtype:
        return torch.mm(a_t, b)
    if a_t.is_cuda and dtype == torch.float32:
        return torch.mm(a_t, b, out_dtype=dtype)
    return torch.mm(a_t, b).to(dtype)


def master_grad(
    master: torch.Tensor, a_t: torch.Tensor, b: torch.Tensor, lowrank: bool = False, alpha: float = 1.0
) -> torch.Tensor | None:
    """alpha * a_t @ b as `master`'s gradient: inside a grad_sink window accumulated into its .grad by the
    GEMM (None returned), else returned in master's dtype."""
    sink = sink_of(master, (a_t.shape[0], b.shape[1]), lowrank)
    if lowrank:  # one Triton launch, alpha inside: into the sink, or into a fresh float32 buffer
        from . import lowrank as lr

        if sink is None:
            return lr.mm(a_t, b, alpha).to(master.dtype)
        lr.mm_into(sink, a_t, b, alpha)
        return None
    if sink is not None:
        grad_sink.mm_into(sink, a_t, b, alpha)
        return None
    g = weight_grad(a_t, b, master.dtype)
    return g if alpha == 1.0 else g.mul_(alpha)


def input_grad(lora: tuple, gys: list, weights: list) -> torch.Tensor:
    """gx = sq down + sum_i gy_i W_i (lora = (sq, down)): the frozen products added in place onto the LoRA
    part, or, for fp8 / int8 weights, the LoRA part onto their frozen product."""
    sq, down = lora
    if isinstance(weights[0], int8.Int8Weight):
        return int8.grad_input(gys, weights).addmm_(sq, down)
    if isinstance(weights[0], mxfp8.Mxfp8Weight):
        return mxfp8.grad_input(gys, weights).addmm_(sq, down)
    if isinstance(weights[0], fp8.Fp8Weight):
        return fp8.grad_input(gys, weights).addmm_(sq, down)
    gx = torch.mm(sq, down)
    for g, w in zip(gys, weights, strict=True):
        gx.addmm_(g, w)
    return gx


def saved_weights(ctx, weights) -> list:
    """Frozen weights for the backward: tensors through save_for_backward (None here), fp8 / int8 ones on ctx."""
    typed = (fp8.Fp8Weight, int8.Int8Weight, mxfp8.Mxfp8Weight)
    ctx.fp8_weights = [w if isinstance(w, typed) else None for w in weights]
    return [None if isinstance(w, typed) else w for w in weights]


def restored_weights(ctx, saved) -> list:
    return [w if f is None else f for w, f in zip(saved, ctx.fp8_weights, strict=True)]


def sink_of(master: torch.Tensor, shape, lowrank: bool) -> torch.Tensor | None:
    """grad_sink's target for `master`; the lowrank kernels accumulate into float32 ones only."""
    sink = grad_sink.target(master, shape)
    return None if sink is None or (lowrank and sink.dtype != torch.float32) else sink


def lora_out(x2, weight, bias, h, up, alpha: float, lora_first: bool, xq=None) -> torch.Tensor:
    """x W^T + b + alpha h up^T: the LoRA term added onto the frozen GEMM's output in place, or
    (lora_first) written first and read by the frozen GEMM's epilogue. An fp8 weight (fp8.Fp8Weight), an
    int8 one (int8.Int8Weight) or an MXFP8 one (mxfp8.Mxfp8Weight) takes the first order: its GEMM writes a fresh output (xq: x2 already
    quantized to fp8)."""
    if isinstance(weight, fp8.Fp8Weight):
        return fp8.linear(x2, weight, bias, xq).addmm_(h, up.t(), alpha=alpha)
    if isinstance(weight, int8.Int8Weight):  # xq: int8.prepare's (rotated x, int8 rows) of a group
        return int8.linear(x2, weight, bias, xq).addmm_(h, up.t(), alpha=alpha)
    if isinstance(weight, mxfp8.Mxfp8Weight):
        return mxfp8.linear(x2, weight, bias).addmm_(h, up.t(), alpha=alpha)
    if lora_first:
        if bias is not None:  # the 1-D bias rides cuBLASLt's epilogue
            return torch.addmm(bias, h, up.t(), alpha=alpha).addmm_(x2, weight.t())
        return scaled_rows(h, up.t(), alpha, lowrank=False).addmm_(x2, weight.t())
    return F.linear(x2, weight, bias).addmm_(h, up.t(), alpha=alpha)


class _LoraLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, down, up, scale: float, lora_first: bool, lowrank: bool = False):
        dtype = x2.dtype
        down_c, up_c = cast(down, dtype), cast(up, dtype)  # the forward's cached copies, or cast here
        hs = scaled_rows(x2, down_c.t(), scale, lowrank)
        out = lora_out(x2, weight, bias, hs, up_c, 1.0, lora_first)
        ctx.save_for_backward(x2, *saved_weights(ctx, [weight]), down_c, up_c, hs)
        ctx.scale, ctx.lowrank = scale, lowrank
        ctx.masters = (down, up)
        return out

    @staticmethod
    def backward(ctx, gy):
        x2, weight, down, up, hs = ctx.saved_tensors
        (weight,) = restored_weights(ctx, [weight])
        need_x, need_w, need_b, need_down, need_up = ctx.needs_input_grad[:5]
        lowrank = ctx.lowrank
        gx = gw = gb = g_down = g_up = None
        sq = scaled_rows(gy, up, ctx.scale, lowrank) if (need_x or need_down) else None
        if need_x:
            gx = input_grad((sq, down), [gy], [weight])
        # the LoRA masters' gradients, None where grad_sink accumulated them into `.grad`
        if need_down:
            g_down = master_grad(ctx.masters[0], sq.t(), x2, lowrank)
        if need_up:
            g_up = master_grad(ctx.masters[1], gy.t(), hs, lowrank)
        if need_w:
            gw = torch.mm(gy.t(), x2)
        if need_b:
            gb = gy.sum(0)
        return gx, gw, gb, g_down, g_up, None, None, None


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
    lora_first: bool = False,
    lowrank: bool = False,
) -> torch.Tensor:
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    out = _LoraLinear.apply(x2, weight, bias, down, up, float(scale), lora_first, lowrank)
    return out.reshape(*lead, out.shape[-1])
