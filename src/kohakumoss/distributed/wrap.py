"""The trainable model wrapped from outside, as torchtitan does: the model knows nothing of ranks.

- `wrap_ddp`: torch's DistributedDataParallel around the backbone's forward, with the adapter network
  registered beside it so its parameters are the ones DDP reduces (LyCORIS reroutes the wrapped linears'
  forward, so the network's own modules are never called). Frozen weights are left out of DDP's
  broadcast and buckets; gradients are all-reduced in fp32 (a comm hook upcasts bf16/fp16 buckets).
- `wrap_fsdp`: FSDP2, `fully_shard` per block then the root, under a MixedPrecisionPolicy; adapter
  parameters (outside the backbone's tree) stay whole on every rank and `all_reduce_grads` averages them
  (the trainer wraps the adapter alone in DDP instead: the same average, overlapped with the backward).
- Graphed DDP steps: no DDP wrapper (its reducer all-reduces from autograd hooks, which a replayed CUDA
  graph never runs); `Bound` is the forward the loss calls until the trainer knows, `broadcast_params` does
  what DDP's constructor does, and `average_grads` averages the `.grad` buffers once after the backward.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from kohakumoss_common.errors import ConfigError

from .collectives import all_reduce_mean


class Forward(nn.Module):
    """The backbone's forward; `network` is registered only so its parameters belong to this module."""

    def __init__(self, backbone: nn.Module, network: nn.Module | None = None):
        super().__init__()
        self.backbone = backbone
        self.network = network

    def forward(self, *args, **kwargs):
        return self.backbone(*args, **kwargs)


def _fp32_allreduce_hook(group, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average a bucket in fp32 whatever the gradients' dtype, then hand it back in theirs."""
    buffer = bucket.buffer()
    wide = buffer.float() / dist.get_world_size(group)
    fut = dist.all_reduce(wide, group=group, async_op=True).get_future()
    return fut.then(lambda f: buffer.copy_(f.value()[0]))


def wrap_ddp(
    backbone: nn.Module,
    network: nn.Module | None = None,
    find_unused: bool = False,
    bucket_mb: float = 25.0,
) -> DistributedDataParallel:
    """DDP over the trainable parameters (the network's, or the backbone's for a full fine-tune).

    Call the returned module as the backbone; use `.no_sync()` on all but the last micro-step."""
    fwd = Forward(backbone, network)
    trainable = [n for n, p in fwd.named_parameters() if p.requires_grad]
    if not trainable:
        raise ConfigError("DISTRIBUTED", "DDP found no trainable parameter (no adapter and a frozen model)")
    ignored = [n for n, p in fwd.named_parameters() if not p.requires_grad]
    # buffers are equal on every rank by construction: ignored, DDP neither broadcasts nor syncs them
    ignored += [n for n, _ in fwd.named_buffers()]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(fwd, ignored)
    ddp = DistributedDataParallel(
        fwd,
        device_ids=None,  # inputs stay where the trainer put them (a PackedSeq holds host lists)
        find_unused_parameters=find_unused,
        bucket_cap_mb=bucket_mb,
        gradient_as_bucket_view=True,
    )
    if any(p.dtype != torch.float32 for p in fwd.parameters() if p.requires_grad):
        ddp.register_comm_hook(None, _fp32_allreduce_hook)
    return ddp


class Bound:
    """The forward the loss calls, bound later (`target`): DDP around the backbone, or the backbone itself
    when its gradients are averaged after the backward (the step runner says which, before any step)."""

    def __init__(self):
        self.target: nn.Module | None = None

    def __call__(self, *args, **kwargs):
        if self.target is None:
            raise RuntimeError("the DDP forward was called before the step runner bound it (RankRun.graphed)")
        return self.target(*args, **kwargs)


@torch.no_grad()
def broadcast_params(params: Sequence[torch.Tensor]) -> None:
    """Rank 0's values on every rank, as DDP's constructor makes them (over the default group)."""
    for p in params:
        dist.broadcast(p.data, src=0)


@torch.no_grad()
def average_grads(params: Sequence[torch.Tensor], group: dist.ProcessGroup | None = None) -> None:
    """DDP's average without its reducer: every parameter's `.grad` becomes its mean over the ranks, in
    place where it lies (NCCL on GPUs, gloo on CPUs; the buffers a CUDA graph accumulates into), summed in
    fp32 buckets (`collectives.all_reduce_mean`). Every trainable parameter must hold a gradient, as DDP
    without `find_unused_parameters` expects: every rank then reduces the same buffers."""
    grads = [p.grad for p in params]
    if (missing := sum(g is None for g in grads)) > 0:
        raise RuntimeError(
            f"{missing} trainable parameter(s) received no gradient; the ranks' gradients are averaged "
            "after the backward and need every one (as DDP without find_unused_parameters does)"
        )
    all_reduce_mean(grads, group)


def blocks(backbone: nn.Module) -> list[nn.Module]:
    """The units FSDP2 shards one by one: the backbone's transformer blocks."""
    layers = getattr(backbone, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError("DISTRIBUTED", f"{type(backbone).__name__} has no `layers` ModuleList to shard")
    return list(layers)


def wrap_fsdp(
    backbone: nn.Module, param_dtype: torch.dtype | None = None, reshard_after_forward: bool = True
) -> nn.Module:
    """FSDP2 in place: each block, then the root (embedders, modulations, head); gradients reduce in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in blocks(backbone):
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(backbone, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return backbone


def all_reduce_grads(params: Iterable[torch.Tensor], bucket_mb: float = 25.0) -> None:
    """Average the gradients of replicated parameters (adapters beside an FSDP2 base) in fp32 buckets."""
    grads = [p.grad for p in params if p.grad is not None]
    world = dist.get_world_size()
    limit = int(bucket_mb * 2**20 / 4)
    bucket: list[torch.Tensor] = []
    size = 0
    for g in [*grads, None]:
        if g is not None:
            bucket.append(g)
            size += g.numel()
        if bucket and (g is None or size >= limit):
            flat = torch.cat([b.reshape(-1).float() for b in bucket])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for b in bucket:
                b.copy_(flat[offset : offset + b.numel()].view_as(b))
                offset += b.numel()
            bucket, size = [], 0
