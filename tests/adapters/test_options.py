"""LoRA+ groups, dropouts, bypass vs merged forward, the T-LoRA mask, and load errors."""

from __future__ import annotations

import types

import pytest
import torch

from kohakumoss.adapters import (
    adapter_param_groups,
    adapter_state_dict,
    build_adapter,
    clear_tlora_mask,
    is_up_param,
    load_adapter,
    set_tlora_sigma,
    tlora_mask,
)
from kohakumoss.adapters.algos import ALGOS
from kohakumoss.model import MossBackbone, get_preset
from kohakumoss_common.errors import CheckpointError

from .helpers import algo_names, flow_batch, forward, tiny_model

UP = [a for a in algo_names() if ALGOS[a].up_params]


@pytest.mark.parametrize("algo", UP)
def test_loraplus_puts_up_factors_in_their_own_group(monkeypatch, algo):
    monkeypatch.setattr("lycoris.modules.tlora.gc.collect", lambda *a: 0)
    net = build_adapter(
        tiny_model(), algo, rank=4, alpha=4, preset="custom", patterns=[r"layers\.0\.proj\.o"]
    )
    groups = adapter_param_groups(net, 1e-4, up_lr_ratio=16.0)
    assert [g["name"] for g in groups] == ["adapter", "adapter_up"]
    assert groups[1]["lr"] == pytest.approx(1.6e-3) and groups[0]["lr"] == 1e-4
    up_names = {n for n, p in net.named_parameters() if any(p is q for q in groups[1]["params"])}
    assert up_names and all(is_up_param(n) for n in up_names)
    assert all(any(m in n for m in ALGOS[algo].up_params) for n in up_names)  # its own Algo.up_params
    assert sum(len(g["params"]) for g in groups) == len(list(net.parameters()))
    assert len(adapter_param_groups(net, 1e-4)) == 1  # no ratio: one group


@pytest.mark.parametrize("algo", [a for a in algo_names() if a not in UP])
def test_an_algorithm_without_up_factors_has_no_up_group(algo):
    net = build_adapter(tiny_model(), algo, rank=8, preset="attn")
    assert [g["name"] for g in adapter_param_groups(net, 1e-4, up_lr_ratio=16.0)] == ["adapter"]


def _nonzero(net):
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05)


def test_dropouts_reach_lycoris_and_only_act_in_training():
    batch = flow_batch()
    model = tiny_model()
    net = build_adapter(
        model,
        "lora",
        rank=4,
        alpha=4,
        preset="attn",
        bypass=True,
        dropout=0.5,
        rank_dropout=0.5,
        module_dropout=0.5,
    )
    m = net.loras[0]
    assert (m.dropout.p, m.rank_dropout, m.module_dropout, m.bypass_mode) == (0.5, 0.5, 0.5, True)
    _nonzero(net)
    net.train()
    with torch.no_grad():
        assert not torch.equal(forward(model, batch), forward(model, batch))
    net.eval()
    with torch.no_grad():
        assert torch.equal(forward(model, batch), forward(model, batch))


def test_bypass_and_merged_forward_agree():
    batch = flow_batch()
    outs = []
    for bypass in (True, False):
        model = tiny_model()
        torch.manual_seed(0)
        net = build_adapter(model, "lora", rank=4, alpha=2, preset="attn-mlp", bypass=bypass)
        _nonzero(net)
        net.eval()
        with torch.no_grad():
            outs.append(forward(model, batch))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_tlora_mask_follows_sigma(monkeypatch):
    assert tlora_mask(0.0, 8).sum() == 8  # clean image: every rank
    assert tlora_mask(1.0, 8, min_rank=2).sum() == 2  # pure noise: min_rank
    assert 2 < tlora_mask(0.5, 8, min_rank=2).sum() < 8
    monkeypatch.setattr("lycoris.modules.tlora.gc.collect", lambda *a: 0)
    batch = flow_batch()
    model = tiny_model()
    net = build_adapter(model, "tlora", rank=8, alpha=8, preset="attn")
    _nonzero(net)
    net.eval()
    with torch.no_grad():
        full = forward(model, batch)
        set_tlora_sigma(torch.tensor([0.9, 1.0]), rank=8, min_rank=1)
        masked = forward(model, batch)
        clear_tlora_mask()
        assert not torch.equal(full, masked) and torch.equal(forward(model, batch), full)


