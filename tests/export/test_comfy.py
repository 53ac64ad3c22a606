"""The ComfyUI-format adapter, applied with ComfyUI's patch math to ComfyUI-layout base weights (the
released names, q/k/v fused into layers.N.proj.qkv), equals the natively merged weights (float32), for
every algorithm; its keys are the ones ComfyUI's generic LoRA key map reaches."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import save_file

from kohakumoss.adapters import adapter_state_dict, build_adapter, merged_state_dict
from kohakumoss.export import fuse_qkv, split_qkv, to_comfy_adapter
from kohakumoss.export.comfy_apply import apply_comfy_adapter, comfy_entries, merge_comfy_adapter
from kohakumoss.export.from_checkpoint import attach

from ..adapters.helpers import CFG, algo_names, flow_batch, forward, tiny_model

# algo, lycoris args, expected format of the fused qkv, expected format of the other modules
CASES = [
    ("lora", {}, "lora", "lora"),
    ("locon", {}, "lora", "lora"),
    ("loha", {}, "loha", "loha"),
    ("lokr", {"factor": 8}, "diff", "lokr"),  # the exact LoRA form would be as large as the diff here
    ("lokr-4", {"factor": 4}, "lora", "lokr"),  # kron(4x4, rank-8 64x64): one rank-96 LoRA on the qkv
    ("dylora", {"block_size": 4}, "lora", "lora"),
    ("dora", {}, "diff", "diff"),
    ("oft", {}, "oft", "oft"),
    ("oft-rescaled", {"rescaled": True}, "diff", "diff"),  # ComfyUI's OFT patch ignores `rescale`
    ("oft-constrained", {"constraint": 1e-4}, "oft", "oft"),  # lycoris: alpha x width; ComfyUI: alpha
    ("boft", {}, "diff", "boft"),  # a butterfly over q, k and v's rows apart is no butterfly of the qkv
    ("boft-constrained", {"constraint": 1e-4}, "diff", "boft"),
    ("boft-rescaled", {"rescaled": True}, "diff", "boft"),
    ("glora", {}, "lora", "glora"),
    ("ia3", {}, "diff", "diff"),
    ("tlora", {}, "diff", "diff"),
]


def test_every_algorithm_of_the_registry_has_a_case():
    assert {c[0].split("-")[0] for c in CASES} == set(algo_names())


SPLIT = re.compile(r"\.layers\.\d+\.proj\.(q|k|v)\.")


def _perturb(net, seed=0, std=0.02):
    """Random non-zero adapter weights (what a few training steps would give, without the steps)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)


def _native(model) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items()}


def _check(model, source, fused=True):
    comfy = to_comfy_adapter(model, source, fused=fused)
    layout = fuse_qkv if fused else dict
    base = layout(_native(model))
    expected = layout(merged_state_dict(model, source))
    patched = apply_comfy_adapter(base, comfy.tensors)
    changed = 0
    for key, want in expected.items():
        torch.testing.assert_close(patched[key], want.float(), rtol=1e-5, atol=1e-5, msg=key)
        changed += not torch.equal(want, base[key])
    assert changed > 0
    # ComfyUI's generic rule maps `diffusion_model.<key without .weight>` onto each weight of its model
    weights = {k[: -len(".weight")] for k in base if k.endswith(".weight")}
    assert set(comfy_entries(comfy.tensors)) <= weights
    return comfy


@pytest.mark.parametrize("algo,args,qkv_format,other_format", CASES, ids=[c[0] for c in CASES])
def test_comfy_adapter_matches_native_merge(monkeypatch, algo, args, qkv_format, other_format):
    monkeypatch.setattr("lycoris.modules.tlora.gc.collect", lambda *a: 0)
    model = tiny_model()
    net = build_adapter(model, algo.split("-")[0], rank=8, alpha=4, preset="full", **args)
    _perturb(net)
    comfy = _check(model, net)
    f = comfy.formats
    assert f["layers.0.proj.qkv"] == qkv_format and f["layers.1.proj.o"] == other_format
    assert f["layers.2.proj.ffn_up_gate"] == other_format and f["layers.3.proj.ffn_down"] == other_format
    for name in ("video_embedder", "final_linear_video", "text_embedder.blocks.0.qkv", "time_embedding.2"):
        assert f[name] == other_format, name  # the refiner's own qkv is one module: not repacked
    assert all(k.startswith("diffusion_model.") for k in comfy.tensors)
    assert not any(SPLIT.search(k) for k in comfy.tensors)


@pytest.mark.parametrize(
    "algo,args", [("lora", {}), ("loha", {}), ("lokr", {"factor": 8})], ids=["lora", "loha", "lokr"]
)
def test_unfused_export_has_the_published_key_style(algo, args):
    model = tiny_model()
    net = build_adapter(model, algo, rank=8, alpha=4, preset="attn-mlp", **args)
    _perturb(net)
    comfy = _check(model, net, fused=False)
    assert not any(".qkv." in k for k in comfy.tensors)
    if algo == "lora":  # exactly the published MOSS LoRAs' names
        names = {
            f"diffusion_model.layers.{i}.proj.{p}.{t}"
            for i in range(CFG.depth)
            for p in ("q", "k", "v", "o", "ffn_up_gate", "ffn_down")
            for t in ("lora_down.weight", "lora_up.weight", "alpha")
        }
        assert set(comfy.tensors) == names


