"""MXFP8 (kohakumoss_kernels/weights/mxfp8.py): the quantizer against a float64 reference of the OCP MX rule, the
GEMM's scale layout, BASE_PRECISION mxfp8's modules over the eager ops, and its refusal off sm100+."""

from __future__ import annotations

import math

import pytest
import torch

from kohakumoss.adapters import build_adapter
from kohakumoss.precision import Mxfp8Linear, quantize_frozen_linears
from kohakumoss_common.errors import ConfigError
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.registry import resolve
from kohakumoss_kernels.weights import mxfp8

from ..adapters.helpers import flow_batch, flow_loss, tiny_model


def _e4m3_round(v: float) -> float:
    """v (already scaled) to the nearest e4m3 value, ties to even, saturated at 448: float64 arithmetic."""
    a = abs(v)
    if a == 0:
        return 0.0
    p = max(math.floor(math.log2(a)), -6)  # below 2^-6 the subnormal step 2^-9
    step = 2.0 ** (p - 3)
    q = round(a / step) * step  # Python's round: half to even
    return math.copysign(min(q, 448.0), v)


def _reference(x: torch.Tensor) -> tuple[list[list[int]], torch.Tensor]:
    """Per 32-block: exponent floor(log2(amax)) - 8 (-127 for a zero block), values rounded in float64."""
    rows, k = x.shape
    xs = x.double().tolist()
    exps, out = [], torch.zeros(rows, k, dtype=torch.float64)
    for r in range(rows):
        row_e = []
        for b in range(k // 32):
            block = xs[r][b * 32 : (b + 1) * 32]
            amax = max(abs(v) for v in block)
            e = -127 if amax == 0 else max(-127, min(127, math.floor(math.log2(amax)) - 8))
            row_e.append(e)
            for j, v in enumerate(block):
                out[r, b * 32 + j] = _e4m3_round(v / 2.0**e) * 2.0**e
        exps.append(row_e)
    return exps, out


def _inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 128, generator=g) * torch.logspace(-30, 30, 6)[:, None]  # e8m0's range, both ends
    x[1, 32:64] = 0  # an all-zero block
    x[2, :32] = torch.linspace(-480.0, 480.0, 32)  # amax / 2^e in (448, 512): saturated at 448
    x[3, 64:96] = torch.randn(32, generator=g) * 1e-3 + torch.tensor([0.0] * 31 + [1.0])  # subnormals
    return x


def test_quantizer_equals_the_float64_reference():
    x = _inputs()
    data, scale = mxfp8.quantize(x)
    assert data.dtype == torch.float8_e4m3fn and scale.dtype == torch.float8_e8m0fnu and scale.shape == (6, 4)
    exps, ref = _reference(x)
    assert mxfp8.scale_exponents(scale).tolist() == exps
    got = mxfp8.dequantize(data, scale, torch.float64)
    assert torch.equal(got, ref)  # every value: the same e4m3 code and exponent
    assert (mxfp8.scale_exponents(scale)[1, 1] == -127) and (data[1, 32:64].float() == 0).all()
    assert data[2, 0].float() == -448 and mxfp8.scale_exponents(scale)[2, 0] == 0  # saturated, not 480


def test_quantizer_error_bound():
    """Half an e4m3 ulp of each value (or of the subnormal step) times its block scale, except the
    saturated values of a block whose amax lands in (448, 512) * scale."""
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(3)) * 3
    data, scale = mxfp8.quantize(x)
    back = mxfp8.dequantize(data, scale)
    s = torch.exp2(mxfp8.scale_exponents(scale).double()).float().repeat_interleave(32, dim=1)
    bound = torch.maximum(x.abs() * 2.0**-4, s * 2.0**-10)
    saturated = x.abs() > 448 * s
    assert ((back - x).abs() <= bound * 1.0001)[~saturated].all()
    assert torch.equal(back[saturated].abs(), (448 * s)[saturated])


