"""Varlen attention as sdpa_groups with SDPA held to its cuDNN kernels.

torch's SDPA puts FlashAttention (FA2) first; on Hopper cuDNN's attention is reported faster for
training shapes, elsewhere often slower, so it is a candidate the tuning table times, not a default.
Where cuDNN cannot serve a call SDPA raises a RuntimeError and the registry falls back.
"""

from functools import partial

import torch
from torch.nn.attention import SDPBackend

from .sdpa_groups import varlen_attention as _varlen_attention


def supports(arch: str, dtype: torch.dtype) -> bool:
    return arch.startswith("sm") and dtype in (torch.float16, torch.bfloat16)


varlen_attention = partial(_varlen_attention, sdpa_backend=SDPBackend.CUDNN_ATTENTION)
