"""Per-sample parameters spread over their tokens as a one-hot matmul, for the torch-only backends.

`p[token_sample]` (the eager reference's gather) has an index-accumulate backward: every token's gradient
row is added atomically into one of a few sample rows, which serializes on the GPU (the eager AdaLN ops'
backward took 7.7 ms at 8704 tokens on the H200, against 0.15 ms for the Triton kernel). As a matmul
with the one-hot [T, B] matrix, the backward is a [B, T] x [T, d] GEMM: one read of the gradient.
Where neither Triton nor TileLang runs (sm70 without TileLang, other GPUs), this is the fast path.
"""

from __future__ import annotations

import torch


def one_hot(token_sample: torch.Tensor, samples: int) -> torch.Tensor:
    """[T, B] float32: row t is 1 at its sample. `samples` comes from a parameter's shape. A comparison,
    not F.one_hot: that one checks the index range on the host (a sync), so it cannot be captured in a
    CUDA graph (the graphed step's tuning failed its capture of every onehot backend on the H200)."""
    classes = torch.arange(samples, device=token_sample.device, dtype=token_sample.dtype)
    return (token_sample[:, None] == classes).to(torch.float32)


def per_token(param: torch.Tensor, hot: torch.Tensor) -> torch.Tensor:
    """param [B, d] -> [T, d] float32, each token's sample row."""
    return hot @ param.float()
