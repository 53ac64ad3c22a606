"""stored_linear: one frozen linear over a stored weight (fp8 / int8 / MXFP8), its backends bound per
weight kind, each against the eager reference (the weight dequantized) on the CPU where it runs here."""

from __future__ import annotations

import pytest
import torch

from kohakumoss_common.quant import convrot_hadamard
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.op_list import SPECS, shape_key
from kohakumoss_kernels.registry import backend_fn, eager_op, resolve
from kohakumoss_kernels.weights import fp8, int8, mxfp8

OUT, IN, ROWS = 48, 64, 24  # rows > 16 and widths in multiples of 16 / 32: every GEMM form fits


def _cpu_scaled_mm_runs() -> bool:
    try:
        a = torch.zeros(16, 16, dtype=fp8.E4M3)
        torch._scaled_mm(a, a.t(), torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.float32)
        return True
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def _weight(kind: str, compute: bool = True, group: int = 0):
    w = torch.randn(OUT, IN, generator=torch.Generator().manual_seed(0)) * IN**-0.5
    if kind == "fp8":
        return fp8.Fp8Weight(*fp8.quantize_weight(w), compute=compute)
    if kind == "int8":
        if group:  # as a ConvRot file stores it: rotated per group of input columns, then quantized
            w = (w.reshape(OUT, -1, group) @ convrot_hadamard(group)).reshape(OUT, IN)
        return int8.Int8Weight(*int8.quantize_weight(w), group=group, compute=compute)
    return mxfp8.quantize_weight(w, compute=compute)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _run(fn, w, with_bias: bool = True):
    """(y, x.grad, bias.grad) of fn(x, w, bias) under a fixed loss."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, ROWS // 2, IN, generator=g).requires_grad_(True)  # leading dims: reshaped rows
    bias = torch.randn(OUT, generator=g).requires_grad_(True) if with_bias else None
    y = fn(x, w, bias)
    (y * torch.linspace(-1, 1, OUT)).square().sum().backward()
    return y.detach(), x.grad, bias.grad if bias is not None else None


# (kind, backend, weight's compute flag, ConvRot group): the forms the CPU runs
WEIGHT_ONLY = [
    ("fp8", "addmm", True, 0),
    ("fp8", "addmm", False, 0),
    ("int8", "addmm", True, 0),
    ("int8", "addmm", False, 16),
    ("int8", "int_mm", False, 0),  # int8_weight: int_mm takes the weight-only form too
    ("int8", "int_mm", False, 16),
    ("mxfp8", "addmm", True, 0),
    ("fp8", "scaled_mm", False, 0),
]


@pytest.mark.parametrize(("kind", "backend", "compute", "group"), WEIGHT_ONLY)
def test_weight_only_forms_equal_the_reference(kind, backend, compute, group):
    """Weight-only: the same float32 products as the reference over the dequantized weight (output, input
    and bias gradients), the rotation of a ConvRot weight moved onto x and back."""
    w = _weight(kind, compute, group)
    ref = _run(eager_op("stored_linear"), w)
    got = _run(backend_fn("stored_linear", backend), w)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
    assert ref[0].shape == (2, ROWS // 2, OUT)


@pytest.mark.parametrize("group", [0, 16])
def test_int_mm_is_the_int8_gemm_within_x_rounding(group):
    """int_mm over a computing weight: x rounded to 8 bits per row (so not equal to the reference, but
    within that rounding); its input gradient is the weight-only one (equal)."""
    w = _weight("int8", True, group)
    ref = _run(eager_op("stored_linear"), w)
    y, gx, gb = _run(backend_fn("stored_linear", "int_mm"), w)
    assert 1e-5 < _rel(y, ref[0]) < 0.01
    xr = torch.randn(ROWS, IN, generator=torch.Generator().manual_seed(1))
    xq, sx = int8.quantize_rows(int8.rotate(xr, group) if group else xr)  # the int8 GEMM's exact operands
    exact = (xq.double() * sx.double()) @ (w.data.double() * w.scale.double()[:, None]).t()
    torch.testing.assert_close(
        backend_fn("stored_linear", "int_mm")(xr, w, None).double(), exact, atol=1e-5, rtol=1e-5
    )
    assert _rel(gx, ref[1]) < 0.02 and _rel(gb, ref[2]) < 0.02


@pytest.mark.skipif(not _cpu_scaled_mm_runs(), reason="no row-wise fp8 GEMM on this CPU build")
def test_scaled_mm_is_the_fp8_gemm_within_e4m3_rounding():
    w = _weight("fp8", True)
    ref = _run(eager_op("stored_linear"), w)
    y, gx, gb = _run(backend_fn("stored_linear", "scaled_mm"), w)
    assert 1e-4 < _rel(y, ref[0]) < 0.08 and 1e-4 < _rel(gx, ref[1]) < 0.12
    assert _rel(gb, ref[2]) < 0.08  # gy's column sums (gy follows y's rounding under this loss)


@pytest.mark.parametrize("kind", ["fp8", "int8", "mxfp8"])
def test_backends_keep_no_dequantized_weight_for_the_backward(kind):
    """The reference keeps the dequantized [O, I] weight for its input gradient; the backends keep the
    stored bytes and dequantize again in the backward (the point of 8-bit storage while training)."""

    def saved_weights(fn) -> int:
        shapes = []

        def pack(t):
            shapes.append((t.numel(), t.dtype))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _run(fn, _weight(kind, compute=False))
        return sum(s == (OUT * IN, torch.float32) for s in shapes)  # [O, I] or its transpose

    assert saved_weights(eager_op("stored_linear")) == 1
    names = [n for n in ("addmm", "int_mm", "scaled_mm") if kind in _module(n).WEIGHTS]
    for name in names:
        assert saved_weights(backend_fn("stored_linear", name)) == 0, name


def _module(backend: str):
    import importlib

    return importlib.import_module(f"kohakumoss_kernels.ops.stored_linear.{backend}")


def test_each_weight_kind_binds_its_own_backends_per_arch():
    """Each kind's 8-bit GEMM first where the arch has it (int8's not on sm90, where it measured slower),
    the weight-only addmm everywhere, the reference last; MXFP8's block-scaled GEMM only on sm100+; the CPU runs the reference unless a backend is named."""
    assert SPECS["stored_linear"].weight_arg == 1 and not SPECS["stored_linear"].compile

    def names(arch: str, kind: str, backend: str = "auto") -> list[str]:
        return resolve("stored_linear", arch, torch.bfloat16, backend=backend, kind=kind).names

    assert names("sm80", "int8") == ["int_mm", "addmm", "eager"]
    assert names("sm90", "int8") == ["addmm", "eager"]  # torch._int_mm measured 1.7-3.1x slower there
    assert names("sm90", "int8", "int_mm,addmm") == ["int_mm", "addmm", "eager"]  # named: offered
    assert names("sm90", "fp8") == ["scaled_mm", "addmm", "eager"]
    assert names("sm90", "mxfp8") == ["addmm", "eager"]
    assert names("sm100", "mxfp8") == ["block_scaled_mm", "addmm", "eager"]
    assert names("sm120", "mxfp8")[0] == "block_scaled_mm"
    assert names("sm80", "fp8") == ["addmm", "eager"] and names("sm75", "int8") == ["addmm", "eager"]
    for kind in ("fp8", "int8", "mxfp8", "dense"):
        assert names("cpu", kind) == ["eager"]
    named = "int_mm,scaled_mm,block_scaled_mm,addmm"
    assert names("cpu", "int8", named) == ["int_mm", "addmm", "eager"]
    assert names("cpu", "fp8", named) == ["scaled_mm", "addmm", "eager"]
    assert names("cpu", "mxfp8", named) == ["addmm", "eager"]  # no block-scaled GEMM on a CPU
    assert names("sm90", "dense") == ["eager"]  # a plain tensor has no stored form: the reference


