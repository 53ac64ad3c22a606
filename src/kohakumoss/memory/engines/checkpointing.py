"""Activation checkpointing per block: the whole block, only its attention half or only its MLP half,
on every k-th block: what the forward did not keep is recomputed in the backward (torch.utils.checkpoint,
non-reentrant). The block runner (block_runner.py) applies it per block.

The halves are `MossBlock.attention_half` and `MossBlock.mlp_half`, which its forward runs in turn:
    attention_half: norm1-modulate, q/k/v, attention, o, gated residual, norm2-modulate -> (x, y)
    mlp_half:       ffn_up_gate, SiTU-GLU, ffn_down, gated residual                    -> x
`mod` is the shared block modulation [6, B, d] the backbone passes to every block.

The recomputation saves and restores the RNG state only when the forward draws random numbers (adapter
dropout): reading the generator's state from the host is what kept a checkpointed step out of a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from kohakumoss_common.errors import ConfigError

MODES = ("none", "full", "attn", "mlp")


@dataclass(frozen=True)
class CheckpointPolicy:
    mode: str = "none"
    every: int = 1  # checkpoint blocks 0, every, 2*every, ...
    preserve_rng: bool = True  # False when the forward draws no random numbers (no adapter dropout)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError("CHECKPOINTING", f"'{self.mode}' is not one of {MODES}")
        if self.every < 1:
            raise ConfigError("CHECKPOINT_EVERY", f"must be >= 1, got {self.every}")

    def applies_to(self, index: int) -> bool:
        return self.mode != "none" and index % self.every == 0


def run_block(
    block, mode: str, x: torch.Tensor, mod: torch.Tensor, seq, rope, ops, preserve_rng: bool = True
) -> torch.Tensor:
    """Block `block` with activation checkpointing `mode` ('none' runs it plainly)."""
    if mode == "none":
        return block(x, mod, seq, rope, ops)
    kw = dict(use_reentrant=False, preserve_rng_state=preserve_rng)
    if mode == "full":
        return checkpoint(block, x, mod, seq, rope, ops, **kw)
    if mode == "attn":
        x, y = checkpoint(block.attention_half, x, mod, seq, rope, ops, **kw)
        return block.mlp_half(x, y, mod, seq, ops)
    x, y = block.attention_half(x, mod, seq, rope, ops)
    return checkpoint(block.mlp_half, x, y, mod, seq, ops, **kw)
