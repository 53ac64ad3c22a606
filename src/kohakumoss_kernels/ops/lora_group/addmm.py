"""lora_group as cuBLAS calls: the members' LoRA down-projections as one GEMM, one input gradient.

Forward:  H = x [down_1; ...; down_n]^T  (one read of x for every member's h)
          y_i = x W_i^T + b_i;  y_i += scale_i * H_i up_i^T   (in place, as ../lora_linear/addmm.py)
Backward: Q_i = scale_i * gy_i up_i;  gx = [Q_1 ... Q_n] [down_1; ...; down_n];  gx += gy_i W_i  (each in place)
          g_down = [Q_1 ... Q_n]^T x  (one read of x);  g_up_i = gy_i^T (scale_i * H_i)
Against n separate lora_linear calls this saves n - 1 reads of x forward, n - 1 backward, and autograd's
n - 1 adds of the members' input gradients (a read of two and a write of one [T, I] tensor each).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..lora_linear.addmm import rank_products


class _LoraGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, n: int, scales: tuple[float, ...], lowrank: bool, *tensors):
        weights, biases, downs, ups = (tensors[i * n : (i + 1) * n] for i in range(4))
        rows, _ = rank_products(lowrank)
        ranks = [d.shape[0] for d in downs]
        down = torch.cat(downs)
        h = rows(x2, down.t())
        hs = h.split(ranks, dim=1)
        outs = tuple(
            F.linear(x2, w, b).addmm_(hi, u.t(), alpha=s)
            for w, b, hi, u, s in zip(weights, biases, hs, ups, scales, strict=True)
        )
        ctx.save_for_backward(x2, down, h, *weights, *ups)
        ctx.n, ctx.scales, ctx.ranks, ctx.lowrank = n, scales, ranks, lowrank
        return outs

    @staticmethod
    def backward(ctx, *gys):
        n, scales, ranks = ctx.n, ctx.scales, ctx.ranks
        x2, down, h, *rest = ctx.saved_tensors
        weights, ups = rest[:n], rest[n:]
        rows, cols = rank_products(ctx.lowrank)
        need = ctx.needs_input_grad[4:]  # after x2, n, scales, lowrank: weights, biases, downs, ups
        need_x = ctx.needs_input_grad[0]
        need_w = need[:n]
        need_down = any(need[2 * n : 3 * n])
        need_up = need[3 * n : 4 * n]
        gys = [torch.zeros(x2.shape[0], w.shape[0], dtype=x2.dtype, device=x2.device) if g is None else g
               for g, w in zip(gys, weights, strict=True)]  # fmt: skip
        gx = g_down = None
        if need_x or need_down:
            q = torch.cat([rows(g, u).mul_(s) for g, u, s in zip(gys, ups, scales, strict=True)], dim=1)
            if need_x:
                gx = torch.mm(q, down)
                for g, w in zip(gys, weights, strict=True):
                    gx.addmm_(g, w)
            if need_down:
                g_down = cols(x2, q).t().split(ranks)
        hs = h.split(ranks, dim=1)
        g_ups = [cols(g, hi * s) if nu else None
                 for g, hi, s, nu in zip(gys, hs, scales, need_up, strict=True)]  # fmt: skip
        g_ws = [torch.mm(g.t(), x2) if nw else None for g, nw in zip(gys, need_w, strict=True)]
        g_bs = [g.sum(0) if nb else None for g, nb in zip(gys, need[n : 2 * n], strict=True)]
        g_downs = list(g_down) if g_down is not None else [None] * n
        return (gx, None, None, None, *g_ws, *g_bs, *g_downs, *g_ups)


def lora_group(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    downs: Sequence[torch.Tensor],
    ups: Sequence[torch.Tensor],
    scales: Sequence[float],
    lowrank: bool = False,
) -> tuple[torch.Tensor, ...]:
    lead, n = x.shape[:-1], len(weights)
    tensors = (*weights, *biases, *downs, *ups)
    scales = tuple(float(s) for s in scales)
    outs = _LoraGroup.apply(x.reshape(-1, x.shape[-1]), n, scales, lowrank, *tensors)
    return tuple(o.reshape(*lead, o.shape[-1]) for o in outs)
