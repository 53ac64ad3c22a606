"""The edit run's allocator setting: expandable segments for a dataset with references, never over the user's."""

from __future__ import annotations

import os

import pytest

from kohakumoss.config.train import TRAIN_SCHEMA
from kohakumoss.memory.allocator import (
    ALLOC_CONF_VAR,
    EDIT_ALLOC_CONF,
    allocator_for_references,
    allocator_setting_line,
    dataset_has_references,
)


def test_dataset_has_references_reads_every_entry():
    assert not dataset_has_references({"kind": "kohya", "path": "data/train"})
    assert dataset_has_references({"kind": "kohya", "path": "d", "references": "d_refs"})
    assert dataset_has_references(
        [{"kind": "folder", "path": "a"}, {"kind": "jsonl", "path": "b", "references": "refs"}]
    )
    assert not dataset_has_references([{"kind": "folder", "path": "a", "references": ""}])


def test_edit_config_sets_expandable_segments():
    env: dict[str, str] = {}
    line = allocator_for_references(True, env)
    assert env == {ALLOC_CONF_VAR: EDIT_ALLOC_CONF}
    assert line is not None and EDIT_ALLOC_CONF in line


def test_text_to_image_and_user_setting_left_alone():
    env: dict[str, str] = {}
    assert allocator_for_references(False, env) is None and env == {}
    env = {ALLOC_CONF_VAR: "max_split_size_mb:128"}
    assert allocator_for_references(True, env) is None
    assert env == {ALLOC_CONF_VAR: "max_split_size_mb:128"}


@pytest.mark.parametrize("references", [True, False])
def test_train_on_devices_sets_it_before_the_workers(monkeypatch, references):
    import kohakumoss.train.loop as loop

    monkeypatch.setenv(ALLOC_CONF_VAR, "recorded")  # so monkeypatch removes what the run sets
    monkeypatch.delenv(ALLOC_CONF_VAR)
    seen = []
    monkeypatch.setattr(loop, "run_on_devices", lambda *a: seen.append(os.environ.get(ALLOC_CONF_VAR)))
    entry = {"kind": "kohya", "path": "data/train", **({"references": "data/refs"} if references else {})}
    loop.train_on_devices({**TRAIN_SCHEMA.defaults(), "DATASET": entry})
    assert seen == [EDIT_ALLOC_CONF if references else None]


def test_an_edit_runs_log_names_its_allocator_setting():
    env = {ALLOC_CONF_VAR: "max_split_size_mb:128"}
    assert allocator_setting_line(True, env) == f"CUDA allocator: {ALLOC_CONF_VAR}=max_split_size_mb:128"
    assert allocator_setting_line(False, env) is None and allocator_setting_line(True, {}) is None
