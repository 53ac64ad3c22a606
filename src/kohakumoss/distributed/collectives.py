"""Small collectives the trainer needs beside the gradient reduction (a logged loss, a barrier), and the
bucketed mean of host buffers (gradients summed on the host by the memory plan's GradOffload)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .world import World

BUCKET_BYTES = 25 << 20  # DDP's default bucket size
IN_FLIGHT = 2  # buckets reduced at once: the next one is flattened while the last one travels


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


def host_group(world: World, timeout_s: float) -> dist.ProcessGroup | None:
    """The group that reduces host tensors: the default one when it is gloo, else a new gloo group over
    every rank (NCCL reduces device tensors only). Every rank must call this, in the same order."""
    if world.backend == "gloo":
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype a buffer is summed in: fp64 stays, every narrower float is summed in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def buckets(buffers: Sequence[torch.Tensor], bucket_bytes: int = BUCKET_BYTES) -> list[list[int]]:
    """Indices of `buffers` grouped into runs of one summing dtype and about `bucket_bytes` (summed in
    that dtype) each; a bigger buffer is a bucket alone."""
    out: list[list[int]] = []
    open_: dict[torch.dtype, tuple[list[int], int]] = {}
    for i, b in enumerate(buffers):
        wide = _wide(b.dtype)
        nbytes = b.numel() * wide.itemsize
        run, used = open_.get(wide, ([], 0))
        if run and used + nbytes > bucket_bytes:
            out.append(run)
            run, used = [], 0
        run.append(i)
        open_[wide] = (run, used + nbytes)
    out.extend(run for run, _ in open_.values() if run)
    return out


def all_reduce_mean(
    buffers: Sequence[torch.Tensor],
    group: dist.ProcessGroup | None = None,
    bucket_bytes: int = BUCKET_BYTES,
) -> None:
    """In place: every floating buffer becomes the mean of its values over the group's ranks.

    The buffers are flattened into a few buckets (fp32, fp64 for fp64 buffers), each all-reduced with
    `async_op` while the next one is flattened; an fp32 buffer alone in its bucket is reduced in place."""
    for b in buffers:
        if not b.is_floating_point():
            raise TypeError(f"all_reduce_mean averages floating buffers, not {b.dtype}")
    world = dist.get_world_size(group)
    if world == 1 or not buffers:
        return
    pending: list[tuple[list[int], torch.Tensor, dist.Work]] = []

    def finish(run: list[int], flat: torch.Tensor, work: dist.Work) -> None:
        work.wait()
        flat.div_(world)
        if len(run) == 1 and flat is buffers[run[0]]:
            return
        offset = 0
        for i in run:
            b = buffers[i]
            b.copy_(flat[offset : offset + b.numel()].view(b.shape))
            offset += b.numel()

    for run in buckets(buffers, bucket_bytes):
        first = buffers[run[0]]
        if len(run) == 1 and first.dtype == _wide(first.dtype) and first.is_contiguous():
            flat = first  # reduced where it lies: no copy
        else:
            flat = torch.cat([buffers[i].reshape(-1).to(_wide(first.dtype)) for i in run])
        pending.append((run, flat, dist.all_reduce(flat, group=group, async_op=True)))
        if len(pending) >= IN_FLIGHT:
            finish(*pending.pop(0))
    for item in pending:
        finish(*item)
