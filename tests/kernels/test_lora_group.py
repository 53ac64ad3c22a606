"""lora_group: LoRA linears sharing one input (q, k, v) as one op; its addmm backend against the eager
reference (float64 gradcheck, float32 values and gradients; bf16 on the GPU) and its registry plumbing."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from kohakumoss_kernels import tuning
from kohakumoss_kernels.op_list import shape_key
from kohakumoss_kernels.ops.lora_group.addmm import lora_group
from kohakumoss_kernels.registry import _exact_key, eager_op

OUTS, RANKS = (7, 7, 5), (3, 2, 3)


def members(dtype=torch.float64, device="cpu", trainable_base=False, with_bias=True, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, grad, scale=1.0):
        return (
            (torch.randn(*shape, generator=g, dtype=torch.float64) * scale)
            .to(device, dtype)
            .requires_grad_(grad)
        )

    x = rnd(2, 5, d, grad=True)
    weights = tuple(rnd(o, d, grad=trainable_base, scale=d**-0.5) for o in OUTS)
    biases = tuple(rnd(o, grad=trainable_base) if with_bias else None for o in OUTS)
    downs = tuple(rnd(r, d, grad=True, scale=d**-0.5) for r in RANKS)
    ups = tuple(rnd(o, r, grad=True) for o, r in zip(OUTS, RANKS, strict=True))
    return x, weights, biases, downs, ups, (0.7, 1.0, 0.25)


@pytest.mark.parametrize("trainable_base", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gradients_are_exact_in_float64(trainable_base, with_bias):
    x, w, b, d, u, s = members(trainable_base=trainable_base, with_bias=with_bias)
    n = len(w)

    def fn(x, *t):
        return lora_group(x, t[:n], t[n : 2 * n] if with_bias else (None,) * n, t[-2 * n : -n], t[-n:], s)

    flat = (x, *w, *(b if with_bias else ()), *d, *u)
    assert torch.autograd.gradcheck(fn, flat)


@pytest.mark.parametrize("lora_first", [False, True])
def test_values_and_gradients_equal_the_eager_reference(lora_first):
    outs, grads = [], []
    for op in (partial(lora_group, lora_first=lora_first), eager_op("lora_group")):
        x, w, b, d, u, s = members(dtype=torch.float32)
        y = op(x, w, b, d, u, s)
        g = torch.Generator().manual_seed(5)
        torch.autograd.backward(y, [torch.randn(o.shape, generator=g) for o in y])
        outs.append(y)
        grads.append([x.grad, *(t.grad for t in d), *(t.grad for t in u)])
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_an_unused_member_output_counts_as_a_zero_gradient():
    x, w, b, d, u, s = members()
    q, k, v = lora_group(x, w, b, d, u, s)
    (q.sum() + v.sum()).backward()  # k unused
    assert torch.count_nonzero(u[1].grad) == 0 and torch.count_nonzero(u[0].grad) > 0


def test_keys_tell_groups_apart_and_timing_leaves_the_members_grads_alone():
    x, w, b, d, u, s = members(dtype=torch.float32)
    key = shape_key("lora_group", x.reshape(-1, 6), w, b, d, u, s)
    assert key == "lora_group|fp32|T=64|I=6|O=7,7,5"
    pair = (x, w[:2], b[:2], d[:2], u[:2], s[:2])  # the same input, another group
    assert _exact_key((x, w, b, d, u, s), {}) != _exact_key(pair, {})
    tuning.time_call(lora_group, (x, w, b, d, u, s), {}, rounds=1, calls=1)
    assert x.grad is None and all(t.grad is None for t in (*d, *u))  # fresh leaves were timed


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lowrank, lora_first", [(False, False), (True, False), (False, True)])
def test_cuda_matches_the_float32_reference(dtype, lowrank, lora_first):
    x, w, b, d, u, s = members(dtype=dtype, device="cuda", d=256)

    def widened(t):  # the same (already rounded) values in float32: only the op's own arithmetic differs
        return t.detach().float().requires_grad_(t.requires_grad)

    ref_x, ref_w, ref_b, ref_d, ref_u = widened(x), *(tuple(map(widened, g)) for g in (w, b, d, u))
    ref = eager_op("lora_group")(ref_x, ref_w, ref_b, ref_d, ref_u, s)
    out = lora_group(x, w, b, d, u, s, lowrank=lowrank, lora_first=lora_first)
    g = [torch.randn_like(o, dtype=torch.float32) for o in ref]
    torch.autograd.backward(ref, g)
    torch.autograd.backward(out, [t.to(dtype) for t in g])
    # tolerances scale with each tensor's largest value: storing a result in bf16/fp16 rounds it relative
    # to its own magnitude, so a near-zero entry of a large weight gradient carries that absolute error
    for a, r in zip(
        (*out, x.grad, *(t.grad for t in (*d, *u))),
        (*ref, ref_x.grad, *(t.grad for t in (*ref_d, *ref_u))),
        strict=True,
    ):
        torch.testing.assert_close(a.float(), r, atol=1e-2 * r.abs().max().item(), rtol=6e-2)
