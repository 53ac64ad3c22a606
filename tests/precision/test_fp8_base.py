"""BASE_PRECISION fp8 / fp8_weight: the blocks' frozen linears stored in float8 with row scales
(kohakumoss/precision/fp8_base.py over kohakumoss_kernels/weights/fp8.py), checked against the float32 reference."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kohakumoss.adapters import build_adapter
from kohakumoss.precision import quantize_frozen_linears
from kohakumoss_common.errors import ConfigError
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.weights import fp8

from ..adapters.helpers import flow_batch, flow_loss, tiny_model

needs_cpu_scaled_mm = pytest.mark.skipif(
    not hasattr(torch, "_scaled_mm"), reason="this torch has no _scaled_mm"
)


def _cpu_scaled_mm_runs() -> bool:
    try:
        a = torch.zeros(16, 16, dtype=fp8.E4M3)
        torch._scaled_mm(a, a.t(), torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.float32)
        return True
    except (RuntimeError, NotImplementedError):
        return False


cpu_fp8 = pytest.mark.skipif(not _cpu_scaled_mm_runs(), reason="no row-wise fp8 GEMM on this CPU build")


def test_weight_quantization_error_is_within_e4m3_rounding():
    w = torch.randn(48, 64) * torch.logspace(-3, 1, 48)[:, None]  # rows of very different ranges
    data, scale = fp8.quantize_weight(w)
    assert data.dtype == fp8.E4M3 and scale.shape == (48,)
    back = fp8.Fp8Weight(data, scale).dequant(torch.float32)
    # 3 mantissa bits: half an ulp is 2^-4 of the value; below e4m3's normal range the step is 2^-9 * scale
    bound = w.abs() / 16 + scale[:, None] * 2.0**-9
    assert ((back - w).abs() <= bound * 1.0001).all()
    torch.testing.assert_close(back.abs().amax(1), w.abs().amax(1))  # each row's largest value: 448 * scale


def test_quantize_rows_folds_column_scales_and_keeps_zero_rows_finite():
    x = torch.randn(5, 32)
    x[2] = 0
    col = torch.rand(32) + 0.5
    q, s = fp8.quantize_rows_eager(x, col)
    assert q.dtype == fp8.E4M3 and s.shape == (5, 1) and torch.isfinite(s).all()
    torch.testing.assert_close(q.float() * s, x * col, atol=0, rtol=2.0**-4)
    assert q[2].float().abs().sum() == 0


@cpu_fp8
def test_fp8_gemms_equal_the_quantized_math():
    """Forward x W^T and backward gy W as fp8 GEMMs: exactly the products of the quantized operands."""
    torch.manual_seed(0)
    x, gy, w = torch.randn(24, 64), torch.randn(24, 48), torch.randn(48, 64) * 0.1
    wq = fp8.Fp8Weight(*fp8.quantize_weight(w))
    xq, sx = fp8.quantize_rows_eager(x)
    ref = (xq.float() * sx) @ wq.dequant(torch.float32).t()
    torch.testing.assert_close(fp8.linear(x, wq), ref, atol=1e-5, rtol=1e-5)
    gq, sg = fp8.quantize_rows_eager(gy, wq.scale)
    ref_gx = (gq.float() * sg) @ wq.data.float()
    torch.testing.assert_close(fp8.grad_input([gy], [wq]), ref_gx, atol=1e-5, rtol=1e-5)
    # two members: one GEMM over the concatenated outputs, the sum of the members' products
    w2 = fp8.Fp8Weight(*fp8.quantize_weight(torch.randn(16, 64)))
    gy2 = torch.randn(24, 16)
    both = fp8.grad_input([gy, gy2], [wq, w2])
    gcat, scat = fp8.quantize_rows_eager(torch.cat([gy, gy2], 1), torch.cat([wq.scale, w2.scale]))
    ref_both = (gcat.float() * scat) @ torch.cat([wq.data, w2.data]).float()
    torch.testing.assert_close(both, ref_both, atol=1e-5, rtol=1e-5)


def _lora_model(mode: str, backend: str):
    model = tiny_model()
    model.ops = OpSet(backend, tune="off")
    model.requires_grad_(False)  # as the trainer builds it (train/components.py): the base frozen
    n = quantize_frozen_linears(model, mode, torch.device("cpu")) if mode != "same" else 0
    net = build_adapter(model, rank=4, alpha=4.0, preset="attn-mlp", bypass=True)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for m in net.loras:
            m.lora_up.weight.copy_(torch.randn(m.lora_up.weight.shape, generator=g) * 0.1)
    return model, net, n


def _loss_grads(model, net):
    loss = flow_loss(model, flow_batch())
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in net.parameters()]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("mode", ["fp8", "fp8_weight"])
def test_lora_training_on_an_fp8_base_tracks_the_full_precision_one(mode):
    if mode == "fp8" and not _cpu_scaled_mm_runs():
        pytest.skip("no row-wise fp8 GEMM on this CPU build")
    ref_loss, ref_grads = _loss_grads(*_lora_model("same", "addmm")[:2])
    model, net, n = _lora_model(mode, "addmm")
    blocks = len(model.layers)
    assert n == 6 * blocks  # q, k, v, o, ffn_up_gate, ffn_down
    lin = model.layers[0].proj["q"]
    assert (
        lin.weight.dtype == fp8.E4M3
        and not lin.weight.requires_grad
        and lin.weight_scale.dtype == torch.float32
    )
    assert model.shared_block_modulation.weight.dtype == torch.float32  # the per-sample linears stay
    loss, grads = _loss_grads(model, net)
    bound = {(op, kind) for op, _, _, kind in model.ops._bound}  # every LoRA op bound for fp8 weights alone
    assert {("lora_group", "fp8"), ("lora_linear", "fp8")} <= bound
    assert not {("lora_group", "dense"), ("lora_linear", "dense")} & bound
    assert abs(float(loss - ref_loss)) < 0.02 * float(ref_loss)
    errs = [_rel(g, r) for g, r in zip(grads, ref_grads, strict=True)]
    assert max(errs) < 0.15, errs  # e4m3's rounding, through every block
    assert all(g.abs().sum() > 0 for g in grads)


def test_weight_only_fast_path_equals_the_dequantized_reference():
    """fp8_weight through the cuBLAS forms (addmm) against the eager op over the dequantized weights."""
    model, net, _ = _lora_model("fp8_weight", "addmm")
    loss, grads = _loss_grads(model, net)
    ref_model, ref_net, _ = _lora_model("fp8_weight", "eager")
    ref_loss, ref_grads = _loss_grads(ref_model, ref_net)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-6)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-5)


@cpu_fp8
def test_a_frozen_fp8_linear_without_lora_has_its_input_gradient():
    torch.manual_seed(0)
    lin = nn.Linear(64, 32).requires_grad_(False)
    holder = nn.Module()
    holder.layers = nn.ModuleList([nn.Module()])
    holder.layers[0].o = lin
    ref_w = lin.weight.clone()
    x = torch.randn(8, 64, requires_grad=True)
    holder.ops = OpSet("scaled_mm", tune="off")  # the CPU registry runs the reference unless named
    assert quantize_frozen_linears(holder, "fp8", torch.device("cpu")) == 1
    y = lin(x)
    assert holder.ops.chosen()["stored_linear[fp8]@cpu/torch.float32"]["*"] == "scaled_mm"
    y.square().sum().backward()
    xr = x.detach().clone().requires_grad_(True)
    yr = xr @ ref_w.t() + lin.bias
    yr.square().sum().backward()
    assert _rel(y.detach(), yr.detach()) < 0.08 and _rel(x.grad, xr.grad) < 0.12


def test_bad_base_precision_and_a_trainable_base_are_refused_by_name():
    model = tiny_model().requires_grad_(False)
    with pytest.raises(ConfigError, match="BASE_PRECISION.*'fp16' is not one of"):
        quantize_frozen_linears(model, "fp16")
    model.requires_grad_(True)
    with pytest.raises(ConfigError, match="BASE_PRECISION.*frozen base"):
        quantize_frozen_linears(model, "fp8_weight")


@pytest.mark.parametrize(("mode", "bound"), [("fp8_weight", 2e-2), ("fp8", 3e-2)])
def test_fp8_forward_error_against_the_float64_reference(mode, bound):
    """docs/concepts/numerics.md's fp8 rows (`pytest -s -k float64_reference tests/precision`)."""
    from kohakumoss.model import get_preset
    from kohakumoss.model.reference import reference_forward

    from ..model.helpers import random_batch, random_model
    from ..model.test_parity import IMG_SIZES, TEXT_LENS, rel_err

    if mode == "fp8" and not _cpu_scaled_mm_runs():
        pytest.skip("no row-wise fp8 GEMM on this CPU build")
    cfg = get_preset("tiny")
    model = random_model(cfg, 0).requires_grad_(False)
    backend = "scaled_mm" if mode == "fp8" else "addmm"  # fp8 GEMMs, or the weight-only form
    model.ops = OpSet(backend, tune="off")
    quantize_frozen_linears(model, mode, torch.device("cpu"))
    imgs, texts, sigma, seq = random_batch(cfg, TEXT_LENS, IMG_SIZES, 0, torch.float32)
    with torch.no_grad():
        packed = model(torch.cat(imgs), torch.cat(texts), sigma, seq)
    assert model.ops.chosen()["stored_linear[fp8]@cpu/torch.float32"]["*"] == backend
    ref_model = random_model(cfg, 0).double()
    ref = reference_forward(
        ref_model, [i.double() for i in imgs], [t.double() for t in texts], IMG_SIZES, sigma.double()
    )
    errors = [rel_err(p, r) for p, r in zip(torch.split(packed, list(seq.img_lens)), ref, strict=True)]
    print(f"{mode}: per-sample error against float64 {[f'{e:.2e}' for e in errors]}")
    assert max(errors) < bound and min(errors) > 1e-4  # fp8's rounding shows; nothing worse


