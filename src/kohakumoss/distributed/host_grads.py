"""DDP with gradients summed on the host (the memory plan's GRAD_OFFLOAD): the all-reduce DDP's reducer
would run, done on the host sums instead.

GradOffload hooks every trainable parameter (the adapter's, or the backbone's for a full fine-tune) and
sums its gradients in fp32 host buffers, so DDP's reducer never sees a gradient: the trainer does not wrap
the model in DDP (`RankRun.prepare_model`), and the host sums are averaged over the ranks in fp32 buckets
over a gloo group (`collectives.all_reduce_mean`) when the optimizer first reads them in a step, before
clipping, unscaling and the update (`GradOffload.host_grads`). What DDP's constructor does besides, broadcasting
rank 0's trainable weights, is done once here too (`broadcast_trainable`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from kohakumoss_common.errors import ConfigError

from .collectives import BUCKET_BYTES, all_reduce_mean


class HostGradMean:
    """GradOffload's `reduce`: the host sums averaged over `group`'s ranks in place; a parameter counts as
    received where any rank received a gradient (the others contribute zeros), so every rank steps it."""

    def __init__(self, group: dist.ProcessGroup | None, bucket_bytes: int = BUCKET_BYTES):
        self.group, self.bucket_bytes = group, bucket_bytes

    def __call__(self, sums: list[torch.Tensor], received: list[bool]) -> list[bool]:
        flags = torch.tensor([float(r) for r in received], dtype=torch.float32)
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        all_reduce_mean(sums, self.group, self.bucket_bytes)
        work.wait()
        return [bool(f) for f in flags.tolist()]


def uncovered(trainable: list[nn.Parameter], offload) -> list[nn.Parameter]:
    """The trainable parameters whose gradients the GradOffload `offload` does not sum (none expected:
    the memory plan hooks every parameter of the optimizer)."""
    hooked = {id(p) for p in offload.params}
    return [p for p in trainable if id(p) not in hooked]


def attach(optimizer, trainable: list[nn.Parameter], group: dist.ProcessGroup | None) -> HostGradMean:
    """Average `optimizer`'s host-summed gradients (a PlacedOptimizer with a GradOffload) over the ranks."""
    offload = optimizer.grad_offload
    if missing := uncovered(trainable, offload):
        raise ConfigError(
            "GRAD_OFFLOAD",
            f"{len(missing)} trainable parameter(s) are not summed on the host and DDP does not wrap "
            "them under GRAD_OFFLOAD; their gradients would not be averaged over the ranks",
        )
    offload.reduce = HostGradMean(group)
    return offload.reduce


@torch.no_grad()
def broadcast_trainable(optimizer, group: dist.ProcessGroup | None) -> None:
    """Every rank starts from rank 0's trainable weights, as DDP's constructor makes it: the fp32 host
    masters over the host `group`, the resident parameters (on the rank's device) over the default group;
    a parameter the optimizer writes back through the weight streamer (a streamed block's, held in its
    host copy) takes rank 0's master through that write-back."""
    masters = optimizer.master_params()
    for m in masters:
        dist.broadcast(m, src=0, group=group)
    write_back = optimizer.write_back
    owns = getattr(write_back, "owns", lambda p: True) if write_back is not None else (lambda p: False)
    for p, m in zip(optimizer.params(), masters, strict=True):
        if owns(p):
            write_back(p, m)
        else:
            dist.broadcast(p.data, src=0)
