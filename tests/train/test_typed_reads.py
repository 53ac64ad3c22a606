"""Code reads its typed config (`cfg.optim.lr`, the section a function takes), never a knob by its name
(`k["LR"]`); `train(knobs)` validates them first; the trainer and a checkpoint's re-export build the adapter
from one spec.

An AST scan of every module of src/kohakumoss but config/ (the configs themselves), cli/ (the config tool
reads and writes config files) and export/metadata.py (the writer of the files' metadata): a subscript, a
`.get` / `.pop` / `.setdefault`, or an `in` test whose key is a script knob's UPPER_CASE name (or a made-up
`_UPPER` one riding a knob dict), and every `.knobs()` call (the typed config turned back into the flat
dict), fail, unless listed in WRITES_FLAT (a place that writes the flat dict out, or reads one back from a
file) or, for now, in NOT_YET_TYPED. A knob name as an error's first argument (`ConfigError("RESUME", ...)`)
names the knob for the user and is not a read.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections import Counter
from pathlib import Path

import pytest

from kohakumoss.config.data_scripts import DATA_SCHEMA
from kohakumoss.config.export import EXPORT_SCHEMA
from kohakumoss.config.sample import SAMPLE_SCHEMA
from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig

PKG = Path(__file__).resolve().parents[2] / "src" / "kohakumoss"
SKIPPED = ("config/", "cli/", "export/metadata.py")
KNOBS = (
    frozenset(TRAIN_SCHEMA.knobs)
    | set(SAMPLE_SCHEMA.knobs)
    | set(EXPORT_SCHEMA.knobs)
    | set(DATA_SCHEMA.knobs)
)
MADE_UP = re.compile(r"^_[A-Z][A-Z0-9_]*$")  # a fake knob riding the dict ('_FSDP_SHARDS')
FLAT = ".knobs()"
# dicts keyed by upper-case names that are no knob dict: the environment, the estimate's named parts
NOT_KNOB_DICTS = ("os.environ", "est.parts")
# (file, knob) pairs allowed to read or make a flat dict: what the run writes out whole (config.json, a
# checkpoint's knobs, the trackers' config: `cfg.knobs()`), or reads back from those files (a checkpoint's
# GRAD_ACCUM, the schedule it trained with, a re-exported run's name, the forward BYPASS trained), and a
# data config's knobs, which the cache identity holds against the training config's.
WRITES_FLAT: frozenset[tuple[str, str]] = frozenset(
    {
        ("train/trainer.py", FLAT),
        ("train/resume.py", FLAT),
        ("checkpoint/folders.py", "GRAD_ACCUM"),
        ("train/resume.py", "LR_SCHEDULE"),
        ("train/cache_identity.py", "CACHE_DIR"),
        ("train/cache_identity.py", "MAX_TEXT_TOKENS"),
        ("train/cache_identity.py", "MICRO_STEPS"),
        ("train/cache_identity.py", "TEXT_FACTORY"),
        ("train/cache_identity.py", "TEXT_KWARGS"),
        ("train/cache_identity.py", "VAE_FACTORY"),
        ("train/cache_identity.py", "VAE_KWARGS"),
        ("export/from_checkpoint.py", "RUN_NAME"),
        ("export/from_checkpoint.py", "ALGO"),
        ("adapters/algos.py", "ALGO"),  # trained_forward: resume compares a checkpoint's config.json
        ("adapters/algos.py", "BYPASS"),
        ("adapters/algos.py", "ALGO_ARGS"),
    }
)
# Files that still read the flat dict, with how many reads: each number may only go down (the test fails
# when a file reads more, and when it reads fewer than listed, so the list shrinks with the code). Empty
# when every package below train/ takes its typed section, as now: launch.run takes the run's
# DistributedConfig and DEVICE and hands each worker its device (train/loop.py makes that rank's knobs).
NOT_YET_TYPED: dict[str, int] = {}


def _knob(node: ast.AST | None) -> str | None:
    text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
    return text if text in KNOBS or MADE_UP.match(text) else None


def knob_reads(source: str) -> list[tuple[int, str]]:
    """(line, knob) of every read of a knob by its name in `source`, and of every `.knobs()` call."""
    out = []
    for node in ast.walk(ast.parse(source)):
        name, holder = None, None
        if isinstance(node, ast.Subscript):
            name, holder = _knob(node.slice), node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "pop", "setdefault") and node.args:
                name, holder = _knob(node.args[0]), node.func.value
            elif node.func.attr == "knobs" and not node.args and not node.keywords:
                name, holder = FLAT, node.func.value
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            name, holder = _knob(node.left), node.comparators[0]
        if name is not None and ast.unparse(holder) not in NOT_KNOB_DICTS:
            out.append((node.lineno, name))
    return out


def scanned_modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if not rel.startswith(SKIPPED):
            out.append((rel, path))
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
        "flat = cfg.knobs()\n"
        'shards = knobs.get("_FSDP_SHARDS", 1)\n'
        'world = os.environ["WORLD_SIZE"]\n'
        'width = k["WIDTH"]\n'
    )
    assert knob_reads(source) == [
        (1, "LR"),
        (2, "SEED"),
        (3, "RANK"),
        (8, FLAT),
        (9, "_FSDP_SHARDS"),
        (11, "WIDTH"),
    ]


def test_the_scan_covers_the_packages_below_train():
    scanned = {rel.split("/")[0] for rel, _ in scanned_modules()}
    assert {"train", "memory", "distributed", "adapters", "diffusion", "data_knobs.py"} <= scanned
    assert not scanned & {"config", "cli"}


def test_no_module_reads_a_knob_by_its_name():
    found, counts = [], Counter()
    for rel, path in scanned_modules():
        for line, name in knob_reads(path.read_text(encoding="utf-8")):
            if (rel, name) in WRITES_FLAT:
                continue
            if rel in NOT_YET_TYPED:
                counts[rel] += 1
                continue
            what = "turns the typed config back into knobs" if name == FLAT else f"reads {name!r} by name"
            found.append(f"{rel}:{line} {what}: read the typed config (cfg.<section>.<field>)")
    assert not found, "\n".join(found)
    stale = {rel: (listed, counts[rel]) for rel, listed in NOT_YET_TYPED.items() if counts[rel] != listed}
    assert not stale, (
        "NOT_YET_TYPED is out of date (file: (listed, found)); it only shrinks: lower the numbers, "
        f"drop the files that read typed values now: {stale}"
    )


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
