"""Optimizers: Muon for the blocks' hidden 2-D matrices and AdamW for the rest, as one object.

Full fine-tune follows the MOSS recipe: `torch.optim.Muon` (2-D parameters only) takes the attention
and SiTU-GLU weight matrices of every block and text refiner block; AdamW takes embedders, norms, the
modulations, biases and the final layer. Muon's `adjust_lr_fn="match_rms_adamw"` scales its update to AdamW's RMS, so one LR fits both.
Adapters train with AdamW on LoRA+ groups. Every optimizer is wrapped in `CombinedOptimizer` so the
trainer, the LR schedule and checkpoints see one interface.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.optim import AdamW, Muon, Optimizer

from kohakumoss_common.errors import CheckpointError, ConfigError

_MUON_NAME = re.compile(
    r"^(layers\.\d+\.proj\.(q|k|v|o|ffn_up_gate|ffn_down)"
    r"|text_embedder\.blocks\.\d+\.(qkv|proj|ffn_gate|ffn_up|ffn_down))\.weight$"
)


def is_muon_param(name: str, p: torch.Tensor) -> bool:
    """A hidden weight matrix of a block or refiner block; never embedders, modulations, norms or biases."""
    return p.ndim == 2 and bool(_MUON_NAME.match(name))


def split_full_ft_params(
    model: nn.Module,
) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """(muon, adamw_decay, adamw_no_decay) named trainable parameters; 1-D ones get no weight decay."""
    muon, decay, no_decay = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if is_muon_param(name, p):
            muon.append((name, p))
        elif p.ndim >= 2:
            decay.append((name, p))
        else:
            no_decay.append((name, p))
    return muon, decay, no_decay


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
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != set(self.optimizers):
            raise CheckpointError(
                "<optimizer state>", f"holds {sorted(state)}, this run has {sorted(self.optimizers)}"
            )
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


def build_full_ft_optimizer(
    model: nn.Module,
    lr: float,
    muon_lr: float | None = None,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    muon_momentum: float = 0.95,
    muon_weight_decay: float | None = None,
    adjust_lr_fn: str = "match_rms_adamw",
    use_muon: bool = True,
) -> CombinedOptimizer:
    """Muon (hidden matrices) + AdamW (everything else) over the model's trainable parameters."""
    muon, decay, no_decay = split_full_ft_params(model)
    if not use_muon:
        decay, muon = decay + muon, []
    opts: dict[str, Optimizer] = {}
    if muon:
        wd = weight_decay if muon_weight_decay is None else muon_weight_decay
        group = {"name": "muon", "params": [p for _, p in muon]}
        opts["muon"] = Muon(
            [group],
            lr=muon_lr if muon_lr is not None else lr,
            weight_decay=wd,
            momentum=muon_momentum,
            adjust_lr_fn=adjust_lr_fn,
        )
    groups = [
        {"name": "adamw", "params": [p for _, p in decay], "weight_decay": weight_decay},
        {"name": "adamw_no_decay", "params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if groups:
        opts["adamw"] = AdamW(groups, lr=lr, betas=betas, eps=eps)
    return CombinedOptimizer(opts)


def build_adamw(
    groups: Iterable[dict], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
) -> CombinedOptimizer:
    """AdamW over prepared groups (e.g. `adapters.adapter_param_groups` for LoRA+)."""
    return CombinedOptimizer({"adamw": AdamW(list(groups), lr=lr, betas=betas, eps=eps)})
