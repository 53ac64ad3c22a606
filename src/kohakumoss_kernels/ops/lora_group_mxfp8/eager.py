"""The reference: ../lora_group/eager.py over the weights dequantized to x's dtype."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...mxfp8 import Mxfp8Weight
from ..lora_group.eager import lora_group as _lora_group


def lora_group_mxfp8(
    x: torch.Tensor,
    weights: Sequence[Mxfp8Weight],
    biases: Sequence[torch.Tensor | None],
    downs: Sequence[torch.Tensor],
    ups: Sequence[torch.Tensor],
    scales: Sequence[float],
) -> tuple[torch.Tensor, ...]:
    return _lora_group(x, [w.dequant(x.dtype) for w in weights], biases, downs, ups, scales)