def test_blocked_scale_layout():
    """to_blocked puts scale (r, c) at tile (r // 128, c // 4), row (r % 32) of the tile's 32 x 16, column
    4 * ((r % 128) // 32) + c % 4; padding zero."""
    rows, cols = 200, 6
    raw = torch.randint(0, 255, (rows, cols), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    flat = mxfp8.to_blocked(raw.view(torch.float8_e8m0fnu)).view(torch.uint8)
    rb, cb = 2, 2
    assert flat.numel() == rb * cb * 512
    want = torch.zeros(rb * cb * 512, dtype=torch.uint8)
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * cb + c // 4
            want[tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4] = raw[r, c]
    assert torch.equal(flat, want)


def test_mxfp8_refused_off_blackwell_by_name():
    model = tiny_model().requires_grad_(False)
    with pytest.raises(ConfigError, match="BASE_PRECISION.*'mxfp8'.*sm100\\+.*cpu has no block-scaled"):
        quantize_frozen_linears(model, "mxfp8", torch.device("cpu"))
    assert not mxfp8.can_compute(torch.device("cpu"))


def test_registry_selects_the_block_scaled_gemm_on_blackwell_only():
    names = lambda arch: resolve("stored_linear", arch, torch.bfloat16, kind="mxfp8").names  # noqa: E731
    assert names("sm100")[0] == "block_scaled_mm" and names("sm120")[0] == "block_scaled_mm"
    assert "block_scaled_mm" not in names("sm90") and "block_scaled_mm" not in names("sm89")
    assert names("cpu") == ["eager"]


def _model(mode_compute: bool, backend: str):
    model = tiny_model()
    model.ops = OpSet(backend, tune="off")
    model.requires_grad_(False)
    quantize_frozen_linears(model, "mxfp8")  # no device: the quantization alone (the CPU runs no MX GEMM)
    for m in model.modules():
        if isinstance(m, Mxfp8Linear):
            m.mxfp8_compute = mode_compute
    net = build_adapter(model, rank=4, alpha=4.0, preset="attn-mlp", bypass=True)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for m in net.loras:
            m.lora_up.weight.copy_(torch.randn(m.lora_up.weight.shape, generator=g) * 0.1)
    return model, net


def test_lora_on_an_mxfp8_base_through_the_lora_ops():
    """The modules and the LoRA twins over the dequantized weights: addmm (its mxfp8 branch, dequantized
    here) equals the eager reference; both track the full-precision model."""
    model, net = _model(False, "addmm")
    lin = model.layers[0].proj["q"]
    assert isinstance(lin, Mxfp8Linear) and lin.weight.dtype == torch.float8_e4m3fn
    assert lin.weight_scale.shape == (lin.out_features, lin.in_features // 32)
    loss = flow_loss(model, flow_batch())
    loss.backward()
    grads = [p.grad.clone() for p in net.parameters()]
    bound = {(op, kind) for op, _, _, kind in model.ops._bound}
    assert {("lora_group", "mxfp8"), ("lora_linear", "mxfp8")} <= bound
    ref_model, ref_net = _model(False, "eager")
    ref = flow_loss(ref_model, flow_batch())
    ref.backward()
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-6)
    for g, r in zip(grads, [p.grad for p in ref_net.parameters()], strict=True):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-5)
    full_model = tiny_model()
    full_model.ops = OpSet("addmm", tune="off")
    full_model.requires_grad_(False)
    full = flow_loss(full_model, flow_batch())
    assert abs(float(loss.detach() - full)) < 0.02 * float(full)


def test_adapters_run_in_bypass_and_merges_see_the_dequantized_weight():
    """BYPASS=False on an MXFP8 base still runs lycoris's bypass forward (its merged-weight forward would
    read the e4m3 bytes); a merged export's state holds the dequantized weight, no scale."""
    from kohakumoss.adapters.merge import dense_state_dict

    model = tiny_model().requires_grad_(False)
    quantize_frozen_linears(model, "mxfp8")
    lin = model.layers[0].proj["q"]
    want = mxfp8.dequantize(lin.weight, lin.weight_scale)
    state = dense_state_dict(model)
    assert torch.equal(state["layers.0.proj.q.weight"], want)
    assert "layers.0.proj.q.weight_scale" not in state
    net = build_adapter(model, algo="lokr", rank=4, alpha=4.0, preset="attn-mlp", bypass=False)
    assert all(m.bypass_mode for m in net.loras)
    assert torch.isfinite(flow_loss(model, flow_batch())).all()
