"""Exports of a run: the LyCORIS and ComfyUI files, merged transformers in the released layouts (the HF
transformer/ folder, ComfyUI's fused-qkv single file) give the base + adapter forward; a full fine-tune
exports its EMA weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from kohakumoss.adapters import build_adapter, load_adapter
from kohakumoss.export import export_all, hf_config_json, save_merged, split_qkv
from kohakumoss.model import MossBackbone, MossConfig
from kohakumoss.model.io import CONFIG_METADATA_KEY
from kohakumoss.train import EMA
from kohakumoss_common.io import load_tensors, read_header

from ..adapters.helpers import CFG, flow_batch, forward, tiny_model
from .test_comfy import _perturb

COMFY_FILE_PREFIX = "model.diffusion_model."
# the released transformer/config.json fields (docs of the release, the public ports)
RELEASED_FIELDS = (
    "dim",
    "ffn_dim",
    "num_heads",
    "num_layers",
    "text_dim",
    "freq_dim",
    "latent_channels",
    "rope_base",
)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def _load(path) -> MossBackbone:
    """A tiny backbone from an exported file or folder (either layout), strict, in float32."""
    state = load_tensors(path, torch.float32)
    state = split_qkv({k.removeprefix(COMFY_FILE_PREFIX): v for k, v in state.items()})
    model = MossBackbone(CFG)
    model.load_state_dict(state, strict=True)
    return model.eval()


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

    fresh = tiny_model()
    load_adapter(fresh, written["lycoris"])
    with safe_open(str(written["comfy"]), "pt") as f:
        keys, meta = list(f.keys()), f.metadata()
    assert keys and all(k.startswith("diffusion_model.") for k in keys)
    assert json.loads(meta["kohakumoss_comfy_formats"])["layers.0.proj.qkv"] == (
        "lora" if algo == "lora" else "diff"
    )

    hf = tmp_path / "transformer"
    config = json.loads((hf / "config.json").read_text())
    assert config == hf_config_json(CFG) and config["_class_name"] == "MOSSImageTransformer"
    assert set(RELEASED_FIELDS) <= set(config)
    assert MossConfig.from_hf_config(config) == CFG
    entries, hf_meta = read_header(hf)
    assert set(entries) == set(model.state_dict())  # the released names, rope.bands included
    assert {d for d, _ in entries.values()} == {"BF16"}
    assert MossConfig.from_json(hf_meta[CONFIG_METADATA_KEY]) == CFG
    assert (hf / "diffusion_pytorch_model.safetensors").is_file()

    comfy_entries, _ = read_header(tmp_path / "merged")
    assert all(k.startswith(COMFY_FILE_PREFIX) for k in comfy_entries)
    assert f"{COMFY_FILE_PREFIX}layers.0.proj.qkv.weight" in comfy_entries
    assert entries["layers.0.proj.q.weight"][1] == [CFG.dim, CFG.dim]
    assert comfy_entries[f"{COMFY_FILE_PREFIX}layers.0.proj.qkv.weight"][1] == [3 * CFG.dim, CFG.dim]
    assert not any(k.endswith((".proj.q.weight", ".proj.k.weight", ".proj.v.weight")) for k in comfy_entries)

    native = save_merged(model, written["lycoris"], tmp_path / "native32", layout="native", dtype=None)
    with torch.no_grad():
        torch.testing.assert_close(forward(fresh, batch), adapted, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(forward(_load(native[0]), batch), adapted, rtol=1e-5, atol=2e-5)
        for folder in ("merged", "transformer"):  # bf16 files: bf16 tolerance
            assert _rel_err(forward(_load(tmp_path / folder), batch), adapted) < 2e-2, folder


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
    exported = _load(written["merged"])
    for name, p in exported.named_parameters():
        assert torch.equal(p, ema.shadow[name]), name
    live = model.video_embedder.weight
    assert not torch.equal(exported.video_embedder.weight, live)  # the live weights are back after the swap


def test_unknown_merged_layout_names_the_knob(tmp_path):
    from kohakumoss_common.errors import ConfigError

    with pytest.raises(ConfigError, match="MERGED_LAYOUT"):
        save_merged(tiny_model(), None, tmp_path, layout="diffusers-old")
