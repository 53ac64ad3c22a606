"""stored_linear on the GPU: each backend over its weight kind against the eager reference at the 5B
block's shapes in bf16 (output, input and bias gradients), the backends the card binds per kind, and
the op's forward and backward replayed from a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from kohakumoss_common.quant import convrot_hadamard
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.registry import eager_op, load_backend
from kohakumoss_kernels.runtime.capture import capture
from kohakumoss_kernels.weights import fp8, int8, mxfp8

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
    ),
]
DEV = torch.device("cuda")
WIDTH = 3072


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability(DEV)
    return f"sm{major}{minor}"


def _can(kind: str) -> bool:
    return {"fp8": fp8.can_compute, "int8": int8.can_compute, "mxfp8": mxfp8.can_compute}[kind](DEV)


def _weight(kind: str, out_f: int, group: int = 0):
    g = torch.Generator(device=DEV).manual_seed(0)
    w = torch.randn(out_f, WIDTH, device=DEV, generator=g) * WIDTH**-0.5
    if kind == "fp8":
        return fp8.Fp8Weight(*fp8.quantize_weight(w))
    if kind == "int8":
        if group:  # as a ConvRot file stores it: rotated per group of input columns, then quantized
            w = (w.reshape(out_f, -1, group) @ convrot_hadamard(group, DEV)).reshape(out_f, WIDTH)
        return int8.Int8Weight(*int8.quantize_weight(w), group=group)
    return mxfp8.quantize_weight(w)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _run(fn, w, tokens: int):
    """(y, x.grad, bias.grad) in bf16 under a fixed output gradient."""
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(tokens, WIDTH, device=DEV, generator=g).bfloat16().requires_grad_(True)
    bias = (torch.randn(w.shape[0], device=DEV, generator=g) * 0.1).bfloat16().requires_grad_(True)
    gy = torch.randn(tokens, w.shape[0], device=DEV, generator=g).bfloat16()
    y = fn(x, w, bias)
    y.backward(gy)
    return y.detach(), x.grad, bias.grad


# (kind, backend, bound on the relative error against the bf16 reference): the weight-only addmm differs
# by bf16 rounding alone; the 8-bit GEMMs round x (and fp8 gy) per row too
CASES = [
    ("int8", "addmm", 1e-2),
    ("int8", "int_mm", 0.02),
    ("fp8", "addmm", 1e-2),
    ("fp8", "scaled_mm", 0.08),
    ("mxfp8", "addmm", 1e-2),
    ("mxfp8", "block_scaled_mm", 0.06),
]


@pytest.mark.parametrize("out_f", [3072, 18432])
@pytest.mark.parametrize("tokens", [8, 4096])
@pytest.mark.parametrize(("kind", "backend", "bound"), CASES)
def test_backend_tracks_the_dequantized_reference(kind, backend, bound, tokens, out_f):
    fn = load_backend("stored_linear", backend, _arch(), torch.bfloat16, kind)
    if fn is None:
        assert backend == "block_scaled_mm" and not mxfp8.can_compute(DEV)  # only it may be missing
        pytest.skip(f"{backend} is not bound on {_arch()}")
    w = _weight(kind, out_f)
    got, ref = _run(fn, w, tokens), _run(eager_op("stored_linear"), w, tokens)
    for a, b in zip(got, ref, strict=True):
        assert torch.isfinite(a).all() and _rel(a, b) < bound, (_rel(a, b), bound)


@pytest.mark.parametrize("backend", ["addmm", "int_mm"])
def test_convrot_int8_tracks_the_reference(backend):
    """A ConvRot weight: its rotation on x (forward) and on the input gradient (backward)."""
    w = _weight("int8", 3072, group=256)
    fn = load_backend("stored_linear", backend, _arch(), torch.bfloat16, "int8")
    got, ref = _run(fn, w, 4096), _run(eager_op("stored_linear"), w, 4096)
    for a, b in zip(got, ref, strict=True):
        assert _rel(a, b) < 0.02


def test_the_card_binds_each_kinds_gemm_first():
    ops = OpSet("auto", tune="off")
    x = torch.randn(64, WIDTH, device=DEV, dtype=torch.bfloat16)
    first = {"int8": "int_mm", "fp8": "scaled_mm", "mxfp8": "block_scaled_mm"}
    for kind in ("int8", "fp8", "mxfp8"):
        ops.stored_linear(x, _weight(kind, 256), None)
        names = ops.bind("stored_linear", x.device, x.dtype, kind).names
        assert names[-2:] == ["addmm", "eager"]
        assert (names[0] == first[kind]) == _can(kind), (kind, names)


@pytest.mark.parametrize("kind", ["int8", "fp8", "mxfp8"])
def test_forward_and_backward_replay_from_a_cuda_graph(kind):
    """The bound op (its first backend) captured with its backward; a replay over new x equals an
    eager call of the same backend."""
    ops = OpSet("auto", tune="off")
    w = _weight(kind, 3072)
    x = torch.randn(512, WIDTH, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(512, 3072, device=DEV, dtype=torch.bfloat16)
    ops.stored_linear(x, w, None).backward(gy)  # warm-up: the binding made, kernels loaded
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with capture(graph, DEV):
        y = ops.stored_linear(x, w, None)
        y.backward(gy)
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
        x.grad.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    xe = x.detach().clone().requires_grad_(True)
    ye = ops.stored_linear(xe, w, None)
    ye.backward(gy)
    torch.testing.assert_close(y, ye.detach(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(x.grad, xe.grad, atol=1e-2, rtol=1e-2)
