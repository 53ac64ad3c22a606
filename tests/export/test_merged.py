"""Exports of a run: the LyCORIS and ComfyUI files, merged transformers (comfy / native / diffusers
layout) give the base + adapter forward; a full fine-tune exports its EMA weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from kohakumoss.adapters import build_adapter, load_adapter
from kohakumoss.export import export_all, save_merged
from kohakumoss.model.io import load_backbone
from kohakumoss.train import EMA

from ..adapters.helpers import flow_batch, forward, tiny_model
from .test_comfy import _perturb


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("algo,args", [("lora", {}), ("lokr", {"factor": 8})], ids=["lora", "lokr"])
def test_exports_reproduce_base_plus_adapter(tmp_path, algo, args):
    batch = flow_batch()
    model = tiny_model()
    net = build_adapter(model, algo, rank=8, alpha=4, preset="full", **args)
    _perturb(net, std=0.06)
    net.eval()
    with torch.no_grad():
        adapted = forward(model, batch)
        assert _rel_err(forward(tiny_model(), batch), adapted) > 5e-2  # so the bf16 tolerance below can fail
    written = export_all(
        model, net, tmp_path, "run", save_merged_model=True, merged_layout="comfy", save_diffusers=True
    )
    assert set(written) == {"lycoris", "comfy", "merged", "diffusers"}
    assert (tmp_path / "transformer" / "config.json").is_file()

    fresh = tiny_model()
    load_adapter(fresh, written["lycoris"])
    with safe_open(str(written["comfy"]), "pt") as f:
        keys, meta = list(f.keys()), f.metadata()
    assert keys and all(k.startswith("diffusion_model.") for k in keys)
    assert json.loads(meta["kohakumoss_comfy_formats"])["layers.0.attention.qkv"] == (
        "lora" if algo == "lora" else "diff"
    )

    native = save_merged(model, written["lycoris"], tmp_path / "native32", layout="native", dtype=None)
    with torch.no_grad():
        torch.testing.assert_close(forward(fresh, batch), adapted, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            forward(load_backbone(native[0], dtype=torch.float32), batch), adapted, rtol=1e-5, atol=2e-5
        )
        for folder in ("merged", "transformer"):  # bf16 files: bf16 tolerance
            merged = load_backbone(tmp_path / folder, dtype=torch.float32)
            assert _rel_err(forward(merged, batch), adapted) < 2e-2, folder


def test_full_finetune_exports_ema_weights(tmp_path):
    model = tiny_model().requires_grad_(True)
    ema = EMA(model, decay=0.5, warmup=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    ema.update(0)
    with ema.swapped():
        written = export_all(model, None, tmp_path, "run", merged_layout="native", dtype=None)
    assert set(written) == {"merged"}
    exported = load_backbone(written["merged"], dtype=torch.float32)
    for name, p in exported.named_parameters():
        assert torch.equal(p, ema.shadow[name]), name
    assert not torch.equal(exported.img_in.weight, model.img_in.weight)  # live weights are back
