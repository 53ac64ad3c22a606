"""ComfyUI W4A8 (`asym_w4a8_int8`) text-encoder files: written here per the published packing, then read
back exactly (against an independent numpy decode), run, recognised, and refused when malformed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kohakumoss.cli.config_weights import find_weights
from kohakumoss.encoders import TextEncoder, TextEncoderConfig
from kohakumoss.encoders.text_layouts import model_to_comfy
from kohakumoss.model.io import read_checkpoint
from kohakumoss.precision.int8_base import Int8Linear
from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.io import iter_tensors, read_header, save_safetensors
from kohakumoss_common.quant import decode_w4a8, plan_quantization

from . import conftest
from .conftest import write_hf_folder

CAPTIONS = ["a red cat", "", "the quick brown fox jumps over the lazy dog"]
GROUP, ROT = 8, 16  # W4A8 group and ConvRot group (ComfyUI's defaults are 16 and 256: too wide here)
# comfy-kitchen's fixed Lloyd-Max table (eager/w4a8_int8.py `_FIXED_LUT`): the codebook of real files
LUT = torch.tensor(
    [-0.980602, -0.794529, -0.638165, -0.500986, -0.377321, -0.263187, -0.155210, -0.050720,
     0.052541, 0.156985, 0.265284, 0.379533, 0.502636, 0.638953, 0.794876, 0.980671]
)  # fmt: skip
NAME = "qwen3.5_9b_w4a8_gptq.safetensors"  # the file ComfyUI's MOSS-Image templates load


@pytest.fixture(autouse=True)
def _tokenizer(tokenizer_folder, monkeypatch):
    monkeypatch.setattr(conftest, "TOKENIZER", str(tokenizer_folder))


def _rope(model) -> dict:
    return {
        "rope_parameters": model.config.rope_parameters,
        "max_position_embeddings": model.config.max_position_embeddings,
    }


def hadamard(size: int) -> torch.Tensor:
    """ConvRot's normalised regular Hadamard (Kronecker powers of H4), float64, built here on its own."""
    h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float64)
    h = h4
    while h.shape[0] < size:
        h = torch.kron(h, h4)
    return h / size**0.5


