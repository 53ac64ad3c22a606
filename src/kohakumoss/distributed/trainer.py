"""What the trainer (train/loop.py) asks of a distributed run, as one object: a no-op in one process.

rr = RankRun(k)                                      # this rank (launch.current())
loader = make_loader(rr.local_data(data), ...)       # this rank's share of every micro-step
forward = rr.wrap(model, network, plan)              # DDP around the backbone's forward
step_loss = rr.loss_fn(step_loss, tcfg, draw_step_noise)   # the share's loss, noise, sync
next_batch = rr.next_batch(prefetch.next_batch, start_micro_step)
loss, samples, tokens = rr.step_totals(step, loss, samples, tokens)   # every rank's, summed
rr.is_main: rank 0 alone writes the run folder; rr.own(run_dir): where this rank's log goes
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kohakumoss_common.errors import ConfigError

from .collectives import barrier
from .knobs import devices_problem, mode_problem
from .launch import current, run
from .shard import rank_weight, shard_plan, step_noise
from .world import beat
from .wrap import wrap_ddp

# the engines the trainer drives; the package has FSDP2 (wrap.wrap_fsdp), the trainer not yet
TRAINER_MODES = ("none", "ddp")


def trainer_problem(k: dict[str, Any]) -> tuple[str, str] | None:
    """(knob, why) when the trainer cannot run these knobs distributed, else None."""
    mode = k.get("DISTRIBUTED", "none")
    if mode == "none":
        return None
    if mode not in TRAINER_MODES:
        return "DISTRIBUTED", f"'{mode}' is not driven by the trainer yet; use 'ddp' (or 'none')"
    if k.get("CUDA_GRAPHS") == "on":
        return (
            "CUDA_GRAPHS",
            "'on' with DISTRIBUTED: graphed steps are not captured with collectives yet; use 'auto'",
        )
    if k.get("ALGO") == "tlora":
        return (
            "ALGO",
            "'tlora' masks its ranks by the step runner's sigmas, which DISTRIBUTED redraws per rank",
        )
    if k.get("GRAD_OFFLOAD"):
        return (
            "GRAD_OFFLOAD",
            "gradients summed on the host are not all-reduced by DDP; leave it off with DISTRIBUTED",
        )
    return None


def refusals(k: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (knob, why) the distributed trainer refuses before work starts (kohakumoss-config check)."""
    mode, devices = k.get("DISTRIBUTED", "none"), k.get("DEVICES", 1)
    if problem := mode_problem(mode):
        return [("DISTRIBUTED", problem)]
    out = []
    if problem := devices_problem(devices, mode):
        out.append(("DEVICES", problem))
    if problem := trainer_problem(k):
        out.append(problem)
    return out


def rank_knobs(k: dict[str, Any]) -> dict[str, Any]:
    """The knobs a rank trains with: refused combinations raise; CUDA graphs stay off (see trainer_problem)."""
    if problem := trainer_problem(k):
        raise ConfigError(*problem)
    return k if k.get("DISTRIBUTED", "none") == "none" else {**k, "CUDA_GRAPHS": "off"}


