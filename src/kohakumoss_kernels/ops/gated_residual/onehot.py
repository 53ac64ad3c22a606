"""gated_residual with the per-sample gate spread as a one-hot matmul (../../per_token.py)."""

from __future__ import annotations

import torch

from ...backends.per_token import one_hot, per_token


def gated_residual(
    x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, token_sample: torch.Tensor
) -> torch.Tensor:
    hot = one_hot(token_sample, gate.shape[0])
    return (x.float() + per_token(gate, hot) * y.float()).to(x.dtype)
