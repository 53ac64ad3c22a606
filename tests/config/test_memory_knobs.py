"""The memory-plan knobs of the train schema: defaults, choices, and errors that name the knob."""

from __future__ import annotations

import pytest

from kohakumoss.config.train import TRAIN_SCHEMA
from kohakumoss.memory.plan import PLAN_KNOBS
from kohakumoss_common.errors import ConfigError


def test_defaults_come_from_the_profile():
    d = TRAIN_SCHEMA.defaults()
    assert d["MEMORY_PROFILE"] == "auto" and d["CARD_GB"] == 0.0
    assert set(PLAN_KNOBS) <= set(TRAIN_SCHEMA.knobs)
    assert all(d[k] is None for k in PLAN_KNOBS)


def test_valid_values():
    ok = {
        "MEMORY_PROFILE": "c0299",
        "CHECKPOINTING": "attn",
        "CHECKPOINT_EVERY": 2,
        "STREAM_BLOCKS": -1,
        "STREAM_SLOTS": 3,
        "ACTIVATION_OFFLOAD": "on",
        "GRAD_OFFLOAD": True,
        "OPTIMIZER_PLACEMENT": "host",
        "TEXT_ENCODER_PLACEMENT": "streamed",
        "VAE_PLACEMENT": "off",
        "CARD_GB": 11.5,
    }
    assert TRAIN_SCHEMA.problems(ok) == []
    for name in ("low_vram", "minimal", "speed", "balanced", "auto"):
        assert TRAIN_SCHEMA.problems({"MEMORY_PROFILE": name}) == []


@pytest.mark.parametrize(
    ("knobs", "expected"),
    [
        ({"MEMORY_PROFILE": "fastest"}, "MEMORY_PROFILE: 'fastest' is not one of"),
        ({"MEMORY_PROFILE": "c0300"}, "MEMORY_PROFILE: no catalog entry 'c0300'"),
        ({"MEMORY_PROFILE": 3}, "MEMORY_PROFILE: expected str"),
        ({"CHECKPOINTING": "all"}, "CHECKPOINTING: 'all' is not one of"),
        ({"CHECKPOINT_EVERY": 0}, "CHECKPOINT_EVERY: 0 is below the minimum 1"),
        ({"STREAM_BLOCKS": -2}, "STREAM_BLOCKS: -2 is below the minimum -1"),
        ({"STREAM_SLOTS": 1}, "STREAM_SLOTS: 1 is below the minimum 2"),
        ({"ACTIVATION_OFFLOAD": True}, "ACTIVATION_OFFLOAD: expected str/NoneType, got bool"),
        ({"GRAD_OFFLOAD": "yes"}, "GRAD_OFFLOAD: expected bool/NoneType, got str"),
        ({"OPTIMIZER_PLACEMENT": "cpu"}, "OPTIMIZER_PLACEMENT: 'cpu' is not one of"),
        ({"TEXT_ENCODER_PLACEMENT": "offload"}, "TEXT_ENCODER_PLACEMENT: 'offload' is not one of"),
        ({"VAE_PLACEMENT": "gpu"}, "VAE_PLACEMENT: 'gpu' is not one of"),
        ({"CARD_GB": -1}, "CARD_GB: -1 is below the minimum 0.0"),
    ],
)
def test_bad_values_name_the_knob(knobs, expected):
    with pytest.raises(ConfigError) as e:
        TRAIN_SCHEMA.validate(knobs)
    assert expected in str(e.value)
