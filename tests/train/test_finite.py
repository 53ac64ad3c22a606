"""The device-side skip of non-finite steps: which optimizers take it, and that a flagged step changes nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.optim import AdamW, Muon

from kohakumoss.optim.combined import CombinedOptimizer
from kohakumoss.train.finite import arm_skip, skips_on_device
from kohakumoss_common.device import device_index, same_device

CPU = torch.device("cpu")


def _adamw(fused: bool, n: int = 3, device: str = "cpu") -> tuple[CombinedOptimizer, torch.nn.Parameter]:
    p = torch.nn.Parameter(torch.ones(n, device=device))
    return CombinedOptimizer({"adamw": AdamW([p], lr=0.1, fused=fused)}), p


def test_only_fused_adam_on_the_loss_device_skips_there():
    assert skips_on_device(_adamw(True)[0], CPU)
    assert not skips_on_device(_adamw(False)[0], CPU)  # foreach / for-loop kernels take no found_inf
    assert not skips_on_device(_adamw(True)[0], torch.device("cuda"))  # params elsewhere: the flag would move
    w = torch.nn.Parameter(torch.ones(4, 4))
    # the trainer's device is torch.device("cuda") (no index) while its params say cuda:0: the same card
    opt = _adamw(True)[0]
    opt.optimizers["adamw"].param_groups[0]["params"] = [SimpleNamespace(device=torch.device("cuda:0"))]
    assert skips_on_device(opt, torch.device("cuda")) == (device_index(torch.device("cuda")) == 0)
    assert not skips_on_device(opt, torch.device("cuda:1"))
    muon = CombinedOptimizer({"muon": Muon([w], lr=0.1), "adamw": _adamw(True)[0].optimizers["adamw"]})
    assert not skips_on_device(muon, CPU)


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])],
)  # fmt: skip
def test_a_flagged_step_leaves_params_and_state_alone(device):
    opt, p = _adamw(True, device=device)
    assert skips_on_device(opt, torch.device(device))  # "cuda" against the params' cuda:0 too
    p.grad = torch.full((3,), float("nan"), device=device)
    arm_skip(opt, torch.isfinite(p.grad.sum()))  # a device flag, as the trainer's from the loss
    opt.step()
    assert torch.equal(p.detach().cpu(), torch.ones(3))
    state = opt.optimizers["adamw"].state[p]
    assert float(state["step"]) == 0 and torch.isfinite(state["exp_avg"]).all()  # nothing of the NaN kept
    p.grad = torch.ones(3, device=device)
    arm_skip(opt, torch.isfinite(p.grad.sum()))
    opt.step()
    assert not torch.equal(p.detach().cpu(), torch.ones(3))


def test_same_device_reads_a_missing_index_as_the_current_one():
    assert same_device("cpu", CPU)
    assert not same_device("cpu", "cuda")
    current = device_index(torch.device("cuda"))
    assert same_device("cuda", f"cuda:{current}")
    assert not same_device("cuda", f"cuda:{current + 1}")
    assert torch.device("cuda") != torch.device(f"cuda:{current}")  # why plain != is not enough
