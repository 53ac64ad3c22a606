"""Named profiles and MEMORY_PROFILE resolution."""

from __future__ import annotations

import pytest

from kohakumoss.memory import PROFILES, MemoryPlan, catalog, estimate_plan, fastest_fit, resolve_plan
from kohakumoss.memory.calibration import GIB
from kohakumoss.model.presets import get_preset
from kohakumoss_common.errors import ConfigError

MOSS = get_preset("moss-image-5b")
KNOBS = {"RANK": 32, "TOKENS_PER_STEP": 8704, "PRECISION": "bf16", "TARGET_PRESET": "attn-mlp"}


@pytest.mark.parametrize("algo", ["lora", "full"])
def test_named_profiles_ordered_by_peak(algo):
    knobs = {**KNOBS, "ALGO": algo}
    peaks = [
        estimate_plan(PROFILES[n], knobs, MOSS).total for n in ("speed", "balanced", "low_vram", "minimal")
    ]
    assert peaks[0] > peaks[1] > peaks[2] > peaks[3], [p / GIB for p in peaks]
    assert PROFILES["speed"] == MemoryPlan()
    assert PROFILES["minimal"].text_encoder == "off" and PROFILES["minimal"].stream_blocks == -1


def test_resolve_named_entry_and_overrides():
    plan, why = resolve_plan({**KNOBS, "MEMORY_PROFILE": "low_vram"}, MOSS, 24.0, False)
    assert plan == PROFILES["low_vram"] and "profile 'low_vram'" in why
    plan, why = resolve_plan(
        {**KNOBS, "MEMORY_PROFILE": "balanced", "CHECKPOINT_EVERY": 3}, MOSS, 24.0, False
    )
    assert plan.checkpointing == "full" and plan.checkpoint_every == 3 and "CHECKPOINT_EVERY=3" in why
    entry = catalog(MOSS, KNOBS)[123]
    plan, why = resolve_plan({**KNOBS, "MEMORY_PROFILE": "c0123"}, MOSS, None, False)
    assert plan == entry.plan and "catalog entry c0123" in why


def test_auto_is_the_fastest_fit_and_speed_without_a_gpu():
    for gb in (8.0, 24.0, 141.0):
        plan, why = resolve_plan({**KNOBS, "MEMORY_PROFILE": "auto"}, MOSS, gb, False)
        best = fastest_fit(catalog(MOSS, KNOBS), gb * GIB)
        assert plan == best.plan and best.id in why and estimate_plan(plan, KNOBS, MOSS).total < gb * GIB
    assert resolve_plan(KNOBS, MOSS, None, False)[0] == PROFILES["speed"]
    plan, why = resolve_plan(KNOBS, MOSS, 0.5, False)
    assert "nothing fits" in why
    # a full fine-tune needs a different plan than an adapter on the same card
    assert resolve_plan(KNOBS, MOSS, 24.0, True)[0] != resolve_plan(KNOBS, MOSS, 24.0, False)[0]


def test_auto_respects_pins():
    plan, _ = resolve_plan({**KNOBS, "CHECKPOINTING": "mlp"}, MOSS, 16.0, False)
    assert plan.checkpointing == "mlp" and estimate_plan(plan, KNOBS, MOSS).total < 16 * GIB


def test_bad_values_name_the_knob():
    with pytest.raises(ConfigError, match="MEMORY_PROFILE"):
        resolve_plan({**KNOBS, "MEMORY_PROFILE": "fast"}, MOSS, 24.0, False)
    with pytest.raises(ConfigError, match="MEMORY_PROFILE: no catalog entry 'c0999'"):
        resolve_plan({**KNOBS, "MEMORY_PROFILE": "c0999"}, MOSS, 24.0, False)
    with pytest.raises(ConfigError, match="GRAD_OFFLOAD"):
        resolve_plan({**KNOBS, "MEMORY_PROFILE": "speed", "GRAD_OFFLOAD": True}, MOSS, 24.0, False)
    with pytest.raises(ConfigError, match="TEXT_ENCODER_PLACEMENT: 'off'.*TEXT_ENCODE is 'online'"):
        resolve_plan({**KNOBS, "MEMORY_PROFILE": "minimal", "TEXT_ENCODE": "online"}, MOSS, 8.0, False)
    with pytest.raises(ConfigError, match="OPTIMIZER_PLACEMENT: a full fine-tune with streamed blocks"):
        resolve_plan({**KNOBS, "MEMORY_PROFILE": "speed", "STREAM_BLOCKS": 4}, MOSS, 80.0, True)
