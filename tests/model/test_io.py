"""Checkpoint io: save/load per layout is bit-exact, the HF tree, config inference, sharding, strict errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from kohakumoss.model import MossBackbone, get_preset
from kohakumoss.model.io import inspect_checkpoint, load_backbone, read_checkpoint, save_backbone
from kohakumoss.model.layouts import LAYOUTS
from kohakumoss.model.rope import rope_bands
from kohakumoss_common.errors import CheckpointError

from .helpers import random_batch, random_model

CFG = get_preset("tiny")
D = CFG.dim


def assert_same_weights(a: MossBackbone, b: MossBackbone):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def bare_file(path, state, metadata=None):
    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata=metadata)
    return path


@pytest.mark.parametrize("layout", ["hf", "comfy"])
def test_save_load_roundtrip_is_bit_exact(tmp_path, layout):
    model = random_model(CFG)
    save_backbone(model, tmp_path / layout, layout=layout)
    loaded = load_backbone(tmp_path / layout, dtype=torch.float32)
    assert_same_weights(model, loaded)
    found_layout, config, _ = inspect_checkpoint(tmp_path / layout)
    assert found_layout.name == layout and config == CFG


def test_native_is_the_hf_layout_and_the_model_names():
    assert LAYOUTS["native"] is LAYOUTS["hf"]
    state = random_model(CFG).state_dict()
    assert LAYOUTS["hf"].from_native(state).keys() == state.keys()  # identity
    assert "layers.0.proj.q.weight" in state and "video_embedder.weight" in state


def test_hf_save_writes_released_config_and_file_names(tmp_path):
    paths = save_backbone(random_model(CFG), tmp_path / "transformer", layout="hf")
    assert [p.name for p in paths] == ["diffusion_pytorch_model.safetensors"]
    cfg = json.loads((tmp_path / "transformer" / "config.json").read_text())
    assert cfg == {
        "_class_name": "MOSSImageTransformer",
        "dim": D,
        "ffn_dim": CFG.mlp_hidden,
        "num_heads": CFG.num_heads,
        "num_layers": CFG.depth,
        "text_dim": CFG.text_dim,
        "freq_dim": CFG.time_freq_dim,
        "latent_channels": CFG.in_channels,
        "rope_base": CFG.rope_theta,
    }


def test_comfy_fuses_qkv_exactly_with_the_prefix_and_back(tmp_path):
    model = random_model(CFG)
    path = save_backbone(model, tmp_path, layout="comfy", prefix="moss_image_base_bf16")[0]
    assert path.name == "moss_image_base_bf16.safetensors"
    stored = load_file(str(path))
    assert all(k.startswith("model.diffusion_model.") for k in stored)
    assert not any(k.endswith(("proj.q.weight", "proj.k.weight", "proj.v.weight")) for k in stored)
    assert len(stored) == len(model.state_dict()) - 2 * CFG.depth
    qkv = stored["model.diffusion_model.layers.2.proj.qkv.weight"]
    block = model.layers[2].proj
    assert qkv.shape == (3 * D, D)
    assert torch.equal(qkv[:D], block["q"].weight)
    assert torch.equal(qkv[D : 2 * D], block["k"].weight)
    assert torch.equal(qkv[2 * D :], block["v"].weight)
    # comfy -> model -> hf -> model: the split is exact
    via_comfy = load_backbone(path, dtype=torch.float32)
    save_backbone(via_comfy, tmp_path / "hf", layout="hf")
    assert_same_weights(model, load_backbone(tmp_path / "hf", dtype=torch.float32))


@pytest.mark.parametrize("prefix", ["", "diffusion_model.", "model.diffusion_model."])
@pytest.mark.parametrize("layout", ["hf", "comfy"])
def test_prefixes_are_read_in_both_layouts(tmp_path, layout, prefix):
    model = random_model(CFG)
    save_backbone(model, tmp_path / "m.safetensors", layout=layout, key_prefix=prefix)
    info = read_checkpoint(tmp_path / "m.safetensors")
    assert info.layout.name == layout and all(k.startswith(prefix) for k in info.entries)
    assert_same_weights(model, load_backbone(tmp_path / "m.safetensors", dtype=torch.float32))


def test_hf_tree_with_model_index_and_sharded_transformer(tmp_path):
    model = random_model(CFG)
    root = tmp_path / "MOSS-Image-Base"
    paths = save_backbone(model, root / "transformer", layout="hf", max_shard_bytes=1 << 20)
    (root / "model_index.json").write_text(
        json.dumps(
            {
                "_class_name": "MOSSImagePipeline",
                "transformer": ["pipeline_moss_image", "MOSSImageTransformer"],
            }
        )
    )
    for other in ("text_encoder", "vae", "tokenizer", "scheduler"):
        (root / other).mkdir()
    transformer = root / "transformer"
    index = transformer / "diffusion_pytorch_model.safetensors.index.json"
    assert len(paths) > 2 and index.exists()
    assert paths[0].name == f"diffusion_pytorch_model-00001-of-{len(paths):05d}.safetensors"
    for target in (root, transformer, index):
        assert_same_weights(model, load_backbone(target, dtype=torch.float32))
    # a second, unsharded save into the same folder leaves no stale shards or index behind
    save_backbone(model, transformer, layout="hf")
    assert sorted(p.name for p in transformer.iterdir()) == [
        "config.json",
        "diffusion_pytorch_model.safetensors",
    ]
    single = transformer / "diffusion_pytorch_model.safetensors"
    assert_same_weights(model, load_backbone(single, dtype=torch.float32))


def test_model_index_without_transformer_is_named(tmp_path):
    (tmp_path / "model_index.json").write_text("{}")
    with pytest.raises(CheckpointError, match="model_index.json but no transformer/"):
        load_backbone(tmp_path)


def test_rope_bands_is_optional_and_recomputed(tmp_path):
    model = random_model(CFG)
    state = dict(model.state_dict())
    assert "rope.bands" in state
    state["rope.bands"] = torch.full_like(state["rope.bands"], 7.0)  # a wrong stored value is ignored
    loaded = load_backbone(bare_file(tmp_path / "with.safetensors", state), dtype=torch.bfloat16)
    expected = rope_bands(CFG.head_dim, CFG.rope_theta)
    assert loaded.rope.bands.dtype == torch.float32 and torch.equal(loaded.rope.bands, expected)
    del state["rope.bands"]
    loaded = load_backbone(bare_file(tmp_path / "without.safetensors", state), dtype=torch.float32)
    assert torch.equal(loaded.rope.bands, expected)


@pytest.mark.parametrize("layout", ["hf", "comfy"])
@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"depth": 3, "refiner_depth": 1},
        {"num_heads": 2, "mlp_hidden": 384, "text_dim": 48},
        {"refiner_depth": 0},
    ],
)
def test_inferred_config_equals_original_without_metadata(tmp_path, layout, variant):
    cfg = dataclasses.replace(CFG, **variant, in_channels=64, time_freq_dim=32)
    model = random_model(cfg)
    path = bare_file(tmp_path / "bare.safetensors", LAYOUTS[layout].from_native(model.state_dict()))
    _, inferred, _ = inspect_checkpoint(path)
    assert inferred == cfg
    assert_same_weights(model, load_backbone(path, dtype=torch.float32))


def test_config_json_gives_rope_theta_and_must_agree_with_shapes(tmp_path):
    cfg = dataclasses.replace(CFG, rope_theta=500.0)
    state = random_model(cfg).state_dict()
    bare_file(tmp_path / "diffusion_pytorch_model.safetensors", state)
    (tmp_path / "config.json").write_text(
        json.dumps({"_class_name": "MOSSImageTransformer", "rope_base": 500.0})
    )
    assert inspect_checkpoint(tmp_path)[1] == cfg
    (tmp_path / "config.json").write_text(json.dumps({"num_layers": CFG.depth + 1, "rope_base": 500.0}))
    with pytest.raises(
        CheckpointError, match=r"config.json field 'num_layers' says depth=5, but the tensors say depth=4"
    ):
        inspect_checkpoint(tmp_path)


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


@pytest.mark.parametrize("layout", ["hf", "comfy"])
def test_missing_and_unexpected_keys_are_one_error(tmp_path, layout):
    state = LAYOUTS[layout].from_native(random_model(CFG).state_dict())
    gone = "layers.1.proj.qkv.weight" if layout == "comfy" else "layers.1.proj.v.weight"
    del state[gone], state["text_embedder.blocks.0.ffn_up.bias"]
    state["layers.0.extra.weight"] = torch.zeros(2)
    path = bare_file(tmp_path / "bad.safetensors", {"diffusion_model." + k: v for k, v in state.items()})
    with pytest.raises(CheckpointError) as e:
        load_backbone(path)
    msg = str(e.value)
    assert msg.startswith(str(path)) and f"the {layout} layout" in msg
    assert (
        f"missing keys (2): ['diffusion_model.{gone}', 'diffusion_model.text_embedder.blocks.0.ffn_up.bias']"
        in msg
    )
    assert "unexpected keys (1): ['diffusion_model.layers.0.extra.weight']" in msg
    loaded = load_backbone(path, dtype=torch.float32, strict=False)  # the rest random, the extra skipped
    assert loaded.layers[1].proj["v"].weight.shape == (D, D)


def test_shape_mismatch_names_key_and_both_shapes(tmp_path):
    state = random_model(CFG).state_dict()
    state["layers.2.proj.ffn_down.weight"] = torch.zeros(D, CFG.mlp_hidden + 1)
    path = bare_file(tmp_path / "bad.safetensors", state, {"kohakumoss_config": CFG.to_json()})
    with pytest.raises(
        CheckpointError, match=r"layers\.2\.proj\.ffn_down\.weight.*\(256, 513\) vs model \(256, 512\)"
    ):
        load_backbone(path, strict=False)


def test_not_a_checkpoint_unknown_layout_and_old_names(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="junk.safetensors"):
        load_backbone(tmp_path / "junk.safetensors")
    bare_file(tmp_path / "other.safetensors", {"foo.weight": torch.zeros(2)})
    with pytest.raises(
        CheckpointError, match=r"other.safetensors: keys match no known layout; tried hf .*comfy"
    ):
        load_backbone(tmp_path / "other.safetensors")
    bare_file(
        tmp_path / "old.safetensors",
        {"img_in.weight": torch.zeros(2), "blocks.0.attn.q_proj.weight": torch.zeros(2)},
    )
    with pytest.raises(CheckpointError, match="names KohakuMoss used before"):
        load_backbone(tmp_path / "old.safetensors")
    with pytest.raises(CheckpointError, match="no such file"):
        load_backbone(tmp_path / "missing")


def test_unknown_quantization_scheme_is_named(tmp_path):
    bnb = LAYOUTS["comfy"].from_native(random_model(CFG).state_dict())
    bnb["layers.0.proj.qkv.absmax"] = torch.ones(4)  # bitsandbytes' state: not weight-only scaled
    with pytest.raises(CheckpointError, match=r"unsupported quantization scheme.*absmax"):
        load_backbone(bare_file(tmp_path / "bnb.safetensors", bnb))
    state = random_model(CFG).state_dict()
    state["layers.0.proj.o.weight"] = torch.zeros(D, D, dtype=torch.int8)  # int8 without a scale
    with pytest.raises(CheckpointError, match=r"layers.0.proj.o.weight: unknown quantization scheme"):
        load_backbone(bare_file(tmp_path / "noscale.safetensors", state))
    state["layers.0.proj.o.weight"] = torch.zeros(D, D, dtype=torch.int64)  # a plain dtype, but not a float
    with pytest.raises(CheckpointError, match=r"'layers.0.proj.o.weight': dtype I64 is not a float type"):
        load_backbone(bare_file(tmp_path / "int.safetensors", state))


@pytest.mark.parametrize("scheme", ["fp8_scaled", "int8_rows"])
def test_weight_only_quantized_dit_file_loads_dequantized(tmp_path, scheme):
    """A ComfyUI-layout DiT whose block linears are scaled fp8 (per-tensor `scale_weight`, the legacy
    marker) or int8 (per-row `weight_scale`, a `comfy_quant` marker) loads with every weight = q * scale."""
    ref = random_model(CFG)
    state = LAYOUTS["comfy"].from_native(ref.state_dict())
    quantized = [k for k in state if k.startswith("layers.") and ".proj." in k]
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
            state[stem + ".comfy_quant"] = torch.tensor(
                list(b'{"format": "int8_tensorwise"}'), dtype=torch.uint8
            )
    if scheme == "fp8_scaled":
        state["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    path = bare_file(tmp_path / "q.safetensors", state)
    _, config, entries = inspect_checkpoint(path)
    assert config == CFG and not any(
        k.endswith(("scale_weight", "weight_scale", "comfy_quant")) for k in entries
    )
    model = load_backbone(path, dtype=torch.float32)
    loaded, expected = model.state_dict(), ref.state_dict()
    assert len(quantized) == 4 * CFG.depth
    for key, w in loaded.items():
        step = w.abs().max() / (16 if scheme == "fp8_scaled" else 254) + 1e-12  # half a quantization step
        assert (w - expected[key]).abs().max() <= step, key
    assert any(not torch.equal(loaded[k], expected[k]) for k in loaded)  # the rounding is there


def test_weights_folder_finds_the_dit(tmp_path):
    model = random_model(CFG)
    comfy_models = tmp_path / "ComfyUI" / "models"
    save_backbone(model, comfy_models / "diffusion_models", layout="comfy", prefix="moss_image_base")
    (comfy_models / "vae").mkdir()
    assert_same_weights(model, load_backbone(comfy_models, dtype=torch.float32))
    save_backbone(model, comfy_models / "diffusion_models", layout="comfy", prefix="moss_image_sft")
    with pytest.raises(CheckpointError, match="expected one MOSS-Image DiT file"):
        load_backbone(comfy_models)
