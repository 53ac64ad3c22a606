"""`python -m kohakumoss.model.info`: presets and checkpoints of every layout, from headers only."""

from __future__ import annotations

import json

import torch

from kohakumoss.model import get_preset
from kohakumoss.model.info import describe, main, param_shapes
from kohakumoss.model.io import save_backbone

from .helpers import random_model

CFG = get_preset("tiny")
TINY_PARAMS = f"params {sum(p.numel() for p in random_model(CFG).parameters())}"


def test_moss_image_5b_is_the_released_count_on_meta():
    shapes = param_shapes(get_preset("moss-image-5b"))
    assert len(shapes) == 462  # + the rope.bands buffer = the released file's 463 tensors
    assert sum(torch.Size(s).numel() for s in shapes.values()) == 5_082_308_608
    assert shapes["layers.41.proj.ffn_up_gate.weight"] == (16384, 3072)
    assert shapes["text_embedder.blocks.1.qkv.weight"] == (9216, 3072)


def test_info_cli_preset_and_every_layout(tmp_path, capsys):
    assert main(["tiny"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == TINY_PARAMS
    model = random_model(CFG)
    root = tmp_path / "MOSS-Image-Base"
    save_backbone(model, root / "transformer", layout="hf", max_shard_bytes=1 << 20, dtype=torch.bfloat16)
    (root / "model_index.json").write_text(json.dumps({"_class_name": "MOSSImagePipeline"}))
    comfy = save_backbone(model, tmp_path / "comfy", layout="comfy")[0]
    for target, layout in ((root, "hf"), (comfy, "comfy")):
        assert main([str(target)]) == 0
        text = capsys.readouterr().out
        assert f"(layout: {layout})" in text and text.strip().splitlines()[-1] == TINY_PARAMS
        assert "rope.bands: in the file (recomputed at load)" in text and "quantization: none" in text
    hf_text = describe(str(root))
    assert "transformer" in hf_text.splitlines()[0] and "files: " in hf_text and "BF16 x" in hf_text
    assert f"'num_layers': {CFG.depth}" in hf_text


def test_info_cli_errors_exit_2(tmp_path, capsys):
    assert main(["no-such-preset"]) == 2
    (tmp_path / "x.safetensors").write_bytes(b"\x00" * 16)
    assert main([str(tmp_path / "x.safetensors")]) == 2
    assert "not a readable safetensors file" in capsys.readouterr().err
