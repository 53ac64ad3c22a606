"""Several torch optimizers stepped as one (`CombinedOptimizer`), their grads zeroed in few launches, and
which members placed optimizer states can step (memory/engines/optimizer.py places them; optim/build.py
builds the members).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.optim import AdamW, Muon, Optimizer

from kohakumoss_common.errors import CheckpointError, ConfigError

from .portable import portable_state, restore_state

# members whose update placed states can run ('gpu' runs any): 'host' steps them on the CPU over fp32
# masters; 'stream' steps them chunk by chunk, so an update that looks across a group's params (Prodigy's
# global d estimate) or keeps state outside `opt.state` (bitsandbytes' per-param configs) cannot stream,
# and schedule-free's train/eval swap would move the host masters but not the device weights
_TORCH_PLACEABLE = (torch.optim.Adam, AdamW, Muon, torch.optim.Adafactor)
_PLACEABLE = {
    "host": {*(f"{c.__module__}.{c.__qualname__}" for c in _TORCH_PLACEABLE), "prodigyopt.prodigy.Prodigy"},
    "stream": {f"{c.__module__}.{c.__qualname__}" for c in _TORCH_PLACEABLE},
}


def _qualname(opt: Optimizer) -> str:
    return f"{type(opt).__module__}.{type(opt).__qualname__}"


def placement_problem(optimizer, placement: str) -> str | None:
    """Why a member of `optimizer` cannot step under OPTIMIZER_PLACEMENT `placement`, or None."""
    if placement == "gpu":
        return None
    ok = _PLACEABLE.get(placement, set())
    for key, opt in getattr(optimizer, "optimizers", {}).items():
        if _qualname(opt) not in ok:
            return (
                f"optimizer '{key}' ({type(opt).__name__}) cannot step with OPTIMIZER_PLACEMENT "
                f"'{placement}': use 'gpu' or OPTIMIZER 'adamw'"
            )
    return None


def zero_grads(params: Iterable[torch.Tensor], set_to_none: bool = True) -> None:
    """Drop or zero every param's grad, zeroing with one multi-tensor launch per device and dtype.

    torch's own zero_grad zeroes tensor by tensor unless the optimizer was *built* foreach or fused: with
    hundreds of LoRA tensors that is hundreds of launches, and the GPU waits on the host between steps.
    """
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
            continue
        if p.grad.grad_fn is not None:
            p.grad.detach_()
        else:
            p.grad.requires_grad_(False)
        groups.setdefault((p.grad.device, p.grad.dtype, p.grad.is_sparse), []).append(p.grad)
    for (_, _, sparse), grads in groups.items():
        if sparse:
            for g in grads:
                g.zero_()
        else:
            torch._foreach_zero_(grads)


class CombinedOptimizer:
    """Several torch optimizers stepped together; param_groups are the members' own group dicts."""

    def __init__(self, optimizers: dict[str, Optimizer]):
        if not optimizers:
            raise ConfigError("OPTIMIZER", "no parameters to optimize")
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> None:
        if closure is not None:
            with torch.enable_grad():
                closure()
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grads(self.params(), set_to_none)

    def state_dict(self) -> dict:
        """Each member's state_dict, tensor-subclass states (torchao's) as plain tensors (optim/portable.py)."""
        return {
            name: portable_state(opt.state_dict(), f"<optimizer state>.{name}")
            for name, opt in self.optimizers.items()
        }

    def load_state_dict(self, state: dict) -> None:
        if set(state) != set(self.optimizers):
            raise CheckpointError(
                "<optimizer state>", f"holds {sorted(state)}, this run has {sorted(self.optimizers)}"
            )
        for name, opt in self.optimizers.items():
            opt.load_state_dict(restore_state(state[name], f"<optimizer state>.{name}"))
