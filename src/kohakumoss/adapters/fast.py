"""Plain LoRA linears run through the kernel registry's `lora_linear` op instead of lycoris's module
forward: the same math (base + scale * up(down(x))) with the add fused and the backends tuned per
shape. lycoris still owns the parameters, the file format and every case this path does not cover
(rank/module/output dropout while training, DoRA, trainable scalars, non-linear modules), which
fall back to its own forward at call time.
"""

from __future__ import annotations

from functools import partial

import torch
from lycoris import LycorisNetwork
from lycoris.modules.locon import LoConModule
from torch import nn


def eligible(module: nn.Module) -> bool:
    """A LoRA on an nn.Linear whose forward is plain base + scale * up(down(x)) in bypass mode."""
    return (
        type(module) is LoConModule
        and module.module_type == "linear"
        and module.bypass_mode
        and not module.tucker
        and not module.wd
        and not isinstance(module.scalar, nn.Parameter)
    )


def _forward(module: LoConModule, ops, scalar: float, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    dropping = module.training and (
        module.rank_dropout or module.module_dropout or not isinstance(module.dropout, nn.Identity)
    )
    if dropping or args or kwargs:
        return module.forward(x, *args, **kwargs)
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    org = module.org_module[0]
    scale = float(module.scale) * float(module.multiplier) * scalar
    with torch.autocast(device, enabled=False):  # the op gets one dtype, whatever the caller's autocast
        return ops.lora_linear(
            x.to(dtype),
            org.weight.to(dtype),
            org.bias.to(dtype) if org.bias is not None else None,
            module.lora_down.weight.to(dtype),
            module.lora_up.weight.to(dtype),
            scale,
        )


def route_through_ops(network: LycorisNetwork, ops) -> int:
    """Point every eligible wrapped linear's forward at `ops.lora_linear`; returns how many."""
    n = 0
    for module in network.loras:
        if eligible(module):
            org = module.org_module[0]
            org.forward = partial(_forward, module, ops, float(module.scalar))
            n += 1
    return n
