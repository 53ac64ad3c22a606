"""sdpa_slots: attention over the trainer's slotted layout (image keys dense, text and pad keys masked,
merged by log-sum-exp) against the eager reference, pad rows included; the registry offers it only
for slotted calls."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.model.seq import PackedSeq
from kohakumoss_kernels import OpSet, registry
from kohakumoss_kernels.host_values import slots
from kohakumoss_kernels.ops.varlen_attention import eager, sdpa_slots

from .cases import TOL

cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
)


def _inputs(captions, side, pad_to, heads, head_dim, dtype, device, seed=0):
    seq = PackedSeq.build(captions, [(side, side)] * len(captions), device, pad_to=pad_to)
    T = int(seq.cu_seqlens[-1])
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, grad = (
        torch.randn(T, heads, head_dim, device=device, dtype=dtype, generator=g) for _ in range(4)
    )
    return seq, (q, k, v), grad


def _check(fn, seq, qkv, grad, dtype):
    """fn's output and q, k, v gradients equal the float32 eager reference's, every row included."""
    leaves = [t.detach().clone().requires_grad_() for t in qkv]
    out = fn(*leaves, seq.cu_seqlens, seq.max_seqlen)
    grads = torch.autograd.grad(out, leaves, grad)
    ref_leaves = [t.detach().float().requires_grad_() for t in qkv]
    ref = eager.varlen_attention(*ref_leaves, seq.cu_seqlens, seq.max_seqlen)
    ref_grads = torch.autograd.grad(ref, ref_leaves, grad.float())
    atol, rtol = TOL[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)
    for name, a, b in zip("qkv", grads, ref_grads, strict=True):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(
            a.float() / scale, b / scale, atol=atol, rtol=rtol, msg=lambda m, n=name: f"d{n}: {m}"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "captions", [[3], [3, 9, 1], [7, 8]], ids=str
)  # [7, 8]: the second fills its slot (an empty pad segment)
def test_equals_the_reference_on_the_cpu(captions, dtype):
    seq, qkv, grad = _inputs(captions, 3, 16, 2, 16, dtype, "cpu")
    assert slots(seq.cu_seqlens) == (seq.max_seqlen, 9)
    _check(sdpa_slots.varlen_attention, seq, qkv, grad, dtype)


def test_a_graph_free_call_reads_no_host_values():
    """The text lengths come from cu_seqlens on the device: no host read (one graph serves all captions)."""
    from kohakumoss_kernels import host_values

    seq, (q, k, v), _ = _inputs([3, 9], 3, 16, 2, 16, torch.float32, "cpu")
    before = host_values.reads()
    sdpa_slots.varlen_attention(q, k, v, seq.cu_seqlens, seq.max_seqlen)
    assert host_values.reads() == before


def test_offered_only_for_slotted_calls():
    seq, (q, k, v), _ = _inputs([3, 9], 3, 16, 2, 16, torch.float32, "cpu")
    assert sdpa_slots.accepts(q, k, v, seq.cu_seqlens, seq.max_seqlen)
    mixed = PackedSeq.build([3, 9], [(3, 3), (2, 3)], pad_to=16)  # two image sizes: one pad segment, no slots
    T = int(mixed.cu_seqlens[-1])
    x = torch.randn(T, 2, 16)
    assert mixed.slots is None and not sdpa_slots.accepts(x, x, x, mixed.cu_seqlens, mixed.max_seqlen)
    text = torch.randn(int(seq.text_cu_seqlens[-1]), 2, 16)  # the text refiner's call: no slots either
    assert not sdpa_slots.accepts(text, text, text, seq.text_cu_seqlens, seq.text_max_seqlen)

    ops = OpSet("sdpa_slots,eager", tune="off")
    bound = ops.bind("varlen_attention", torch.device("cpu"), torch.float32)
    assert bound.names == ["sdpa_slots", "eager"]  # the CPU runs it when named
    assert [n for n, _ in bound.order(q, k, v, seq.cu_seqlens, seq.max_seqlen)][0] == "sdpa_slots"
    assert [n for n, _ in bound.order(x, x, x, mixed.cu_seqlens, mixed.max_seqlen)] == ["eager"]
    torch.testing.assert_close(
        ops.varlen_attention(x, x, x, mixed.cu_seqlens, mixed.max_seqlen),
        eager.varlen_attention(x, x, x, mixed.cu_seqlens, mixed.max_seqlen),
    )


# the trainer's layout: two 1 MP samples (4096 image tokens), captions of 40 and 90 tokens, TEXT_PAD 128
TRAINER = ([40, 90], 64, 128)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kernels", ["cudnn", "flash"])
@pytest.mark.parametrize("layout", [TRAINER, ([1, 127, 64], 32, 128), ([5], 16, 128)], ids=str)
def test_equals_the_reference_on_the_gpu(kernels, layout, dtype, monkeypatch):
    """cuDNN for the image keys, and flash (where torch has no cuDNN)."""
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: kernels == "cudnn")
    fn = registry.load_backend("varlen_attention", "sdpa_slots", "sm90", dtype)
    seq, qkv, grad = _inputs(*layout, 2, 128, dtype, "cuda")
    _check(fn, seq, qkv, grad, dtype)


@pytest.mark.gpu
@cuda
def test_a_graph_replays_other_captions():
    """Forward and backward captured at one batch's captions, replayed with another's (cu_seqlens copied
    in, same slots): the eager reference's outputs and gradients."""
    dtype = torch.bfloat16
    fn = registry.load_backend("varlen_attention", "sdpa_slots", "sm90", dtype)
    seq, (q, k, v), grad = _inputs([40, 90], 64, 128, 2, 128, dtype, "cuda")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    cu = seq.cu_seqlens

    def step():
        out = fn(q, k, v, cu, seq.max_seqlen)
        return (out, *torch.autograd.grad(out, (q, k, v), grad))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        results = step()
    other = PackedSeq.build([100, 3], [(64, 64)] * 2, "cuda", pad_to=128)
    assert other.slots == seq.slots and other.cu_seqlens.shape == cu.shape
    cu.copy_(other.cu_seqlens)
    graph.replay()
    ref_leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = eager.varlen_attention(*ref_leaves, other.cu_seqlens, other.max_seqlen)
    ref_grads = torch.autograd.grad(ref, ref_leaves, grad.float())
    atol, rtol = TOL[dtype]
    for a, b in zip(results, (ref, *ref_grads), strict=True):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a.float() / scale, b / scale, atol=atol, rtol=rtol)
