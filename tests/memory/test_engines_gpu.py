"""The memory engines on CUDA (side streams, pinned memory, events): same loss and gradients as the
plain path, fp32 exactly-ish and bf16 within a stated tolerance, and the memory they promise to save."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kohakumoss.adapters import build_adapter
from kohakumoss.memory.install import install_memory_plan
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.model import MossConfig, PackedSeq

from ..model.helpers import random_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
    ),
]
CFG = MossConfig(dim=512, depth=6, num_heads=4, mlp_hidden=1024, text_dim=64)  # head_dim 128
PLANS = {
    "stream all x2": MemoryPlan(stream_blocks=-1, stream_slots=2),
    "stream 4 x3": MemoryPlan(stream_blocks=4, stream_slots=3),
    "offload": MemoryPlan(activation_offload="on"),
    "full ckpt + offload + stream": MemoryPlan(
        checkpointing="full", activation_offload="on", stream_blocks=-1
    ),
    "attn ckpt + offload + stream": MemoryPlan(
        checkpointing="attn", activation_offload="on", stream_blocks=-1
    ),
}


def batch(device):
    g = torch.Generator().manual_seed(0)
    text_lens, grids = [7, 33], [(16, 24), (9, 13)]
    seq = PackedSeq.build(text_lens, grids, device)
    img = torch.randn(sum(h * w for h, w in grids), CFG.in_channels, generator=g).to(device)
    text = torch.randn(sum(text_lens), CFG.text_dim, generator=g).to(device)
    sigma = torch.rand(2, generator=g).to(device)
    return img, text, sigma, seq


def run(plan, adapter: bool, dtype: torch.dtype):
    dev = torch.device("cuda")
    model = random_model(CFG).train()
    if adapter:
        model.requires_grad_(False)
    if plan is None:
        model.to(dev)
    else:
        plan = plan if adapter else replace(plan, optimizer="host")
        engines = install_memory_plan(plan, model, dev, full_ft=not adapter)
        if engines.offload is not None:
            engines.offload.min_bytes = 0
    trained = dict(model.named_parameters())
    if adapter:
        net = build_adapter(model, algo="lora", rank=8, alpha=8.0, preset="attn-mlp")
        net.to(dev)
        with torch.no_grad():
            for name, p in net.named_parameters():
                if "lora_up" in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
        if plan is not None and engines.offload is not None:
            engines.offload.keep_tensors(net.parameters())
        trained = dict(net.named_parameters())
    img, text, sigma, seq = batch(dev)
    losses = []
    for _ in range(3):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            loss = model(img, text, sigma, seq).float().pow(2).mean()
        loss.backward()
        losses.append(loss.item())
    torch.cuda.synchronize()
    return losses, {n: p.grad.float().cpu() for n, p in trained.items()}


CASES = [(name, torch.bfloat16) for name in PLANS] + [("full ckpt + offload + stream", torch.float32)]


@pytest.mark.parametrize("name, dtype", CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
@pytest.mark.parametrize("adapter", [True, False], ids=["lora", "full"])
def test_engines_match_plain_on_cuda(name, dtype, adapter):
    ref_losses, ref_grads = run(None, adapter, dtype)
    losses, grads = run(PLANS[name], adapter, dtype)
    # bf16: the same kernels on the same inputs; only reduction order may differ
    rtol, atol = (1e-4, 1e-6) if dtype == torch.float32 else (2e-2, 1e-4)
    assert losses == pytest.approx(ref_losses, rel=rtol)
    for key, g in ref_grads.items():
        torch.testing.assert_close(
            grads[key], g, rtol=rtol, atol=atol * max(1.0, g.abs().max().item()), msg=key
        )


def test_streaming_keeps_only_the_slots_on_the_device():
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    model = random_model(CFG).requires_grad_(False)
    engines = install_memory_plan(MemoryPlan(stream_blocks=-1, stream_slots=2), model, dev)
    block_bytes = sum(p.numel() * p.element_size() for p in model.layers[0].parameters())
    resident = torch.cuda.memory_allocated() - base
    assert resident < 3 * block_bytes + sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if not n.startswith("layers.")
    ) + (1 << 20)
    assert engines.streamer.num_slots == 2
