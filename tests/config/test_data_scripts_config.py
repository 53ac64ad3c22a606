"""The data scripts' typed configs: shared sections are the training config's, one schema checks a data
config, the scripts read their typed values, and the knob reference page is generated."""

from __future__ import annotations

import dataclasses
import runpy
from pathlib import Path

import pytest

from kohakumoss.config.data_scripts import (
    DATA_SCHEMA,
    SCRIPT_CONFIGS,
    SHARED,
    TRAIN_SECTIONS,
    CacheLatentsConfig,
    DataScriptsConfig,
    reference_page,
    run_data_script,
)
from kohakumoss.config.train import TRAIN_SCHEMA, DataConfig, RunConfig, TrainConfig
from kohakumoss_common.typed_config import config_knobs, config_sections
from kohakumoss_data import PlanKnobs

ROOT = Path(__file__).resolve().parents[2]


def test_the_shared_sections_are_the_training_configs_own_fields():
    for cls in TRAIN_SECTIONS:
        assert issubclass(DataConfig, cls) or issubclass(RunConfig, cls), cls
    # the same Knob (default, help, rules) in both schemas: one definition per shared knob
    assert SHARED and all(DATA_SCHEMA.knobs[n] == TRAIN_SCHEMA.knobs[n] for n in SHARED)
    assert {"DATASET", "SEED", "TOKENS_PER_STEP", "CACHE_DIR", "SCAN_WORKERS"} <= set(SHARED)
    # a name in both schemas that is not shared is a different knob, and says so in its help
    other = sorted(set(DATA_SCHEMA.knobs) & set(TRAIN_SCHEMA.knobs) - set(SHARED))
    assert other == ["EPOCHS", "WORKERS"] and "not the training loader" in DATA_SCHEMA.knobs["WORKERS"].help
    assert "not the training run's EPOCHS" in DATA_SCHEMA.knobs["EPOCHS"].help
    # the trainer still reads the shared knobs where it did
    cfg = TrainConfig.from_knobs(TRAIN_SCHEMA.validate({"AREA": 512 * 512, "SEED": 3, "CACHE_DIR": "c"}))
    assert (cfg.data.area, cfg.run.seed, cfg.data.cache_dir) == (512 * 512, 3, "c")
    assert DATA_SCHEMA.knobs["EPOCHS"].default == PlanKnobs.epochs


def test_the_data_schema_is_the_union_of_the_scripts_configs():
    union = {k.name for cls in SCRIPT_CONFIGS.values() for k in config_knobs(cls)}
    assert union == set(DATA_SCHEMA.knobs) == {k.name for k in config_knobs(DataScriptsConfig)}
    for cls in SCRIPT_CONFIGS.values():
        # a section a script reads is the union's section of the same name (one class per section)
        union_sections = {f.name: f.default_factory for f in dataclasses.fields(DataScriptsConfig)}
        for f in dataclasses.fields(cls):
            assert union_sections[f.name] is f.default_factory, (cls.__name__, f.name)
        assert cls().knobs() == {n: DATA_SCHEMA.knobs[n].default for n in cls().knobs()}


def test_a_data_config_converts_to_each_scripts_typed_config():
    k = DATA_SCHEMA.validate(
        {"SEED": 7, "VAE_KWARGS": {"path": "v"}, "TEXT_FACTORY": "m:f", "MAX_AREA": None}
    )
    latents = CacheLatentsConfig.from_knobs(k)
    assert (latents.plan.seed, latents.vae.vae_kwargs, latents.cache.shard_items) == (7, {"path": "v"}, 512)
    assert not hasattr(latents, "text")  # cache_latents' config holds only its own sections
    assert SCRIPT_CONFIGS["convert_shards"].from_knobs(k).shards.max_area is None
    assert SCRIPT_CONFIGS["cache_text"].from_knobs(k).text.text_factory == "m:f"
    with pytest.raises(dataclasses.FrozenInstanceError):
        latents.vae.workers = 1  # type: ignore[misc]


def test_run_data_script_checks_every_data_knob_then_passes_the_typed_config(capsys):
    got = []
    ok = {"SEED": 4, "OUT_DIR": "o", "lowercase_helper": 1}
    assert run_data_script(CacheLatentsConfig, ok, got.append, "cache_latents.py") == 0
    assert isinstance(got[0], CacheLatentsConfig) and got[0].plan.seed == 4
    # another script's knob with a bad value is refused too: one data config feeds them all
    bad = {"ITEMS_PER_SHARD": 0, "VAE_FACTROY": "x", "BATCH_SIZE": "8"}
    assert run_data_script(CacheLatentsConfig, bad, got.append, "cache_latents.py") == 2
    err = capsys.readouterr().err
    assert "3 problem(s) in cache_latents.py knobs" in err
    assert "VAE_FACTROY: unknown knob (did you mean VAE_FACTORY?)" in err
    assert "ITEMS_PER_SHARD: 0 is below the minimum 1" in err and "BATCH_SIZE: expected int, got str" in err
    assert len(got) == 1


