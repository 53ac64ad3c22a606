"""What the trainer (train/loop.py) asks of a distributed run, as one object: a no-op in one process.

rr = RankRun(k)                      # this rank; refuses what the trainer cannot run distributed
loader = make_loader(rr.local_data(data), ...)   # this rank's share of every micro-step
sigma, noise = rr.noise(...)         # the whole step's draws, cut to this rank's images
forward = rr.wrap(model, network)    # DDP around the backbone's forward
with rr.sync(micro, accum): (loss * rr.weight(micro_step) / accum).backward()
rr.all_finite(loss), rr.step_loss(...), rr.is_main (files are written by rank 0 only)
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist

from kohakumoss_common.errors import ConfigError

from .collectives import barrier
from .knobs import devices_problem, mode_problem
from .launch import current
from .shard import rank_weight, shard_plan, step_noise
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


class RankRun:
    def __init__(self, k: dict[str, Any]):
        self.world = current()
        self.seed = int(k["SEED"])
        self.reduction = k["LOSS_REDUCTION"]
        self.find_unused = (
            float(k.get("MODULE_DROPOUT", 0.0)) > 0
        )  # a dropped module leaves its params unused
        self.plan = None
        self.picks: list[list[int]] = []
        self.ddp = None

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    @property
    def active(self) -> bool:
        return self.world.size > 1

    def local_data(self, data):
        """RunData whose plan holds this rank's images of every micro-step (the global plan is kept here)."""
        self.plan = data.plan
        if not self.active:
            return data
        local, self.picks = shard_plan(data.plan, self.world.rank, self.world.size)
        return dataclasses.replace(data, plan=local)

    def noise(self, micro_step: int, batch, tcfg) -> tuple[torch.Tensor, torch.Tensor]:
        from kohakumoss.train.step import draw_step_noise

        if not self.active:
            return draw_step_noise(self.seed, micro_step, batch.x0, batch.seq, tcfg)
        step = self.plan.steps[micro_step]
        x0 = batch.x0
        return step_noise(
            self.seed, micro_step, step, self.picks[micro_step], tcfg, x0.device, x0.dtype, x0.shape[-1]
        )

    def weight(self, micro_step: int) -> float:
        if not self.active:
            return 1.0
        return rank_weight(
            self.plan.steps[micro_step], self.picks[micro_step], self.world.size, self.reduction
        )

    def wrap(self, model: torch.nn.Module, network: torch.nn.Module | None) -> torch.nn.Module:
        """What the loss calls: the backbone itself, or DDP around it (after resume: DDP broadcasts rank 0's)."""
        if not self.active:
            return model
        self.ddp = wrap_ddp(model, network, find_unused=self.find_unused)
        return self.ddp

    def sync(self, micro: int, accum: int):
        """DDP all-reduces only on the step's last micro-step; the others accumulate locally."""
        if self.ddp is None or micro == accum - 1:
            return nullcontext()
        return self.ddp.no_sync()

    def all_finite(self, loss: torch.Tensor) -> bool:
        """Every rank's loss is finite (all ranks skip a step together, or none does)."""
        ok = torch.isfinite(loss.detach()).to(torch.float32).reshape(1)
        if self.active:
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        return bool(ok.item())

    def finite_flag(self, ok: torch.Tensor) -> torch.Tensor:
        """The device-side skip flag agreed by every rank (no host read)."""
        if not self.active:
            return ok
        flag = ok.to(torch.float32).reshape(1)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return flag.reshape(ok.shape) > 0

    def step_loss(self, losses: list[float], first_micro_step: int) -> list[float]:
        """The whole micro-steps' losses from this rank's: the mean over ranks of weight * loss."""
        if not self.active:
            return losses
        w = [self.weight(first_micro_step + i) for i in range(len(losses))]
        t = torch.tensor([v * wi for v, wi in zip(losses, w)], dtype=torch.float64)
        if self.world.backend == "nccl":
            t = t.to(self.world.device)
        dist.all_reduce(t)
        return [float(v) / self.world.size for v in t.cpu()]

    def total(self, *counts: int) -> list[int]:
        """Counts (samples, tokens) summed over ranks."""
        if not self.active:
            return list(counts)
        t = torch.tensor(counts, dtype=torch.int64, device=self.world.device)
        dist.all_reduce(t)
        return [int(v) for v in t.cpu()]

    def barrier(self) -> None:
        barrier(self.world)
