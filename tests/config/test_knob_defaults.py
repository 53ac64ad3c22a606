"""One default per knob: the data settings, the schemas, the scripts' module-level lines and every
`knobs.get("KNOB", fallback)` in the source agree."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from kohakumoss.config.data_scripts import DATA_SCHEMA, SCRIPT_CONFIGS
from kohakumoss.config.export import EXPORT_SCHEMA
from kohakumoss.config.sample import SAMPLE_SCHEMA
from kohakumoss.config.train import TRAIN_SCHEMA
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


@pytest.mark.parametrize("script", sorted((ROOT / "scripts" / "data").glob("*.py")), ids=lambda p: p.name)
def test_data_script_knobs_equal_its_typed_config(script):
    mine = module_defaults(script)
    config = SCRIPT_CONFIGS[script.stem]().knobs()
    assert list(mine) == list(config), (
        f"{script.name}: the script's knob lines are not its config's, in order"
    )
    differ = {k: (v, config[k]) for k, v in mine.items() if v != config[k]}
    assert not differ, f"{script.name}: (script, typed config) defaults differ: {differ}"


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
