"""TextEncoder from one ComfyUI-style safetensors file: round trip, inferred config, quantization, errors."""

from __future__ import annotations

import json

import pytest
import torch

from kohakumoss.encoders import TextEncoderConfig, tiny_text_encoder_config
from kohakumoss.encoders.text_config import infer_text_config
from kohakumoss.encoders.text_layouts import model_to_comfy
from kohakumoss_common.errors import CheckpointError, ConfigError
from kohakumoss_common.io import save_safetensors

from . import conftest
from .conftest import write_hf_folder

CAPTIONS = ["a red cat", "", "the quick brown fox jumps over the lazy dog"]
TINY = tiny_text_encoder_config()
ROPE = {"rope_parameters": TINY.rope_parameters, "max_position_embeddings": TINY.max_position_embeddings}


@pytest.fixture(autouse=True)
def _tokenizer(tokenizer_folder, monkeypatch):
    monkeypatch.setattr(conftest, "TOKENIZER", str(tokenizer_folder))


def comfy_tensors(model, wrapper: str = "") -> dict[str, torch.Tensor]:
    return {wrapper + model_to_comfy(k): v for k, v in model.state_dict().items()}


def write(tmp_path, tensors, name="te.safetensors"):
    path = tmp_path / name
    save_safetensors(tensors, path)
    return path


@pytest.mark.parametrize("wrapper", ["", "text_encoders.qwen35.transformer."])
def test_comfy_file_round_trip(tmp_path, hf_folder, text_model, wrapper):
    file = write(tmp_path, comfy_tensors(text_model, wrapper))
    single = conftest.load_text_encoder(file, model_overrides=ROPE)
    folder = conftest.load_text_encoder(hf_folder)
    assert torch.equal(single.encode(CAPTIONS)[0], folder.encode(CAPTIONS)[0])
    assert single.full_config.layer_types == text_model.config.layer_types
    # RoPE settings are not in the shapes: without the override the preset's theta is used
    preset_rope = conftest.load_text_encoder(file)
    assert not torch.allclose(preset_rope.encode(CAPTIONS)[0], folder.encode(CAPTIONS)[0])


def test_inferred_config_equals_original(text_model):
    shapes = {k: tuple(v.shape) for k, v in text_model.state_dict().items()}
    inferred = infer_text_config(shapes).to_dict()
    original = text_model.config.to_dict()
    for field in [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "layer_types",
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
    ]:
        assert inferred[field] == original[field], field


def test_bf16_load_casts_per_tensor(tmp_path, text_model):
    file = write(tmp_path, comfy_tensors(text_model))
    enc = conftest.load_text_encoder(file, dtype="bfloat16")
    assert enc.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in enc.model.parameters())
    assert enc.encode(CAPTIONS)[0].dtype == torch.bfloat16


def _marker(conf: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = weight.abs().amax(dim=1, keepdim=True).clamp_min(1e-8) / 127
    return torch.round(weight / scale).to(torch.int8), scale


def int8_file(tmp_path, model, conf=None, scale_shape=None):
    """Every 2-D projection as int8 with a per-row scale; also returns the dequantized state dict."""
    tensors, dequant = {}, {}
    for key, value in model.state_dict().items():
        name = model_to_comfy(key)
        if value.dim() == 2 and key.endswith("proj.weight"):
            q, s = quantize_rows(value)
            tensors[name] = q
            tensors[name.replace(".weight", ".weight_scale")] = (
                s if scale_shape is None else s.reshape(scale_shape)
            )
            tensors[name.replace(".weight", ".input_scale")] = torch.tensor(1.0)
            tensors[name.replace(".weight", ".comfy_quant")] = _marker(conf or {"format": "int8_tensorwise"})
            dequant[key] = q.float() * s
        else:
            tensors[name] = value
            dequant[key] = value
    return write(tmp_path, tensors, "te_int8.safetensors"), dequant


def test_int8_per_row_is_dequantized(tmp_path, text_model):
    file, dequant = int8_file(tmp_path, text_model)
    reference = conftest.random_text_model()
    reference.load_state_dict(dequant)
    folder = write_hf_folder(tmp_path / "dq", reference, prefix="model.")
    got = conftest.load_text_encoder(file, model_overrides=ROPE).encode(CAPTIONS)[0]
    want = conftest.load_text_encoder(folder).encode(CAPTIONS)[0]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def _hadamard(size: int) -> torch.Tensor:
    """ConvRot's regular Hadamard (Kronecker powers of comfy-kitchen's H4), normalised: built here on its own."""
    h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float64)
    h = h4
    while h.shape[0] < size:
        h = torch.kron(h, h4)
    return h / size**0.5


