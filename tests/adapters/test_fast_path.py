"""adapters/fast.py: routed LoRA linears run through the op registry; an attention whose q, k and v are all
routed runs them as one `lora_group` op; the grouped and per-linear paths give the same loss and grads."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kohakumoss.adapters import build_adapter
from kohakumoss.adapters.fast import _grouped_forward
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.runtime import cast_cache

from .helpers import flow_batch, flow_loss, tiny_model


def adapted(preset="attn-mlp", patterns=(), **kw):
    model = tiny_model()
    model.ops = OpSet("addmm", tune="off")  # the fused cuBLAS forms, on the CPU too
    net = build_adapter(model, rank=4, alpha=4.0, preset=preset, patterns=patterns, bypass=True, **kw)
    with torch.no_grad():  # LoRA up starts at zero: give it values so the LoRA terms count
        g = torch.Generator().manual_seed(1)
        for m in net.loras:
            m.lora_up.weight.copy_(torch.randn(m.lora_up.weight.shape, generator=g) * 0.1)
    return model, net


def grouped(model) -> list:
    """The blocks whose project_qkv hook adapters/fast.py replaced with the grouped op."""
    return [b for b in model.layers if isinstance(b.__dict__.get("project_qkv"), partial)]


def loss_and_grads(model, net):
    loss = flow_loss(model, flow_batch())
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in net.parameters()]


def test_qkv_run_as_one_group_with_the_per_linear_results():
    model, net = adapted()
    blocks = grouped(model)
    assert len(blocks) == len(model.layers) and blocks[0].project_qkv.func is _grouped_forward
    assert [m.lora_name for m in blocks[0].project_qkv.args[0]] == [
        f"lycoris_layers_0_proj_{p}" for p in "qkv"
    ]
    loss, grads = loss_and_grads(model, net)
    bound = {op for op, *_ in model.ops._bound}
    assert "lora_group" in bound and "lora_linear" in bound  # o, ffn_up_gate, ffn_down stay single
    net.zero_grad(set_to_none=True)
    for block in blocks:  # back to the class's project_qkv: q, k, v one by one
        del block.project_qkv
    ref_loss, ref_grads = loss_and_grads(model, net)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-6)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-5)
    assert any(g.abs().sum() > 0 for g in grads)


def test_no_group_unless_q_k_and_v_are_all_routed():
    model, _ = adapted(preset="custom", patterns=(r"layers\.\d+\.proj\.(q|k)",))
    assert grouped(model) == []
    flow_loss(model, flow_batch()).backward()
    assert "lora_group" not in {op for op, *_ in model.ops._bound}


def test_rank_dropout_while_training_takes_lycoris_forward():
    model, _ = adapted(rank_dropout=0.5)
    model.train()
    assert grouped(model)
    flow_loss(model, flow_batch()).backward()
    assert not {"lora_group", "lora_linear"} & {op for op, *_ in model.ops._bound}


class _CastCount(TorchDispatchMode):
    """Counts casts of fp32 tensors (the LoRA masters) to bf16."""

    def __init__(self):
        super().__init__()
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32:
            self.casts += kwargs.get("dtype") == torch.bfloat16
        return func(*args, **kwargs)


def _bf16_step(model, net):
    """A bf16-autocast loss and backward: casts counted, the window's state seen from inside a block."""
    seen = []
    hook = model.layers[0].register_forward_pre_hook(lambda *a: seen.append(len(cast_cache._copies)))
    with _CastCount() as count, torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grads = loss_and_grads(model, net)
    hook.remove()
    net.zero_grad(set_to_none=True)
    return loss, grads, count.casts, seen[0]


def test_lora_weights_cast_once_per_forward_with_the_per_call_results():
    model, net = adapted()
    loss, grads, casts, inside = _bf16_step(model, net)
    assert inside == 2 * len(net.loras) and not cast_cache._copies  # open in the forward, closed after
    # a block runner (checkpointing, streaming) keeps the per-call casts: the reference here
    model.block_runner = lambda block, *a: block(*a, model.ops)
    ref_loss, ref_grads, ref_casts, ref_inside = _bf16_step(model, net)
    assert ref_inside == 0
    assert ref_casts - casts >= 2 * len(net.loras) - 1  # one multi-tensor copy instead of one per weight
    torch.testing.assert_close(loss, ref_loss, atol=0, rtol=0)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=0, rtol=0)


def test_cast_window_closes_when_the_forward_raises():
    model, net = adapted()
    model.layers[1].register_forward_pre_hook(lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError), torch.autocast("cpu", dtype=torch.bfloat16):
        flow_loss(model, flow_batch())
    assert not cast_cache._copies
