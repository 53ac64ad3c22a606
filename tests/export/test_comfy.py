"""The ComfyUI-format adapter, applied with ComfyUI's patch math to ComfyUI-layout base weights, equals
the natively merged weights (float32), for every algorithm; q/k/v land in the fused qkv matrix."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.adapters import adapter_state_dict, build_adapter, merged_state_dict
from kohakumoss.export import to_comfy_adapter
from kohakumoss.export.comfy_apply import apply_comfy_adapter
from kohakumoss.model.layouts import LAYOUTS

from ..adapters.helpers import CFG, tiny_model

COMFY = LAYOUTS["comfy"]
# algo, lycoris args, expected format of the fused qkv, expected format of the other modules
CASES = [
    ("lora", {}, "lora", "lora"),
    ("loha", {}, "loha", "loha"),
    ("lokr", {"factor": 8}, "diff", "lokr"),
    ("dylora", {"block_size": 4}, "lora", "lora"),
    ("dora", {}, "diff", "diff"),
    ("oft", {}, "diff", "diff"),
    ("boft", {}, "diff", "diff"),
    ("glora", {}, "diff", "diff"),
    ("ia3", {}, "diff", "diff"),
    ("tlora", {}, "diff", "diff"),
]


def _perturb(net, seed=0, std=0.02):
    """Random non-zero adapter weights (what a few training steps would give, without the steps)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)


def _check(model, source):
    comfy = to_comfy_adapter(model, source)
    base = COMFY.from_native({k: v.detach() for k, v in model.state_dict().items()})
    expected = COMFY.from_native(merged_state_dict(model, source))
    patched = apply_comfy_adapter(base, comfy.tensors)
    changed = 0
    for key, want in expected.items():
        torch.testing.assert_close(patched[key], want.float(), rtol=1e-5, atol=1e-5, msg=key)
        changed += not torch.equal(want, base[key])
    assert changed > 0
    return comfy


@pytest.mark.parametrize("algo,args,qkv_format,other_format", CASES, ids=[c[0] for c in CASES])
def test_comfy_adapter_matches_native_merge(monkeypatch, algo, args, qkv_format, other_format):
    monkeypatch.setattr("lycoris.modules.tlora.gc.collect", lambda *a: 0)
    model = tiny_model()
    net = build_adapter(model, algo, rank=8, alpha=4, preset="full", **args)
    _perturb(net)
    comfy = _check(model, net)
    assert comfy.formats["layers.0.attention.qkv"] == qkv_format
    assert comfy.formats["layers.1.attention.out"] == other_format
    assert comfy.formats["x_embedder"] == other_format and comfy.formats["final_layer.linear"] == other_format
    assert all(k.startswith("diffusion_model.") for k in comfy.tensors)
    assert not any(".q_proj" in k or "attn." in k for k in comfy.tensors)


def test_fused_lora_layout_and_uneven_scales():
    model = tiny_model()
    net = build_adapter(
        model, "lora", rank=4, alpha=4, preset="custom", patterns=[r"blocks\.0\.attn\.(q|v)_proj"]
    )
    _perturb(net)
    sd = adapter_state_dict(net)
    sd["lycoris_blocks_0_attn_q_proj.alpha"] = (
        sd["lycoris_blocks_0_attn_q_proj.alpha"] * 3
    )  # q scale != v scale
    comfy = _check(model, sd)
    t = comfy.tensors
    key = "diffusion_model.layers.0.attention.qkv"
    assert t[f"{key}.lora_down.weight"].shape == (8, CFG.dim)  # q and v ranks concatenated, k absent
    up = t[f"{key}.lora_up.weight"]
    assert up.shape == (3 * CFG.dim, 8)
    assert torch.count_nonzero(up[CFG.dim : 2 * CFG.dim]) == 0  # k rows stay zero
    assert torch.count_nonzero(up[: CFG.dim, 4:]) == 0 and torch.count_nonzero(up[2 * CFG.dim :, :4]) == 0
    assert float(t[f"{key}.alpha"]) == 8.0  # uneven scales folded into up, alpha = rank
