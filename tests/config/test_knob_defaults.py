"""One default per knob: the data settings, the schemas, every script's module-level lines and every
`knobs.get("KNOB", fallback)` in the source agree."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from kohakumoss.config.data_scripts import DATA_SCHEMA, SCRIPT_CONFIGS, DataScriptsConfig
from kohakumoss.config.export import EXPORT_SCHEMA, ExportScriptConfig
from kohakumoss.config.sample import SAMPLE_SCHEMA, SampleScriptConfig
from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig
from kohakumoss.data_knobs import LOADER_KNOBS, PLAN_KNOBS, SCAN_KNOBS
from kohakumoss_data import LoaderKnobs, PlanKnobs, ScanKnobs

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = {"train": TRAIN_SCHEMA, "sample": SAMPLE_SCHEMA, "export": EXPORT_SCHEMA, "data": DATA_SCHEMA}

# fallbacks that differ from every schema's default, each with why it is left: reading an older
# checkpoint's or another script's knobs. A new entry here needs a reason; fixing one removes it.
KNOWN = {
    ("src/kohakumoss/export/from_checkpoint.py", "RUN_NAME"): "a checkpoint without RUN_NAME",
    ("src/kohakumoss/export/metadata.py", "DATASET"): "a checkpoint without DATASET: no dataset tags",
}


def module_defaults(path: Path) -> dict:
    """The UPPER_CASE module-level assignments of a script, evaluated (constants: `1024 * 1024`)."""
    out = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id.isupper():
            out[target.id] = eval(
                compile(ast.Expression(node.value), str(path), "eval"), {"__builtins__": {}}
            )
    return out


@pytest.mark.parametrize(
    "table, settings", [(SCAN_KNOBS, ScanKnobs), (PLAN_KNOBS, PlanKnobs), (LOADER_KNOBS, LoaderKnobs)]
)
def test_a_data_knobs_default_is_its_settings_field_default(table, settings):
    defaults = {f.name: f.default for f in dataclasses.fields(settings)}
    for schema in (TRAIN_SCHEMA, DATA_SCHEMA):
        for knob, field in table.items():
            # the data scripts' WORKERS is cache_latents' decode pool, not the training loader's workers
            # and the trainer's EPOCHS is the run's length (0: STEPS decides), the plan's own epochs follow it
            other = (schema is DATA_SCHEMA and knob == "WORKERS") or (
                schema is TRAIN_SCHEMA and knob == "EPOCHS"
            )
            if knob in schema.knobs and not other:
                assert schema.knobs[knob].default == defaults[field], (knob, field)
    assert TRAIN_SCHEMA.defaults()["TOKENS_PER_STEP"] == PlanKnobs.tokens_per_step == 8192


# every script that checks its knobs, and the typed config its knob lines must equal
SCRIPT_CONFIG_OF = {
    "scripts/train/moss.py": TrainConfig,
    "scripts/sample/sample.py": SampleScriptConfig,
    "scripts/export/export.py": ExportScriptConfig,
    **{f"scripts/data/{name}.py": cls for name, cls in SCRIPT_CONFIGS.items()},
}
# a script that checks knobs without a typed config, or a typed config without a script, each with why
NO_TYPED_CONFIG = {
    "scripts/demo/demo.py": "the demo's eight knobs, handed to train() over TrainConfig's defaults"
}
NO_SCRIPT = {DataScriptsConfig: "the union of the data scripts' configs (DATA_SCHEMA), no script of its own"}


def script_config_classes() -> set[type]:
    """Every subclass of the scripts' typed-config base (found through TrainConfig, wherever it lives)."""
    base = next(c for c in TrainConfig.__mro__ if c.__name__ == "ScriptConfig")
    out, todo = set(), [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("kohakumoss"):  # not a test's own config
                out.add(sub)
    return out


def test_each_script_checks_its_knobs_against_a_typed_config_and_each_config_has_its_script():
    checking = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "scripts").rglob("*.py")
        if re.search(r"\brun_(checked|data_script)\(", p.read_text(encoding="utf-8"))
    }
    assert checking == set(SCRIPT_CONFIG_OF) | set(NO_TYPED_CONFIG), "add the script to SCRIPT_CONFIG_OF"
    assert script_config_classes() == set(SCRIPT_CONFIG_OF.values()) | set(NO_SCRIPT), (
        "a typed config without a script: add it to SCRIPT_CONFIG_OF or say why in NO_SCRIPT"
    )


