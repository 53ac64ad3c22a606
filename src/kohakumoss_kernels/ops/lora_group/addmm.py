"""lora_group as cuBLAS calls: the members' LoRA down-projections as one GEMM, one input gradient.

Forward:  H = x [down_1; ...; down_n]^T  (one read of x for every member's h; the scale as alpha when the
          members share one);  y_i = x W_i^T + b_i;  y_i += scale_i * H_i up_i^T   (in place, as
          ../lora_linear/addmm.py)
Backward: Q_i = scale_i * gy_i up_i (into one [T, sum r] buffer);  gx = Q [down_1; ...; down_n];
          gx += gy_i W_i  (each in place);  g_down = Q^T x  (one read of x);  g_up_i = gy_i^T (scale_i * H_i)
Against n separate lora_linear calls this saves n - 1 reads of x forward, n - 1 backward, and autograd's
n - 1 adds of the members' input gradients (a read of two and a write of one [T, I] tensor each).
LoRA weights and their gradients keep their own dtype, as in lora_linear's addmm.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...runtime.cast_cache import cast, cast_cat
from ...weights import fp8, int8
from ...weights.stored_weight import WEIGHT_KINDS
from ..lora_linear.addmm import (
    input_grad,
    lora_out,
    master_grad,
    restored_weights,
    saved_weights,
    scaled_rows,
    sink_of,
    weight_grad,
)

WEIGHTS = WEIGHT_KINDS  # as ../lora_linear/addmm.py


class _LoraGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, n: int, scales: tuple[float, ...], lowrank: bool, lora_first: bool, *tensors):
        weights, biases, downs, ups = (tensors[i * n : (i + 1) * n] for i in range(4))
        dtype = x2.dtype
        ranks = [d.shape[0] for d in downs]
        down = cast_cat(downs, dtype)  # a view of the forward's cast_cache window, or cat + cast here
        ups_c = [cast(u, dtype) for u in ups]
        shared = len(set(scales)) == 1  # one scale: H carries it (alpha), the up GEMMs none
        h = scaled_rows(x2, down.t(), scales[0] if shared else 1.0, lowrank)
        hs = h.split(ranks, dim=1)
        xq = fp8.quantize_rows(x2) if any(_fp8_compute(w) for w in weights) else None  # once for all
        if isinstance(weights[0], int8.Int8Weight) and all(w.group == weights[0].group for w in weights):
            xq = int8.prepare(x2, weights[0])  # one rotation (and int8 rows) for every member
        outs = tuple(
            lora_out(x2, w, b, hi, u, 1.0 if shared else s, lora_first, xq)
            for w, b, hi, u, s in zip(weights, biases, hs, ups_c, scales, strict=True)
        )
        ctx.save_for_backward(x2, down, h, *saved_weights(ctx, weights), *ups_c)
        ctx.n, ctx.scales, ctx.ranks, ctx.lowrank, ctx.shared = n, scales, ranks, lowrank, shared
        ctx.masters = (downs, ups)
        return outs

    @staticmethod
    def backward(ctx, *gys):
        n, scales, ranks, lowrank = ctx.n, ctx.scales, ctx.ranks, ctx.lowrank
        x2, down, h, *rest = ctx.saved_tensors
        weights, ups = restored_weights(ctx, rest[:n]), rest[n:]
        downs_m, ups_m = ctx.masters
        need = ctx.needs_input_grad[
            5:
        ]  # after x2, n, scales, lowrank, lora_first: weights, biases, downs, ups
        need_x = ctx.needs_input_grad[0]
        need_w = need[:n]
        need_down = any(need[2 * n : 3 * n])
        need_up = need[3 * n : 4 * n]
        gys = [torch.zeros(x2.shape[0], w.shape[0], dtype=x2.dtype, device=x2.device) if g is None else g
               for g, w in zip(gys, weights, strict=True)]  # fmt: skip
        q = None
        if need_x or need_down:
            q = torch.cat(
                [scaled_rows(g, u, s, lowrank) for g, u, s in zip(gys, ups, scales, strict=True)], dim=1
            )

        def weight_grads() -> tuple[list | None, list]:
            """The LoRA masters' gradients, None where grad_sink accumulated them into `.grad`."""
            g_downs = None
            if need_down:
                g_down = weight_grad(q.t(), x2, downs_m[0].dtype, lowrank)
                parts = g_down.split(ranks)
                sinks = [sink_of(m, m.shape, lowrank) for m in downs_m]
                if all(t is not None and t.dtype == g_down.dtype for t in sinks):
                    torch._foreach_add_(sinks, parts)  # one launch for the members' .grad (grad_sink)
                else:
                    g_downs = [g.to(m.dtype) for g, m in zip(parts, downs_m, strict=True)]
            g_ups = [
                master_grad(m, g.t(), hi, lowrank, 1.0 if ctx.shared else s) if nu else None
                for g, hi, s, m, nu in zip(gys, h.split(ranks, dim=1), scales, ups_m, need_up, strict=True)
            ]
            return g_downs, g_ups

        gx = None
        if need_x:
            gx = input_grad((q, down), gys, weights)
        g_downs, g_ups = weight_grads()
        g_ws = [torch.mm(g.t(), x2) if nw else None for g, nw in zip(gys, need_w, strict=True)]
        g_bs = [g.sum(0) if nb else None for g, nb in zip(gys, need[n : 2 * n], strict=True)]
        return (gx, None, None, None, None, *g_ws, *g_bs, *(g_downs or [None] * n), *g_ups)


def _fp8_compute(w) -> bool:
    return isinstance(w, fp8.Fp8Weight) and w.compute


def lora_group(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    downs: Sequence[torch.Tensor],
    ups: Sequence[torch.Tensor],
    scales: Sequence[float],
    lowrank: bool = False,
    lora_first: bool = False,
) -> tuple[torch.Tensor, ...]:
    lead, n = x.shape[:-1], len(weights)
    tensors = (*weights, *biases, *downs, *ups)
    scales = tuple(float(s) for s in scales)
    outs = _LoraGroup.apply(x.reshape(-1, x.shape[-1]), n, scales, lowrank, lora_first, *tensors)
    return tuple(o.reshape(*lead, o.shape[-1]) for o in outs)
