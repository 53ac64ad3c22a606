"""Checkpoint io: save/load per layout is bit-exact, config inference, sharding, bad-checkpoint messages."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from kohakumoss.model import MossBackbone, get_preset
from kohakumoss.model.info import describe, main, param_shapes
from kohakumoss.model.io import inspect_checkpoint, load_backbone, save_backbone
from kohakumoss.model.layouts import LAYOUTS
from kohakumoss_common.errors import CheckpointError

from .helpers import random_batch, random_model

CFG = get_preset("tiny")


def assert_same_weights(a: MossBackbone, b: MossBackbone):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_save_load_roundtrip_is_bit_exact(tmp_path, layout):
    model = random_model(CFG)
    save_backbone(model, tmp_path / layout, layout=layout)
    loaded = load_backbone(tmp_path / layout, dtype=torch.float32)
    assert_same_weights(model, loaded)
    found_layout, config, _ = inspect_checkpoint(tmp_path / layout)
    assert found_layout.name == layout and config == CFG


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(
    "variant", [{}, {"mlp_act": "gelu_tanh", "qkv_bias": True}, {"qk_norm": False, "text_norm": False}]
)
def test_inferred_config_equals_original_without_metadata(tmp_path, layout, variant):
    cfg = dataclasses.replace(CFG, **variant)
    model = random_model(cfg)
    state = LAYOUTS[layout].from_native(model.state_dict())
    save_file(
        {k: v.contiguous() for k, v in state.items()}, str(tmp_path / "bare.safetensors")
    )  # no metadata
    hints = {"mlp_act": cfg.mlp_act, "head_dim": cfg.head_dim} if not cfg.qk_norm else {}
    if hints:
        (tmp_path / "config.json").write_text(json.dumps(hints))
    _, inferred, _ = inspect_checkpoint(tmp_path / "bare.safetensors")
    assert inferred == cfg
    loaded = load_backbone(tmp_path / "bare.safetensors", dtype=torch.float32)
    assert_same_weights(model, loaded)


def test_comfy_layout_fuses_qkv_and_accepts_prefix(tmp_path):
    model = random_model(CFG)
    state = LAYOUTS["comfy"].from_native(model.state_dict())
    qkv = state["layers.0.attention.qkv.weight"]
    assert qkv.shape == (3 * CFG.dim, CFG.dim)
    assert torch.equal(qkv[CFG.dim : 2 * CFG.dim], model.blocks[0].attn.k_proj.weight)
    prefixed = {f"model.diffusion_model.{k}": v.contiguous() for k, v in state.items()}
    save_file(prefixed, str(tmp_path / "moss_image_base.safetensors"))
    assert_same_weights(model, load_backbone(tmp_path / "moss_image_base.safetensors", dtype=torch.float32))


def test_sharded_save_writes_index_and_loads(tmp_path):
    model = random_model(CFG)
    paths = save_backbone(model, tmp_path, max_shard_bytes=2 << 20)
    assert len(paths) > 1 and (tmp_path / "model.safetensors.index.json").exists()
    assert_same_weights(model, load_backbone(tmp_path / "model.safetensors.index.json", dtype=torch.float32))


def test_load_casts_dtype_and_forward_matches(tmp_path):
    model = random_model(CFG)
    save_backbone(model, tmp_path)
    loaded = load_backbone(tmp_path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in loaded.parameters())
    imgs, texts, sigma, seq = random_batch(CFG, [3, 5], [(2, 3), (4, 1)])
    with torch.no_grad():
        a = load_backbone(tmp_path, dtype=torch.float32)(torch.cat(imgs), torch.cat(texts), sigma, seq)
        b = model(torch.cat(imgs), torch.cat(texts), sigma, seq)
    assert torch.equal(a, b)


def test_missing_and_unexpected_keys_are_listed(tmp_path):
    state = random_model(CFG).state_dict()
    del state["blocks.1.attn.v_proj.weight"]
    state["blocks.0.extra.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "bad.safetensors"), metadata={"kohakumoss_config": CFG.to_json()})
    with pytest.raises(CheckpointError) as e:
        load_backbone(tmp_path / "bad.safetensors")
    msg = str(e.value)
    assert (
        "bad.safetensors" in msg and "blocks.1.attn.v_proj.weight" in msg and "blocks.0.extra.weight" in msg
    )


def test_shape_mismatch_names_key_and_both_shapes(tmp_path):
    state = random_model(CFG).state_dict()
    state["blocks.2.mlp.down_proj.weight"] = torch.zeros(CFG.dim, CFG.mlp_hidden + 1)
    save_file(state, str(tmp_path / "bad.safetensors"), metadata={"kohakumoss_config": CFG.to_json()})
    with pytest.raises(
        CheckpointError, match=r"blocks\.2\.mlp\.down_proj\.weight.*\(256, 513\).*\(256, 512\)"
    ):
        load_backbone(tmp_path / "bad.safetensors")


def test_unknown_quantization_scheme_is_named(tmp_path):
    state = LAYOUTS["comfy"].from_native(random_model(CFG).state_dict())
    state["layers.0.attention.qkv.weight"] = torch.zeros(3 * CFG.dim, CFG.dim, dtype=torch.int8)
    marker = b'{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}'
    state["layers.0.attention.qkv.comfy_quant"] = torch.tensor(list(marker), dtype=torch.uint8)
    state["layers.0.attention.qkv.weight_scale"] = torch.ones(())
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "q.safetensors"))
    with pytest.raises(CheckpointError, match=r"qkv.comfy_quant.*ConvRot.*not supported"):
        load_backbone(tmp_path / "q.safetensors")
    bnb = LAYOUTS["comfy"].from_native(random_model(CFG).state_dict())
    bnb["layers.0.attention.qkv.absmax"] = torch.ones(4)  # bitsandbytes' state: not weight-only scaled
    save_file({k: v.contiguous() for k, v in bnb.items()}, str(tmp_path / "bnb.safetensors"))
    with pytest.raises(CheckpointError, match=r"unsupported quantization scheme.*absmax"):
        load_backbone(tmp_path / "bnb.safetensors")


@pytest.mark.parametrize("scheme", ["fp8_scaled", "int8_rows"])
def test_weight_only_quantized_dit_file_loads_dequantized(tmp_path, scheme):
    """A ComfyUI-layout DiT whose linears are scaled fp8 (per-tensor `scale_weight`, the legacy marker) or
    int8 (per-row `weight_scale`, a `comfy_quant` marker) loads with every weight = q * scale."""
    ref = random_model(CFG)
    state = LAYOUTS["comfy"].from_native(ref.state_dict())
    quantized = [
        k for k, v in state.items() if k.startswith("layers.") and k.endswith(".weight") and v.dim() == 2
    ]
    for key in quantized:
        w, stem = state[key], key.removesuffix(".weight")
        if scheme == "fp8_scaled":
            scale = w.abs().amax() / 448
            state[key] = (w / scale).to(torch.float8_e4m3fn)
            state[stem + ".scale_weight"] = scale.reshape(1)
        else:
            scale = w.abs().amax(1) / 127
            state[key] = (w / scale[:, None]).round().to(torch.int8)
            state[stem + ".weight_scale"] = scale
            marker = b'{"format": "int8_tensorwise"}'
            state[stem + ".comfy_quant"] = torch.tensor(list(marker), dtype=torch.uint8)
    if scheme == "fp8_scaled":
        state["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "q.safetensors"))
    _, config, entries = inspect_checkpoint(tmp_path / "q.safetensors")
    assert config == CFG and not any(
        k.endswith(("scale_weight", "weight_scale", "comfy_quant")) for k in entries
    )
    model = load_backbone(tmp_path / "q.safetensors", dtype=torch.float32)
    loaded, expected = model.state_dict(), ref.state_dict()
    assert len(quantized) > 10
    for key, w in loaded.items():
        step = w.abs().max() / (16 if scheme == "fp8_scaled" else 254) + 1e-12  # half a quantization step
        assert (w - expected[key]).abs().max() <= step, key
    assert any(not torch.equal(loaded[k], expected[k]) for k in loaded)  # the rounding is there


def test_not_a_checkpoint_and_unknown_layout(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="junk.safetensors"):
        load_backbone(tmp_path / "junk.safetensors")
    save_file({"foo.weight": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(CheckpointError, match="no known layout"):
        load_backbone(tmp_path / "other.safetensors")
    with pytest.raises(CheckpointError, match="no such file"):
        load_backbone(tmp_path / "missing")


def test_moss_image_5b_param_count_in_range_on_meta():
    shapes = param_shapes(get_preset("moss-image-5b"))
    total = sum(torch.Size(s).numel() for s in shapes.values())
    assert 4.5e9 <= total <= 5.5e9
    large = {k for k, s in shapes.items() if k.startswith("blocks.0.") and len(s) == 2 and min(s) >= 3072}
    assert len(large) == 6, sorted(large)


def test_info_cli_last_line_is_params(tmp_path, capsys):
    assert main(["tiny"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == f"params {sum(p.numel() for p in random_model(CFG).parameters())}"
    save_backbone(random_model(CFG), tmp_path, layout="comfy")
    assert describe(str(tmp_path)).splitlines()[-1] == out[-1]
    assert main(["no-such-preset"]) == 2


def test_weights_folder_finds_the_dit(tmp_path):
    model = random_model(CFG)
    comfy_models = tmp_path / "ComfyUI" / "models"
    save_backbone(model, comfy_models / "diffusion_models", layout="comfy", prefix="moss_image_base")
    (comfy_models / "vae").mkdir()
    assert_same_weights(model, load_backbone(comfy_models, dtype=torch.float32))
    hf = tmp_path / "MOSS-Image-Base"
    save_backbone(model, hf / "transformer", layout="hf")
    assert_same_weights(model, load_backbone(hf, dtype=torch.float32))
    save_backbone(model, comfy_models / "diffusion_models", layout="comfy", prefix="moss_image_sft")
    with pytest.raises(CheckpointError, match="expected one MOSS-Image DiT file"):
        load_backbone(comfy_models)
