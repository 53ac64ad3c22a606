"""The product's ConvRot int8 DiT writer (`model/convrot_file.py`): its file reads as the Comfy-Org one."""

from __future__ import annotations

import torch

from kohakumoss.model import get_preset
from kohakumoss.model.convrot_file import save_convrot_dit
from kohakumoss.model.io import load_backbone, read_checkpoint
from kohakumoss.model.layouts import LAYOUTS
from kohakumoss.precision.int8_base import stored_int8_weights
from kohakumoss_common.io import read_header
from kohakumoss_common.quant import convrot_quantize, unrotate

from .helpers import random_model

CFG = get_preset("tiny")
GROUP = 256


def test_written_file_loads_as_a_convrot_comfy_dit_within_int8_rounding(tmp_path):
    model = random_model(CFG)
    path = save_convrot_dit(model, tmp_path / "moss_image_base_int8_convrot.safetensors", GROUP)
    info = read_checkpoint(path)
    assert info.layout.name == "comfy" and info.config == CFG
    assert len(info.quant.rotations) == 4 * CFG.depth  # qkv, o, ffn_up_gate, ffn_down of every block
    assert set(info.quant.rotations.values()) == {GROUP}
    header, _ = read_header(path)
    assert all(k.startswith("model.diffusion_model.") for k in header)
    assert header["model.diffusion_model.final_linear_video.weight"][0] == "BF16"  # the rest stays bf16
    want = LAYOUTS["comfy"].from_native(model.state_dict())
    got = LAYOUTS["comfy"].from_native(load_backbone(path, dtype=torch.float32).state_dict())
    for key, weight in want.items():
        if key == "rope.bands":
            continue
        if key in info.quant.rotations or "model.diffusion_model." + key in info.quant.rotations:
            scale = (
                weight.abs().amax(dim=1, keepdim=True) * 2 / 127
            )  # a generous row bound (rotation spreads)
            assert ((got[key] - weight).abs() <= 8 * scale).all(), key
            assert (got[key] - weight).abs().max() < 0.05 * weight.abs().max(), key
        else:
            torch.testing.assert_close(got[key], weight.to(torch.bfloat16).float(), rtol=0, atol=0)


def test_kept_int8_bytes_are_the_published_rotation_of_each_matrix(tmp_path):
    model = random_model(CFG)
    path = save_convrot_dit(model, tmp_path / "dit.safetensors", GROUP)
    stored = stored_int8_weights(path)
    assert len(stored) == 6 * CFG.depth  # the fused qkv split back into q, k, v
    q, scale, group = stored["layers.1.proj.k.weight"]
    weight = model.layers[1].proj["k"].weight.detach()
    want_q, want_scale = convrot_quantize(weight, GROUP)
    assert group == GROUP and torch.equal(q, want_q)
    torch.testing.assert_close(scale, want_scale.reshape(-1))
    back = unrotate(q.float() * scale[:, None], GROUP)  # un-rotated, the weight comes back
    assert (back - weight).abs().max() < 0.02 * weight.abs().max()
    assert (q.float() * scale[:, None] - weight).abs().max() > 0.1 * weight.abs().max()  # rotated on disk
