"""Varlen attention as sdpa_groups with SDPA's cuDNN kernels first.

SDPA's own order depends on torch's version and the card (torch 2.11 on the H200 already chose cuDNN's
kernels); cuDNN's attention is reported faster on Hopper for training shapes and often slower elsewhere,
so asking for it first is a candidate the tuning table times, not a default.
Runs cuDNN refuses (key length 1, for one) go to flash / memory-efficient, so mixed lengths still run.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from .sdpa_groups import varlen_attention as _varlen_attention

# cuDNN 9.13 and 9.14 can fault (illegal memory access) in CUDA graphs for non-causal attention over
# more than 1024 keys (Transformer Engine turns cuDNN attention off there); a fault would end the process.
_GRAPH_FAULT_VERSIONS = range(91300, 91500)
PREFERENCE = (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)


def supports(arch: str, dtype: torch.dtype) -> bool:
    return arch.startswith("sm") and dtype in (torch.float16, torch.bfloat16)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
) -> torch.Tensor:
    if (
        max_seqlen > 1024
        and torch.backends.cudnn.version() in _GRAPH_FAULT_VERSIONS
        and torch.cuda.is_current_stream_capturing()
    ):
        raise RuntimeError(
            f"cuDNN {torch.backends.cudnn.version()} attention is not safe in a CUDA graph here"
        )
    return _varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale, sdpa_backends=PREFERENCE)
