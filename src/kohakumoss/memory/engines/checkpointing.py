"""Activation checkpointing per block: the whole block, only its attention half or only its MLP half,
on every k-th block: what the forward did not keep is recomputed in the backward (torch.utils.checkpoint,
non-reentrant). The block runner (runner.py) applies it per block.

The halves are `MossBlock.forward` cut after the attention residual (the same ops in the same order,
so a split block computes bit for bit what the whole one does; tests/memory/test_checkpointing.py checks):
    attention_half: norm1-modulate, q/k/v, attention, o, gated residual, norm2-modulate -> (x, y)
    mlp_half:       ffn_up_gate, SiTU-GLU, ffn_down, gated residual                    -> x
`mod` is the shared block modulation [6, B, d] the backbone passes to every block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from kohakumoss.model.blocks import attention, fold_norm_weight
from kohakumoss_common.errors import ConfigError

MODES = ("none", "full", "attn", "mlp")


@dataclass(frozen=True)
class CheckpointPolicy:
    mode: str = "none"
    every: int = 1  # checkpoint blocks 0, every, 2*every, ...

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError("CHECKPOINTING", f"'{self.mode}' is not one of {MODES}")
        if self.every < 1:
            raise ConfigError("CHECKPOINT_EVERY", f"must be >= 1, got {self.every}")

    def applies_to(self, index: int) -> bool:
        return self.mode != "none" and index % self.every == 0


def attention_half(
    block, x: torch.Tensor, mod: torch.Tensor, seq, rope, ops
) -> tuple[torch.Tensor, torch.Tensor]:
    """x after the attention residual, and the MLP's modulated input y."""
    shift_a, scale_a, gate_a, shift_f, scale_f, _ = mod.unbind(0)
    ts, eps = seq.token_sample, block.eps
    scale_a = fold_norm_weight(block.norm1.weight, scale_a)
    scale_f = fold_norm_weight(block.norm2.weight, scale_f)
    y, x = ops.norm_modulate(x, shift_a, scale_a, ts, eps, fork=True)
    q, k, v = block.project_qkv(y)
    out = attention(
        q, k, v, block.q_norm, block.k_norm, rope, seq.cu_seqlens, seq.max_seqlen, block.num_heads, eps, ops
    )
    return ops.residual_norm_modulate(x, block.proj["o"](out), gate_a, shift_f, scale_f, ts, eps)


def mlp_half(block, x: torch.Tensor, y: torch.Tensor, mod: torch.Tensor, seq, ops) -> torch.Tensor:
    """x after the SiTU-GLU residual."""
    p = block.proj
    gate_f = mod.unbind(0)[5]
    return ops.gated_residual(x, p["ffn_down"](ops.situ_glu(p["ffn_up_gate"](y))), gate_f, seq.token_sample)


def run_block(block, mode: str, x: torch.Tensor, mod: torch.Tensor, seq, rope, ops) -> torch.Tensor:
    """Block `block` with activation checkpointing `mode` ('none' runs it plainly)."""
    if mode == "none":
        return block(x, mod, seq, rope, ops)
    if mode == "full":
        return checkpoint(block, x, mod, seq, rope, ops, use_reentrant=False)
    if mode == "attn":
        x, y = checkpoint(attention_half, block, x, mod, seq, rope, ops, use_reentrant=False)
        return mlp_half(block, x, y, mod, seq, ops)
    x, y = attention_half(block, x, mod, seq, rope, ops)
    return checkpoint(mlp_half, block, x, y, mod, seq, ops, use_reentrant=False)
