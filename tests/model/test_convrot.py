"""ConvRot int8 DiT files (Comfy-Org `*_int8_convrot.safetensors`): written here per the published format
(comfy-quants docs/formats/int8_w8a8.md: rotate each group of 256 input columns by the normalised regular
Hadamard, W_rot = W @ H^T, then symmetric per-row int8 with scale = amax / 127), loaded back dequantized."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from kohakumoss.model import get_preset
from kohakumoss.model.info import describe
from kohakumoss.model.io import load_backbone, read_checkpoint
from kohakumoss.model.layouts import LAYOUTS
from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.io import read_header
from kohakumoss_common.quant import convrot_hadamard, plan_quantization

from .helpers import random_model

CFG = get_preset("tiny")
GROUP = 256
H4 = [[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]]  # the published regular H4
KITCHEN_MARKER = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": GROUP}  # ComfyUI's
INT8_FAST_MARKER = {"convrot": True, "convrot_groupsize": GROUP, "per_row": True}  # comfy-quants'


def hadamard_by_digits(size: int) -> torch.Tensor:
    """H[i, j] = prod over base-4 digits of H4[i_d, j_d] / sqrt(size), float64, built without kron."""
    n = round(math.log(size, 4))
    h = torch.empty(size, size, dtype=torch.float64)
    for i in range(size):
        for j in range(size):
            v = 1
            for d in range(n):
                v *= H4[(i // 4**d) % 4][(j // 4**d) % 4]
            h[i, j] = v
    return h / math.sqrt(size)


H = hadamard_by_digits(GROUP)


def independent_dequant(q: torch.Tensor, scale: torch.Tensor, rotated: bool) -> torch.Tensor:
    """float64: (q * scale) @ blockdiag(H, ..., H)^T."""
    w = q.double() * scale.double().reshape(-1, 1)
    if not rotated:
        return w
    return w @ torch.block_diag(*[H] * (q.shape[1] // GROUP)).T


def marker(conf: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)


def quantize_published(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """comfy-quants' `_quantize_int8_per_row(convrot=True)`, written out: (int8 [out, in], fp32 [out, 1])."""
    out_f, in_f = w.shape
    rot = (w.double().reshape(out_f, in_f // GROUP, GROUP) @ H.T).reshape(out_f, in_f).float()
    scale = (rot.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-30)
    return rot.mul(1.0 / scale).round().clamp(-128, 127).to(torch.int8), scale


def convrot_file(tmp_path, conf: dict, exact: bool = False, seed: int = 0):
    """A ComfyUI-layout tiny DiT with every block linear ConvRot int8, plus `text_embedder.proj` (32 input
    columns: not a multiple of 256) plain per-row int8 with a `convrot: false` marker, as the format says.
    exact: random int8 codes with power-of-two scales instead of a quantized model, so that every
    dequantized value is exactly representable and any correct order of summation gives the same bits.
    Returns (path, reference state, {comfy key: (q, scale, rotated)})."""
    ref = random_model(CFG, seed)
    state = LAYOUTS["comfy"].from_native(ref.state_dict())
    g = torch.Generator().manual_seed(seed)
    codes = {}
    for key in [k for k in state if ".proj." in k and k.startswith("layers.")] + [
        "text_embedder.proj.weight"
    ]:
        w, stem = state[key], key.removesuffix(".weight")
        rotated = w.shape[1] % GROUP == 0
        if exact:
            q = torch.randint(-128, 128, w.shape, generator=g, dtype=torch.int8)
            scale = 2.0 ** torch.randint(-12, -4, (w.shape[0], 1), generator=g).float()
        elif rotated:
            q, scale = quantize_published(w)
        else:
            scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-30)
            q = (w / scale).round().clamp(-128, 127).to(torch.int8)
        state[key], state[stem + ".weight_scale"] = q, scale
        state[stem + ".comfy_quant"] = marker(conf if rotated else {"convrot": False, "per_row": True})
        codes[key] = (q, scale, rotated)
    path = tmp_path / "moss_image_base_int8_convrot.safetensors"
    save_file({"model.diffusion_model." + k: v.contiguous() for k, v in state.items()}, str(path))
    return path, ref.state_dict(), codes


def test_hadamard_is_the_published_regular_one():
    h = convrot_hadamard(GROUP)
    assert torch.equal(h.double(), H)  # entries +-1/16: exact in float32
    assert torch.equal(h, h.T)  # symmetric, so H and H^T are the same matrix
    torch.testing.assert_close(h @ h, torch.eye(GROUP), rtol=0, atol=1e-6)
    assert (
        not (h > 0).all(0).any()
    )  # no all-ones column: not Sylvester's H (whose first row and column are all ones)
    with pytest.raises(ValueError, match="power of four"):
        convrot_hadamard(128)


@pytest.mark.parametrize("conf", [KITCHEN_MARKER, INT8_FAST_MARKER], ids=["comfyui", "int8_fast"])
def test_convrot_file_dequantizes_exactly_as_the_formula(tmp_path, conf):
    path, _, codes = convrot_file(tmp_path, conf, exact=True)
    model = load_backbone(path, dtype=torch.float32)
    state = LAYOUTS["comfy"].from_native(model.state_dict())
    assert sum(rotated for *_, rotated in codes.values()) == 4 * CFG.depth
    for key, (q, scale, rotated) in codes.items():
        want = independent_dequant(q, scale, rotated).float()
        assert torch.equal(state[key], want), key
    assert torch.equal(
        model.layers[0].proj["k"].weight, state["layers.0.proj.qkv.weight"][CFG.dim : 2 * CFG.dim]
    )


def test_convrot_quantized_model_loads_within_int8_rounding(tmp_path):
    path, ref, codes = convrot_file(tmp_path, KITCHEN_MARKER)
    info = read_checkpoint(path)
    assert info.layout.name == "comfy" and info.config == CFG
    assert len(info.quant.rotations) == 4 * CFG.depth and len(info.quant.scales) == 4 * CFG.depth + 1
    state = LAYOUTS["comfy"].from_native(load_backbone(path, dtype=torch.float32).state_dict())
    want = LAYOUTS["comfy"].from_native(ref)
    for key, (q, scale, rotated) in codes.items():
        # rounding error <= scale / 2 per rotated entry; H is orthogonal, so a group's error keeps its
        # L2 norm: <= sqrt(256) * scale / 2 = 8 * scale per entry after un-rotating
        bound = (8.0 if rotated else 0.5) * scale * (1 + 1e-5)
        assert ((state[key] - want[key]).abs() <= bound).all(), key
        torch.testing.assert_close(
            state[key].double(), independent_dequant(q, scale, rotated), rtol=1e-6, atol=1e-7
        )
        if rotated:  # without the un-rotation the weights would be far off: the test can fail
            assert (q.float() * scale - want[key]).abs().max() > 20 * scale.max()
    for key in want:
        if key not in codes:
            assert torch.equal(state[key], want[key]), key


def test_bf16_load_is_the_float32_dequant_rounded(tmp_path):
    path, _, _ = convrot_file(tmp_path, KITCHEN_MARKER)
    a = load_backbone(path, dtype=torch.float32).state_dict()
    b = load_backbone(path, dtype=torch.bfloat16).state_dict()
    for key in a:
        if key != "rope.bands":
            assert torch.equal(a[key].to(torch.bfloat16), b[key]), key


def test_loaders_that_do_not_unrotate_still_refuse_convrot(tmp_path):
    path, _, _ = convrot_file(tmp_path, KITCHEN_MARKER)
    header, _ = read_header(path)
    with pytest.raises(CheckpointError, match=r"comfy_quant: .*ConvRot.*not supported by this loader"):
        plan_quantization(path, header)  # the default, as the text encoder and VAE loaders call it
    assert plan_quantization(path, header, rotations=True).rotations


@pytest.mark.parametrize(
    "conf, match",
    [
        ({**KITCHEN_MARKER, "convrot_groupsize": 128}, r"unsupported ConvRot marker"),
        ({**KITCHEN_MARKER, "format": "float8_e4m3fn"}, r"unsupported ConvRot marker"),
        (
            {**KITCHEN_MARKER, "convrot_groupsize": 1024},
            r"512 input columns do not split into ConvRot groups of 1024",
        ),
        ({"format": "nvfp4"}, r"unknown quantization scheme"),
    ],
)
def test_bad_convrot_markers_are_named(tmp_path, conf, match):
    state = LAYOUTS["comfy"].from_native(random_model(CFG).state_dict())
    key = "layers.1.proj.ffn_down"
    q, scale = quantize_published(state[key + ".weight"])
    state.update({key + ".weight": q, key + ".weight_scale": scale, key + ".comfy_quant": marker(conf)})
    path = tmp_path / "bad.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    with pytest.raises(CheckpointError, match=match) as e:
        load_backbone(path)
    assert str(path) in str(e.value) and key in str(e.value)


def test_info_reports_the_convrot_file(tmp_path):
    path, _, _ = convrot_file(tmp_path, INT8_FAST_MARKER)
    text = describe(str(path))
    n = 4 * CFG.depth
    assert "(layout: comfy)" in text and f"ConvRot int8 ({n} of {n + 1} weights rotated" in text
    assert f"I8 x{n + 1}" in text
    assert text.splitlines()[-1] == f"params {sum(p.numel() for p in random_model(CFG).parameters())}"
