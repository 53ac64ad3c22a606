"""int8_linear in the compute dtype: the rotation on x, the int8 rows dequantized per call (any card)."""

from __future__ import annotations

import torch

from ... import int8


def int8_linear(x: torch.Tensor, weight: int8.Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    return int8.frozen_linear(x, weight, bias, compute=False)
