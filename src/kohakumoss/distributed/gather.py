"""The whole weights of an FSDP2-sharded model on rank 0, for the exports (ComfyUI, merged, diffusers).

`full_weights(model, world)` is a collective: every rank all-gathers each sharded parameter in the same
order; rank 0 keeps the full tensors (the shards' dtype: a full fine-tune's fp32 masters, exactly what a
one-process run exports from) and sees them as the model's parameters inside the block, the others drop
them. The sharded parameters are put back afterwards, so FSDP2 finds its own objects again. Nothing may
call the model's forward inside the block (its FSDP hooks would all-gather on rank 0 alone); the export
code only reads weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from torch.distributed.tensor import DTensor

from .world import World


def sharded_params(model: nn.Module) -> list[tuple[nn.Module, str, nn.Parameter]]:
    """(owner module, name, parameter) of every DTensor parameter, in named_parameters order (every rank's)."""
    out = []
    for fqn, p in model.named_parameters():
        if isinstance(p, DTensor):
            owner, _, name = fqn.rpartition(".")
            out.append((model.get_submodule(owner) if owner else model, name, p))
    return out


@contextmanager
def full_weights(model: nn.Module, world: World) -> Iterator[None]:
    """Inside: rank 0's `model` holds whole plain parameters (one all-gather per parameter, every rank)."""
    swapped = []
    try:
        for owner, name, p in sharded_params(model):
            full = p.full_tensor()  # a collective: every rank, the same order
            if world.is_main:
                owner._parameters[name] = nn.Parameter(full.detach(), requires_grad=p.requires_grad)
                swapped.append((owner, name, p))
            del full
        yield
    finally:
        for owner, name, p in swapped:
            owner._parameters[name] = p


def any_sharded(model: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())
