"""Muon + AdamW parameter split, the combined optimizer's state, LR schedules, full fine-tune learning."""

from __future__ import annotations

import pytest
import torch
from torch.optim import AdamW, Muon

from kohakumoss.optim.build import build_full_ft_optimizer, split_full_ft_params
from kohakumoss.optim.combined import zero_grads
from kohakumoss.train import LRSchedule
from kohakumoss_common.errors import CheckpointError, ConfigError

from ..adapters.helpers import flow_batch, flow_loss, tiny_model


def test_muon_takes_only_block_hidden_matrices():
    model = tiny_model().requires_grad_(True)
    muon, decay, no_decay = split_full_ft_params(model)
    muon_names = {n for n, _ in muon}
    assert all(p.ndim == 2 for _, p in muon)
    assert "layers.0.proj.q.weight" in muon_names and "layers.3.proj.ffn_down.weight" in muon_names
    assert "text_embedder.blocks.1.qkv.weight" in muon_names
    assert len(muon_names) == 6 * 4 + 5 * 2
    others = {n for n, _ in decay + no_decay}
    for name in (
        "video_embedder.weight",
        "text_embedder.proj.weight",
        "shared_block_modulation.weight",
        "final_linear_video.weight",
        "time_embedding.0.weight",
        "layers.0.q_norm.weight",
        "text_embedder.blocks.0.qkv.bias",
    ):
        assert name in others, name
    assert all(p.ndim == 1 for _, p in no_decay)
    opt = build_full_ft_optimizer(model, lr=1e-3)
    assert isinstance(opt.optimizers["muon"], Muon) and isinstance(opt.optimizers["adamw"], AdamW)
    assert len(opt.params()) == len(list(model.parameters()))


def test_full_finetune_with_muon_adamw_ema_reduces_loss():
    from kohakumoss.train import EMA

    batch = flow_batch()
    model = tiny_model().requires_grad_(True).train()
    opt = build_full_ft_optimizer(model, lr=3e-3)
    ema = EMA(model, decay=0.8, warmup=0)
    losses = []
    for step in range(8):
        loss = flow_loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema.update(step)
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    with torch.no_grad():
        live = flow_loss(model, batch).item()
        with ema.swapped():
            averaged = flow_loss(model, batch).item()
        assert flow_loss(model, batch).item() == live  # swapped back
    assert averaged != live and averaged < losses[0]


def test_combined_state_dict_roundtrip_and_mismatch():
    model = tiny_model().requires_grad_(True)
    opt = build_full_ft_optimizer(model, lr=1e-3)
    flow_loss(model, flow_batch()).backward()
    opt.step()
    state = opt.state_dict()
    other = build_full_ft_optimizer(model, lr=1e-3)
    other.load_state_dict(state)
    a, b = opt.optimizers["muon"].state_dict()["state"], other.optimizers["muon"].state_dict()["state"]
    assert all(torch.equal(a[k]["momentum_buffer"], b[k]["momentum_buffer"]) for k in a)
    with pytest.raises(CheckpointError, match="muon"):
        build_full_ft_optimizer(model, lr=1e-3, use_muon=False).load_state_dict(state)


def test_schedules():
    const = LRSchedule("constant", warmup_steps=4, total_steps=10)
    assert [const.factor(s) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    lin = LRSchedule("linear", warmup_steps=0, total_steps=10, min_ratio=0.0)
    assert lin.factor(0) == 1.0 and lin.factor(5) == pytest.approx(0.5) and lin.factor(10) == 0.0
    cos = LRSchedule("cosine", warmup_steps=2, total_steps=12, min_ratio=0.1)
    assert (
        cos.factor(1) == 1.0 and cos.factor(7) == pytest.approx(0.55) and cos.factor(12) == pytest.approx(0.1)
    )
    model = tiny_model().requires_grad_(True)
    opt = build_full_ft_optimizer(model, lr=1e-3)
    cos.apply(opt, 0)
    assert all(g["lr"] == pytest.approx(5e-4) and g["base_lr"] == 1e-3 for g in opt.param_groups)
    with pytest.raises(ConfigError, match="LR_SCHEDULE"):
        LRSchedule("step")


def test_zero_grads_zeroes_with_one_launch_per_dtype(monkeypatch):
    params = [torch.nn.Parameter(torch.randn(3, 2)) for _ in range(40)]
    params += [torch.nn.Parameter(torch.randn(4, dtype=torch.float64)) for _ in range(3)]
    params.append(torch.nn.Parameter(torch.randn(2)))  # no grad: left as it is
    for p in params[:-1]:
        p.grad = torch.randn_like(p)
    calls = []
    real = torch._foreach_zero_
    monkeypatch.setattr(torch, "_foreach_zero_", lambda ts: calls.append(len(ts)) or real(ts))
    zero_grads(params, set_to_none=False)
    assert sorted(calls) == [3, 40]  # one launch per dtype, not one per tensor (torch's unfused zero_grad)
    assert all(p.grad is not None and not p.grad.any() for p in params[:-1]) and params[-1].grad is None
    zero_grads(params, set_to_none=True)
    assert all(p.grad is None for p in params)


def test_schedules_follow_the_library_after_warmup():
    """Past warmup each factor is transformers' lambda at that step (rex: its published formula)."""
    from transformers import get_scheduler

    warm, total = 2, 12
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    for kind, extra in (
        ("cosine_with_restarts", {"num_cycles": 3}),
        ("polynomial", {"power": 2.0, "lr_end": 0.0}),
    ):
        ref = get_scheduler(kind, dummy, warm, total, scheduler_specific_kwargs=extra).lr_lambdas[0]
        ours = LRSchedule(kind, warm, total, cycles=3, power=2.0)
        assert [ours.factor(s) for s in range(warm, total)] == pytest.approx(
            [ref(s) for s in range(warm, total)]
        )
    restarts = LRSchedule("cosine_with_restarts", 0, 12, cycles=3)
    assert [round(restarts.factor(s), 3) for s in (3, 4, 7, 8)] == [0.146, 1.0, 0.146, 1.0]  # hard restarts
    rex = LRSchedule("rex", 0, 10, min_ratio=0.0)
    assert rex.factor(5) == pytest.approx(0.5 / 0.75) and rex.factor(10) == 0.0
    with pytest.raises(ConfigError, match="LR_CYCLES"):
        LRSchedule("cosine_with_restarts", cycles=0)
