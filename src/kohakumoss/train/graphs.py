"""CUDA graphs of the training micro-step: forward, loss and backward captured per batch shape, replayed.

An eager step of a 5B DiT costs the host (Python, the autograd engine, hundreds of kernel launches per
block) about as long as the GPU's own work, so the GPU waits. A graph replays the recorded kernels with
one launch. A batch shape is captured the second time it is seen (the first run stays eager: it is
the kernel registry's tuning window); that micro-step runs eagerly on a side stream first (the warm-up
a capture needs), so no micro-step is lost or repeated. Every graph accumulates into one shared set of
gradient buffers, which become the parameters' `.grad` before each replay; ops that can (the LoRA
linears) add their weight gradients into those buffers from their GEMMs (kohakumoss_kernels.runtime.grad_sink).

Captions differ in length from batch to batch; the trainer pads each batch's text tokens to a multiple
of TEXT_PAD (a pad segment, `PackedSeq.build(pad_to=...)`), so batches of the same image sizes share
tensor shapes and one graph: a graph is keyed by shapes and length bounds alone, and each replay copies
the batch's sequence tensors (cu_seqlens, indices, positions) into the graph's. That holds while every
captured kernel reads the lengths on the device. The fastest attention on the H200 reads them on the
host, so graphs start keyed by the exact lengths too, and switch to device-length backends when the
lengths keep varying (`lengths.LengthSwitch`): fixed-length captions keep the faster attention, varied
ones get graphs that replay. A capture during which an op still read lengths on the host
(`kohakumoss_kernels.runtime.host_values`) keys the graphs by the exact lengths again.

Only the plain memory plan is graphed (streaming, offload and host optimizers move bytes from Python),
and only adapters whose forward is a function of tensors alone (T-LoRA, DyLoRA and module dropout
decide in Python per step). `graph_refusal` says which knob stops it (the memory plan's part: `MemoryPlan.graph_refusal`).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kohakumoss.adapters.algos import adapter_algo
from kohakumoss.adapters.spec import AdapterSpec
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.log import get_logger
from kohakumoss_kernels.runtime import grad_sink, host_values
from kohakumoss_kernels.runtime.capture import capture

from .lengths import LengthSwitch
from .step import DeviceBatch

log = get_logger("kohakumoss.train.graphs")

MODES = ("auto", "on", "off")
TEXT_PAD = 128  # text tokens per batch rounded up to this: ~1.5% more tokens at 1 MP x 2, few graph shapes


def graph_refusal(
    plan: MemoryPlan,
    device: torch.device,
    algo: str = AdapterSpec.algo,
    module_dropout: float = AdapterSpec.module_dropout,
    dtype: torch.dtype = torch.bfloat16,
    draws_random: bool = False,
) -> str | None:
    """Why the step cannot be graphed (naming the knob), or None: the device, the memory plan's engines
    (`MemoryPlan.graph_refusal`, with `draws_random`: the adapter uses dropout), then the adapter and dtype."""
    if device.type != "cuda":
        return f"DEVICE: CUDA graphs need a CUDA device, not {device.type}"
    if problem := plan.graph_refusal(draws_random):
        return problem
    if (record := adapter_algo(algo)) is not None and record.python_state:  # Algo.python_state
        return f"ALGO: '{algo}' sets its rank from Python each step"
    if module_dropout:
        return "MODULE_DROPOUT: whole modules are dropped by a Python decision each step"
    if dtype == torch.float16:
        return "PRECISION: fp16 needs a loss scaler that skips steps from the host"
    return None


def resolve_graphs(mode: str, refusal: str | None) -> bool:
    """CUDA_GRAPHS: auto graphs where allowed; on refuses a run it cannot graph; off never."""
    if mode not in MODES:
        raise ConfigError("CUDA_GRAPHS", f"'{mode}' is not one of {MODES}")
    if mode == "on" and refusal is not None:
        raise ConfigError("CUDA_GRAPHS", f"'on' is not possible with this run: {refusal}")
    return mode != "off" and refusal is None


def batch_signature(
    batch: DeviceBatch, sigma: torch.Tensor, noise: torch.Tensor, exact: bool = False
) -> tuple:
    """Everything a captured graph depends on besides tensor values: shapes and the length bounds the
    kernels' grids are sized by; `exact` adds the lengths themselves (ops that read them on the host)."""
    seq = batch.seq
    tensors = (batch.x0, batch.text, sigma, noise, *_optional(batch), *seq.tensors())
    shapes = tuple((tuple(t.shape), t.dtype) for t in tensors)
    key = (
        shapes,
        seq.max_seqlen,
        seq.text_max_seqlen,
        str(batch.x0.device),
        batch.weight is not None,
        batch.refs is not None,
    )
    return (*key, seq.text_lens, seq.img_sizes, seq.ref_sizes) if exact else key


