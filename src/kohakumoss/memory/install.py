"""Install a MemoryPlan on a backbone: place its weights, set its block runner, place the optimizer.

    engines = install_memory_plan(plan, model, device, compute_dtype, full_ft)
    optimizer = engines.place_optimizer(combined)   # after the trainable parameters exist
    engines.before_step() ... forward / backward ... optimizer.step()

The model may arrive on the CPU (how a small card loads a 5B model): resident parameters move to the
device, streamed blocks to pinned host memory, and nothing is ever whole on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kohakumoss_common.errors import ConfigError
from kohakumoss_common.log import get_logger
from kohakumoss_kernels.weights.fp8 import castable

from .engines.activation_offload import ActivationOffload
from .engines.block_runner import BlockRunner
from .engines.checkpointing import CheckpointPolicy
from .engines.streaming import WeightStreamer
from .plan import MemoryPlan

log = get_logger(__name__)


@dataclass
class MemoryEngines:
    plan: MemoryPlan
    device: torch.device
    full_ft: bool
    runner: BlockRunner | None
    streamer: WeightStreamer | None
    offload: ActivationOffload | None
    model: Any = None
    grad_offload: Any = None
    optimizer: Any = None

    def place_optimizer(self, combined):
        """Wrap the run's CombinedOptimizer per the plan (states on the GPU, streamed or on the host)."""
        from .engines.grad_offload import GradOffload
        from .engines.optimizer import PlacedOptimizer

        params = [p for p in combined.params() if p.requires_grad]
        if self.offload is not None:  # trainable weights are read in backward: never offload them
            self.offload.keep_tensors(params)
        if self.plan.grad_offload:
            self.grad_offload = GradOffload(params)
        write_back = None
        if self.streamer is not None and self.full_ft:
            write_back = self.streamer.write_back_fn()
        self.optimizer = PlacedOptimizer(
            combined,
            self.plan.optimizer,
            grad_offload=self.grad_offload,
            write_back=write_back,
            chunk_params=_block_chunks(self.model, params) if self.model is not None else None,
        )
        return self.optimizer

    def before_step(self) -> None:
        if self.offload is not None:
            self.offload.new_step()

    def describe(self) -> str:
        return self.plan.label()


def _move_resident(model: nn.Module, device: torch.device, streamed_ids: set[int], dtype) -> None:
    for module in model.modules():
        for p in list(module.parameters(recurse=False)):
            if id(p) in streamed_ids:
                continue
            target = dtype if (dtype is not None and castable(p)) else p.dtype
            if p.device != device or p.dtype != target:
                p.data = p.data.to(device=device, dtype=target)
        for name, b in list(module.named_buffers(recurse=False)):
            if b is not None and b.device != device:
                module._buffers[name] = b.to(device)


def install_memory_plan(
    plan: MemoryPlan,
    model,
    device: torch.device,
    compute_dtype: torch.dtype | None = None,
    full_ft: bool = False,
) -> MemoryEngines:
    """Place `model` (a MossBackbone, anywhere) per `plan` and set its block runner."""
    device = torch.device(device)
    depth = len(model.layers)
    n_stream = plan.streamed_count(depth)
    if refusal := plan.refusal(full_ft, depth):
        raise ConfigError(*refusal)
    # full fine-tune with host masters: the device copy is in the compute dtype
    store = compute_dtype if (full_ft and plan.masters_on_host()) else None
    streamer = None
    if n_stream:
        streamer = WeightStreamer(
            model.layers,
            range(n_stream),
            plan.slots(depth),
            device,
            dtype=store if full_ft else None,
            trainable=full_ft,
        )
    streamed_ids = {id(p) for lay in (streamer.layouts.values() if streamer else []) for p in lay.params}
    _move_resident(model, device, streamed_ids, store)
    offload = None
    if plan.activation_offload != "none":
        offload = ActivationOffload(device)
        offload.keep_tensors(p for p in model.parameters() if id(p) not in streamed_ids)
        if streamer is not None:
            offload.keep_storages(streamer.storages())
    policy = CheckpointPolicy(plan.checkpointing, int(plan.checkpoint_every))
    runner = None
    if policy.mode != "none" or streamer is not None or offload is not None:
        runner = BlockRunner(model, policy, streamer, offload)
    model.block_runner = runner
    engines = MemoryEngines(plan, device, full_ft, runner, streamer, offload, model)
    log.info(f"memory plan: {plan.label()}")
    return engines


CHUNK_BYTES = 64 << 20  # parameters outside the blocks (adapters) are stepped in chunks this size


def _block_chunks(model, params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """Trainable parameters grouped by the block that owns them; the rest in ~CHUNK_BYTES chunks."""
    owner = {id(p): i for i, b in enumerate(model.layers) for p in b.parameters()}
    by_block: dict[int, list[nn.Parameter]] = {}
    loose: list[list[nn.Parameter]] = [[]]
    size = 0
    for p in params:
        if id(p) in owner:
            by_block.setdefault(owner[id(p)], []).append(p)
            continue
        if loose[-1] and size + p.numel() * 4 > CHUNK_BYTES:
            loose.append([])
            size = 0
        loose[-1].append(p)
        size += p.numel() * 4
    return [by_block[k] for k in sorted(by_block)] + [c for c in loose if c]
