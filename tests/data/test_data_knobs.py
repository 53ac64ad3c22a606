"""The one conversion from a script's data knobs to kohakumoss_data's settings, and the data package
knowing no knob name."""

from __future__ import annotations

import re
import tokenize
from pathlib import Path

import pytest

from kohakumoss.config.data_scripts import DataScriptsConfig
from kohakumoss.config.train import TrainConfig
from kohakumoss.data_knobs import (
    LOADER_KNOBS,
    PLAN_KNOBS,
    SCAN_KNOBS,
    knob_errors,
    knob_name,
    loader_knobs,
    open_dataset,
    plan_dataset,
    plan_knobs,
    scan_knobs,
)
from kohakumoss_common.errors import ConfigError
from kohakumoss_data import LoaderKnobs, PlanKnobs, ScanKnobs
from kohakumoss_data.packing import pack_steps

DATA = Path(__file__).resolve().parents[2] / "src" / "kohakumoss_data"
# the train script's, which still imports the tables from here until it takes them from data_knobs
LEGACY = {DATA / "settings.py"}


def test_knobs_become_the_settings_and_absent_ones_keep_the_fields_defaults():
    knobs = {
        "AREA": 64 * 64,
        "TOKENS_PER_STEP": 300,
        "SCAN_WORKERS": 1,
        "WORKERS": 0,
        "BUCKETS": "[[64, 64]]",
    }
    data = TrainConfig.from_knobs(knobs).data
    plan = plan_knobs(data)
    assert (plan.area, plan.tokens_per_step, plan.buckets) == (4096, 300, ((64, 64),))
    assert plan.max_text_tokens == PlanKnobs.max_text_tokens and plan.crop == PlanKnobs.crop
    assert scan_knobs(data) == ScanKnobs(workers=1)
    assert loader_knobs(data) == LoaderKnobs(workers=0)
    assert plan_knobs(TrainConfig().data) == PlanKnobs()
    assert plan_knobs(DataScriptsConfig().plan) == PlanKnobs()  # a data script's plan section alike


@pytest.mark.parametrize(
    "key, knob",
    [
        ("tokens_per_step", "TOKENS_PER_STEP"),
        ("min_aspect/max_aspect", "MIN_ASPECT/MAX_ASPECT"),
        ("epochs/tokens_per_step/area", "EPOCHS/TOKENS_PER_STEP/AREA"),
        ("dataset[1].tag_dropout", "DATASET[1].tag_dropout"),
        ("dataset.kind", "DATASET.kind"),
        ("missing_caption", "MISSING_CAPTION"),
        ("VAL_ITEMS", "VAL_ITEMS"),
    ],
)
def test_a_data_errors_field_is_named_as_its_knob(key, knob):
    assert knob_name(key) == knob


def test_knob_errors_renames_the_field_and_keeps_the_message():
    too_small = r"^TOKENS_PER_STEP: 6 is smaller than one item \(7 tokens\)"
    with pytest.raises(ConfigError, match=too_small) as e, knob_errors():
        pack_steps([7], 6)
    assert e.value.knob == "TOKENS_PER_STEP" and isinstance(e.value.__cause__, ConfigError)
    with pytest.raises(ConfigError, match="^CROP: must be 'center' or 'random'"):
        plan_knobs(TrainConfig.from_knobs({"CROP": "middle"}).data)
    with pytest.raises(ConfigError, match=r"^DATASET\[1\]\.repeats: "):
        plan_knobs(
            TrainConfig().data,
            [{"kind": "kohya", "path": "a"}, {"kind": "kohya", "path": "b", "repeats": 0}],
        )
    with pytest.raises(ConfigError, match=r"^DATASET\.kind: unknown source kind 'zip'"):
        zip_data = TrainConfig.from_knobs({"DATASET": {"kind": "zip", "path": "x"}}).data
        open_dataset(zip_data, zip_data)


def test_the_scripts_helpers_scan_and_plan(kohya_dir, tmp_path, capsys):
    knobs = {"DATASET": {"kind": "kohya", "path": str(kohya_dir)}, "CATALOG_DIR": str(tmp_path), "SEED": 3}

    def planned(**more):
        cfg = DataScriptsConfig.from_knobs({**knobs, "AREA": 64 * 64, "TOKENS_PER_STEP": 300, **more})
        return plan_dataset(cfg.plan, cfg.dataset.dataset, catalog)

    cfg = DataScriptsConfig.from_knobs({**knobs, "SCAN_WORKERS": 1})
    _, catalog = open_dataset(cfg.dataset, cfg.scan)
    plan = planned()
    assert f"plan sha256 {plan.sha256}" in capsys.readouterr().out
    assert plan.seed == 3 and plan.knobs.tokens_per_step == 300 and plan.steps
    # MICRO_STEPS: at least the epochs a run of that many micro-steps plans (the trainer's count)
    per_epoch = len(plan.steps)
    longer = planned(MICRO_STEPS=2 * per_epoch + 1)
    assert longer.knobs.epochs == 3 and len(longer.steps) >= 2 * per_epoch + 1
    kept = planned(EPOCHS=4, MICRO_STEPS=1)
    assert kept.knobs.epochs == 4  # never fewer than EPOCHS


def knob_mentions(path: Path, knobs: set[str]) -> list[str]:
    """`line: NAME` for every knob name in a string or comment of `path` (a constant of the same name,
    like the drop reason MISSING_CAPTION, is code, not a knob)."""
    out = []
    with path.open("rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type in (tokenize.STRING, tokenize.COMMENT):
                out += [
                    f"{tok.start[0]}: {w}"
                    for w in re.findall(r"\b[A-Z][A-Z0-9_]+\b", tok.string)
                    if w in knobs
                ]
    return out


def test_the_data_package_names_no_script_knob(tmp_path):
    knobs = {
        *SCAN_KNOBS,
        *PLAN_KNOBS,
        *LOADER_KNOBS,
        "BUCKETS",
        "DATASET",
        "SEED",
        "CATALOG_DIR",
        "CACHE_DIR",
    }
    knobs |= {"VAE_ENCODE", "TEXT_ENCODE"}
    found = [
        f"{p.relative_to(DATA)}:{m}"
        for p in sorted(set(DATA.rglob("*.py")) - LEGACY)
        for m in knob_mentions(p, knobs)
    ]
    assert not found, "\n".join(found)
    probe = tmp_path / "probe.py"
    probe.write_text(
        'MISSING_CAPTION = "missing_caption"  # a drop reason\nraise ValueError("AREA too small")\n'
    )
    assert knob_mentions(probe, knobs) == ["2: AREA"]