def test_fused_lora_layout_and_uneven_scales():
    model = tiny_model()
    net = build_adapter(model, "lora", rank=4, alpha=4, preset="custom", patterns=[r"layers\.0\.proj\.(q|v)"])
    _perturb(net)
    sd = adapter_state_dict(net)
    sd["lycoris_layers_0_proj_q.alpha"] = sd["lycoris_layers_0_proj_q.alpha"] * 3  # q scale != v scale
    comfy = _check(model, sd)
    t = comfy.tensors
    key = "diffusion_model.layers.0.proj.qkv"
    assert set(t) == {f"{key}.lora_down.weight", f"{key}.lora_up.weight", f"{key}.alpha"}
    assert t[f"{key}.lora_down.weight"].shape == (8, CFG.dim)  # q and v ranks concatenated, k absent
    up = t[f"{key}.lora_up.weight"]
    assert up.shape == (3 * CFG.dim, 8)
    assert torch.count_nonzero(up[CFG.dim : 2 * CFG.dim]) == 0  # k rows stay zero
    assert torch.count_nonzero(up[: CFG.dim, 4:]) == 0 and torch.count_nonzero(up[2 * CFG.dim :, :4]) == 0
    assert float(t[f"{key}.alpha"]) == 8.0  # uneven scales folded into up, alpha = rank


def test_fuse_and_split_are_inverse_and_keep_rows_in_q_k_v_order():
    state = _native(tiny_model())
    fused = fuse_qkv(state)
    assert "layers.0.proj.qkv.weight" in fused and "layers.0.proj.q.weight" not in fused
    assert len(fused) == len(state) - 2 * CFG.depth
    rows = fused["layers.2.proj.qkv.weight"]
    assert torch.equal(rows[CFG.dim : 2 * CFG.dim], state["layers.2.proj.k.weight"])
    assert torch.equal(fused["text_embedder.blocks.0.qkv.weight"], state["text_embedder.blocks.0.qkv.weight"])
    back = split_qkv(fused)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)


def test_a_loha_comfy_file_merges_into_the_native_model(tmp_path):
    """LoHa / LoKr / diff entries cannot run as LoRA modules: the sample path merges them (ComfyUI's math)."""
    batch = flow_batch()
    model = tiny_model()
    net = build_adapter(model, "loha", rank=8, alpha=4, preset="full")
    _perturb(net)
    source = adapter_state_dict(net)
    comfy = to_comfy_adapter(model, source)
    path = tmp_path / "loha-comfy.safetensors"
    save_file(comfy.tensors, str(path))
    want = tiny_model()
    want.load_state_dict(merged_state_dict(want, source, multiplier=0.5))
    target = tiny_model()
    network, _ = attach(target, path, multiplier=0.5)
    assert network is None  # merged, not attached
    with torch.no_grad():
        assert (forward(want, batch) - forward(tiny_model(), batch)).abs().max() > 1e-3
        torch.testing.assert_close(forward(target, batch), forward(want, batch), rtol=1e-5, atol=1e-5)
    changed = merge_comfy_adapter(tiny_model(), comfy.tensors)
    assert "layers.0.proj.k.weight" in changed and "text_embedder.blocks.1.qkv.weight" in changed


STRENGTH_CASES = [c for c in CASES if c[0] not in ("tlora", "dylora")]


@pytest.mark.parametrize(
    "algo,args,qkv_format,other_format", STRENGTH_CASES, ids=[c[0] for c in STRENGTH_CASES]
)
def test_comfy_strength_against_the_lycoris_multiplier(algo, args, qkv_format, other_format):
    """ComfyUI's strength s adds s times the file's change (W + s dW, DoRA: W + s (W' - W); its OFT: s^2
    times); lycoris's multiplier does the same except for DoRA (it rescales W + dW by
    1 + s (m / |W + dW| - 1)) and BOFT (it scales the rotation): DoRA, OFT and BOFT agree with ComfyUI only
    at 1 (docs/concepts/adapters.md)."""
    model = tiny_model()
    net = build_adapter(model, algo.split("-")[0], rank=8, alpha=4, preset="attn", **args)
    _perturb(net, std=0.05)
    source = adapter_state_dict(net)
    comfy = to_comfy_adapter(model, source)
    base = fuse_qkv(_native(model))
    for strength in (1.0, 0.5):
        got = apply_comfy_adapter(base, comfy.tensors, strength)
        want = fuse_qkv(merged_state_dict(model, source, multiplier=strength))
        full = fuse_qkv(merged_state_dict(model, source))
        key = "layers.1.proj.o.weight"
        err = float((got[key] - want[key].float()).norm() / (full[key].float() - base[key].float()).norm())
        if strength == 1.0 or algo.split("-")[0] not in ("dora", "oft", "boft"):
            assert err < 1e-4, (strength, err)
        else:
            assert err > 1e-2, err
