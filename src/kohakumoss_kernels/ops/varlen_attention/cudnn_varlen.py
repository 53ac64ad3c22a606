"""Varlen attention through cuDNN's ragged SDPA (`aten._cudnn_attention_forward` with cumulative lengths).

The kernels torch's SDPA runs per sample on Hopper, over the packed [T, H, D] tensors, with the lengths
read on the device: one CUDA graph serves batches whose lengths differ. torch's jagged tensors call the same
op. cuDNN builds one plan per (samples, max length) and caches it, so `max_seqlen` should be the bound.
"""

from __future__ import annotations

import torch

from kohakumoss_common.device import sm_at_least

_OP = getattr(torch.ops.aten, "_cudnn_attention_forward", None)
MIN_BOUND = 128  # torch's jagged SDPA refuses cuDNN at or below this many query tokens; so does this backend


def supports(arch: str, dtype: torch.dtype) -> bool:
    # sm80+: cuDNN's fused attention (its flash form) needs Ampere; torch must be built with cuDNN
    return (
        _OP is not None
        and sm_at_least(arch, 80)
        and dtype in (torch.float16, torch.bfloat16)
        and torch.backends.cudnn.is_available()
    )


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
) -> torch.Tensor:
    if _OP is None:
        raise RuntimeError("this torch has no aten._cudnn_attention_forward")
    if max_seqlen <= MIN_BOUND:
        raise RuntimeError(
            f"cuDNN's ragged attention needs a length bound above {MIN_BOUND} (got {max_seqlen})"
        )
    cu = cu_seqlens.to(torch.int32)
    # the log-sum-exp is what the backward reads: skip writing it when no gradient is wanted (sampling)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    out = _OP(q, k, v, None, cu, cu, max_seqlen, max_seqlen, grad, 0.0, False, False, scale=scale)[0]
    return out


varlen_attention.device_lengths = True  # cu_seqlens read on the device: graph-safe across lengths
