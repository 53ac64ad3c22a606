"""Knob validation: every unknown knob and bad value is named, all at once."""

from __future__ import annotations

import pytest

from kohakumoss_common.errors import ConfigError
from kohakumoss_common.knobs import Knob, Schema, script_knobs

SCHEMA = Schema(
    [
        Knob("LR", 1e-4, "learning rate", min=0.0),
        Knob("STEPS", 100, "optimizer steps", min=1),
        Knob("ALGO", "lora", "adapter algorithm", choices=("lora", "loha", "lokr")),
        Knob("BYPASS", False, "bypass forward"),
        Knob("DATA", "", "dataset folder", path="dir"),
        Knob("PROMPTS", [], "sample prompts", type=list),
    ]
)


def test_defaults_overlaid():
    out = SCHEMA.validate({"LR": 2e-4, "STEPS": 5})
    assert out["LR"] == 2e-4 and out["STEPS"] == 5 and out["ALGO"] == "lora"


def test_int_accepted_for_float_but_not_bool_for_int():
    assert SCHEMA.validate({"LR": 1})["LR"] == 1
    with pytest.raises(ConfigError, match="STEPS: expected int, got bool"):
        SCHEMA.validate({"STEPS": True})


def test_every_problem_named_with_did_you_mean(tmp_path):
    with pytest.raises(ConfigError) as e:
        SCHEMA.validate(
            {"STEPZ": 3, "LR": -1.0, "ALGO": "lorra", "DATA": str(tmp_path / "nope"), "PROMPTS": "x"}
        )
    msg = str(e.value)
    assert "STEPZ: unknown knob (did you mean STEPS?)" in msg
    assert "LR: -1.0 is below the minimum 0.0" in msg
    assert "ALGO: 'lorra' is not one of ['lora', 'loha', 'lokr'] (did you mean 'lora'?)" in msg
    assert "DATA: path" in msg and "does not exist" in msg
    assert "PROMPTS: expected list, got str" in msg
    assert "5 problem(s)" in msg


def test_path_kind_checked(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        SCHEMA.validate({"DATA": str(f)})
    assert SCHEMA.validate({"DATA": str(tmp_path)})["DATA"] == str(tmp_path)


def test_script_knobs_only_upper_case():
    assert script_knobs({"LR": 1, "_X": 2, "lower": 3, "__name__": "m"}) == {"LR": 1}


def test_command_line_text_reads_as_the_literal_the_knob_takes():
    """`kogine run ... --set K=V` hands text wherever the script's default hides the type (None, a count
    that may be a list): the schema reads it; a choice spelled 'none' stays that choice."""
    from kohakumoss.config.train import TRAIN_SCHEMA

    got = TRAIN_SCHEMA.validate(
        {
            "STREAM_BLOCKS": "3",
            "GRAD_OFFLOAD": "true",
            "CHECKPOINTING": "none",
            "OPTIMIZER_PLACEMENT": "None",
            "DEVICES": "['cpu', 'cpu']",
            "DISTRIBUTED": "ddp",
            "BUCKETS": "[[512, 512]]",
        }  # fmt: skip
    )
    assert (got["STREAM_BLOCKS"], got["GRAD_OFFLOAD"], got["CHECKPOINTING"]) == (3, True, "none")
    assert got["OPTIMIZER_PLACEMENT"] is None and got["DEVICES"] == ["cpu", "cpu"]
    assert got["BUCKETS"] == [[512, 512]]
    assert TRAIN_SCHEMA.validate({"BUCKETS": "kohya"})["BUCKETS"] == "kohya"
    with pytest.raises(ConfigError, match=r"STREAM_BLOCKS: expected int/NoneType, got str '3x'"):
        TRAIN_SCHEMA.validate({"STREAM_BLOCKS": "3x"})
    # a knob whose default gives kogine its type arrives typed: text there is a mistake, named
    with pytest.raises(ConfigError, match="STEPS: expected int, got str '5'"):
        SCHEMA.validate({"STEPS": "5"})
