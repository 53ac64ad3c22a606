"""The trainer reads its typed config (`cfg.optim.lr`), never a knob by its name (`k["LR"]`); `train(knobs)`
validates them first; the trainer and a checkpoint's re-export build the adapter from one spec.

An AST scan of every module under src/kohakumoss/train: a subscript, a `.get` / `.pop` / `.setdefault`, or an
`in` test whose key is a train knob's UPPER_CASE name fails, unless listed in WRITES_FLAT (a place that
writes the flat dict out). A knob name as an error's first argument (`ConfigError("RESUME", ...)`) names the
knob for the user and is not a read.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig

TRAIN = Path(__file__).resolve().parents[2] / "src" / "kohakumoss" / "train"
KNOBS = frozenset(TRAIN_SCHEMA.knobs)
# (file, knob) pairs allowed to read a flat dict by name: dicts read back from files, never the run's own
# config (config.json, a checkpoint's knobs and the trackers' config are written whole by `cfg.knobs()`):
# a checkpoint's saved knobs (its GRAD_ACCUM, the schedule it trained with) and a data config's knobs, which
# the cache identity holds against the training config's.
WRITES_FLAT: frozenset[tuple[str, str]] = frozenset(
    {
        ("checkpoint.py", "GRAD_ACCUM"),
        ("resume.py", "LR_SCHEDULE"),
        ("cache_identity.py", "CACHE_DIR"),
        ("cache_identity.py", "MAX_TEXT_TOKENS"),
    }
)


def _knob(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in KNOBS:
        return node.value
    return None


def knob_reads(source: str) -> list[tuple[int, str]]:
    """(line, knob) of every read of a knob by its name in `source`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        name = None
        if isinstance(node, ast.Subscript):
            name = _knob(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in ("get", "pop", "setdefault"):
                name = _knob(node.args[0])
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            name = _knob(node.left)
        if name is not None:
            out.append((node.lineno, name))
    return out


def test_the_scan_finds_each_form_of_a_read_and_not_a_named_error():
    source = (
        'lr = k["LR"]\n'
        'seed = knobs.get("SEED", 0)\n'
        'if "RANK" in k:\n'
        "    pass\n"
        'raise ConfigError("RESUME", "no checkpoint")\n'
        'x = d["not_a_knob"]\n'
        "y = cfg.optim.lr\n"
    )
    assert knob_reads(source) == [(1, "LR"), (2, "SEED"), (3, "RANK")]


def test_no_trainer_module_reads_a_knob_by_its_name():
    modules = sorted(TRAIN.rglob("*.py"))
    assert len(modules) > 10  # the scan looks at the trainer's files
    found = []
    for path in modules:
        rel = str(path.relative_to(TRAIN))
        for line, name in knob_reads(path.read_text(encoding="utf-8")):
            if (rel, name) not in WRITES_FLAT:
                found.append(
                    f"train/{rel}:{line} reads {name!r} by name: read the typed config (cfg.<section>.{name.lower()})"
                )
    assert not found, "\n".join(found)


def test_train_validates_its_knobs_before_any_run_folder(tmp_path):
    from kohakumoss.train.loop import train
    from kohakumoss_common.errors import ConfigError

    knobs = {"MODEL_PRESET": "tiny", "RUNS_DIR": str(tmp_path), "RUN_NAME": "bad", "LR": "big", "STEPZ": 3}
    with pytest.raises(
        ConfigError, match=r"(?s)STEPZ: unknown knob \(did you mean STEPS\?\).*LR: expected float"
    ):
        train(knobs)
    assert not (tmp_path / "bad").exists()


def test_the_export_rebuilds_the_adapter_the_trainer_built():
    """One spec from the knobs: the re-export's is the trainer's without the dropouts; an older run's
    config.json without TARGET_PATTERNS / BYPASS / ALGO_ARGS takes their defaults."""
    knobs = {"ALGO": "lokr", "RANK": 8, "ALPHA": 4.0, "TARGET_PRESET": "attn", "DROPOUT": 0.1,
             "RANK_DROPOUT": 0.2, "BYPASS": True, "ALGO_ARGS": {"factor": 4}}  # fmt: skip
    adapter = TrainConfig.from_knobs(knobs).adapter
    trained, exported = adapter.spec(), adapter.spec(multiplier=0.5, dropouts=False)
    assert (trained.algo, trained.rank, trained.alpha, trained.preset) == ("lokr", 8, 4.0, "attn")
    assert (trained.dropout, trained.rank_dropout, trained.bypass, trained.algo_args) == (
        0.1,
        0.2,
        True,
        {"factor": 4},
    )
    assert exported == dataclasses.replace(trained, dropout=0.0, rank_dropout=0.0, multiplier=0.5)
    old = TrainConfig.from_knobs({"ALGO": "lora", "RANK": 4, "ALPHA": 2.0, "TARGET_PRESET": "attn"})
    spec = old.adapter.spec(dropouts=False)
    assert (spec.patterns, spec.bypass, spec.algo_args, spec.rank) == ((), "auto", {}, 4)
