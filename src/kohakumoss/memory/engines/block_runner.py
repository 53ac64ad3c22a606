"""How each block is called under a memory plan: the one `MossBackbone.block_runner` that composes
weight streaming, activation checkpointing and activation offload.

Every block gets the shared block modulation [6, B, d] as its `mod` (computed once per forward; it
requires grad only in a full fine-tune, where its gradient sums over the blocks' backwards).
Two autograd barriers frame a streamed or offloaded block. `_Join` on its inputs (x, the shared
modulation) makes every backward node of the block finish before the gradient leaves it, so a slot or a
host buffer is reused only after its last reader. `_BackwardStart` on its output runs first in the
block's backward: it loads the block's weights, prefetches the blocks below and their activations.
A fully checkpointed block with offload runs as one `_OffloadedCheckpoint` node: forward without
saving, its input sent to the host, recomputed in backward (RNG and autocast state replayed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import nullcontext

import torch

from .activation_offload import ActivationOffload
from .checkpointing import CheckpointPolicy, run_block
from .streaming import WeightStreamer


class _Join(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, mod: torch.Tensor):
        return x.view_as(x), mod.view_as(mod)

    @staticmethod
    def backward(ctx, gx, gm):
        return gx, gm


class _BackwardStart(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hook: Callable[[], None], x: torch.Tensor):
        ctx.hook = hook
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.hook()
        return None, g


class _OffloadedCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, offload: ActivationOffload, index: int, x, mod, _grad_anchor):
        device = x.device
        ctx.run, ctx.device = run, device
        ctx.autocast = (torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type))
        ctx.cpu_rng = torch.get_rng_state()
        ctx.dev_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        ctx.needs = (x.requires_grad, mod.requires_grad)
        with torch.no_grad():
            out = run(x, mod)
        ctx.offload, ctx.x = offload, offload.stash(x.detach(), index)
        ctx.mod = mod.detach()
        return out

    @staticmethod
    def backward(ctx, g):
        x = ctx.offload.fetch(ctx.x).detach().requires_grad_(ctx.needs[0])
        m = ctx.mod.requires_grad_(ctx.needs[1])
        device = ctx.device
        devices = [device] if device.type == "cuda" else []
        enabled, dtype = ctx.autocast
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
            torch.set_rng_state(ctx.cpu_rng)
            if ctx.dev_rng is not None:
                torch.cuda.set_rng_state(ctx.dev_rng, device)
            with torch.enable_grad(), torch.autocast(device.type, dtype=dtype, enabled=enabled):
                out = ctx.run(x, m)
        torch.autograd.backward(out, g)
        return None, None, None, x.grad if ctx.needs[0] else None, m.grad if ctx.needs[1] else None, None


class BlockRunner:
    """Calls block i of `model` as the plan says (see the module docstring)."""

    def __init__(
        self,
        model,
        policy: CheckpointPolicy,
        streamer: WeightStreamer | None = None,
        offload: ActivationOffload | None = None,
    ):
        self.ops = model.ops
        self.policy = policy
        self.streamer = streamer
        self.offload = offload
        self.index = {id(b): i for i, b in enumerate(model.layers)}
        self._anchor = torch.empty(0, requires_grad=True)  # makes the checkpoint node need a backward

    def recompute_rng(self, needed: bool) -> None:
        """Whether a recomputed block restores the RNG state: only a forward that draws random numbers
        (adapter dropout) needs it, and reading that state from the host keeps the step out of a CUDA graph."""
        self.policy = dataclasses.replace(self.policy, preserve_rng=needed)

    def _backward_start(self, i: int) -> None:
        st = self.streamer
        if st is not None and st.is_streamed(i):
            st.ensure(i)
            st.prefetch(i, -1)
        if self.offload is not None:
            self.offload.prefetch(i)
            self.offload.prefetch(i - 1)

    def _run(self, block, i: int, x, mod, seq, rope):
        mode = self.policy.mode if self.policy.applies_to(i) else "none"
        if mode == "full" and self.offload is not None:
            ops = self.ops
            return _OffloadedCheckpoint.apply(
                lambda a, m: block(a, m, seq, rope, ops), self.offload, i, x, mod, self._anchor
            )
        return run_block(block, mode, x, mod, seq, rope, self.ops, self.policy.preserve_rng)

    def __call__(self, block, x: torch.Tensor, mod: torch.Tensor, seq, rope) -> torch.Tensor:
        i = self.index[id(block)]
        grad = torch.is_grad_enabled()
        st = self.streamer if self.streamer is not None and self.streamer.is_streamed(i) else None
        if st is not None:
            st.ensure(i)
            st.prefetch(i, +1)
        framed = grad and (st is not None or self.offload is not None)
        if framed:
            x, mod = _Join.apply(x, mod)
        if grad and self.offload is not None:
            shared = (mod, *rope, *(v for v in vars(seq).values() if isinstance(v, torch.Tensor)))
            context = self.offload.block(i, shared)
        else:
            context = nullcontext()
        with context:
            out = self._run(block, i, x, mod, seq, rope)
        if framed:
            out = _BackwardStart.apply(lambda: self._backward_start(i), out)
        return out


def install_checkpointing(model, policy: CheckpointPolicy) -> BlockRunner | None:
    """Checkpointing alone (no streaming or offload): set the backbone's block runner; None for 'none'."""
    model.block_runner = BlockRunner(model, policy) if policy.mode != "none" else None
    return model.block_runner
