"""lora_linear as cuBLAS calls with the LoRA terms folded into the frozen GEMMs' epilogues.

Forward:  y  = addmm(x W^T + b, h, up^T, alpha=scale),  h = x down^T        (h kept for the backward)
Backward: q  = gy up;   gx = addmm(scale * q down, gy, W)                   (one pass, no separate add)
          g_up = gy^T (scale * h);   g_down = (scale * q)^T x;   gW = gy^T x (only when W trains)
Eager autograd would write the LoRA part of gx and the base part separately and add them: two more
passes over a [T, I] tensor per linear, and twice the autograd nodes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _LoraLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, down, up, scale: float):
        h = torch.mm(x2, down.t())
        out = torch.addmm(F.linear(x2, weight, bias), h, up.t(), alpha=scale)
        ctx.save_for_backward(x2, weight, down, up, h)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, gy):
        x2, weight, down, up, h = ctx.saved_tensors
        need_x, need_w, need_b, need_down, need_up = ctx.needs_input_grad[:5]
        gx = gw = gb = g_down = g_up = None
        sq = torch.mm(gy, up).mul_(ctx.scale) if (need_x or need_down) else None
        if need_x:
            gx = torch.addmm(torch.mm(sq, down), gy, weight)
        if need_down:
            g_down = torch.mm(sq.t(), x2)
        if need_up:
            g_up = torch.mm(gy.t(), h * ctx.scale)
        if need_w:
            gw = torch.mm(gy.t(), x2)
        if need_b:
            gb = gy.sum(0)
        return gx, gw, gb, g_down, g_up, None


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    lead = x.shape[:-1]
    out = _LoraLinear.apply(x.reshape(-1, x.shape[-1]), weight, bias, down, up, float(scale))
    return out.reshape(*lead, out.shape[-1])