def test_opset_binds_stored_linear_per_weight_kind():
    ops = OpSet("int_mm,scaled_mm,addmm", tune="off")
    x = torch.randn(ROWS, IN)
    for kind in ("fp8", "int8", "mxfp8"):
        w = _weight(kind, compute=False)
        torch.testing.assert_close(ops.stored_linear(x, w, None), eager_op("stored_linear")(x, w, None))
    bound = {k[3]: b.names for k, b in ops._bound.items()}
    assert bound == {
        "fp8": ["scaled_mm", "addmm", "eager"],
        "int8": ["int_mm", "addmm", "eager"],
        "mxfp8": ["addmm", "eager"],
    }
    assert "stored_linear[int8]@cpu/torch.float32" in ops.chosen()


def test_shape_keys_carry_the_weight_kind():
    x = torch.zeros(300, IN)
    assert (
        shape_key("stored_linear", x, _weight("int8"), None)
        == f"stored_linear|fp32|W=int8|T=512|I={IN}|O={OUT}"
    )
    assert shape_key("stored_linear", x, _weight("mxfp8"), None).startswith("stored_linear|fp32|W=mxfp8|")


def test_the_reference_is_never_timed_over_a_stored_weight(monkeypatch):
    """The reference keeps a dequantized copy for its backward: over a stored weight it stays the last
    resort, out of the tuner's race (a plain tensor's reference still races)."""
    from kohakumoss_kernels import tuning

    timed = []
    monkeypatch.setattr(tuning, "time_call", lambda fn, *a, **k: timed.append(fn) or 1.0)
    bound = resolve("stored_linear", "cpu", torch.float32, backend="int_mm,addmm", tune="always", kind="int8")
    w = _weight("int8")
    order = [n for n, _ in bound.order(torch.randn(ROWS, IN), w, None)]
    assert order[-1] == "eager" and set(bound.choices.values()) <= {"int_mm", "addmm"}
    assert len(timed) == 2 and eager_op("stored_linear") not in timed
    timed.clear()
    dense = resolve("rms_norm", "cpu", torch.float32, backend="compile", tune="always")
    dense.order(torch.randn(4, 8), None, 1e-6)
    assert eager_op("rms_norm") in timed
