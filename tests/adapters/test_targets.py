"""Targeting presets select exactly the intended MOSS linears; bad presets fail with named knobs."""

from __future__ import annotations

import pytest

from kohakumoss.adapters import build_adapter, matched_modules, target_patterns
from kohakumoss_common.errors import ConfigError

from .helpers import CFG, tiny_model


def _names(preset, patterns=None):
    pats, globs = target_patterns(preset, patterns)
    return matched_modules(tiny_model(), pats, globs)


def test_presets_select_the_intended_modules():
    d = CFG.depth
    attn = _names("attn")
    assert len(attn) == 4 * d and all(".attn." in n and n.endswith("_proj") for n in attn)
    mlp = _names("attn-mlp")
    assert len(mlp) == 6 * d and "blocks.0.mlp.gate_up_proj" in mlp and "blocks.0.mlp.down_proj" in mlp
    full = set(_names("full"))
    extra = {
        "img_in",
        "txt_in",
        "time_embed.linear_1",
        "time_embed.linear_2",
        "final.modulation",
        "final.proj",
    }
    assert extra <= full and {f"blocks.{i}.modulation" for i in range(d)} <= full
    assert len(full) == 6 * d + d + len(extra)


def test_custom_regex_and_glob():
    assert _names("custom", [r"blocks\.0\.attn\.(q|v)_proj"]) == [
        "blocks.0.attn.q_proj",
        "blocks.0.attn.v_proj",
    ]
    assert len(_names("custom", ["blocks.*.mlp.down_proj"])) == CFG.depth


def test_network_wraps_exactly_the_preset():
    model = tiny_model()
    net = build_adapter(model, "lora", rank=4, alpha=4, preset="custom", patterns=["final.proj", "img_in"])
    assert sorted(m.lora_name for m in net.loras) == ["lycoris_final_proj", "lycoris_img_in"]
    assert not any(p.requires_grad for p in model.parameters())


def test_bad_presets_name_the_knob():
    with pytest.raises(ConfigError, match="TARGET_PRESET"):
        target_patterns("everything")
    with pytest.raises(ConfigError, match="TARGET_PATTERNS"):
        target_patterns("custom", [])
    with pytest.raises(ConfigError, match="matches no"):
        build_adapter(tiny_model(), "lora", preset="custom", patterns=["nothing_here"])
    with pytest.raises(ConfigError, match="ALGO"):
        build_adapter(tiny_model(), "lorax")
    with pytest.raises(ConfigError, match="ALGO_ARGS"):
        build_adapter(tiny_model(), "dylora", rank=6, alpha=6, block_size=4)
