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

from kohakumoss.precision import base_dtype, frozen_weight
from kohakumoss_kernels.runtime import cast_cache


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


def _dropping(module: LoConModule) -> bool:
    return module.training and bool(
        module.rank_dropout or module.module_dropout or not isinstance(module.dropout, nn.Identity)
    )


def _terms(module: LoConModule, scalar: float, dtype: torch.dtype) -> tuple:
    """(weight, bias, down, up, scale) of a routed LoRA linear: the frozen base in the compute dtype (or its
    fp8 form), the LoRA weights as stored (the op computes in x's dtype; its fast backends return fp32
    grads directly)."""
    org = module.org_module[0]
    return (
        frozen_weight(org, dtype),
        org.bias.to(dtype) if org.bias is not None else None,
        module.lora_down.weight,
        module.lora_up.weight,
        float(module.scale) * float(module.multiplier) * scalar,
    )


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _forward(module: LoConModule, ops, scalar: float, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    if _dropping(module) or args or kwargs:
        return module.forward(x, *args, **kwargs)
    dtype = _compute_dtype(x)
    with torch.autocast(
        x.device.type, enabled=False
    ):  # the op gets one dtype, whatever the caller's autocast
        # a stored (fp8 / int8 / MXFP8) weight binds that kind's backends: the registry reads its type
        return ops.lora_linear(x.to(dtype), *_terms(module, scalar, dtype))


def _grouped_forward(group: list[LoConModule], ops, scalars: list[float], x: torch.Tensor) -> tuple:
    """The members of a group that reads one input (q, k, v) through `ops.lora_group`; member by member
    while one of them drops ranks or modules (lycoris's own forward does that)."""
    if any(_dropping(m) for m in group):
        return tuple(m.org_module[0](x) for m in group)
    dtype = _compute_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        terms = [_terms(m, s, dtype) for m, s in zip(group, scalars, strict=True)]
        return ops.lora_group(x.to(dtype), *(tuple(t[i] for t in terms) for i in range(5)))


def _open_cast_window(model: nn.Module, groups: list[list[torch.Tensor]], modules: list, *args) -> None:
    """Before the model's forward: its LoRA weights cast to the compute dtype at once (cast_cache), while
    blocks run plainly; a memory engine's block runner (checkpointing, streaming) keeps the per-call casts,
    so the copies never outlive the saved tensors that hold them anyway."""
    if getattr(model, "block_runner", None) is not None or all(_dropping(m) for m in modules):
        return
    base = modules[0].org_module[0]
    device = base.weight.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else base_dtype(base)
    if groups[0][0].dtype != dtype:
        cast_cache.begin(groups, dtype)


def _close_cast_window(*args) -> None:
    cast_cache.end()


def route_through_ops(network: LycorisNetwork, ops, model: nn.Module | None = None) -> int:
    """Point every eligible wrapped linear's forward at `ops.lora_linear`, and every block whose q, k
    and v all qualify at one `ops.lora_group` (its `project_qkv`); returns how many linears. With the
    model given, its forward casts the routed LoRA weights once (`_open_cast_window`)."""
    n, routed, grouped = 0, {}, []
    for module in network.loras:
        if eligible(module):
            org = module.org_module[0]
            org.forward = partial(_forward, module, ops, float(module.scalar))
            routed[id(org)] = module
            n += 1
    for attn in model.modules() if model is not None else ():
        projs = attn.qkv_linears() if hasattr(attn, "qkv_linears") else ()
        if projs and hasattr(attn, "project_qkv") and all(id(p) in routed for p in projs):
            group = [routed[id(p)] for p in projs]
            attn.project_qkv = partial(_grouped_forward, group, ops, [float(m.scalar) for m in group])
            grouped.append(group)
    if model is not None and routed:
        in_group = {id(m) for g in grouped for m in g}
        casts = [[m.lora_down.weight for m in g] for g in grouped]  # a group's downs: one view, no cat
        casts += [[m.lora_up.weight] for g in grouped for m in g]
        casts += [
            [w]
            for m in routed.values()
            if id(m) not in in_group
            for w in (m.lora_down.weight, m.lora_up.weight)
        ]
        modules = list(routed.values())
        model.register_forward_pre_hook(partial(_open_cast_window, model, casts, modules))
        model.register_forward_hook(_close_cast_window, always_call=True)
    return n