def quantize_w4a8(weight: torch.Tensor, codebook: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """comfy-kitchen's symmetric W4A8 writer, redone: rotate (W @ H^T per ROT columns), 4-bit codes per
    GROUP (code - 8, or the nearest codebook level), s_channel = amax(level * group scale) / 127,
    s_rel = group scale / s_channel in fp8 e4m3, two codes a byte with the even column low."""
    o, i = weight.shape
    rotated = (weight.double().reshape(o, i // ROT, ROT) @ hadamard(ROT).T).reshape(o, i // GROUP, GROUP)
    if codebook is None:
        scale = (rotated.abs().amax(-1, keepdim=True) / 7).clamp_min(1e-8)
        signed = torch.round(rotated / scale).clamp(-8, 7)
        codes, levels = signed + 8, signed
    else:
        scale = rotated.abs().amax(-1, keepdim=True).clamp_min(1e-8)
        codes = ((rotated / scale).unsqueeze(-1) - codebook.double()).abs().argmin(-1)
        levels = codebook.double()[codes]
    s_channel = (levels * scale).abs().amax(dim=(1, 2)) / 127
    s_rel = (scale.squeeze(-1) / s_channel[:, None]).float().to(torch.float8_e4m3fn)
    codes = codes.reshape(o, i).to(torch.int32)
    packed = ((codes[:, 0::2] & 0xF) | ((codes[:, 1::2] & 0xF) << 4)).to(torch.uint8).view(torch.int8)
    out = {"weight": packed, "weight_s_rel": s_rel, "weight_s_channel": s_channel.float()}
    if codebook is not None:
        out["weight_codebook"] = codebook.float().clone()
    return out


def reference_grid(t: dict[str, torch.Tensor]) -> np.ndarray:
    """The int8 grid the stored tensors stand for, decoded with numpy (independent of the loader)."""
    b = t["weight"].numpy().view(np.uint8).astype(np.int64)
    codes = np.empty((b.shape[0], b.shape[1] * 2), np.int64)
    codes[:, 0::2], codes[:, 1::2] = b & 15, b >> 4
    cb = t.get("weight_codebook")
    level = cb.numpy()[codes] if cb is not None else (codes - 8).astype(np.float32)
    s_rel = t["weight_s_rel"]
    s_rel = (s_rel.view(torch.float8_e4m3fn) if s_rel.dtype == torch.uint8 else s_rel).float().numpy()
    return np.clip(np.rint(level * np.repeat(s_rel, GROUP, axis=1)), -127, 127).astype(np.int8)


def reference_weight(t: dict[str, torch.Tensor]) -> torch.Tensor:
    """(int8 grid * s_channel) @ H^T per ROT columns, float64."""
    grid = torch.from_numpy(reference_grid(t)).double() * t["weight_s_channel"].double()[:, None]
    o, i = grid.shape
    return (grid.reshape(o, i // ROT, ROT) @ hadamard(ROT).T).reshape(o, i)


def _marker(conf: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)


def w4a8_tensors(model) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Every block linear as W4A8 (alternating codebook / plain codes, fp8 / uint8 group scales)."""
    tensors, stored = {}, {}
    for n, (key, value) in enumerate(model.state_dict().items()):
        name = model_to_comfy(key)
        if value.dim() == 2 and key.startswith("layers."):
            q = quantize_w4a8(value, LUT if n % 2 else None)
            if n % 3 == 0:  # older exporters keep the fp8 group scales as raw bytes
                q["weight_s_rel"] = q["weight_s_rel"].view(torch.uint8)
            stem = name.removesuffix(".weight")
            tensors.update({f"{stem}.{suffix}": v for suffix, v in q.items()})
            tensors[f"{stem}.comfy_quant"] = _marker(
                {"format": "asym_w4a8_int8", "group_size": GROUP, "convrot_groupsize": ROT}
            )
            stored[key] = q
        else:
            tensors[name] = value
    return tensors, stored


def write_w4a8(folder, model, name: str = NAME):
    tensors, stored = w4a8_tensors(model)
    folder.mkdir(parents=True, exist_ok=True)
    save_safetensors(tensors, folder / name)
    return folder / name, stored


def test_decode_equals_independent_decode(tmp_path, text_model):
    path, stored = write_w4a8(tmp_path, text_model)
    plan = plan_quantization(path, read_header(path)[0], rotations=True, packed=True)
    assert len(plan.packed) == len(stored) and "asym_w4a8_int8" in plan.scheme
    for key, t in stored.items():
        rec = plan.packed[model_to_comfy(key)]
        side = dict(iter_tensors(path, keys={k for k in (rec.s_rel, rec.codebook) if k}))
        grid = decode_w4a8(t["weight"], side[rec.s_rel], side.get(rec.codebook), rec.group_size)
        assert np.array_equal(grid.numpy(), reference_grid(t)), key
        weight = plan.dequantize(model_to_comfy(key), t["weight"], t["weight_s_channel"], torch.float64)
        torch.testing.assert_close(weight, reference_weight(t), rtol=1e-6, atol=1e-7)
    # the writer follows the format: decoding gives back the weights up to 4-bit rounding
    want = text_model.state_dict()["layers.0.mlp.up_proj.weight"].double()
    got = reference_weight(stored["layers.0.mlp.up_proj.weight"])
    assert torch.corrcoef(torch.stack([got.flatten(), want.flatten()]))[0, 1] > 0.97


def test_loader_reconstructs_the_dequantized_weights(tmp_path, text_model):
    path, stored = write_w4a8(tmp_path, text_model)
    enc = conftest.load_text_encoder(path, model_overrides=_rope(text_model))
    state = enc.model.state_dict()
    for key, t in stored.items():
        torch.testing.assert_close(state[key].double(), reference_weight(t), rtol=1e-6, atol=1e-7)
    untouched = "layers.0.input_layernorm.weight"
    assert torch.equal(state[untouched], text_model.state_dict()[untouched])


def test_hidden_states_equal_the_dequantized_model(tmp_path, text_model):
    path, stored = write_w4a8(tmp_path, text_model)
    reference = conftest.random_text_model()
    reference.load_state_dict(
        {
            k: reference_weight(stored[k]).float() if k in stored else v
            for k, v in text_model.state_dict().items()
        }
    )
    folder = write_hf_folder(tmp_path / "dq", reference, prefix="model.")
    got = conftest.load_text_encoder(path, model_overrides=_rope(text_model)).encode(CAPTIONS)[0]
    want = conftest.load_text_encoder(folder).encode(CAPTIONS)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_markers_in_the_header_metadata(tmp_path, text_model):
    """The same file with its markers in the header's `_quantization_metadata` (which ComfyUI's
    `convert_old_quants` turns into marker tensors) instead of `.comfy_quant` tensors."""
    tensors, stored = w4a8_tensors(text_model)
    layers = {
        k.removesuffix(".comfy_quant"): json.loads(bytes(v.tolist()))
        for k, v in tensors.items()
        if k.endswith(".comfy_quant")
    }
    tensors = {k: v for k, v in tensors.items() if not k.endswith(".comfy_quant")}
    path = tmp_path / NAME
    save_safetensors(
        tensors,
        path,
        metadata={"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})},
    )
    state = conftest.load_text_encoder(path, model_overrides=_rope(text_model)).model.state_dict()
    for key, t in stored.items():
        torch.testing.assert_close(state[key].double(), reference_weight(t), rtol=1e-6, atol=1e-7)


def test_int8_mode_keeps_the_int8_grid(tmp_path, text_model):
    """TEXT_ENCODER_QUANT=int8_weight runs the W4A8 file as ComfyUI does: its int8 grid, row scales and
    ConvRot group in Int8Linear (no second rounding), equal to the dequantized load."""
    path, stored = write_w4a8(tmp_path, text_model)
    kept = conftest.load_text_encoder(path, model_overrides=_rope(text_model), quant="int8_weight")
    plain = conftest.load_text_encoder(path, model_overrides=_rope(text_model))
    linears = [m for m in kept.model.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == len(stored) and all(m.convrot_group == ROT for m in linears)
    lin = kept.model.layers[0].mlp.up_proj
    assert np.array_equal(lin.weight.numpy(), reference_grid(stored["layers.0.mlp.up_proj.weight"]))
    torch.testing.assert_close(kept.encode(CAPTIONS)[0], plain.encode(CAPTIONS)[0], rtol=1e-5, atol=1e-5)


def test_weights_finder_recognises_the_template_file(tmp_path, text_model):
    """A ComfyUI models folder holding the template's W4A8 text encoder: found by name, read by content."""
    path, _ = write_w4a8(tmp_path / "models" / "text_encoders", text_model)
    (tmp_path / "models" / "diffusion_models").mkdir()  # what makes it a ComfyUI models folder
    found = find_weights(tmp_path / "models")
    assert found.text_encoder == str(path)
    assert not [p for p in found.problems if p[0] == "TEXT_ENCODER"]


def test_weights_finder_names_a_gptq_packed_text_encoder(tmp_path, text_model):
    tensors = {model_to_comfy(k): v for k, v in text_model.state_dict().items()}
    tensors["model.layers.0.mlp.up_proj.qweight"] = torch.zeros(4, 64, dtype=torch.int32)
    (tmp_path / "models" / "text_encoders").mkdir(parents=True)
    (tmp_path / "models" / "diffusion_models").mkdir()
    save_safetensors(tensors, tmp_path / "models" / "text_encoders" / NAME)
    problems = [m for knob, m in find_weights(tmp_path / "models").problems if knob == "TEXT_ENCODER"]
    assert len(problems) == 1 and "model.layers.0.mlp.up_proj.qweight: GPTQ / AWQ packed" in problems[0]


def _malformed(tmp_path, text_model, change) -> str:
    tensors, _ = w4a8_tensors(text_model)
    change(tensors)
    path = tmp_path / NAME
    save_safetensors(tensors, path)
    with pytest.raises(CheckpointError) as err:
        conftest.load_text_encoder(path, model_overrides=_rope(text_model))
    assert NAME in str(err.value)
    return str(err.value)


UP = "model.layers.0.mlp.up_proj"


def test_missing_group_scales_named(tmp_path, text_model):
    msg = _malformed(tmp_path, text_model, lambda t: t.pop(f"{UP}.weight_s_rel"))
    assert f"{UP}.weight_s_rel: missing (the group scales" in msg


def test_missing_row_scales_named(tmp_path, text_model):
    msg = _malformed(tmp_path, text_model, lambda t: t.pop(f"{UP}.weight_s_channel"))
    assert f"{UP}.weight_s_channel: missing (the row scales" in msg


def test_wrong_group_scale_shape_named(tmp_path, text_model):
    def change(t):
        t[f"{UP}.weight_s_rel"] = t[f"{UP}.weight_s_rel"][:, :2].contiguous()

    msg = _malformed(tmp_path, text_model, change)
    assert f"{UP}.weight_s_rel: F8_E4M3 [64, 2], expected the group scales" in msg


def test_unpacked_weight_named(tmp_path, text_model):
    def change(t):
        t[f"{UP}.weight"] = torch.zeros(64, 32)

    msg = _malformed(tmp_path, text_model, change)
    assert f"{UP}.comfy_quant: W4A8 marker for '{UP}.weight', which is F32 [64, 32], not 2-d int8" in msg


def test_group_size_that_does_not_divide_named(tmp_path, text_model):
    def change(t):
        t[f"{UP}.comfy_quant"] = _marker(
            {"format": "asym_w4a8_int8", "group_size": 12, "convrot_groupsize": ROT}
        )

    assert "W4A8 group_size 12 does not divide 32" in _malformed(tmp_path, text_model, change)


def test_asymmetric_correction_refused(tmp_path, text_model):
    msg = _malformed(
        tmp_path, text_model, lambda t: t.update({f"{UP}.weight_correction": torch.zeros(4, 64)})
    )
    assert f"{UP}.weight_correction: asymmetric W4A8 is not supported" in msg


def test_gptq_packing_refused_by_name(tmp_path, text_model):
    """AutoGPTQ's layout (qweight / qzeros / scales / g_idx) is not a ComfyUI format: named, not misread."""

    def change(t):
        t[f"{UP}.qweight"] = torch.zeros(4, 64, dtype=torch.int32)
        t[f"{UP}.qzeros"] = torch.zeros(4, 8, dtype=torch.int32)

    msg = _malformed(tmp_path, text_model, change)
    assert f"{UP}.qweight: GPTQ / AWQ packed weights" in msg


def test_loaders_that_do_not_decode_refuse_w4a8_by_name(tmp_path, text_model):
    """The DiT loader (and `kohakumoss.model.info`) does not read packed shapes: a W4A8 marker is
    refused by name before anything else, never misread."""
    path, _ = write_w4a8(tmp_path, text_model)
    with pytest.raises(CheckpointError, match="'asym_w4a8_int8' .* is not supported by this loader"):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match="'asym_w4a8_int8' .* is not supported by this loader"):
        plan_quantization(path, read_header(path)[0], rotations=True)  # as the VAE loader calls it


def test_plain_config_is_unchanged(tmp_path, text_model):
    """The encoder built from the W4A8 file has the original's shapes (two codes a byte unpacked)."""
    path, _ = write_w4a8(tmp_path, text_model)
    enc = TextEncoder.load(
        TextEncoderConfig(path=str(path), tokenizer_path=conftest.TOKENIZER, dtype="float32")
    )
    want = {k: tuple(v.shape) for k, v in text_model.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in enc.model.state_dict().items()} == want
