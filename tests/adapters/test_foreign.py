"""Published-style LoRA files (kohya / ComfyUI, PEFT, Comfy-Org's fused qkv) load as LyCORIS networks that
change the tiny model's output exactly as the hand merge W + multiplier * alpha / rank * up @ down does;
keys that fit nothing are refused by name (or, not strict, logged like ComfyUI does)."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import save_file

from kohakumoss.adapters import adapter_state_dict, build_adapter, is_lora_state, load_adapter
from kohakumoss.export import to_comfy_adapter
from kohakumoss.export.from_checkpoint import attach
from kohakumoss_common.errors import CheckpointError

from .helpers import CFG, flow_batch, forward, tiny_model

D, F = CFG.dim, CFG.mlp_hidden
# module -> (out, in) of its weight, a spread of the model's linears (biased ones included)
SHAPES = {
    "layers.0.proj.q": (D, D),
    "layers.0.proj.k": (D, D),
    "layers.1.proj.o": (D, D),
    "layers.2.proj.ffn_up_gate": (2 * F, D),
    "layers.3.proj.ffn_down": (D, F),
    "text_embedder.blocks.0.qkv": (3 * D, D),
    "video_embedder": (D, CFG.in_channels),
}


def _loras(rank=4, seed=0, alpha=True) -> dict[str, tuple]:
    """{module: (up, down, alpha or None)} with values large enough to move the output."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, (name, (o, n)) in enumerate(SHAPES.items()):
        r = rank + i % 3  # ranks differ between modules
        up, down = torch.randn(o, r, generator=g) * 0.1, torch.randn(r, n, generator=g) * 0.1
        out[name] = (up, down, float(2 + i) if alpha else None)
    return out


def _hand_merged(loras: dict, multiplier: float = 1.0):
    model = tiny_model()
    state = model.state_dict()
    for name, (up, down, alpha) in loras.items():
        scale = (alpha if alpha is not None else down.shape[0]) / down.shape[0]
        state[f"{name}.weight"] = state[f"{name}.weight"] + multiplier * scale * (up @ down)
    model.load_state_dict(state)
    return model


def _kohya(loras: dict, prefix="diffusion_model.") -> dict[str, torch.Tensor]:
    sd = {}
    for name, (up, down, alpha) in loras.items():
        sd[f"{prefix}{name}.lora_down.weight"] = down
        sd[f"{prefix}{name}.lora_up.weight"] = up
        if alpha is not None:
            sd[f"{prefix}{name}.alpha"] = torch.tensor(alpha)
    return sd


def _peft(loras: dict, prefix="transformer.", default=False) -> dict[str, torch.Tensor]:
    d = ".default" if default else ""
    sd = {}
    for name, (up, down, _) in loras.items():
        sd[f"{prefix}{name}.lora_A{d}.weight"] = down
        sd[f"{prefix}{name}.lora_B{d}.weight"] = up
    return sd


def _check(sd_or_path, loras, multiplier=1.0, **kw):
    batch = flow_batch()
    with torch.no_grad():
        want = forward(_hand_merged(loras, multiplier), batch)
        base = forward(tiny_model(), batch)
        model = tiny_model()
        net = load_adapter(model, sd_or_path, multiplier=multiplier, **kw)
        got = forward(model, batch)
    assert (want - base).abs().max() > 1e-2  # the LoRA moves the output, so the comparison can fail
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    return net


@pytest.mark.parametrize("prefix", ["diffusion_model.", "model.diffusion_model.", ""])
def test_kohya_file_equals_the_hand_merge(tmp_path, prefix):
    loras = _loras()
    path = tmp_path / "kohya.safetensors"
    save_file({k: v.contiguous() for k, v in _kohya(loras, prefix).items()}, str(path))
    net = _check(path, loras, multiplier=0.7)
    assert {type(m).__name__ for m in net.loras} == {"LoConModule"} and len(net.loras) == len(SHAPES)
    assert {m.lora_dim for m in net.loras} == {4, 5, 6}


def test_kohya_without_alpha_scales_by_one_and_underscore_names_load():
    loras = _loras(alpha=False)
    _check(_kohya(loras), loras)
    underscored = {
        k.replace("diffusion_model.", "").replace(name, "lora_unet_" + name.replace(".", "_")): v
        for name in loras
        for k, v in _kohya({name: loras[name]}).items()
    }
    _check(underscored, loras)


@pytest.mark.parametrize(
    "prefix,default", [("transformer.", False), ("", False), ("base_model.model.", True)]
)
def test_peft_file_equals_the_hand_merge(prefix, default):
    loras = {k: (u, d, None) for k, (u, d, _) in _loras(seed=3).items()}  # PEFT files carry no alpha
    sd = _peft(loras, prefix, default)
    assert is_lora_state(sd)
    _check(sd, loras, multiplier=1.5)


def test_fused_qkv_lora_splits_into_q_k_v():
    g = torch.Generator().manual_seed(5)
    R = 6
    up, down = torch.randn(3 * D, R, generator=g) * 0.1, torch.randn(R, D, generator=g) * 0.1
    sd = {
        "diffusion_model.layers.1.proj.qkv.lora_up.weight": up,
        "diffusion_model.layers.1.proj.qkv.lora_down.weight": down,
        "diffusion_model.layers.1.proj.qkv.alpha": torch.tensor(3.0),
    }
    loras = {f"layers.1.proj.{p}": (u, down, 3.0) for p, u in zip("qkv", up.chunk(3))}
    net = _check(sd, loras)
    assert sorted(m.lora_name for m in net.loras) == [f"lycoris_layers_1_proj_{p}" for p in "kqv"]
    assert {m.lora_dim for m in net.loras} == {R}  # dense: every member keeps the full rank


