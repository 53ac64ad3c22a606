"""Knob values and names refused before any weight loads: non-finite floats, seeds the generators cannot
take, devices torch cannot parse, knob names in another case (every kogine script, `--set` and config
files), ALGO_ARGS keys lycoris ignores, RANK wider than a targeted layer, resume's compared inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kohakumoss.config.data_scripts import DATA_SCHEMA
from kohakumoss.config.export import EXPORT_SCHEMA
from kohakumoss.config.sample import SAMPLE_SCHEMA
from kohakumoss.config.train import RESUME_FIXED, RESUME_SAFE, TRAIN_SCHEMA
from kohakumoss_common.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
# every script that validates its knobs with run_checked (kogine hands it the globals), with a knob of it
SCRIPTS = {
    "train/moss.py": "STEPS",
    "sample/sample.py": "STEPS",
    "export/export.py": "OUT",
    "data/cache_latents.py": "MIN_SIDE",
    "data/cache_text.py": "MIN_SIDE",
    "data/convert_shards.py": "MIN_SIDE",
    "data/inspect_data.py": "MIN_SIDE",
    "demo/demo.py": "STEPS",
}


def problems(schema, **values) -> dict[str, str]:
    return dict(schema.problems(values))


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
def test_float_knobs_must_be_finite(value):
    """LR=inf once trained NaN weights and LR=nan passed `min=0` (nan compares False): both refused by name."""
    with pytest.raises(ConfigError, match=r"LR: .* is not a finite number"):
        TRAIN_SCHEMA.validate({"LR": value})
    assert "is not a finite number" in problems(TRAIN_SCHEMA, GRAD_CLIP=value)["GRAD_CLIP"]
    assert "non-finite" in problems(TRAIN_SCHEMA, VAL_SIGMAS=[0.5, value])["VAL_SIGMAS"]
    assert "is not a finite number" in problems(SAMPLE_SCHEMA, CFG=value)["CFG"]
    assert TRAIN_SCHEMA.validate({"LR": 2e-4})["LR"] == 2e-4


def test_seeds_are_within_what_the_generators_take():
    """SEED=2**70 once reached torch.manual_seed and raised an overflow traceback after setup."""
    for schema in (TRAIN_SCHEMA, SAMPLE_SCHEMA, EXPORT_SCHEMA, DATA_SCHEMA):
        assert "above the maximum" in problems(schema, SEED=2**70)["SEED"]
        assert "below the minimum" in problems(schema, SEED=-1)["SEED"]
        assert "SEED" not in problems(schema, SEED=2**63 - 1)
    torch.manual_seed(2**63 - 1 + 1000)  # the largest SEED plus a sampler's image index still seeds
    assert "not integers" in problems(SAMPLE_SCHEMA, SEEDS=[1, 2**70])["SEEDS"]
    assert "not integers" in problems(TRAIN_SCHEMA, SAMPLE_SEEDS=[-3])["SAMPLE_SEEDS"]


def test_a_device_torch_cannot_parse_is_refused_by_the_schema():
    for schema in (TRAIN_SCHEMA, SAMPLE_SCHEMA):
        assert "'banana' is not a device" in problems(schema, DEVICE="banana")["DEVICE"]
        assert "'meta' is a meta device" in problems(schema, DEVICE="meta")["DEVICE"]
        for ok in ("auto", "cpu", "cuda", "cuda:1", "xpu"):
            assert "DEVICE" not in problems(schema, DEVICE=ok), ok


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA GPUs")
def test_a_device_not_present_is_refused_before_anything_loads():
    from kohakumoss.train.components import resolve_device

    for absent in ("cuda", "cuda:3"):
        with pytest.raises(ConfigError, match="DEVICE: .*torch sees no CUDA GPU"):
            resolve_device(absent)
    with pytest.raises(ConfigError, match="DEVICE: 'banana' is not a device"):
        resolve_device("banana")
    assert resolve_device("cpu") == torch.device("cpu")


def test_a_knob_name_in_another_case_is_refused_with_its_spelling():
    for name in ("steps", "Steps", "min_side"):
        found = problems(TRAIN_SCHEMA, **{name: 5000})
        assert found == {name: f"knob names are upper case: did you mean {name.upper()}?"}
    # a config's own lower-case helpers and the script's functions are not knobs
    assert problems(TRAIN_SCHEMA, root="/data", main=print) == {}
    assert DATA_SCHEMA.miscased({"min_side": 1, "sys": 2, "MIN_SIDE": 3}) == {"min_side": 1}


def test_every_script_that_validates_its_knobs_is_covered():
    validating = {
        str(p.relative_to(ROOT / "scripts"))
        for p in (ROOT / "scripts").rglob("*.py")
        if "run_checked(" in p.read_text() or "run_data_script(" in p.read_text()
    }
    assert validating == set(SCRIPTS)


def _run_with_kogine(script: Path, config) -> int:
    """The script run as `kogine run` runs it (its globals set from `config`); its exit status."""
    from kohakuengine import Script
    from kohakuengine.engine.executor import ScriptExecutor

    with pytest.raises(SystemExit) as exit_info:
        ScriptExecutor(Script(str(script), config=config)).execute()
    return exit_info.value.code


@pytest.mark.parametrize("script", sorted(SCRIPTS), ids=lambda s: s)
def test_every_script_refuses_a_lower_case_set(script, capsys):
    """`kogine run SCRIPT --set steps=50` once ran with STEPS at its default, without a word."""
    from kohakuengine import Config

    name = SCRIPTS[script].lower()
    assert _run_with_kogine(ROOT / "scripts" / script, Config(globals_dict={name: "50"})) == 2
    assert f"{name}: knob names are upper case: did you mean {name.upper()}?" in capsys.readouterr().err


def test_a_config_file_with_a_lower_case_knob_is_refused(tmp_path, capsys):
    from kohakuengine.config.loader import load_config_file

    config = tmp_path / "cfg.py"
    config.write_text("root = '/data'\nmin_side = 5000\nSTEPS = 3\n")
    assert _run_with_kogine(ROOT / "scripts" / "train" / "moss.py", load_config_file(config)) == 2
    err = capsys.readouterr().err
    assert "min_side: knob names are upper case: did you mean MIN_SIDE?" in err and "root" not in err


def test_algo_args_keys_lycoris_ignores_are_refused():
    """ALGO_ARGS={'factr': 4} once trained without the factor: a key lycoris never reads is refused by
    the schema, with the closest option; a key the ALGO's module ignores before anything loads."""
    from kohakumoss.adapters.algo_args import algo_args_problem

    found = problems(TRAIN_SCHEMA, ALGO_ARGS={"factr": 4})["ALGO_ARGS"]
    assert "'factr' is not an option lycoris reads (did you mean 'factor'?)" in found
    assert "set by DROPOUT" in problems(TRAIN_SCHEMA, ALGO_ARGS={"dropout": 0.1})["ALGO_ARGS"]
    assert "ALGO_ARGS" not in problems(TRAIN_SCHEMA, ALGO_ARGS={"factor": 4})
    assert algo_args_problem("lokr", {"factor": 4}) is None
    assert algo_args_problem("dylora", {"block_size": 4}) is None
    assert algo_args_problem("oft", {"constraint": 1e-3, "rescaled": True}) is None
    assert algo_args_problem("dora", {"wd_on_output": True}) is None
    assert "does not use ['factor']" in algo_args_problem("lora", {"factor": 4})
    assert "does not use ['block_size']" in algo_args_problem("loha", {"block_size": 4})


