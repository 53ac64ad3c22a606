"""GPU (H200): adapters on CUDA run lycoris's fused kernels (Triton) and match the CPU float32 forward;
a bf16 autocast LoRA + LoRA+ step and a Muon full fine-tune step stay finite."""

from __future__ import annotations

import pytest
import torch
from lycoris.kernels import available_backends

from kohakumoss.adapters import adapter_param_groups, build_adapter, load_adapter, save_adapter
from kohakumoss.optim.build import build_adamw, build_full_ft_optimizer

from .helpers import flow_batch, flow_loss, forward, tiny_model

pytestmark = pytest.mark.gpu
ALGOS = [
    ("lora", {}),
    ("loha", {}),
    ("lokr", {"factor": 8}),
    ("dora", {}),
    ("oft", {}),
    ("boft", {}),
    ("glora", {}),
    ("ia3", {}),
    ("tlora", {}),
]


def _to(batch, device):
    batch.img, batch.text, batch.sigma = batch.img.to(device), batch.text.to(device), batch.sigma.to(device)
    batch.target, batch.seq = batch.target.to(device), batch.seq.to(device)
    return batch


CASES = [(a, args, bypass) for a, args in ALGOS for bypass in (False, True) if not (bypass and a == "dora")]


@pytest.mark.parametrize(
    "algo,args,bypass", CASES, ids=[f"{a}-{'bypass' if b else 'rebuild'}" for a, _, b in CASES]
)
def test_cuda_adapter_matches_cpu(tmp_path, algo, args, bypass):
    torch.backends.cuda.matmul.allow_tf32 = False
    assert "triton" in available_backends(torch.device("cuda"))
    model = tiny_model()
    net = build_adapter(model, algo, rank=8, alpha=4, preset="attn-mlp", bypass=bypass, **args)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.02)
    net.eval()
    batch = flow_batch()
    with torch.no_grad():
        cpu = forward(model, batch)
    path = save_adapter(net, tmp_path / "a.safetensors")
    gpu_model = tiny_model().cuda()
    load_adapter(gpu_model, path)
    with torch.no_grad():
        gpu = forward(gpu_model, _to(flow_batch(), "cuda")).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=1e-4, atol=1e-4)


def test_bf16_autocast_lora_plus_and_muon_steps():
    batch = _to(flow_batch(), "cuda")
    model = tiny_model().cuda()
    net = build_adapter(model, "lora", rank=8, alpha=8, preset="full", bypass=True, dropout=0.1)
    opt = build_adamw(adapter_param_groups(net, 1e-3, up_lr_ratio=8), lr=1e-3)
    for _ in range(3):
        with torch.autocast("cuda", torch.bfloat16):
            loss = flow_loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert torch.isfinite(loss)
    full = tiny_model().cuda().requires_grad_(True)
    opt = build_full_ft_optimizer(full, lr=1e-3)
    losses = []
    for _ in range(3):
        with torch.autocast("cuda", torch.bfloat16):
            loss = flow_loss(full, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
