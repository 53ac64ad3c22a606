"""The device-side skip of non-finite steps: which optimizers take it, and that a flagged step changes nothing."""

from __future__ import annotations

import torch
from torch.optim import AdamW, Muon

from kohakumoss.train.finite import arm_skip, skips_on_device
from kohakumoss.train.optim import CombinedOptimizer

CPU = torch.device("cpu")


def _adamw(fused: bool, n: int = 3) -> tuple[CombinedOptimizer, torch.nn.Parameter]:
    p = torch.nn.Parameter(torch.ones(n))
    return CombinedOptimizer({"adamw": AdamW([p], lr=0.1, fused=fused)}), p


def test_only_fused_adam_on_the_loss_device_skips_there():
    assert skips_on_device(_adamw(True)[0], CPU)
    assert not skips_on_device(_adamw(False)[0], CPU)  # foreach / for-loop kernels take no found_inf
    assert not skips_on_device(_adamw(True)[0], torch.device("cuda"))  # params elsewhere: the flag would move
    w = torch.nn.Parameter(torch.ones(4, 4))
    muon = CombinedOptimizer({"muon": Muon([w], lr=0.1), "adamw": _adamw(True)[0].optimizers["adamw"]})
    assert not skips_on_device(muon, CPU)


def test_a_flagged_step_leaves_params_and_state_alone():
    opt, p = _adamw(True)
    p.grad = torch.full((3,), float("nan"))
    arm_skip(opt, torch.tensor(False))
    opt.step()
    assert torch.equal(p.detach(), torch.ones(3))
    state = opt.optimizers["adamw"].state[p]
    assert float(state["step"]) == 0 and torch.isfinite(state["exp_avg"]).all()  # nothing of the NaN kept
    p.grad = torch.ones(3)
    arm_skip(opt, torch.tensor(True))
    opt.step()
    assert not torch.equal(p.detach(), torch.ones(3))
