"""BASE_PRECISION int8 / int8_weight: int8 block linears with row scales (kohakumoss_kernels/weights/int8.py,
precision/int8_base.py), ConvRot files kept int8 with the rotation on the activations, checked against
the dequantized float reference."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from kohakumoss.adapters import build_adapter
from kohakumoss.model import get_preset
from kohakumoss.model.io import load_backbone, save_backbone
from kohakumoss.precision import Int8Linear, quantize_frozen_linears, stored_int8_weights
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.quant import convrot_hadamard, dequantize
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.weights import int8

from ..adapters.helpers import flow_batch, flow_loss, tiny_model


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_weight_quantization_error_is_half_a_step():
    w = torch.randn(48, 64) * torch.logspace(-3, 1, 48)[:, None]  # rows of very different ranges
    data, scale = int8.quantize_weight(w)
    assert data.dtype == torch.int8 and scale.shape == (48,)
    back = int8.Int8Weight(data, scale).dequant(torch.float32)
    assert ((back - w).abs() <= scale[:, None] * 0.5 * 1.0001).all()  # round to nearest: half a step
    torch.testing.assert_close(back.abs().amax(1), w.abs().amax(1))  # each row's largest value: 127 * scale


def test_int_mm_runs_on_this_cpu():
    """torch._int_mm exists on the CPU too: exact int32 products (the CPU tests below rely on it)."""
    a = torch.randint(-127, 128, (5, 64), dtype=torch.int8)
    b = torch.randint(-127, 128, (48, 64), dtype=torch.int8)
    assert torch.equal(torch._int_mm(a, b.t()), a.int() @ b.int().t())


def _convrot(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a ConvRot file stores for float weight w: (W @ H per group) quantized per row."""
    o, i = w.shape
    h = convrot_hadamard(group)
    return int8.quantize_weight((w.reshape(o, i // group, group) @ h).reshape(o, i))


@pytest.mark.parametrize("group", [0, 16])
def test_int8_products_equal_the_dequantized_reference(group):
    """Forward (int8 GEMM and weight-only) and input gradient against the float64 product of the
    dequantized weight; the int8 GEMM's error is x's 8-bit rounding, the weight-only one float32's."""
    torch.manual_seed(0)
    x, gy = torch.randn(24, 64), torch.randn(24, 48)
    data, scale = (
        _convrot(torch.randn(48, 64) * 0.1, group) if group else int8.quantize_weight(torch.randn(48, 64))
    )
    w = int8.Int8Weight(data, scale, group)
    ref_w = dequantize(data, scale, torch.float64, group)  # kohakumoss_common.quant: the load-time maths
    torch.testing.assert_close(w.dequant(torch.float64), ref_w)
    ref = x.double() @ ref_w.t()
    assert _rel(int8.linear_weight_only(x, w).double(), ref) < 1e-6
    xr = int8.rotate(x, group) if group else x
    xq, sx = int8.quantize_rows(xr)
    exact = (xq.double() * sx.double()) @ (data.double() * scale.double()[:, None]).t()
    torch.testing.assert_close(int8.linear_int_mm(x, w).double(), exact, atol=1e-5, rtol=1e-5)
    assert _rel(int8.linear_int_mm(x, w).double(), ref) < 0.01  # 8-bit x: ~0.4% / sqrt(fan-in) noise
    torch.testing.assert_close(int8.grad_input([gy], [w]).double(), gy.double() @ ref_w, atol=1e-5, rtol=1e-5)


def test_frozen_int8_linear_through_the_registry():
    """Int8Linear -> ops.stored_linear (the int8 kind): eager (the dequantized reference), int_mm and addmm backends agree;
    the input gradient flows through each."""
    outs = {}
    for backend in ("eager", "int_mm", "addmm"):
        torch.manual_seed(1)
        lin = nn.Linear(64, 32).requires_grad_(False)
        nn.init.normal_(lin.weight)
        holder = nn.Module()
        holder.layers = nn.ModuleList([nn.Module()])
        holder.layers[0].o = lin
        holder.ops = OpSet(backend, tune="off")
        assert quantize_frozen_linears(holder, "int8", torch.device("cpu")) == 1
        assert isinstance(lin, Int8Linear) and lin.weight.dtype == torch.int8
        x = torch.randn(20, 64, generator=torch.Generator().manual_seed(2), requires_grad=True)
        y = lin(x)
        y.square().sum().backward()
        assert holder.ops.chosen()["stored_linear[int8]@cpu/torch.float32"]["*"] == backend
        outs[backend] = (y.detach(), x.grad)
    ref_y, ref_gx = outs["eager"]
    torch.testing.assert_close(outs["addmm"][0], ref_y, atol=1e-5, rtol=1e-5)
    assert _rel(outs["int_mm"][0], ref_y) < 0.01
    for b in ("int_mm", "addmm"):
        assert _rel(outs[b][1], ref_gx) < 0.02


def _lora_model(mode: str, backend: str):
    model = tiny_model()
    model.ops = OpSet(backend, tune="off")
    model.requires_grad_(False)
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


@pytest.mark.parametrize("mode", ["int8", "int8_weight"])
def test_lora_training_on_an_int8_base_tracks_the_full_precision_one(mode):
    ref_loss, ref_grads = _loss_grads(*_lora_model("same", "addmm")[:2])
    model, net, n = _lora_model(mode, "addmm")
    assert n == 6 * len(model.layers)
    lin = model.layers[0].proj["q"]
    assert lin.weight.dtype == torch.int8 and lin.weight_scale.dtype == torch.float32
    loss, grads = _loss_grads(model, net)
    bound = {(op, kind) for op, _, _, kind in model.ops._bound}  # every LoRA op bound for int8 weights alone
    assert {("lora_group", "int8"), ("lora_linear", "int8")} <= bound
    assert not {("lora_group", "dense"), ("lora_linear", "dense")} & bound
    assert abs(float(loss - ref_loss)) < 0.01 * float(ref_loss)
    errs = [_rel(g, r) for g, r in zip(grads, ref_grads, strict=True)]
    assert max(errs) < 0.05, errs  # int8 rows: ~8x finer than e4m3
    assert all(g.abs().sum() > 0 for g in grads)


def test_int8_weight_fast_path_equals_the_dequantized_reference():
    """int8_weight through the cuBLAS forms (addmm) against the eager op over the dequantized weights."""
    model, net, _ = _lora_model("int8_weight", "addmm")
    loss, grads = _loss_grads(model, net)
    ref_model, ref_net, _ = _lora_model("int8_weight", "eager")
    ref_loss, ref_grads = _loss_grads(ref_model, ref_net)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-6)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-5)


def test_int8_refused_on_a_trained_base_and_on_old_cards():
    model = tiny_model()
    with pytest.raises(ConfigError, match="frozen base"):
        quantize_frozen_linears(model, "int8_weight")
    with pytest.raises(ConfigError, match="'int8' needs a CUDA card of sm80\\+ or the CPU"):
        quantize_frozen_linears(model.requires_grad_(False), "int8", torch.device("meta"))


def _write_convrot(src: str, dst, group: int) -> dict:
    """A ConvRot int8 file per the published format (Comfy-Org layout, fused qkv) from a bf16 one."""
    from safetensors import safe_open

    from kohakumoss_common.io import iter_tensors

    with safe_open(src, "pt") as f:
        metadata = f.metadata()

    out, stored = {}, {}
    marker = json.dumps({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group})
    for key, t in iter_tensors(src):
        if key.startswith("layers.") and ".proj." in key and key.endswith(".weight") and t.dim() == 2:
            q, s = _convrot(t.float(), group)
            stem = key.removesuffix(".weight")
            out[key], out[stem + ".weight_scale"] = q, s[:, None]
            out[stem + ".comfy_quant"] = torch.tensor(list(marker.encode()), dtype=torch.uint8)
            stored[key] = (q, s)
        else:
            out[key] = t
    save_file({"model.diffusion_model." + k: v.contiguous() for k, v in out.items()}, str(dst), metadata)
    return stored


def test_convrot_file_kept_int8_matches_its_dequantized_load(tmp_path):
    """A ConvRot Comfy-Org file: its int8 bytes are the Int8Linears' (qkv split by rows), and the
    forward equals the model loaded with the weights dequantized (un-rotated) at load."""
    config = get_preset("tiny")
    (plain,) = save_backbone(tiny_model(), tmp_path / "plain.safetensors", layout="comfy", key_prefix="")
    stored = _write_convrot(str(plain), tmp_path / "convrot.safetensors", group=16)
    native = stored_int8_weights(tmp_path / "convrot.safetensors")
    assert len(native) == 6 * config.depth and all(g == 16 for _, _, g in native.values())
    q, s = stored["layers.0.proj.qkv.weight"]
    d = config.dim
    assert torch.equal(native["layers.0.proj.k.weight"][0], q[d : 2 * d])
    assert torch.equal(native["layers.0.proj.k.weight"][1], s[d : 2 * d])

    ref = load_backbone(tmp_path / "convrot.safetensors", dtype=torch.float32).requires_grad_(False)
    ref.ops = OpSet("eager", tune="off")
    model = load_backbone(tmp_path / "convrot.safetensors", dtype=torch.float32).requires_grad_(False)
    model.ops = OpSet("eager", tune="off")
    quantize_frozen_linears(
        model, "int8_weight", torch.device("cpu"), source=tmp_path / "convrot.safetensors"
    )
    lin = model.layers[0].proj["k"]
    assert lin.convrot_group == 16 and torch.equal(lin.weight, native["layers.0.proj.k.weight"][0])
    batch = flow_batch()
    with torch.no_grad():
        a, b = flow_loss(model, batch), flow_loss(ref, batch)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode,backend,bound", [("int8_weight", "addmm", 1e-2), ("int8", "int_mm", 1e-2)])
def test_int8_forward_error_against_the_float64_reference(mode, backend, bound):
    """docs/concepts/numerics.md's int8 rows (`pytest -s -k float64_reference tests/precision`)."""
    from kohakumoss.model.reference import reference_forward

    from ..model.helpers import random_batch, random_model
    from ..model.test_parity import IMG_SIZES, TEXT_LENS, rel_err

    cfg = get_preset("tiny")
    model = random_model(cfg, 0).requires_grad_(False)
    model.ops = OpSet(backend, tune="off")
    quantize_frozen_linears(model, mode, torch.device("cpu"))
    imgs, texts, sigma, seq = random_batch(cfg, TEXT_LENS, IMG_SIZES, 0, torch.float32)
    with torch.no_grad():
        packed = model(torch.cat(imgs), torch.cat(texts), sigma, seq)
    assert model.ops.chosen()["stored_linear[int8]@cpu/torch.float32"]["*"] == backend
    ref_model = random_model(cfg, 0).double()
    ref = reference_forward(
        ref_model, [i.double() for i in imgs], [t.double() for t in texts], IMG_SIZES, sigma.double()
    )
    errors = [rel_err(p, r) for p, r in zip(torch.split(packed, list(seq.img_lens)), ref, strict=True)]
    print(f"{mode}: per-sample error against float64 {[f'{e:.2e}' for e in errors]}")
    assert max(errors) < bound and min(errors) > 1e-5  # int8's rounding shows; nothing worse


@pytest.mark.parametrize("mode", ["int8", "int8_weight"])
def test_lora_on_a_convrot_base_fast_path_equals_the_reference(tmp_path, mode):
    """LoRA on a ConvRot-kept base through the cuBLAS forms (one rotation of x per q/k/v group, the int8
    GEMM on the CPU) against the eager ops over the un-rotated dequantized weights."""
    (plain,) = save_backbone(tiny_model(), tmp_path / "plain.safetensors", layout="comfy", key_prefix="")
    path = tmp_path / "convrot.safetensors"
    _write_convrot(str(plain), path, group=16)

    def run(backend):
        model = load_backbone(path, dtype=torch.float32).requires_grad_(False)
        model.ops = OpSet(backend, tune="off")
        quantize_frozen_linears(model, mode, torch.device("cpu"), source=path)
        if backend == "addmm":  # the frozen linears' own GEMM too (the CPU registry runs eager by default)
            for m in model.modules():
                if isinstance(m, Int8Linear):
                    m.__dict__["ops"] = OpSet("int_mm", tune="off")
        torch.manual_seed(0)  # the same LoRA initialisation in both runs
        net = build_adapter(model, rank=4, alpha=4.0, preset="attn-mlp", bypass=True)
        with torch.no_grad():
            g = torch.Generator().manual_seed(1)
            for m in net.loras:
                m.lora_up.weight.copy_(torch.randn(m.lora_up.weight.shape, generator=g) * 0.1)
        return _loss_grads(model, net)

    loss, grads = run("addmm")
    ref_loss, ref_grads = run("eager")
    tol = 1e-5 if mode == "int8_weight" else 1e-2  # int8: x rounded to 8 bits per row in the forward
    assert abs(float(loss - ref_loss)) <= tol * float(ref_loss)
    errs = [_rel(g, r) for g, r in zip(grads, ref_grads, strict=True)]
    print(mode, [f"{e:.1e}" for e in errs])
    assert max(errs) < (1e-4 if mode == "int8_weight" else 0.05)
