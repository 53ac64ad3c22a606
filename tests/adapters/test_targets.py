"""Targeting presets select exactly the intended MOSS linears (the released names); bad presets fail
with named knobs."""

from __future__ import annotations

import pytest

from kohakumoss.adapters import build_adapter, matched_modules, target_patterns
from kohakumoss_common.errors import ConfigError

from .helpers import CFG, tiny_model


def _names(preset, patterns=None):
    pats, globs = target_patterns(preset, patterns)
    return matched_modules(tiny_model(), pats, globs)


def test_presets_select_the_intended_modules():
    d, r = CFG.depth, CFG.refiner_depth
    attn = set(_names("attn"))
    assert attn == {f"layers.{i}.proj.{p}" for i in range(d) for p in "qkvo"}
    mlp = set(_names("attn-mlp"))
    assert mlp == attn | {f"layers.{i}.proj.{p}" for i in range(d) for p in ("ffn_up_gate", "ffn_down")}
    full = set(_names("full"))
    refiner = {"text_embedder.proj"} | {
        f"text_embedder.blocks.{i}.{p}"
        for i in range(r)
        for p in ("qkv", "proj", "ffn_gate", "ffn_up", "ffn_down")
    }
    rest = {
        "video_embedder",
        "time_embedding.0",
        "time_embedding.2",
        "shared_block_modulation",
        "video_head_modulation",
        "final_linear_video",
    }
    assert full == mlp | refiner | rest
    assert len(full) == 6 * d + 1 + 5 * r + len(rest)  # every nn.Linear of the model


def test_full_covers_every_linear_of_the_model():
    from torch import nn

    model = tiny_model()
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert set(_names("full")) == linears


def test_custom_regex_and_glob():
    assert _names("custom", [r"layers\.0\.proj\.(q|v)"]) == ["layers.0.proj.q", "layers.0.proj.v"]
    assert _names("custom", ["layers.*.proj.q"]) == [f"layers.{i}.proj.q" for i in range(CFG.depth)]
    assert len(_names("custom", ["layers.*.proj.ffn_down"])) == CFG.depth
    # a regex is anchored: the refiner's own `proj` is not text_embedder.proj
    assert _names("custom", [r"text_embedder\.proj"]) == ["text_embedder.proj"]


def test_network_wraps_exactly_the_preset():
    model = tiny_model()
    net = build_adapter(
        model, "lora", rank=4, alpha=4, preset="custom", patterns=["final_linear_video", "video_embedder"]
    )
    assert sorted(m.lora_name for m in net.loras) == ["lycoris_final_linear_video", "lycoris_video_embedder"]
    assert not any(p.requires_grad for p in model.parameters())
    net = build_adapter(tiny_model(), "lora", rank=4, preset="attn-mlp")
    assert "lycoris_layers_0_proj_ffn_up_gate" in {m.lora_name for m in net.loras}
    assert len(net.loras) == 6 * CFG.depth


def test_bad_presets_name_the_knob():
    with pytest.raises(ConfigError, match="TARGET_PRESET"):
        target_patterns("everything")
    with pytest.raises(ConfigError, match="TARGET_PATTERNS"):
        target_patterns("custom", [])
    with pytest.raises(ConfigError, match="matches no"):
        build_adapter(tiny_model(), "lora", preset="custom", patterns=["nothing_here"])
    with pytest.raises(ConfigError, match="matches no"):  # an old (pre-release) name
        build_adapter(tiny_model(), "lora", preset="custom", patterns=[r"blocks\.\d+\.attn\.q_proj"])
    with pytest.raises(ConfigError, match="ALGO"):
        build_adapter(tiny_model(), "lorax")
    with pytest.raises(ConfigError, match="ALGO_ARGS"):
        build_adapter(tiny_model(), "dylora", rank=6, alpha=6, block_size=4)