def knob_line_problems(script: Path, config: type) -> list[str]:
    """How a script's UPPER_CASE lines differ from its typed config's fields: missing on either side, or
    another default (value or type)."""
    mine, fields = module_defaults(script), config().knobs()
    problems = [f"typed field without a knob line: {k}" for k in fields if k not in mine]
    problems += [f"knob line without a typed field: {k}" for k in mine if k not in fields]
    problems += [
        f"{k} = {v!r} in the script, {fields[k]!r} in the config"
        for k, v in mine.items()
        if k in fields and (v != fields[k] or type(v) is not type(fields[k]))
    ]
    return problems


@pytest.mark.parametrize("script", sorted(SCRIPT_CONFIG_OF))
def test_a_scripts_knob_lines_are_its_typed_configs_fields_with_the_same_defaults(script):
    """Each knob written once: the script lists exactly its config's fields, each with the field's default."""
    assert not knob_line_problems(ROOT / script, SCRIPT_CONFIG_OF[script]), script


def test_the_knob_line_check_sees_a_second_default_and_a_missing_knob(tmp_path):
    text = (ROOT / "scripts/train/moss.py").read_text()
    edited = text.replace("\nLR = 0.0001 ", "\nLR = 2e-4 ", 1).replace(
        "\nLR_CYCLES = 1 ", "\nLR_CYCLEZ = 1 ", 1
    )
    assert edited.count("\n") == text.count("\n") and edited != text
    (tmp_path / "moss.py").write_text(edited)
    assert knob_line_problems(tmp_path / "moss.py", TrainConfig) == [
        "typed field without a knob line: LR_CYCLES",
        "knob line without a typed field: LR_CYCLEZ",
        "LR = 0.0002 in the script, 0.0001 in the config",
    ]


# benchmark knobs that stand for the trainer's own (the step measured is the trainer's): same default
TRAINER_MIRRORS = {
    "scripts/bench/train_step.py": (
        "TARGET_PRESET", "BYPASS", "LR", "GRAD_CLIP", "CUDA_GRAPHS", "GC_EVERY", "BASE_PRECISION", "SEED",
    ),
}  # fmt: skip


@pytest.mark.parametrize("script", sorted(TRAINER_MIRRORS))
def test_a_benchmarks_trainer_knobs_keep_the_trainers_defaults(script):
    names, trainer = TRAINER_MIRRORS[script], TrainConfig().knobs()
    mine = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse((ROOT / script).read_text(encoding="utf-8")).body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in names
    }
    assert set(mine) == set(names), f"{script}: knobs gone: {set(names) - set(mine)}"
    differ = {k: (mine[k], trainer[k]) for k in names if mine[k] != trainer[k]}
    assert not differ, f"{script}: (benchmark, trainer) defaults differ: {differ}"


def knob_fallbacks(root: Path = ROOT) -> list[tuple[str, int, str, object]]:
    """(file, line, KNOB, literal) of every `x.get("KNOB", literal)` under src/ and scripts/ on a schema's knob."""
    names = {n for s in SCHEMAS.values() for n in s.knobs}
    out = []
    for path in sorted([*(root / "src").rglob("*.py"), *(root / "scripts").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "get" or len(node.args) != 2 or not isinstance(node.args[0], ast.Constant):
                continue
            if node.args[0].value not in names:
                continue
            try:
                value = ast.literal_eval(node.args[1])
            except ValueError:  # a name (PlanKnobs.area): the one default itself
                continue
            out.append((path.relative_to(root).as_posix(), node.lineno, node.args[0].value, value))
    return out


def test_every_literal_knob_fallback_is_a_schemas_default():
    found = knob_fallbacks()
    assert len(found) > 20  # the scan sees the memory estimate's, the adapters', the export metadata's
    bad = []
    for file, line, name, value in found:
        defaults = [s.knobs[name].default for s in SCHEMAS.values() if name in s.knobs]
        if value not in defaults and (file, name) not in KNOWN:
            bad.append(f"{file}:{line}: {name} falls back to {value!r}; the schemas say {defaults}")
    assert not bad, "\n".join(bad)
    stale = set(KNOWN) - {(file, name) for file, _, name, _ in found}
    assert not stale, f"KNOWN lists fallbacks that are gone: {sorted(stale)}"


def test_the_fallback_scan_finds_a_disagreement(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "x.py").write_text(
        'def f(knobs):\n    return knobs.get("TOKENS_PER_STEP", 32768), knobs.get("AREA", PlanKnobs.area)\n'
    )
    assert knob_fallbacks(tmp_path) == [("scripts/x.py", 2, "TOKENS_PER_STEP", 32768)]