def test_rank_above_the_narrowest_targeted_layer_is_refused_before_loading(monkeypatch):
    """RANK=100000 once built a LoRA far wider than any layer until memory ran out: refused from the
    DiT's config (a meta-device module tree), before build_components loads or draws a weight."""
    from kohakumoss.config.train import TrainConfig
    from kohakumoss.train import components

    def base(**k):
        knobs = {"MODEL_PRESET": "tiny", "DEVICE": "cpu", "PRECISION": "fp32", **k}
        return TrainConfig.from_knobs(TRAIN_SCHEMA.validate(knobs))

    monkeypatch.setattr(components, "build_backbone", lambda *a, **k: pytest.fail("weights were built"))
    with pytest.raises(ConfigError, match=r"RANK: 100000 is above the width .*RANK <= 256"):
        components.build_components(base(RANK=100000))
    found = dict(components.component_problems(base(RANK=64, TARGET_PRESET="full")))
    assert "text_embedder.proj" in found["RANK"] and "RANK <= 32" in found["RANK"]
    assert "RANK" not in dict(components.component_problems(base(RANK=256)))
    assert "RANK" not in dict(components.component_problems(base(ALGO="ia3", RANK=100000)))


def test_resume_compares_every_input_of_the_step():
    """A changed TOKENIZER once resumed silently while a changed TEXT_ENCODER was refused."""
    from kohakumoss.config.train import TrainConfig
    from kohakumoss.train.resume import changed_knobs

    assert "TOKENIZER" in RESUME_SAFE and "ENCODER_PRECISION" in RESUME_FIXED
    old = TrainConfig.from_knobs({"TOKENIZER": "/a/tok"}).knobs()
    assert set(changed_knobs(old, {**old, "TOKENIZER": "/b/tok", "ENCODER_PRECISION": "fp32"})) == {
        "TOKENIZER",
        "ENCODER_PRECISION",
    }
