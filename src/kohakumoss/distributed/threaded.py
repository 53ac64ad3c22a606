"""The threaded pipeline: one process, the backbone's stages on several devices, a thread per stage.

Each trainer micro-step is cut into PIPELINE_CHUNKS micro-batches of whole samples (pipeline.py's
`cut_chunks`). Stage s runs in its own thread: it takes micro-batch i's activations from its queue,
moves them onto its device (`Tensor.to`, recorded by autograd), runs its blocks and puts the result in
the next stage's queue, so stage s works on micro-batch i while stage s + 1 works on i - 1 (GPipe's
forward order). The last stage's weighted losses are then summed and one backward runs through every
stage and device (autograd's own per-device threads). The parameters stay in this process: the
optimizer, the gradient clipping, checkpoints and exports are a one-process run's. The sampler and the
validation loss call the backbone's own forward across the stages' devices (`spread_forward`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from .pipeline import (
    LAST_MODULES,
    Prediction,
    StageModule,
    StepChunks,
    cut_chunks,
    place_stages,
    stage_of_block,
)

_FAILED = object()  # put in the next queue by a stage whose thread raised


class ThreadedEngine:
    """Stages [starts[s], starts[s + 1]) on `devices[s]`, run by one thread each."""

    def __init__(
        self,
        backbone: nn.Module,
        network: nn.Module | None,
        starts: Sequence[int],
        devices: Sequence[str | torch.device],
        chunks: int,
        dtype: torch.dtype,
        loss: Callable,
        prediction: Prediction,
        accum: int,
        reduction: str,
    ):
        self.devices = [torch.device(d) for d in devices]
        self.chunks, self.accum, self.reduction = int(chunks), int(accum), reduction
        self.state = StepChunks()
        place_stages(backbone, network, starts, self.devices)
        self.modules = [
            StageModule(backbone, s, starts, self.state, loss, prediction, dtype, None, dev)
            for s, dev in enumerate(self.devices)
        ]

    def run(self, batch, sigma: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """One micro-step's forward (pipelined over the stage threads) and backward; its loss."""
        self.state.chunks = cut_chunks(batch, sigma, noise, self.chunks, self.accum, self.reduction)
        self.state.losses = []
        stages = len(self.modules)
        queues: list[queue.Queue] = [queue.Queue() for _ in range(stages + 1)]
        errors: list[BaseException] = []

        def work(s: int) -> None:
            module, device = self.modules[s], self.devices[s]
            for i in range(self.chunks):
                item = queues[s].get()
                if item is _FAILED:
                    queues[s + 1].put(_FAILED)
                    return
                try:
                    acts = tuple(t.to(device) for t in item)
                    queues[s + 1].put(module(*acts, chunk=torch.tensor([i])))
                except BaseException as e:  # the main thread re-raises it
                    errors.append(e)
                    queues[s + 1].put(_FAILED)
                    return

        threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in range(stages)]
        for t in threads:
            t.start()
        try:
            for _ in range(self.chunks):
                queues[0].put(())
            losses = []
            for _ in range(self.chunks):
                out = queues[stages].get()
                if out is _FAILED:
                    break
                losses.append(out.reshape(()))
            for t in threads:
                t.join()
        finally:
            self.state.chunks = []
        if errors:
            raise errors[0]
        torch.stack(losses).sum().backward()  # through every stage, across the devices
        return torch.stack(self.state.losses).sum().to(batch.x0.device)


def head_modules(backbone: nn.Module, network: nn.Module | None) -> list[nn.Module]:
    """The last stage's modules outside its blocks (the final norm and the output linear: small), and
    the adapter modules wrapping them."""
    heads = [getattr(backbone, name) for name in LAST_MODULES]
    out = list(heads)
    if network is not None:
        owners = {id(m) for h in heads for m in h.modules()}
        out += [m for m in network.modules() if id(_wrapped(m)) in owners]
    return out


def _wrapped(module: nn.Module):
    wrapped = getattr(module, "org_module", None)
    return wrapped[0] if isinstance(wrapped, (list, tuple)) and wrapped else wrapped


@contextmanager
def spread_forward(
    backbone: nn.Module, network: nn.Module | None, starts: Sequence[int], devices: Sequence
) -> Iterator[None]:
    """Inside: the backbone's own forward (the sampler's, the validation loss's) runs over the stages'
    devices. The backbone's block runner is wrapped from outside: each block is called on its stage's
    device (its inputs moved there, the layout and rotary tables moved once per forward) and its output
    comes back to the device its input came from, so the backbone's forward, skip-layer guidance
    included, sees every tensor on the first stage's device; the head's small modules sit there
    meanwhile. Everything is put back on exit."""
    devices = [torch.device(d) for d in devices]
    where = {id(b): devices[stage_of_block(i, starts)] for i, b in enumerate(backbone.layers)}
    runner, ops = backbone.block_runner, backbone.ops
    moved: dict[tuple[int, str], tuple] = {}  # (id, device) -> (the object, its copy); one forward's

    def on(obj, device):
        key = (id(obj), str(device))
        if key not in moved or moved[key][0] is not obj:
            moved[key] = (obj, obj.to(device))
        return moved[key][1]

    def call(block, x, mod, seq, rope):
        device, home = where[id(block)], x.device
        x, mod, seq = x.to(device), on(mod, device), on(seq, device)
        rope = (on(rope[0], device), on(rope[1], device))
        out = runner(block, x, mod, seq, rope) if runner is not None else block(x, mod, seq, rope, ops)
        return out.to(home)

    heads = head_modules(backbone, network)
    back = [next(m.parameters()).device for m in heads]
    hook = backbone.register_forward_pre_hook(lambda *_: moved.clear())
    backbone.block_runner = call
    try:
        for m in heads:
            m.to(devices[0])
        yield
    finally:
        hook.remove()
        backbone.block_runner = runner
        moved.clear()
        for m, device in zip(heads, back):
            m.to(device)