def test_the_step_runner_sets_the_algorithms_step_hook_from_each_micro_steps_sigmas(monkeypatch):
    """T-LoRA's mask reaches the generic step only through its `Algo.step_hook`: the runner calls the hook
    the trainer builds with the micro-step's sigmas before the forward; sampling and exports reset it."""
    from kohakumoss.adapters.algos import reset_step_hook
    from kohakumoss.config.train import AdapterConfig
    from kohakumoss.train.runner import StepInputs, StepResult, StepRunner
    from kohakumoss.train.trainer import step_hook

    assert step_hook(AdapterConfig(algo="lora")) is None and step_hook(AdapterConfig(algo="full")) is None
    monkeypatch.setattr("lycoris.modules.tlora.gc.collect", lambda *a: 0)
    batch, model = flow_batch(), tiny_model()
    net = build_adapter(model, "tlora", rank=8, alpha=8, preset="attn")
    _nonzero(net)
    net.eval()
    with torch.no_grad():
        full = forward(model, batch)
    outs = []

    def loss(_batch, sigma, _noise):
        outs.append(forward(model, batch).detach())
        return sum(p.sum() for p in net.parameters()) * 0.0

    params = list(net.parameters())
    runner = StepRunner(
        torch.optim.SGD(params, lr=0.0), loss, lambda: None, device=torch.device("cpu"), seed=0,
        step_hook=step_hook(AdapterConfig(algo="t-lora", rank=8)),
    )  # fmt: skip
    stub = types.SimpleNamespace(num_samples=2, tokens=1, reference_tokens=0)
    runner.micro(StepInputs(0, stub, torch.tensor([0.9, 1.0]), None), StepResult())
    assert not torch.equal(outs[0], full)  # high noise: fewer ranks
    reset_step_hook("tlora")
    with torch.no_grad():
        assert torch.equal(forward(model, batch), full)


def test_loading_onto_another_model_names_the_modules():
    net = build_adapter(tiny_model(), "lora", rank=4, preset="full")
    other = MossBackbone(get_preset("tiny").__class__(**{**get_preset("tiny").to_dict(), "depth": 2}))
    with pytest.raises(CheckpointError, match="lycoris_layers_2"):
        load_adapter(other, adapter_state_dict(net))


BYPASS_ALGOS = [
    ("lora", {}),
    ("loha", {}),
    ("lokr", {"factor": 8}),
    ("oft", {}),
    ("boft", {}),
    ("glora", {}),
    ("ia3", {}),
    ("tlora", {}),
]


@pytest.mark.parametrize("algo,args", BYPASS_ALGOS, ids=[a for a, _ in BYPASS_ALGOS])
def test_bypass_equals_rebuild_forward_for_every_algo(monkeypatch, algo, args):
    monkeypatch.setattr("lycoris.modules.tlora.gc.collect", lambda *a: 0)
    batch = flow_batch()
    outs = []
    for bypass in (True, False):
        model = tiny_model()
        net = build_adapter(model, algo, rank=8, alpha=4, preset="attn", bypass=bypass, **args)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
        net.eval()
        with torch.no_grad():
            outs.append(forward(model, batch))
    assert (outs[0] - forward(tiny_model(), batch)).abs().max() > 1e-3
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_bypass_combinations_lycoris_gets_wrong_are_refused():
    from kohakumoss_common.errors import ConfigError

    for algo, args in [("dora", {}), ("loha", {"dora_wd": True}), ("dylora", {})]:
        with pytest.raises(ConfigError, match="BYPASS"):
            build_adapter(tiny_model(), algo, rank=8, preset="attn", bypass=True, **args)