def test_convrot_int8_file_is_unrotated_and_dequantized(tmp_path, text_model):
    """A ConvRot file as the published format writes it (W @ H^T per group of 16 input columns, then int8
    per row) loads as the dequantized, un-rotated weights."""
    group = 16
    h = _hadamard(group)
    tensors, dequant = {}, {}
    for key, value in text_model.state_dict().items():
        name = model_to_comfy(key)
        if value.dim() == 2 and key.endswith("proj.weight"):
            o, i = value.shape
            rotated = (value.double().reshape(o, i // group, group) @ h.T).reshape(o, i).float()
            q, s = quantize_rows(rotated)
            tensors[name], tensors[name.replace(".weight", ".weight_scale")] = q, s
            tensors[name.replace(".weight", ".comfy_quant")] = _marker(
                {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group}
            )
            back = (q.double() * s.double()).reshape(o, i // group, group) @ h.T  # H symmetric, H @ H = I
            dequant[key] = back.reshape(o, i).float()
            assert (dequant[key] - value).abs().max() < 0.02 * value.abs().max()  # int8 rounding only
        else:
            tensors[name] = dequant[key] = value
    file = write(tmp_path, tensors, "te_convrot.safetensors")
    reference = conftest.random_text_model()
    reference.load_state_dict(dequant)
    folder = write_hf_folder(tmp_path / "dq", reference, prefix="model.")
    got = conftest.load_text_encoder(file, model_overrides=ROPE).encode(CAPTIONS)[0]
    want = conftest.load_text_encoder(folder).encode(CAPTIONS)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_unknown_scheme_is_named(tmp_path, text_model):
    file, _ = int8_file(tmp_path, text_model, conf={"format": "nvfp4"})
    with pytest.raises(CheckpointError, match="unknown quantization scheme.*nvfp4"):
        conftest.load_text_encoder(file)


def test_scaleless_int8_is_refused(tmp_path, text_model):
    tensors = comfy_tensors(text_model)
    key = "model.layers.0.mlp.up_proj.weight"
    tensors[key] = tensors[key].to(torch.int8)
    with pytest.raises(CheckpointError, match=f"{key}: unknown quantization scheme"):
        conftest.load_text_encoder(write(tmp_path, tensors))


def test_blockwise_scale_is_refused(tmp_path, text_model):
    tensors = comfy_tensors(text_model)
    q, _ = quantize_rows(tensors["model.layers.0.mlp.up_proj.weight"])
    tensors["model.layers.0.mlp.up_proj.weight"] = q
    tensors["model.layers.0.mlp.up_proj.weight_scale"] = torch.ones(q.shape[0], 2)
    with pytest.raises(CheckpointError, match="block-wise"):
        conftest.load_text_encoder(write(tmp_path, tensors))


def test_missing_and_unexpected_keys_listed(tmp_path, text_model):
    tensors = comfy_tensors(text_model)
    del tensors["model.layers.3.mlp.down_proj.weight"]
    tensors["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    with pytest.raises(CheckpointError) as err:
        conftest.load_text_encoder(write(tmp_path, tensors), preset=None)
    assert "missing keys (1): layers.3.mlp.down_proj.weight" in str(err.value)
    assert "unexpected keys (1): layers.0.mlp.extra.weight" in str(err.value)


def test_preset_shape_mismatch_names_key_and_shapes(tmp_path, text_model):
    file = write(tmp_path, comfy_tensors(text_model))
    with pytest.raises(
        CheckpointError, match=r"shape mismatch at embed_tokens.weight: checkpoint \[64, 32\], "
    ):
        conftest.load_text_encoder(file, preset="qwen3.5-9b")


def test_single_file_needs_tokenizer(tmp_path, text_model):
    file = write(tmp_path, comfy_tensors(text_model))
    with pytest.raises(ConfigError, match="tokenizer_path"):
        conftest.load_text_encoder(file, tokenizer_path=None)


def test_not_a_checkpoint(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        conftest.load_text_encoder(bad)


def test_config_knobs_named():
    with pytest.raises(ConfigError, match="preset"):
        TextEncoderConfig(path="x", preset="qwen9")


def test_full_size_preset_inference_round_trip():
    """The Qwen3.5-9B preset built on the meta device (no memory) infers back to itself."""
    from transformers.models.qwen3_5 import Qwen3_5TextConfig, Qwen3_5TextModel

    from kohakumoss.encoders.text_config import QWEN35_9B

    with torch.device("meta"):
        model = Qwen3_5TextModel(Qwen3_5TextConfig(**QWEN35_9B))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    inferred = infer_text_config(shapes).to_dict()
    for key, value in QWEN35_9B.items():
        assert inferred[key] == value or key == "rope_parameters", key
    assert shapes["embed_tokens.weight"] == (248320, 4096)


def test_missing_tokenizer_is_named(tmp_path, text_model):
    file = write(tmp_path, comfy_tensors(text_model))
    with pytest.raises(ConfigError, match="tokenizer_path"):
        conftest.load_text_encoder(file, tokenizer_path=str(tmp_path / "nowhere"))


def test_tokenizer_beside_a_single_file_or_a_folder_is_found(
    tmp_path, hf_folder, text_model, tokenizer_folder
):
    """The Comfy-Org file and the HF snapshot's text_encoder/ hold no tokenizer: without TOKENIZER the
    one beside them is read (text_encoders/<...>/tokenizer, the snapshot's tokenizer/); none is named."""
    models = tmp_path / "text_encoders"
    file = write(models, comfy_tensors(text_model), "qwen.safetensors")
    with pytest.raises(ConfigError, match=f"no tokenizer folder .* is under {models}"):
        conftest.load_text_encoder(file, tokenizer_path=None)
    conftest.make_tokenizer(models / "qwen3.5_tokenizer" / "tokenizer")
    want = conftest.load_text_encoder(file, model_overrides=ROPE).encode(CAPTIONS)[0]
    got = conftest.load_text_encoder(file, model_overrides=ROPE, tokenizer_path=None).encode(CAPTIONS)[0]
    assert torch.equal(got, want)
    snapshot = tmp_path / "snapshot"
    write_hf_folder(snapshot / "text_encoder", text_model, prefix="model.")
    conftest.make_tokenizer(snapshot / "tokenizer")
    got = conftest.load_text_encoder(snapshot / "text_encoder", tokenizer_path=None).encode(CAPTIONS)[0]
    assert torch.equal(got, conftest.load_text_encoder(hf_folder).encode(CAPTIONS)[0])
