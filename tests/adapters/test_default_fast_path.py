"""The adapter a shipped config trains runs the fused LoRA ops: `kohakumoss-config new train`'s knobs for the
24 GB layer (the TrainConfig defaults, gpu/vram_24g, algo/lora: TARGET_PRESET 'attn-mlp', BYPASS 'auto')
route every wrapped linear through `lora_linear` and each block's q, k, v through one `lora_group`, with the
loss and gradients of the merged-weight forward (BYPASS=False)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

from kohakumoss.adapters import build_from_spec
from kohakumoss.adapters.algos import ALGOS
from kohakumoss.adapters.fast import eligible
from kohakumoss.cli.config_layers import compose, layer_path
from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig
from kohakumoss_kernels import OpSet

from .helpers import flow_batch, flow_loss, tiny_model

LORA_OPS = ("lora_linear", "lora_group")


class CountingOps:
    """The model's OpSet, counting the calls of the LoRA ops."""

    def __init__(self, ops: OpSet):
        self._ops, self.calls = ops, Counter()

    def __getattr__(self, name: str):
        op = getattr(self._ops, name)
        if name not in LORA_OPS:
            return op

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return op(*args, **kwargs)

        return counted


def shipped_config(layer: str = "vram_24g", algo: str = "lora", **over) -> TrainConfig:
    """What `new train` writes for this layer: the schema's defaults under the gpu and algo layers."""
    knobs = compose([layer_path("gpu", layer), layer_path("algo", algo)], over)
    return TrainConfig.from_knobs(TRAIN_SCHEMA.validate(knobs))


def adapted(cfg: TrainConfig):
    model = tiny_model()
    model.ops = CountingOps(OpSet("addmm", tune="off"))  # the fused cuBLAS forms, on the CPU too
    spec = dataclasses.replace(
        cfg.adapter.spec(), rank=4
    )  # the layer's rank 32 would be most of the tiny model
    net = build_from_spec(model, spec)
    with torch.no_grad():  # LoRA up starts at zero: give it values so the LoRA terms count
        g = torch.Generator().manual_seed(1)
        for m in net.loras:
            m.lora_up.weight.copy_(torch.randn(m.lora_up.weight.shape, generator=g) * 0.1)
    return model, net


def loss_and_grads(model, net):
    loss = flow_loss(model, flow_batch())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in net.named_parameters()}


@pytest.mark.parametrize("layer", ["vram_24g", "vram_80g"])
def test_the_shipped_lora_config_runs_every_linear_through_the_fused_ops(layer):
    cfg = shipped_config(layer)
    assert (cfg.adapter.algo, cfg.adapter.target_preset, cfg.adapter.bypass) == ("lora", "attn-mlp", "auto")
    model, net = adapted(cfg)
    blocks = len(model.layers)
    assert len(net.loras) == 6 * blocks and all(
        eligible(m) for m in net.loras
    )  # q k v o ffn_up_gate ffn_down
    loss, grads = loss_and_grads(model, net)
    # per block: one lora_group (q, k, v) and three lora_linear (o, ffn_up_gate, ffn_down), nothing else
    assert model.ops.calls == {"lora_group": blocks, "lora_linear": 3 * blocks}

    merged_model, merged = adapted(
        dataclasses.replace(cfg, adapter=dataclasses.replace(cfg.adapter, bypass=False))
    )
    assert not any(m.bypass_mode for m in merged.loras)
    ref_loss, ref_grads = loss_and_grads(merged_model, merged)
    assert merged_model.ops.calls == {}  # the merged-weight forward is lycoris's own
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-4)
    assert all(g.abs().sum() > 0 for g in grads.values())


@pytest.mark.parametrize(
    "algo",
    sorted(a for a, r in ALGOS.items() if not r.dora() and not r.bypass_refused),  # bypass allowed
)
def test_auto_is_the_bypass_forward_exactly_where_it_computes_the_merged_function(monkeypatch, algo):
    """'auto' takes lycoris's bypass forward for the algorithms whose bypass equals their merged forward
    (tests/adapters/test_options.py compares them), and keeps the merged one for the OFTs and IA3, whose
    bypass forward also transforms a linear's bias ('full' wraps the embedders and modulations, which have one)."""
    monkeypatch.setattr("lycoris.modules.tlora.gc.collect", lambda *a: 0)
    cfg = shipped_config(algo=algo if algo not in ("diag-oft",) else "oft")
    spec = dataclasses.replace(cfg.adapter.spec(), algo=algo, rank=8, preset="attn")
    net = build_from_spec(tiny_model(), spec)
    assert {m.bypass_mode for m in net.loras} == {ALGOS[algo].bypass_same}
