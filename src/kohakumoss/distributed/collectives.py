"""Small collectives the trainer needs beside the gradient reduction: a logged loss, a barrier."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .world import World


def global_sum(value: torch.Tensor, world: World) -> torch.Tensor:
    """The sum over ranks of a tensor (a copy; in fp32 where it was lower)."""
    out = value.detach().float().clone()
    if world.size > 1:
        dist.all_reduce(out)
    return out


def step_loss(weighted_loss: torch.Tensor, world: World) -> torch.Tensor:
    """The whole micro-step's loss from each rank's `rank_weight * loss` (shard.py): their mean."""
    return global_sum(weighted_loss, world) / world.size


def barrier(world: World) -> None:
    if world.size > 1:
        dist.barrier()
