"""Learning-rate schedules as pure functions of the step: constant, linear or cosine, with linear warmup.

The base LR of each param group is stored in the group itself (`base_lr`), so it travels with the
optimizer's state_dict and a resumed run sets the same LR at the same step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kohakumoss_common.errors import ConfigError

SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class LRSchedule:
    kind: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    min_ratio: float = 0.0  # final LR as a fraction of the base LR (linear / cosine)

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ConfigError("LR_SCHEDULE", f"'{self.kind}' is not one of {SCHEDULES}")
        if self.warmup_steps < 0:
            raise ConfigError("LR_WARMUP_STEPS", f"must be >= 0, got {self.warmup_steps}")
        if self.total_steps < 1:
            raise ConfigError("STEPS", f"must be >= 1, got {self.total_steps}")
        if not 0.0 <= self.min_ratio <= 1.0:
            raise ConfigError("LR_MIN_RATIO", f"must be in [0, 1], got {self.min_ratio}")

    def factor(self, step: int) -> float:
        """LR multiplier for the optimizer step with 0-based index `step`."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.kind == "linear":
            shape = 1.0 - progress
        else:
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_ratio + (1.0 - self.min_ratio) * shape

    def apply(self, optimizer, step: int) -> float:
        """Set every group's lr to base_lr * factor(step); returns the factor."""
        f = self.factor(step)
        for group in optimizer.param_groups:
            group.setdefault("base_lr", group["lr"])
            group["lr"] = group["base_lr"] * f
        return f