def on_devices(train: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    """The train script's entry: train(k) in this process, or on every rank DISTRIBUTED and DEVICES ask for
    (`train` is passed in: this package imports nothing of kohakumoss.train)."""

    def entry(k: dict[str, Any]) -> Any:
        return run(rank_knobs(k), train)

    return entry


class RankRun:
    """This process's part of the run. Wraps the trainer's pieces so the step runner needs no change:
    the batches it takes (`next_batch`: which micro-step each one is) and the loss it calls (`loss_fn`:
    the whole step's noise, the rank's weight, DDP's gradient sync on the last micro-step only, and a
    non-finite loss on any rank seen by every rank, so all skip the step together)."""

    def __init__(self, k: dict[str, Any]):
        self.world = current()
        self.seed = int(k["SEED"])
        self.accum = int(k.get("GRAD_ACCUM", 1))
        self.reduction = k["LOSS_REDUCTION"]
        self.find_unused = (
            float(k.get("MODULE_DROPOUT", 0.0)) > 0
        )  # a dropped module leaves its params unused
        self.plan = None
        self.picks: list[list[int]] = []
        self.ddp = None
        self.micro: dict[int, int] = {}  # id(batch) -> its micro-step
        self.taken = 0

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    @property
    def active(self) -> bool:
        return self.world.size > 1

    def own(self, run_dir: Path) -> Path:
        """Where this rank writes its log and metrics: the run folder (rank 0) or run_dir/ranks/<rank>."""
        folder = run_dir if self.is_main else run_dir / "ranks" / str(self.world.rank)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def local_data(self, data):
        """RunData whose plan holds this rank's images of every micro-step (the global plan is kept here)."""
        self.plan = data.plan
        if not self.active:
            return data
        local, self.picks = shard_plan(data.plan, self.world.rank, self.world.size)
        return dataclasses.replace(data, plan=local)

    def next_batch(self, take: Callable[[], Any], start: int) -> Callable[[], Any]:
        """`take` (the prefetcher's next_batch), each batch remembered with its micro-step."""
        if not self.active:
            return take
        self.taken = start

        def next_batch():
            batch = take()
            self.micro = {i: m for i, m in self.micro.items() if m >= self.taken - 4}  # the last few
            self.micro[id(batch)] = self.taken
            self.taken += 1
            return batch

        return next_batch

    def wrap(self, model: torch.nn.Module, network: torch.nn.Module | None, plan=None) -> torch.nn.Module:
        """What the loss calls: the backbone itself, or DDP around it (after resume: DDP broadcasts rank 0's).
        `plan`: the resolved memory plan; one that sums gradients on the host is refused (DDP never sees them)."""
        if not self.active:
            return model
        if plan is not None and getattr(plan, "grad_offload", False):
            raise ConfigError(
                "GRAD_OFFLOAD",
                "the memory plan sums gradients on the host, where DDP does not all-reduce them; "
                "set GRAD_OFFLOAD=False (or another MEMORY_PROFILE) with DISTRIBUTED",
            )
        self.ddp = wrap_ddp(model, network, find_unused=self.find_unused)
        return self.ddp

    def loss_fn(self, loss: Callable, tcfg, draw: Callable) -> Callable:
        """loss(batch, sigma, noise) as this rank's share of the whole micro-step (see the class); `draw`
        is the trainer's noise function (train/step.py draw_step_noise), run on the whole step."""
        if not self.active:
            return loss

        def share(batch, sigma, noise):
            m = self.micro[id(batch)]
            sigma, noise = step_noise(
                draw,
                self.seed,
                m,
                self.plan.steps[m],
                self.picks[m],
                tcfg,
                batch.x0.device,
                noise.dtype,
                batch.x0.shape[-1],
            )
            sync = (
                nullcontext() if self.ddp is None or m % self.accum == self.accum - 1 else self.ddp.no_sync()
            )
            with sync:  # DDP decides at the forward whether the backward all-reduces
                value = loss(batch, sigma, noise) * self.weight(m)
            finite = torch.isfinite(value.detach()).to(torch.float32).reshape(1)
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # queued on the device: no host read
            return torch.where(finite.reshape(()) > 0, value, torch.full_like(value, math.nan))

        return share

    def weight(self, micro_step: int) -> float:
        if not self.active:
            return 1.0
        return rank_weight(
            self.plan.steps[micro_step], self.picks[micro_step], self.world.size, self.reduction
        )

    def step_totals(self, step: int, loss: float, samples: int, tokens: int) -> tuple[float, int, int]:
        """Step `step` done: its loss (mean over ranks of their weighted losses), samples and tokens of all
        ranks; the step is recorded in the store, where a fault message reads each rank's last step."""
        if not self.active:
            return loss, samples, tokens
        beat(self.world, step)
        t = torch.tensor([loss, samples, tokens], dtype=torch.float64)
        if self.world.backend == "nccl":
            t = t.to(self.world.device)
        dist.all_reduce(t)
        loss_sum, samples_sum, tokens_sum = (float(v) for v in t.cpu())
        return loss_sum / self.world.size, int(samples_sum), int(tokens_sum)

    def barrier(self) -> None:
        barrier(self.world)
