"""lora_linear as cuBLAS calls with the LoRA terms folded into the frozen GEMMs' outputs, in place.

Forward:  y  = x W^T + b;  y += scale * h up^T  (in place),  h = x down^T     (h kept for the backward)
          or, `lora_first` (backend addmm_lora_first): y = b + scale * h up^T;  y += x W^T (in place)
Backward: q  = gy up;   gx = scale * q down;  gx += gy W  (in place)        (one pass, no separate add)
          g_up = gy^T (scale * h);   g_down = (scale * q)^T x;   gW = gy^T x (only when W trains)
In place because out-of-place `torch.addmm(C, a, b)` on CUDA first copies C into a new result (a read and
a write of [T, out] before the GEMM reads it again); eager autograd would also write the LoRA part of gx
and the base part separately and add them: two more passes over a [T, I] tensor per linear.
The two forward orders move the same bytes; `lora_first` reads the [T, out] sum inside the big
(compute-bound) GEMM's epilogue instead of in the rank-r GEMM (memory-bound): the tuner picks per shape.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _t_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a.t(), b)


def rank_products(lowrank: bool):
    """(rows, cols) = (a @ b, a^T @ b) for the rank-r products: cuBLAS, or the Triton kernels of lowrank.py."""
    if lowrank:
        from .lowrank import cols_mm, rows_mm  # Triton: imported only where that backend runs

        return rows_mm, cols_mm
    return torch.mm, _t_mm


class _LoraLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, down, up, scale: float, lora_first: bool, lowrank: bool = False):
        rows, _ = rank_products(lowrank)
        h = rows(x2, down.t())
        if lora_first:  # scale the [T, r] h, not the [T, out] product; a 1-D bias rides cuBLASLt's epilogue
            hs = h * scale
            out = torch.mm(hs, up.t()) if bias is None else torch.addmm(bias, hs, up.t())
            out.addmm_(x2, weight.t())
        else:
            out = F.linear(x2, weight, bias).addmm_(h, up.t(), alpha=scale)
        ctx.save_for_backward(x2, weight, down, up, h)
        ctx.scale, ctx.lowrank = scale, lowrank
        return out

    @staticmethod
    def backward(ctx, gy):
        x2, weight, down, up, h = ctx.saved_tensors
        need_x, need_w, need_b, need_down, need_up = ctx.needs_input_grad[:5]
        rows, cols = rank_products(ctx.lowrank)
        gx = gw = gb = g_down = g_up = None
        sq = rows(gy, up).mul_(ctx.scale) if (need_x or need_down) else None
        if need_x:
            gx = torch.mm(sq, down).addmm_(gy, weight)
        if need_down:
            g_down = cols(x2, sq).t()
        if need_up:
            g_up = cols(gy, h * ctx.scale)
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
