"""fp8 frozen bases on the GPU (sm89+): the Triton row quantizer against the eager one, the fp8 LoRA ops
against their dequantized references in bf16, and the whole op inside a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from kohakumoss_kernels.registry import eager_op, load_backend
from kohakumoss_kernels.weights import fp8

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not fp8.can_compute(torch.device("cuda")),
        reason="needs a CUDA GPU of sm89+ (run on the H200 through the device tool)",
    ),
]
DEV = torch.device("cuda")


@pytest.mark.parametrize("shape", [(1, 16), (37, 3072), (300, 9216), (64, 16384)])
@pytest.mark.parametrize("with_cols", [False, True])
def test_triton_quantize_rows_writes_the_reference_bytes(shape, with_cols):
    from kohakumoss_kernels.weights.fp8_triton import quantize_rows

    torch.manual_seed(0)
    x = (torch.randn(*shape, device=DEV) * torch.rand(shape[0], 1, device=DEV) * 5).bfloat16()
    x[0] = 0  # a zero row keeps a finite scale
    col = torch.rand(shape[1], device=DEV) + 0.5 if with_cols else None
    third = shape[1] // 3
    parts = list(x.split([third, third, shape[1] - 2 * third], dim=1))
    sources = [x] if shape[1] < 48 else [x, parts, parts + [x[:, :16]]]  # a group's three; four: one cat
    for src in sources:  # through the dispatcher: Triton on CUDA (four sources: concatenated first)
        four = isinstance(src, list) and len(src) == 4
        c = torch.cat([col, col[:16]]) if four and col is not None else col
        q, s = fp8.quantize_rows(src, c) if four else quantize_rows(src, c)
        q_ref, s_ref = fp8.quantize_rows_eager(src, c)
        assert torch.equal(s, s_ref)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    if shape[1] >= 32:  # a strided view (a column slice) reads through its row stride
        q2, s2 = quantize_rows(x[:, 16:], None)
        q2_ref, s2_ref = fp8.quantize_rows_eager(x[:, 16:])
        assert torch.equal(s2, s2_ref) and torch.equal(q2.view(torch.uint8), q2_ref.view(torch.uint8))


def test_triton_transpose_cat_equals_torch():
    from kohakumoss_kernels.weights.fp8_triton import transpose_cat

    datas = [torch.randn(o, 3000, device=DEV).to(fp8.E4M3) for o in (3072, 100, 4096)]
    ref = torch.cat(datas).t().contiguous()
    assert torch.equal(transpose_cat(datas).view(torch.uint8), ref.view(torch.uint8))


def _lora_inputs(T=512, width=3072, outs=(3072,), r=32, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(T, width, device=DEV, generator=g).bfloat16().requires_grad_(True)
    ws = [torch.randn(o, width, device=DEV, generator=g) * width**-0.5 for o in outs]
    downs = [
        (torch.randn(r, width, device=DEV, generator=g) * width**-0.5).requires_grad_(True) for _ in outs
    ]
    ups = [(torch.randn(o, r, device=DEV, generator=g) * 0.05).requires_grad_(True) for o in outs]
    return x, ws, downs, ups


def _grads(outs, leaves):
    for leaf in leaves:
        leaf.grad = None
    torch.autograd.backward(list(outs), [torch.ones_like(o) * 0.01 for o in outs])
    return [leaf.grad.clone() for leaf in leaves]


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("backend", ["addmm", "addmm_lowrank"])
@pytest.mark.parametrize("compute", [True, False])
def test_lora_linear_fp8_tracks_the_dequantized_reference(backend, compute):
    x, (w,), (down,), (up,) = _lora_inputs(outs=(4096,))
    wq = fp8.Fp8Weight(*fp8.quantize_weight(w), compute=compute)
    fn = load_backend("lora_linear", backend, "sm90", torch.bfloat16, "fp8")
    y = fn(x, wq, None, down, up, 0.5)
    grads = _grads([y], [x, down, up])
    y_ref = eager_op("lora_linear")(x, wq, None, down, up, 0.5)
    ref = _grads([y_ref], [x, down, up])
    bound = 0.08 if compute else 0.01  # compute: x and gy rounded to e4m3 too (3 mantissa bits)
    assert _rel(y, y_ref) < bound
    for g, r in zip(grads, ref, strict=True):
        assert _rel(g, r) < bound


@pytest.mark.parametrize("backend", ["addmm", "addmm_lowrank"])
def test_lora_group_fp8_tracks_the_dequantized_reference(backend):
    """q, k, v as one fp8 group (x quantized once, one GEMM over the concatenated gradients for gx)
    against the eager group over dequantized weights, and against three single fp8 linears."""
    x, ws, downs, ups = _lora_inputs(outs=(3072, 3072, 3072))
    wqs = [fp8.Fp8Weight(*fp8.quantize_weight(w)) for w in ws]
    group = load_backend("lora_group", backend, "sm90", torch.bfloat16, "fp8")
    single = load_backend("lora_linear", backend, "sm90", torch.bfloat16, "fp8")
    leaves = [x, *downs, *ups]
    outs = group(x, wqs, [None] * 3, downs, ups, [0.5] * 3)
    grads = _grads(outs, leaves)
    ref_outs = eager_op("lora_group")(x, wqs, [None] * 3, downs, ups, [0.5] * 3)
    ref = _grads(ref_outs, leaves)
    singles = [single(x, w, None, d, u, 0.5) for w, d, u in zip(wqs, downs, ups, strict=True)]
    single_grads = _grads(singles, leaves)
    for o, r, o1 in zip(outs, ref_outs, singles, strict=True):
        assert _rel(o, r) < 0.08 and _rel(o, o1) < 1e-2  # the same x rounding as one member alone
    for g, r, g1 in zip(grads, ref, single_grads, strict=True):
        assert _rel(g, r) < 0.08
        assert _rel(g, r) < 1.5 * _rel(g1, r) + 1e-3  # one row scale over three gradients: no worse


def test_fp8_lora_step_replays_from_a_cuda_graph():
    x, (w,), (down,), (up,) = _lora_inputs(outs=(3072,))
    wq = fp8.Fp8Weight(*fp8.quantize_weight(w))
    fn = load_backend("lora_linear", "addmm_lowrank", "sm90", torch.bfloat16, "fp8")
    leaves = [x, down, up]
    eager = _grads([fn(x, wq, None, down, up, 0.5)], leaves)
    for leaf in leaves:
        leaf.grad = None
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _grads([fn(x, wq, None, down, up, 0.5)], leaves)  # warm-up: kernels compiled, picks made
        for leaf in leaves:
            leaf.grad = None
        with torch.cuda.graph(graph, stream=stream):
            y = fn(x, wq, None, down, up, 0.5)
            torch.autograd.backward([y], [torch.ones_like(y) * 0.01])
    torch.cuda.current_stream().wait_stream(stream)
    for leaf in leaves:
        leaf.grad.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for leaf, e in zip(leaves, eager, strict=True):
        torch.testing.assert_close(leaf.grad, e, atol=1e-3, rtol=1e-2)
