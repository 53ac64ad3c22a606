"""Tiny-model training tests: one intra-op thread, and Muon's Newton-Schulz in float32 on the CPU.

torch.optim.Muon runs its Newton-Schulz iteration in bfloat16, which is ~30x slower than float32 on
CPUs without bf16 matmul units (this CI box): one tiny-model step takes seconds. The tests swap in
the same quintic iteration in float32; everything else (parameter handling, momentum, LR adjustment,
state) is torch's Muon. On the GPU nothing is patched.
"""

import pytest
import torch
import torch.optim._muon as muon_impl


def _newton_schulz_fp32(grad, ns_coefficients, ns_steps, eps):
    a, b, c = ns_coefficients
    x = grad.float()
    transposed = grad.size(0) > grad.size(1)
    if transposed:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if transposed else x


@pytest.fixture(autouse=True)
def _one_thread_fp32_muon(monkeypatch):
    monkeypatch.setattr(muon_impl, "_zeropower_via_newtonschulz", _newton_schulz_fp32)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
