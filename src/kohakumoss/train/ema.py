"""EMA of the trainable weights: decay with warmup, an update interval, state_dict, swap-in for export.

decay_n = min(decay, (1 + n) / (warmup + n)) after n updates (warmup = 0: the plain decay). An update
every k steps uses decay_n ** k, so the averaging horizon in steps does not depend on k. Shadows are
float32 and may live on another device (e.g. the CPU) than the weights.

torch's `swa_utils.get_ema_multi_avg_fn` does each update (one `_foreach_lerp_` over all shadows; the
same values as a lerp per tensor, measured bitwise on the CPU). Its `AveragedModel` is not used: it
deep-copies the whole module (a LoRA's network holds the base model's linears) in the weights' dtype
(a bf16 full fine-tune's EMA at decay 0.999 would drop updates below bf16's resolution), and has no
warmup, update interval, shadows on another device or resume state of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.optim.swa_utils import get_ema_multi_avg_fn

from kohakumoss.config.train import OptimConfig
from kohakumoss_common.errors import CheckpointError, ConfigError


class EMA:
    def __init__(
        self,
        source: nn.Module | dict[str, torch.Tensor],
        decay: float = OptimConfig.ema_decay,
        warmup: int = OptimConfig.ema_warmup,
        every: int = OptimConfig.ema_every,
        device: torch.device | str | None = None,
    ):
        if not 0.0 < decay < 1.0:
            raise ConfigError("EMA_DECAY", f"must be in (0, 1), got {decay}")
        if every < 1:
            raise ConfigError("EMA_EVERY", f"must be >= 1, got {every}")
        if warmup < 0:
            raise ConfigError("EMA_WARMUP", f"must be >= 0, got {warmup}")
        self.params = _trainable(source)
        self.decay, self.warmup, self.every = decay, warmup, every
        self.num_updates = 0
        self.shadow = {
            k: p.detach().to(device or p.device, torch.float32, copy=True) for k, p in self.params.items()
        }

    def current_decay(self) -> float:
        n = self.num_updates
        d = min(self.decay, (1 + n) / (self.warmup + n)) if self.warmup > 0 else self.decay
        return d**self.every

    @torch.no_grad()
    def update(self, step: int) -> bool:
        """Call after the optimizer step with 0-based index `step`; updates on every `every`-th step."""
        if (step + 1) % self.every:
            return False
        shadows = list(self.shadow.values())
        current = [p.detach().to(s.device, torch.float32) for s, p in zip(shadows, self.params.values())]
        get_ema_multi_avg_fn(self.current_decay())(shadows, current, self.num_updates)
        self.num_updates += 1
        return True

    def state_dict(self) -> dict:
        return {
            "shadow": {k: v.clone() for k, v in self.shadow.items()},
            "num_updates": self.num_updates,
            "decay": self.decay,
            "warmup": self.warmup,
            "every": self.every,
        }

    def load_state_dict(self, state: dict) -> None:
        shadow = state["shadow"]
        if set(shadow) != set(self.shadow):
            missing, extra = sorted(set(self.shadow) - set(shadow)), sorted(set(shadow) - set(self.shadow))
            raise CheckpointError(
                "<ema state>", f"keys differ: missing {missing[:5]}, unexpected {extra[:5]}"
            )
        for k, v in shadow.items():
            self.shadow[k].copy_(v)
        self.num_updates = int(state["num_updates"])

    @torch.no_grad()
    def copy_to(self) -> None:
        """Overwrite the live weights with the EMA weights."""
        for k, p in self.params.items():
            p.copy_(self.shadow[k].to(p.device, p.dtype))

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """The EMA weights are in the model inside the block (export, samples); the live ones after."""
        backup = {k: p.detach().clone() for k, p in self.params.items()}
        self.copy_to()
        try:
            yield
        finally:
            with torch.no_grad():
                for k, p in self.params.items():
                    p.copy_(backup[k])


def _trainable(source: nn.Module | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(source, nn.Module):
        params = {n: p for n, p in source.named_parameters() if p.requires_grad}
    else:
        params = dict(source)
    if not params:
        raise ConfigError("EMA", "no trainable parameters to average")
    return params
