"""PRECISION fp16 on the GPU: float32 residual streams through the registry's backends (Triton: a float32
stream beside fp16 branches and modulations) against the eager ops, forward and a LoRA backward."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.adapters import build_adapter
from kohakumoss.precision import fp32_residuals
from kohakumoss_kernels import OpSet

from ..adapters.helpers import flow_batch, flow_loss, tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
    ),
]
DEV = torch.device("cuda")


def _run(backend: str, residual32: bool):
    model = tiny_model().to(DEV)
    model.ops = OpSet(backend, tune="off")
    fp32_residuals(model, residual32)
    model = model.half().requires_grad_(False)
    net = build_adapter(model, rank=4, alpha=4.0, preset="attn-mlp", bypass=True).to(DEV)
    with torch.no_grad():
        for m in net.loras:
            m.lora_up.weight.normal_(0, 0.1, generator=torch.Generator(DEV).manual_seed(1))
    b = flow_batch()
    b = type(b)(b.img.to(DEV), b.text.to(DEV), b.sigma.to(DEV), b.seq.to(DEV), b.target.to(DEV))
    with torch.autocast("cuda", dtype=torch.float16):
        loss = flow_loss(model, b)
    loss.backward()
    return loss.float(), [p.grad.float() for p in net.parameters()]


def test_fp32_residual_streams_through_the_registry_match_eager():
    loss, grads = _run("auto", True)
    ref_loss, ref_grads = _run("eager", True)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(loss, ref_loss, rtol=5e-3, atol=1e-4)
    for g, r in zip(grads, ref_grads, strict=True):
        assert float((g - r).norm() / r.norm()) < 2e-2
