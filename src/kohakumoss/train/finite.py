"""Non-finite steps skipped on the device, so the host reads a step's loss only after queuing its update.

Checking the loss on the host (`if not torch.isfinite(loss)`, `.item()`) before the optimizer step waits
for the whole forward and backward; the optimizer's launches (fused AdamW's host side over hundreds of
LoRA tensors: ~7 ms on the H200 speed row) then run while the GPU idles. When every optimizer is torch's
fused Adam/AdamW on the loss's device, the step carries a `found_inf` flag instead: the fused kernel
skips the update, and its step count, on the device. The trainer reads the flag after the launches.

A step whose loss is finite can still leave non-finite weights (an update no flag caught); the trainer
checks them before it writes a checkpoint (`nonfinite_tensors`, a host read off the step's path) and stops
with `NonFiniteWeights` instead of saving or exporting them.
"""

from __future__ import annotations

import torch
from torch.optim import Adam, AdamW

from kohakumoss_common.device import same_device
from kohakumoss_common.errors import KohakuMossError


class NonFiniteWeights(KohakuMossError):
    """The trainable weights hold inf or nan: nothing of them is saved or exported."""


def skips_on_device(optimizer, device: torch.device) -> bool:
    """Every member is fused Adam/AdamW with its params on `device` (host or streamed optimizers, Muon and
    fp16's loss scaler keep the host check)."""
    members = list(getattr(optimizer, "optimizers", {}).values())
    if not members or getattr(optimizer, "placement", "gpu") != "gpu":
        return False
    for opt in members:
        if not isinstance(opt, (Adam, AdamW)):
            return False
        for group in opt.param_groups:
            if not group.get("fused") or any(not same_device(p.device, device) for p in group["params"]):
                return False
    return True


def arm_skip(optimizer, finite: torch.Tensor) -> None:
    """The next `step()` of every member updates nothing where `finite` (a device bool) is False."""
    flag = (~finite).to(torch.float32)
    for opt in optimizer.optimizers.values():
        opt.found_inf = flag


_CHECKED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # fp8 stores hold no inf


def nonfinite_tensors(module: torch.nn.Module) -> list[str]:
    """Names of `module`'s floating-point parameters and buffers holding inf or nan (this process's
    shards of a sharded one, its stages of a pipeline); one host read for all of them."""
    named = [*module.named_parameters(), *module.named_buffers()]
    named = [(n, t.to_local() if hasattr(t, "to_local") else t) for n, t in named if t.dtype in _CHECKED]
    named = [(n, t) for n, t in named if t.numel() and not t.is_meta]  # a pipeline's other stages: meta
    if not named:
        return []
    flags = torch.stack([torch.isfinite(t.detach()).all().to(named[0][1].device) for _, t in named])
    return [n for (n, _), ok in zip(named, flags.tolist(), strict=True) if not ok]