def test_a_scripts_run_reads_the_typed_values(tmp_path):
    """convert_shards' run passes its typed shard values on (a renamed field would fail here)."""
    ns = runpy.run_path(str(ROOT / "scripts" / "data" / "convert_shards.py"))
    seen = {}

    def fake_convert(source, catalog, out, max_area, items):
        seen.update(out=out, max_area=max_area, items=items)
        return []

    class Catalog:
        usable = ()

    ns["run"].__globals__["open_dataset"] = lambda dataset, scan: (seen.setdefault("scan", scan), Catalog())
    ns["run"].__globals__["convert_to_shards"] = fake_convert
    cfg = SCRIPT_CONFIGS["convert_shards"].from_knobs(
        {"OUT_DIR": str(tmp_path), "MAX_AREA": 1000, "MIN_SIDE": 9}
    )
    ns["run"](cfg)
    assert (seen["out"], seen["max_area"], seen["items"]) == (str(tmp_path), 1000, 256)
    assert seen["scan"].min_side == 9


def test_the_data_knobs_page_is_generated_from_the_configs():
    page = (ROOT / "docs" / "guides" / "data-knobs.md").read_text()
    assert page == reference_page(), (
        "regenerate: python -m kohakumoss.config.data_scripts > docs/guides/data-knobs.md"
    )
    for path, _ in config_sections(DataScriptsConfig):
        assert f"## `{path}`: " in page
    assert "| `scripts/data/cache_latents.py` | `dataset`, `scan`, `plan`, `cache`, `vae` |" in page
    assert "| `TOKENS_PER_STEP` | int | `8192` | >= 2 |" in page and "| `MAX_AREA` | int \\| None |" in page


@pytest.mark.parametrize("name", sorted(SCRIPT_CONFIGS))
def test_a_scripts_upper_case_globals_are_exactly_its_knobs(name):
    """What run_checked sees: an imported UPPER_CASE name (TYPE_CHECKING) would be an unknown knob."""
    from kohakumoss_common.knobs import script_knobs

    ns = runpy.run_path(str(ROOT / "scripts" / "data" / f"{name}.py"), run_name="kohakumoss_test")
    assert script_knobs(ns) == SCRIPT_CONFIGS[name]().knobs()


def test_a_factory_argument_it_does_not_take_is_refused_by_the_kwargs_knob():
    from kohakumoss.config.data_scripts import call_factory
    from kohakumoss.encoders import TextEncoderConfig
    from kohakumoss_common.errors import ConfigError

    def make(path: str, device: str = "cpu") -> tuple:
        return path, device

    assert call_factory(make, {"path": "p"}, "VAE_KWARGS") == ("p", "cpu")
    with pytest.raises(ConfigError, match=r"^VAE_KWARGS: got an unexpected keyword argument 'devise'"):
        call_factory(make, {"path": "p", "devise": "cuda"}, "VAE_KWARGS")
    with pytest.raises(ConfigError, match=r"^VAE_KWARGS: missing a required argument: 'path'"):
        call_factory(make, {}, "VAE_KWARGS")
    with pytest.raises(ConfigError, match=r"^TEXT_KWARGS: got an unexpected keyword argument 'layer'"):
        call_factory(TextEncoderConfig, {"path": "p", "layer": -2}, "TEXT_KWARGS")


def test_cache_text_names_a_bad_text_kwargs_field_before_loading():
    """The default factory (the real encoder) checks TEXT_KWARGS against TextEncoderConfig first."""
    from kohakumoss_common.errors import ConfigError

    ns = runpy.run_path(str(ROOT / "scripts" / "data" / "cache_text.py"), run_name="kohakumoss_test")
    with pytest.raises(ConfigError, match=r"^TEXT_KWARGS: .*'tokenizer'"):
        ns["real_text_encoder"]({"path": "models/none", "tokenizer": "t"}, 256)


def test_kohakumoss_config_checks_a_data_config_by_the_data_schema(tmp_path):
    from kohakumoss.cli.config_check import check_config

    path = tmp_path / "my_data.py"
    path.write_text("SEED = 3\nSHARD_ITEMS = 0\nVAE_KWARG = {}\nOUT_DIR = 'shards'\nRUN_DIR = 'r'\n")
    res = check_config(path)
    assert res.kind == "data"  # guessed: every knob but the typo is a data script's
    assert res.problems == [
        ("VAE_KWARG", "unknown knob (did you mean VAE_KWARGS?)"),
        ("SHARD_ITEMS", "0 is below the minimum 1"),
    ]