def test_our_comfy_export_loads_back_at_the_trained_ranks():
    """The fused export of separate q and v LoRAs (k absent, uneven scales) comes back as q and v only."""
    batch = flow_batch()
    model = tiny_model()
    net = build_adapter(
        model, "lora", rank=4, alpha=2, preset="custom", patterns=[r"layers\.\d+\.proj\.(q|v|o)"]
    )
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    sd = adapter_state_dict(net)
    sd["lycoris_layers_0_proj_q.alpha"] = sd["lycoris_layers_0_proj_q.alpha"] * 3  # uneven scales in a group
    reference = tiny_model()
    load_adapter(reference, sd)
    comfy = to_comfy_adapter(model, sd)
    assert (
        is_lora_state(comfy.tensors) and "diffusion_model.layers.0.proj.qkv.lora_up.weight" in comfy.tensors
    )
    fresh = tiny_model()
    loaded = load_adapter(fresh, comfy.tensors)
    assert sorted(m.lora_name for m in loaded.loras) == sorted(m.lora_name for m in net.loras)
    assert {m.lora_dim for m in loaded.loras} == {4}
    with torch.no_grad():
        want = forward(reference, batch)
        assert (want - forward(tiny_model(), batch)).abs().max() > 1e-2
        torch.testing.assert_close(forward(fresh, batch), want, rtol=1e-5, atol=1e-5)


def test_the_sample_scripts_attach_takes_a_kohya_file_at_a_multiplier(tmp_path):
    loras = _loras(seed=7)
    path = tmp_path / "published.safetensors"
    save_file({k: v.contiguous() for k, v in _kohya(loras).items()}, str(path))
    batch = flow_batch()
    model = tiny_model()
    network, name = attach(model, path, multiplier=0.5)
    assert name == "published" and network is not None and len(network.loras) == len(SHAPES)
    with torch.no_grad():
        want = forward(_hand_merged(loras, 0.5), batch)
        torch.testing.assert_close(forward(model, batch), want, rtol=1e-5, atol=1e-5)


def test_unusable_keys_are_named_or_logged(tmp_path, caplog):
    loras = _loras()
    sd = _kohya(loras)
    sd["diffusion_model.layers.0.norm1.lora_up.weight"] = torch.zeros(D, 4)  # a norm is no linear
    sd["lora_te_text_model_encoder_layers_0_mlp_fc1.lora_up.weight"] = torch.zeros(8, 4)  # text encoder
    sd["diffusion_model.layers.9.proj.q.alpha"] = torch.tensor(1.0)  # a block tiny has not
    path = tmp_path / "extra.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    with pytest.raises(CheckpointError, match="3 keys name no linear") as err:
        load_adapter(tiny_model(), path)
    assert "layers.0.norm1" in str(err.value) and "lora_te_text_model" in str(err.value)
    assert str(path) in str(err.value)
    with caplog.at_level(logging.WARNING):
        _check(path, loras, strict=False)
    assert "layers.9.proj.q.alpha" in caplog.text and "lora key not loaded" in caplog.text


def test_lora_of_another_shape_and_broken_pairs_are_refused():
    loras = _loras()
    up, down, alpha = loras["layers.1.proj.o"]
    wrong = _kohya({**loras, "layers.1.proj.o": (up, torch.zeros(down.shape[0], 2 * D), alpha)})
    with pytest.raises(
        CheckpointError, match=r"diffusion_model\.layers\.1\.proj\.o\.lora_up\.weight.*do not fit"
    ):
        load_adapter(tiny_model(), wrong)
    no_up = {k: v for k, v in _kohya(loras).items() if k != "diffusion_model.video_embedder.lora_up.weight"}
    with pytest.raises(CheckpointError, match="'video_embedder' lacks its up"):
        load_adapter(tiny_model(), no_up)
    twice = {**_kohya(loras), **_peft({"layers.0.proj.q": loras["layers.0.proj.q"]}, "")}
    with pytest.raises(CheckpointError, match="hold the same tensor of layers.0.proj.q"):
        load_adapter(tiny_model(), twice)
    both = {**_kohya(loras), "diffusion_model.layers.0.proj.qkv.lora_up.weight": torch.ones(3 * D, 2),
            "diffusion_model.layers.0.proj.qkv.lora_down.weight": torch.ones(2, D)}  # fmt: skip
    with pytest.raises(CheckpointError, match="both on its own and inside a fused qkv"):
        load_adapter(tiny_model(), both)


def test_a_kohya_file_runs_beside_an_fp8_base(tmp_path):
    """Not merged: LyCORIS wraps the fp8 linears in bypass, as it does for our own files."""
    from kohakumoss.precision import quantize_frozen_linears

    loras = _loras(seed=4)
    path = tmp_path / "published.safetensors"
    save_file({k: v.contiguous() for k, v in _kohya(loras).items()}, str(path))
    batch = flow_batch()
    model = tiny_model().requires_grad_(False)
    quantize_frozen_linears(model, "fp8_weight")
    with torch.no_grad():
        fp8_base = forward(model, batch)
        network, _ = attach(model, path)
        fp8_lora = forward(model, batch)
        lora_effect = forward(_hand_merged(loras), batch) - forward(tiny_model(), batch)
    assert network is not None and all(m.bypass_mode for m in network.loras if "layers" in m.lora_name)
    err = (fp8_lora - fp8_base - lora_effect).abs().max() / lora_effect.abs().max()
    assert err < 0.05, err  # the LoRA's effect survives the fp8 base up to its rounding
