"""Learning-rate schedules as pure functions of the step, their shapes from transformers' `get_scheduler`.

The base LR of each param group is stored in the group itself (`base_lr`), so it travels with the
optimizer's state_dict; the factor depends on nothing but the step, so a resumed run sets the same LR at
the same step with no scheduler state to save. The library's lambda is evaluated at the step's index
after warmup and at index + 1 during it: warmup's first step trains at LR / warmup, not at 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kohakumoss.config.rules import FLAT_SCHEDULES, SCHEDULES
from kohakumoss.config.train import OptimConfig
from kohakumoss_common.errors import ConfigError

__all__ = ["FLAT_SCHEDULES", "SCHEDULES", "LRSchedule", "library_lambda"]


def _rex_lambda(step: int, warmup: int, total: int) -> float:
    # REX (Chen et al. 2021, "REX: Revisiting Budgeted Training with an Improved Schedule"): neither
    # transformers nor diffusers ships it; (1 - z) / (1 - z / 2) with z the progress after warmup
    if step < warmup:
        return step / max(1, warmup)
    z = min(1.0, (step - warmup) / max(1, total - warmup))
    return (1.0 - z) / (1.0 - z / 2.0)


def library_lambda(kind: str, warmup: int, total: int, cycles: int, power: float) -> Callable[[int], float]:
    """The LR multiplier of `kind` as a function of the scheduler's step index, from the library."""
    if kind == "rex":
        return functools.partial(_rex_lambda, warmup=warmup, total=total)
    from transformers import get_scheduler

    name = "constant_with_warmup" if kind == "constant" else kind
    extra = {"num_cycles": cycles} if kind == "cosine_with_restarts" else {}
    if kind == "polynomial":
        extra = {"power": power, "lr_end": 0.0}
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)  # the lambda reads its lr: 1
    scheduler = get_scheduler(
        name, dummy, num_warmup_steps=warmup, num_training_steps=total, scheduler_specific_kwargs=extra
    )
    return scheduler.lr_lambdas[0]


@dataclass(frozen=True)
class LRSchedule:
    kind: str = OptimConfig.lr_schedule
    warmup_steps: int = OptimConfig.lr_warmup_steps
    total_steps: int = 1
    min_ratio: float = (
        OptimConfig.lr_min_ratio
    )  # final LR as a fraction of the base LR (the decaying schedules)
    cycles: int = OptimConfig.lr_cycles  # cosine_with_restarts: hard restarts
    power: float = OptimConfig.lr_power  # polynomial: the decay's power
    _shape: Callable[[int], float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ConfigError("LR_SCHEDULE", f"'{self.kind}' is not one of {SCHEDULES}")
        if self.warmup_steps < 0:
            raise ConfigError("LR_WARMUP_STEPS", f"must be >= 0, got {self.warmup_steps}")
        if self.total_steps < 1:
            raise ConfigError("STEPS", f"must be >= 1, got {self.total_steps}")
        if not 0.0 <= self.min_ratio <= 1.0:
            raise ConfigError("LR_MIN_RATIO", f"must be in [0, 1], got {self.min_ratio}")
        if self.cycles < 1:
            raise ConfigError("LR_CYCLES", f"must be >= 1, got {self.cycles}")
        if not self.power > 0 or not math.isfinite(self.power):
            raise ConfigError("LR_POWER", f"must be > 0, got {self.power}")
        shape = library_lambda(self.kind, self.warmup_steps, self.total_steps, self.cycles, self.power)
        object.__setattr__(self, "_shape", shape)

    def factor(self, step: int) -> float:
        """LR multiplier for the optimizer step with 0-based index `step`."""
        if step < self.warmup_steps:
            return float(self._shape(step + 1))
        shape = float(self._shape(min(step, self.total_steps)))
        if self.kind in FLAT_SCHEDULES:
            return shape
        # the floor as transformers' cosine_with_min_lr and polynomial's lr_end draw it: min + (1 - min) * shape
        return self.min_ratio + (1.0 - self.min_ratio) * shape

    def apply(self, optimizer, step: int) -> float:
        """Set every group's lr to base_lr * factor(step); returns the factor."""
        f = self.factor(step)
        for group in optimizer.param_groups:
            group.setdefault("base_lr", group["lr"])
            group["lr"] = group["base_lr"] * f
        return f
