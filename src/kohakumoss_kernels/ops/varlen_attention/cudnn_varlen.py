"""Varlen attention through cuDNN's ragged (packed) attention: the sequence bounds are read on the device.

`torch.ops.aten._cudnn_attention_forward` / `_backward` with `cum_seq_q` / `cum_seq_k` take the packed
[T, H, D] tensors and the cu_seqlens as they are, as torch's own `varlen_attn` calls them on Hopper and
Blackwell from cuDNN 9.18. Nothing here reads a length on the host, so a CUDA graph captured with it
serves batches of other lengths (the graphed training step); `max_seqlen` is a bound, not a length.
"""

from __future__ import annotations

import torch

# torch's varlen_attn uses these kernels from cuDNN 9.18 on sm90 / sm100 (torch/nn/attention/varlen.py)
MIN_CUDNN = 91800


def supports(arch: str, dtype: torch.dtype) -> bool:
    version = torch.backends.cudnn.version() or 0
    return arch in ("sm90", "sm100") and dtype in (torch.float16, torch.bfloat16) and version >= MIN_CUDNN


class _CudnnVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, scale):
        cu = cu_seqlens.to(torch.int32)
        out = torch.ops.aten._cudnn_attention_forward(
            q, k, v, None, cu, cu, max_seqlen, max_seqlen, True, 0.0, False, False, scale=scale
        )
        o, lse, seed, offset = out[0], out[1], out[6], out[7]
        ctx.save_for_backward(q, k, v, o, lse, cu, seed, offset)
        ctx.max_seqlen, ctx.scale = max_seqlen, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, cu, seed, offset = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._cudnn_attention_backward(
            do.contiguous(), q, k, v, o, lse, seed, offset, None, cu, cu, ctx.max_seqlen, ctx.max_seqlen,
            0.0, False, scale=ctx.scale,
        )  # fmt: skip
        return dq, dk, dv, None, None, None


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
) -> torch.Tensor:
    return _CudnnVarlen.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens, int(max_seqlen), scale
    )


varlen_attention.device_lengths = True
