"""The trainable weights of a run (adapter network or full model), as a flat name -> tensor dict."""

from __future__ import annotations

import torch
from torch import nn

from kohakumoss_common.errors import CheckpointError


def trainable_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Detached views of every parameter that requires grad (exact values, no custom state_dict hooks)."""
    return {n: p.detach() for n, p in module.named_parameters() if p.requires_grad}


@torch.no_grad()
def load_trainable_state(
    module: nn.Module, tensors: dict[str, torch.Tensor], where: object = "<checkpoint>"
) -> None:
    """Copy saved tensors into the module's trainable parameters; names and shapes must match exactly."""
    params = {n: p for n, p in module.named_parameters() if p.requires_grad}
    missing, extra = sorted(set(params) - set(tensors)), sorted(set(tensors) - set(params))
    if missing or extra:
        raise CheckpointError(
            where, f"trainable weights differ: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    for name, p in params.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(p.shape):
            raise CheckpointError(
                where, f"shape mismatch for '{name}': saved {tuple(t.shape)} vs {tuple(p.shape)}"
            )
        p.copy_(t.to(p.device, p.dtype))