def _memory(device: torch.device) -> str:
    gib = 2**30
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    return f"{allocated / gib:.1f} GiB allocated, {reserved / gib:.1f} GiB reserved"


def _optional(batch: DeviceBatch) -> tuple[torch.Tensor, ...]:
    """The static inputs after x0, text, sigma and noise, those the batch has: the per-token loss weight
    (masks, reg weights), then the reference tokens (edit training)."""
    return tuple(t for t in (batch.weight, batch.refs) if t is not None)


def _static_batch(batch: DeviceBatch, inputs: tuple[torch.Tensor, ...]) -> DeviceBatch:
    """The batch the graph reads: `inputs` (x0, text, sigma, noise, then `_optional`) in place of its own."""
    rest = list(inputs[4:])
    weight = rest.pop(0) if batch.weight is not None else None
    refs = rest.pop(0) if batch.refs is not None else None
    return DeviceBatch(inputs[0], inputs[1], batch.seq, weight, refs)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[
        torch.Tensor, ...
    ]  # static x0, text, sigma, noise (, weight, refs): each replay copies into them
    loss: torch.Tensor
    batch: DeviceBatch  # holds the PackedSeq the graph read (its device tensors must stay alive)


class StepGraphs:
    """`run(batch, sigma, noise)` does one micro-step's forward and backward and returns its loss.

    loss_fn(batch, sigma, noise) -> loss; the backward uses loss * backward_scale (1 / GRAD_ACCUM).
    """

    def __init__(
        self,
        loss_fn: Callable[[DeviceBatch, torch.Tensor, torch.Tensor], torch.Tensor],
        params: Sequence[torch.Tensor],
        backward_scale: float = 1.0,
        max_graphs: int = 8,
        ops=None,
    ):
        self.loss_fn = loss_fn
        # with the model's OpSet: graphs start keyed by exact lengths (every attention backend may run,
        # the fastest reads lengths on the host); once batches keep differing in lengths alone, the ops
        # switch to backends that read them on the device and the graphs serve every length
        self.ops = ops
        self.params = [p for p in params if p.requires_grad]
        self.backward_scale = float(backward_scale)
        self.max_graphs = max_graphs
        self.graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self.seen: Counter = Counter()
        self.grads: list[torch.Tensor | None] | None = None  # the buffers every graph accumulates into
        self.pool = None
        self.failed: str | None = None
        self.capture_peak_bytes = 0  # the allocator's peak up to the last capture (replays allocate nothing)
        self.replays = 0
        self.captures = 0
        self.exact_lengths = ops is not None  # keyed by the lengths too (an op reads them on the host)
        self.lengths = None if ops is None else LengthSwitch(ops, "one CUDA graph serves every length")
        self.retime = False  # the next eager micro-step times the device-length backends
        self.side: torch.cuda.Stream | None = None  # the warm-ups' stream (one: its cached blocks are reused)

    def run(self, batch: DeviceBatch, sigma: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        key = batch_signature(batch, sigma, noise, self.exact_lengths)
        entry = self.graphs.get(key)
        if entry is not None:
            self.graphs.move_to_end(key)
            return self._replay(entry, batch, sigma, noise)
        if self.exact_lengths and self.lengths is not None:
            loose = batch_signature(batch, sigma, noise)
            if self.lengths.observe(loose, key):  # graphs now serve every length
                self.exact_lengths, self.retime = False, True
                self.graphs.clear()
                self.seen.clear()
                key = loose
        self.seen[key] += 1
        if self.failed is None and self._thrashing():
            self.failed = (
                f"{self.captures} captures for {self.replays} replays: more batch shapes than max_graphs"
            )
            log.warning(f"CUDA graphs off for the rest of the run ({self.failed})")
        if self.failed is not None or self.seen[key] < 2:
            return self._eager(batch, sigma, noise)
        return self._capture(key, batch, sigma, noise)

    def _thrashing(self) -> bool:
        """Shapes keep evicting each other: every capture costs a step's memory and a second of setup."""
        return self.captures >= 2 * self.max_graphs and self.replays < 4 * self.captures

    def _eager(self, batch: DeviceBatch, sigma: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        window = self.ops.tuning(device_time=True) if self.retime else contextlib.nullcontext()
        self.retime = False
        with window:  # after the switch: the device-length backends' shape keys are timed
            loss = self.loss_fn(batch, sigma, noise)
            (loss * self.backward_scale).backward()
        return loss.detach()

    def _use_shared_grads(self) -> None:
        """Point every parameter's .grad at the shared buffers, keeping what they hold now."""
        if self.grads is None:
            return
        zero = []
        for p, buf in zip(self.params, self.grads):
            if buf is None or p.grad is buf:
                continue
            if p.grad is None:
                zero.append(buf)
            else:
                buf.copy_(p.grad)
            p.grad = buf
        if zero:
            torch._foreach_zero_(zero)

    def _capture(self, key: tuple, batch: DeviceBatch, sigma, noise) -> torch.Tensor:
        device, t0 = batch.x0.device, time.perf_counter()
        self._use_shared_grads()
        torch.cuda.empty_cache()  # the eager steps' cached blocks, or they sit beside the graph's pool
        inputs = tuple(t.clone() for t in (batch.x0, batch.text, sigma, noise, *_optional(batch)))
        static_batch = _static_batch(batch, inputs)
        if self.side is None:
            self.side = torch.cuda.Stream(device)
        side = self.side
        side.wait_stream(torch.cuda.current_stream(device))
        # this micro-step, for real: also the warm-up the capture needs
        with torch.cuda.stream(side):
            loss = self._eager(static_batch, inputs[2], inputs[3])
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.empty_cache()  # the warm-up's activations, cached for the side stream: the graph needs them
        reads = host_values.reads()
        # parameters without a gradient after the same computation get none in the graph either
        before = [p.grad for p in self.params]
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        held = _memory(device)
        graph, failed = torch.cuda.CUDAGraph(), None
        try:
            with capture(graph, device, self.pool, side), grad_sink.into(self.params):
                static_loss = self.loss_fn(static_batch, inputs[2], inputs[3])
                (static_loss * self.backward_scale).backward()
        except Exception as e:  # an op that cannot be captured, or no memory for the graph
            failed = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if failed is not None:  # this run stays eager
            self.failed = failed
            del graph
            torch.cuda.empty_cache()  # the partial capture's blocks, so the eager steps have them
            log.warning(f"CUDA graph capture failed ({held} before it), the run continues eagerly ({failed})")
            for p, g in zip(self.params, before):
                p.grad = g
            return loss
        if any(p.grad is not g for p, g in zip(self.params, before)):
            self.failed = "the captured backward replaced a .grad tensor"
            log.warning(f"CUDA graphs off: {self.failed}")
            for p, g in zip(self.params, before):
                p.grad = g
            return loss
        if not self.exact_lengths and host_values.reads() != reads:
            self.exact_lengths = True  # graphs so far baked lengths in too: keep none of them
            self.graphs.clear()
            key = batch_signature(batch, sigma, noise, exact=True)
            log.info(
                "CUDA graphs keyed by exact sequence lengths: an op read them on the host during capture"
            )
        if self.grads is None:
            self.grads = before
        else:  # a parameter this shape trains for the first time: its buffer joins the shared set
            self.grads = [g if g is not None else b for g, b in zip(self.grads, before)]
        if len(self.graphs) >= self.max_graphs:
            self.graphs.popitem(last=False)  # least recently used shape
        self.graphs[key] = _Graph(graph, inputs, static_loss.detach(), static_batch)
        self.captures += 1
        self.capture_peak_bytes = max(self.capture_peak_bytes, torch.cuda.max_memory_allocated(device))
        log.info(
            f"CUDA graph captured for batch shape {len(self.graphs)} ({batch.tokens} tokens) "
            f"in {time.perf_counter() - t0:.1f} s ({held} before it)"
        )
        return loss

    def _replay(self, entry: _Graph, batch: DeviceBatch, sigma, noise) -> torch.Tensor:
        for dst, src in zip(
            entry.inputs, (batch.x0, batch.text, sigma, noise, *_optional(batch)), strict=True
        ):
            dst.copy_(src, non_blocking=True)
        if entry.batch.seq is not batch.seq:  # this batch's lengths, where the kernels read them
            for dst, src in zip(entry.batch.seq.tensors(), batch.seq.tensors()):
                dst.copy_(src, non_blocking=True)
        self._use_shared_grads()
        entry.graph.replay()
        self.replays += 1
        return entry.loss
