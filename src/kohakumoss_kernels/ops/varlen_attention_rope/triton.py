"""Varlen attention with the rotary embedding in the kernel's prologue (Triton, flash-attention-2 style).

The kernels of ops/varlen_attention/triton.py with HAS_ROPE: every q or k tile is loaded as its two
halves and rotated in registers (half-split pairs, fp32, rounded to the input dtype as the
reference's separate rope does); q k^T is then two dots over the halves, so the rotated q and k
never go to memory and no register shuffle is needed. The backward recomputes the rotation from the
saved unrotated q, k, keeps dq and dk as halves, and un-rotates them before their store.
"""

from __future__ import annotations

import math

import torch

from ..varlen_attention.triton import (
    _attention_bwd_dkdv,
    _attention_bwd_dq,
    _attention_fwd,
    _configs,
    attention_backward,
    attention_forward,
    tuned,
)
from ..varlen_attention.triton import supports as supports

# Smaller tiles than the plain kernel (the cos/sin tiles take registers too); these compile for sm90
# without register spills. Two per kernel, so a fresh machine compiles few.
FWD_CONFIGS = _configs([(128, 64, 8, 3), (64, 64, 4, 3)])
DKDV_CONFIGS = _configs([(64, 64, 8, 3), (32, 64, 8, 3)])
DQ_CONFIGS = _configs([(128, 64, 8, 3), (64, 64, 8, 3)])

_FWD = tuned(_attention_fwd, FWD_CONFIGS)
_DKDV = tuned(_attention_bwd_dkdv, DKDV_CONFIGS)
_DQ = tuned(_attention_bwd_dq, DQ_CONFIGS)


class _VarlenAttentionRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, cos, sin, scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        T, _, D = q.shape
        if D not in (32, 64, 128, 256):  # each half feeds a dot, which needs K >= 16
            raise RuntimeError(f"triton varlen_attention_rope: head_dim {D} is not a power of two in 32..256")
        if cos.shape != (T, D // 2) or sin.shape != (T, D // 2):
            raise RuntimeError(
                f"triton varlen_attention_rope: cos/sin {tuple(cos.shape)}, need ({T}, {D // 2})"
            )
        cu = cu_seqlens.to(torch.int32).contiguous()
        sm_scale = scale if scale is not None else 1.0 / math.sqrt(D)
        o, lse = attention_forward(_FWD, q, k, v, cos, sin, cu, max_seqlen, sm_scale)
        ctx.save_for_backward(q, k, v, cos, sin, o, lse, cu)
        ctx.max_seqlen, ctx.sm_scale = max_seqlen, sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, cos, sin, o, lse, cu = ctx.saved_tensors
        dq, dk, dv = attention_backward(
            _DKDV, _DQ, q, k, v, cos, sin, o, lse, cu, do, ctx.max_seqlen, ctx.sm_scale
        )
        return dq, dk, dv, None, None, None, None, None


def varlen_attention_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    return _VarlenAttentionRope.apply(q, k, v, cu_seqlens, int(max_seqlen), cos, sin, scale)