def test_a_linear_whose_width_fp8_gemms_cannot_take_is_dequantized_instead():
    holder = nn.Module()
    holder.layers = nn.ModuleList([nn.Module()])
    holder.layers[0].o = nn.Linear(40, 24).requires_grad_(False)  # 40: not a multiple of 16
    holder.layers[0].ffn_down = nn.Linear(32, 48).requires_grad_(False)
    quantize_frozen_linears(holder, "fp8", torch.device("cpu"))
    assert not holder.layers[0].o.fp8_compute and holder.layers[0].ffn_down.fp8_compute
    assert holder.layers[0].o.weight.dtype == fp8.E4M3
    assert holder.layers[0].o(torch.randn(3, 40)).shape == (3, 24)


def test_fp8_linears_are_lycoris_weight_only_fp8_linears_and_survive_a_model_cast():
    from lycoris.modules.base import is_weight_only_fp8_linear

    from kohakumoss.precision import fp8_base

    model = tiny_model().requires_grad_(False)
    quantize_frozen_linears(model, "fp8_weight", torch.device("cpu"))
    lin = model.layers[1].proj["ffn_down"]
    assert isinstance(lin, fp8_base.Fp8Linear) and is_weight_only_fp8_linear(lin)
    before = lin.weight.detach().view(torch.uint8).clone(), lin.weight_scale.clone()
    model.to(torch.bfloat16)  # a cast re-types the other weights, never the fp8 bytes or their scales
    assert lin.weight.dtype == fp8.E4M3 and lin.weight_scale.dtype == torch.float32
    assert torch.equal(lin.weight.view(torch.uint8), before[0]) and torch.equal(lin.weight_scale, before[1])
    assert lin.source_dtype == torch.bfloat16 and model.shared_block_modulation.weight.dtype == torch.bfloat16
    assert lin(torch.randn(3, lin.in_features, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_adapters_that_read_the_frozen_weight_are_refused_on_an_fp8_base():
    from kohakumoss.adapters.algos import ALGOS, base_precision_check
    from kohakumoss.adapters.config import AdapterConfig as A

    quantized = [a for a, r in ALGOS.items() if r.quantized_base and not r.dora()]
    assert {"lora", "locon", "loha", "lokr", "glora"} <= set(quantized)
    ok = [(A(algo=a), "fp8") for a in quantized]
    ok += [(A(algo="lokr", algo_args={"dora_wd": True}), "fp8")]
    ok += [(A(algo=a), "same") for a in (*ALGOS, "full")]
    assert [k for k in ok if base_precision_check(*k) is not None] == []
    bad = [(A(algo=a), "fp8_weight") for a in (*ALGOS, "full") if a not in quantized]
    assert {"dora", "oft", "boft", "ia3", "tlora", "full"} <= {a.algo for a, _ in bad}
    bad += [(A(algo="lora", algo_args={"dora_wd": True}), "fp8")]
    assert [k for k in bad if base_precision_check(*k) is None] == []
    assert "without DoRA" in base_precision_check(*bad[-1])
