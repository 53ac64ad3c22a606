"""The optimizer step, one implementation: the trainer runs it and scripts/bench/train_step.py measures it.

A step is GRAD_ACCUM micro-steps (inputs, memory engines, forward, loss, backward: eager or replayed from a
CUDA graph), then gradient clipping, the optimizer and zeroing. Nothing here reads a device value on the
host: with fused AdamW a non-finite step is skipped on the device (`finite.py`) and the caller reads the
loss after the launches; the next step's first inputs are prepared before that read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from kohakumoss.diffusion import TimestepConfig
from kohakumoss.precision import placed_scaled_step
from kohakumoss_common.log import get_logger
from kohakumoss_kernels.backends.triton_utils import counting_compiles

from .finite import arm_skip, skips_on_device
from .graphs import StepGraphs, batch_signature
from .lengths import LengthSwitch
from .step import DeviceBatch, draw_step_noise

log = get_logger("kohakumoss.train.runner")

LossFn = Callable[[DeviceBatch, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class StepInputs:
    micro_step: int
    batch: DeviceBatch
    sigma: torch.Tensor
    noise: torch.Tensor


@dataclass
class StepResult:
    losses: list = field(default_factory=list)  # per micro-step: device scalars (device skip) or floats
    ok: torch.Tensor | None = None  # device bool: every loss and the gradient norm finite (device-side skip)
    finite: bool = True  # False: a micro-step's loss was read non-finite on the host; no update queued
    grad_norm: torch.Tensor | None = None
    samples: int = 0
    tokens: int = 0  # every token of the micro-steps' sequences (DeviceBatch.tokens)
    reference_tokens: int = 0  # of them, the reference images' (edit training)

    def applied(self) -> bool:
        """Host read (after the launches): was the update applied?"""
        return self.finite and (self.ok is None or bool(self.ok))

    def loss(self) -> float:
        values = [float(v) for v in self.losses]
        return sum(values) / len(values)


class StepRunner:
    """`run(step)` launches one optimizer step and returns its (unread) result.

    next_batch() -> DeviceBatch gives the micro-steps' batches in order (a `Prefetcher`, or the
    benchmark's encoders); sigma and noise come from (seed, micro-step) alone (`step.draw_step_noise`).

    `lengths` (an eager step over padded batches): attention reads the lengths on the host until they
    vary, then on the device (`lengths.py`); the micro-step that switches is a tuning window again.

    `loss_fn.hooks` (a DDP rank's share, distributed/rank_run.py RankRun.step_fn) is told whether the
    micro-steps are graphed, and runs what a graph may not hold, eagerly: `before_micro(micro_step, batch,
    sigma, noise)` gives the sigma and noise to use, `after_micro(loss)` the loss to keep,
    `after_backward()` runs after the step's last micro-step, before clipping and the update (the ranks'
    gradient average).
    """

    def __init__(
        self,
        optimizer,
        loss_fn: LossFn,
        next_batch: Callable[[], DeviceBatch],
        *,
        device: torch.device,
        seed: int,
        accum: int = 1,
        timesteps: TimestepConfig | None = None,
        grad_clip: float = 0.0,
        graphs: StepGraphs | None = None,
        engines=None,
        scaler: torch.amp.GradScaler | None = None,
        tuning: Callable[[], object] | None = None,
        step_hook: Callable[[torch.Tensor], None] | None = None,
        lengths: LengthSwitch | None = None,
    ):
        self.optimizer, self.loss_fn, self.next_batch = optimizer, loss_fn, next_batch
        self.device, self.seed, self.accum = device, int(seed), int(accum)
        self.timesteps = timesteps or TimestepConfig()
        self.clip = float(grad_clip) or math.inf
        self.graphs, self.engines, self.scaler = graphs, engines, scaler
        self.tuning = tuning  # the kernel registry's window, opened around the run's first micro-step
        self.step_hook = step_hook  # the adapter's per-step state from the sigmas (Algo.step_hook)
        self.lengths = None if graphs is not None else lengths  # graphs keep their own
        self.on_device = scaler is None and skips_on_device(optimizer, device)
        self.ready: StepInputs | None = None
        self.started = False
        self.hooks = getattr(loss_fn, "hooks", None)
        if self.hooks is not None:
            self.hooks.graphed(graphs is not None)

    def inputs(self, micro_step: int) -> StepInputs:
        if self.ready is not None and self.ready.micro_step == micro_step:
            ready, self.ready = self.ready, None
            return ready
        self.ready = None
        batch = self.next_batch()
        sigma, noise = draw_step_noise(self.seed, micro_step, batch.x0, batch.seq, self.timesteps)
        return StepInputs(micro_step, batch, sigma, noise)

    def micro(self, inputs: StepInputs, res: StepResult) -> bool:
        """One micro-step's forward and backward, its loss added to `res`; False if it was read non-finite."""
        if self.engines is not None:
            self.engines.before_step()
        if self.step_hook is not None:
            self.step_hook(inputs.sigma)
        # the run's first micro-step is the kernel registry's prewarm: every op's missing shape keys
        # are timed once and the winners kept in the card's tuning table
        first = not self.started
        watch = self.lengths is not None and not self.lengths.switched
        switched = watch and self.lengths.observe(
            batch_signature(inputs.batch, inputs.sigma, inputs.noise),
            batch_signature(inputs.batch, inputs.sigma, inputs.noise, exact=True),
        )  # then the device-length backends' shape keys are timed in this micro-step
        window = self.tuning() if self.tuning is not None and (first or switched) else nullcontext()
        compiles = counting_compiles() if first else nullcontext()
        self.started, began = True, time.perf_counter()
        sigma, noise, hooks = inputs.sigma, inputs.noise, self.hooks
        if hooks is not None:
            sigma, noise = hooks.before_micro(inputs.micro_step, inputs.batch, sigma, noise)
        with window, compiles as compiled:
            if self.graphs is not None:  # forward and backward replayed from a CUDA graph
                loss = self.graphs.run(inputs.batch, sigma, noise)
            else:
                loss = self.loss_fn(inputs.batch, sigma, noise)
            if hooks is not None:
                loss = hooks.after_micro(loss)
            if self.on_device:  # read after the update is queued (finite.py)
                ok = torch.isfinite(loss)
                res.ok = ok if res.ok is None else res.ok & ok
                res.losses.append(loss.detach())
            else:
                value = loss.item()
                res.losses.append(value)
                if not math.isfinite(value):
                    res.finite = False
                    return False
            if self.graphs is None and not getattr(self.loss_fn, "runs_backward", False):
                scaled = loss / self.accum  # (a pipeline's loss_fn ran the backward itself)
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        if first and compiled is not None and compiled.kernels:
            log.info(
                f"first micro-step: Triton compiled {compiled.kernels} kernels in {compiled.seconds:.0f} s of its "
                f"{time.perf_counter() - began:.0f} s (Triton's cache keeps them: later runs here load them)"
            )
        res.samples += inputs.batch.num_samples
        res.tokens += inputs.batch.tokens
        res.reference_tokens += inputs.batch.reference_tokens
        return True

    def run(self, step: int) -> StepResult:
        res = StepResult()
        for m in range(self.accum):
            if not self.micro(self.inputs(step * self.accum + m), res):
                break
        if res.finite:
            if self.hooks is not None:
                self.hooks.after_backward()
            self.update(res)
        self.optimizer.zero_grad(set_to_none=self.graphs is None)  # graphs keep their .grad buffers
        return res

    def update(self, res: StepResult) -> None:
        opt, scaler = self.optimizer, self.scaler
        if scaler and getattr(opt, "placement", "gpu") != "gpu":  # fp16, masters off the GPU
            res.grad_norm = placed_scaled_step(opt, scaler, self.clip)
            return
        if scaler:
            for member in opt.optimizers.values():
                scaler.unscale_(member)
        res.grad_norm = opt.clip_grad_norm_(self.clip)  # a device tensor: read when logged
        if scaler:
            for member in opt.optimizers.values():
                scaler.step(member)
            scaler.update()
            return
        if self.on_device:  # a finite loss whose gradients are not (inf * 0 in the clip) is skipped too
            res.ok = res.ok & torch.isfinite(res.grad_norm)  # a 0-d host norm (no grads) acts as a scalar
            arm_skip(opt, res.ok)
        opt.step()

    def prepare_next(self, step: int) -> None:
        """The next step's first inputs, queued while the GPU finishes this step (before its host read)."""
        if self.on_device:
            self.ready = self.inputs((step + 1) * self.accum)

    def skip_rest(self, res: StepResult) -> None:
        """A step stopped on the host: take the batches of its micro-steps that did not run."""
        for _ in range(self.accum - len(res.losses)):
            self.next_batch()
