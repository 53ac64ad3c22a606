"""The typed training config: the schema, its defaults and the knob reference come from its fields."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kohakumoss.config.export import EXPORT_SCHEMA, ExportScriptConfig
from kohakumoss.config.reference import reference
from kohakumoss.config.sample import SAMPLE_SCHEMA, SampleScriptConfig
from kohakumoss.config.train import ENCODER_KNOBS, TRAIN_SCHEMA, EncoderConfig, TrainConfig
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.typed_config import (
    config_knobs,
    config_sections,
    from_knobs,
    knob,
    section,
    to_knobs,
    with_knobs,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_section_field_is_one_knob_with_help_and_one_default():
    names = [k.name for k in config_knobs(TrainConfig)]
    assert len(names) == len(set(names)) == len(TRAIN_SCHEMA.knobs)  # no knob in two sections
    assert list(TRAIN_SCHEMA.knobs) == names  # the schema is the config's fields, in order
    assert TrainConfig().knobs() == TRAIN_SCHEMA.defaults()
    for _, cls in config_sections(TrainConfig):
        for f in dataclasses.fields(cls):
            assert TRAIN_SCHEMA.knobs[f.name.upper()].help, f.name
    assert [k.name for k in ENCODER_KNOBS] == [k.name for k in config_knobs(EncoderConfig)]


@pytest.mark.parametrize(
    "config, schema",
    [(TrainConfig, TRAIN_SCHEMA), (SampleScriptConfig, SAMPLE_SCHEMA), (ExportScriptConfig, EXPORT_SCHEMA)],
)
def test_each_script_schema_is_its_typed_config(config, schema):
    assert list(schema.knobs) == [k.name for k in config_knobs(config)]
    assert config().knobs() == schema.defaults() and config.from_knobs(schema.defaults()) == config()


def test_from_knobs_and_back_is_the_same_dict_and_typed_by_section():
    k = TRAIN_SCHEMA.validate({"LR": 2e-4, "STEPS": 30, "DATASET": [{"kind": "folder", "path": "x"}]})
    config = TrainConfig.from_knobs(k)
    assert (config.optim.lr, config.optim.steps, config.data.dataset[0]["kind"]) == (2e-4, 30, "folder")
    assert config.knobs() == k
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.optim.lr = 1.0  # type: ignore[misc]


def test_a_list_default_is_a_fresh_copy_per_config_and_the_schema_keeps_its_own():
    a, b = TrainConfig(), TrainConfig()
    a.data.val_sigmas.append(0.95)
    assert b.data.val_sigmas == TRAIN_SCHEMA.defaults()["VAL_SIGMAS"] == [0.1, 0.3, 0.5, 0.7, 0.9]


def test_the_annotation_is_the_type_the_schema_checks():
    problems = dict(
        TRAIN_SCHEMA.problems({"CHECKPOINT_EVERY": "two", "DEVICES": "all", "LR": 1, "GRAD_OFFLOAD": 1})
    )
    assert problems == {
        "CHECKPOINT_EVERY": "expected int/NoneType, got str 'two'",
        "DEVICES": "expected int/list, got str 'all'",
        "GRAD_OFFLOAD": "expected bool/NoneType, got int 1",
    }  # LR: float takes an int
    with pytest.raises(ConfigError, match="STEPS: 1 problem"):
        TRAIN_SCHEMA.validate({"STEPS": 0})


@dataclasses.dataclass(frozen=True)
class _Inner:
    """Inner knobs."""

    depth: int = knob(3, "how deep", min=1)
    names: list = knob(["a"], "some names")


@dataclasses.dataclass(frozen=True)
class _Outer:
    """Outer knobs."""

    width: float | None = knob(None, "how wide")
    inner: _Inner = section(_Inner)


def test_nested_sections_generate_knobs_in_order_and_convert_both_ways():
    knobs = config_knobs(_Outer)
    assert [(k.name, k.types, k.min) for k in knobs] == [
        ("WIDTH", (float, int, type(None)), None),
        ("DEPTH", (int,), 1),
        ("NAMES", (list,), None),
    ]
    assert [path for path, _ in config_sections(_Outer)] == ["", "inner"]
    config = from_knobs(_Outer, {"DEPTH": 5, "WIDTH": 2.0})
    assert config == _Outer(width=2.0, inner=_Inner(depth=5)) and to_knobs(config)["NAMES"] == ["a"]


def test_with_knobs_sets_knobs_by_their_names_at_any_depth_and_refuses_others():
    config = _Outer(width=2.0)
    changed = with_knobs(config, {"DEPTH": 7, "NAMES": ["b"]})
    assert changed == _Outer(width=2.0, inner=_Inner(depth=7, names=["b"])) and config.inner.depth == 3
    assert with_knobs(config, {}) is config
    run = TrainConfig()
    smaller = with_knobs(run, {"RANK": 8, "TOKENS_PER_STEP": 4096})
    assert (smaller.adapter.rank, smaller.data.tokens_per_step) == (8, 4096)
    assert smaller.optim is run.optim and run.adapter.rank == 16  # untouched sections are shared
    with pytest.raises(KeyError, match="RANKK"):
        with_knobs(run, {"RANKK": 8})


def test_a_type_rule_or_a_plain_field_is_refused():
    with pytest.raises(TypeError, match="annotation"):
        knob(1, "x", type=int)

    @dataclasses.dataclass(frozen=True)
    class Plain:
        value: int = 3

    with pytest.raises(TypeError, match="neither a knob"):
        config_knobs(Plain)


def test_the_knob_reference_page_is_generated_from_the_config():
    page = (ROOT / "docs" / "guides" / "train-knobs.md").read_text()
    assert page == reference(TrainConfig, resume=True), (
        "regenerate: python -m kohakumoss.config.reference > docs/guides/train-knobs.md"
    )
    assert "| `TOKENS_PER_STEP` | int | `8192` | >= 2 |" in page
    assert "kohya\\|folder" in page  # a | inside a help text does not split the table row
