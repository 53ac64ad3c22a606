"""Checkpoint folders: atomic save, keep-last-N, 'latest', and a crash mid-save leaves the previous one."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from kohakumoss.checkpoint.folders import list_checkpoints, resolve_checkpoint
from kohakumoss.checkpoint.read import load_checkpoint
from kohakumoss.checkpoint.rng import capture_rng, restore_rng
from kohakumoss.checkpoint.write import save_checkpoint
from kohakumoss_common.errors import CheckpointError


def _save(root, step, value=0.0, **kw):
    return save_checkpoint(
        root,
        step,
        {"w": torch.full((4, 4), value)},
        optimizer_state={"adamw": {"state": {}, "param_groups": []}},
        ema_state={"shadow": {"w": torch.full((4, 4), value + 1)}, "num_updates": 3, "decay": 0.9},
        data_position={"epoch": 1, "index": step},
        config={"LR": 1e-4},
        **kw,
    )


def test_save_load_all_parts(tmp_path):
    g = torch.Generator().manual_seed(5)
    path = _save(tmp_path, 10, 2.0, generators={"noise": g}, metadata={"run": "x"})
    assert path.name == "step_00000010"
    ck = load_checkpoint(resolve_checkpoint(tmp_path))
    assert ck.step == 10 and torch.equal(ck.trainable["w"], torch.full((4, 4), 2.0))
    assert ck.optimizer == {"adamw": {"state": {}, "param_groups": []}}
    assert ck.ema["num_updates"] == 3 and torch.equal(ck.ema["shadow"]["w"], torch.full((4, 4), 3.0))
    assert ck.data_position == {"epoch": 1, "index": 10} and ck.config == {"LR": 1e-4}
    assert ck.metadata["run"] == "x" and "noise" in ck.rng["generators"]


def test_rng_capture_restore_every_source(tmp_path):
    g = torch.Generator().manual_seed(7)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    _save(tmp_path, 1, generators={"noise": g})
    expect = (random.random(), np.random.rand(), torch.rand(1).item(), torch.rand(1, generator=g).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9), g.manual_seed(9)
    restore_rng(load_checkpoint(tmp_path / "step_00000001").rng, {"noise": g})
    assert (
        random.random(),
        np.random.rand(),
        torch.rand(1).item(),
        torch.rand(1, generator=g).item(),
    ) == expect
    with pytest.raises(CheckpointError, match="other"):
        restore_rng(capture_rng({}), {"other": torch.Generator()})


def test_keep_last_and_latest(tmp_path):
    for step in (5, 10, 15, 20):
        _save(tmp_path, step, float(step), keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [15, 20]
    assert resolve_checkpoint(tmp_path, "latest").name == "step_00000020"
    assert resolve_checkpoint(tmp_path, tmp_path / "step_00000015").name == "step_00000015"
    assert resolve_checkpoint(tmp_path / "empty") is None
    with pytest.raises(CheckpointError, match="no complete"):
        resolve_checkpoint(tmp_path, tmp_path / "nothing")


def test_crash_during_save_keeps_previous(tmp_path):
    _save(tmp_path, 10, 1.0)

    def die(_tmp):
        raise KeyboardInterrupt("killed mid-save")

    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 20, 2.0, write_extra=die)
    with pytest.raises(KeyboardInterrupt):  # re-saving an existing step must not destroy it either
        _save(tmp_path, 10, 3.0, write_extra=die)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000010"]  # no partial folder left behind
    ck = load_checkpoint(resolve_checkpoint(tmp_path))
    assert ck.step == 10 and torch.equal(ck.trainable["w"], torch.full((4, 4), 1.0))


def test_partial_folders_from_a_hard_kill_are_ignored(tmp_path):
    _save(tmp_path, 10, 1.0)
    (tmp_path / ".step_00000020.abc123.tmp").mkdir()  # what a SIGKILL inside atomic_dir leaves
    (tmp_path / ".step_00000020.abc123.tmp" / "trainable.safetensors").write_bytes(b"partial")
    (tmp_path / "step_00000030").mkdir()  # a hand-copied folder without meta.json
    assert resolve_checkpoint(tmp_path).name == "step_00000010"
    with pytest.raises(CheckpointError, match="incomplete"):
        load_checkpoint(tmp_path / "step_00000030")


def test_older_five_digit_folders_still_count_by_step(tmp_path):
    """Runs from before the 8-digit names: 'latest' compares steps, not names."""
    _save(tmp_path, 100, 1.0)
    old = tmp_path / "step_00100"
    (tmp_path / "step_00000100").rename(old)  # an old-style name of step 100's folder
    _save(tmp_path, 20, 2.0)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [20, 100]
    assert resolve_checkpoint(tmp_path, "latest") == old


def test_meta_records_every_file_and_verify_names_the_broken_one(tmp_path):
    from kohakumoss.checkpoint.folders import verify_checkpoint

    path = _save(
        tmp_path,
        1,
        write_extra=lambda tmp: (tmp / "export").mkdir() or (tmp / "export" / "a.bin").write_bytes(b"x" * 9),
    )
    meta = json.loads((path / "meta.json").read_text())
    assert sorted(meta["files"]) == sorted(
        p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != "meta.json"
    )
    assert meta["files"]["export/a.bin"]["size"] == 9 and verify_checkpoint(path) is None
    (path / "export" / "a.bin").write_bytes(b"y" * 9)
    assert verify_checkpoint(path) == f"{path / 'export' / 'a.bin'}: checksum differs from the one written"
    with pytest.raises(CheckpointError, match="a.bin: checksum differs"):
        resolve_checkpoint(tmp_path, path)


def test_latest_skips_a_broken_newest_and_refuses_when_none_verifies(tmp_path, caplog):
    good, bad = _save(tmp_path, 1), _save(tmp_path, 2)
    (bad / "trainable.safetensors").write_bytes((bad / "trainable.safetensors").read_bytes()[:50])
    with caplog.at_level("WARNING", logger="kohakumoss"):
        assert resolve_checkpoint(tmp_path) == good
    assert f"checkpoint step_00000002 is broken, skipped: {bad / 'trainable.safetensors'}: " in caplog.text
    (good / "meta.json").write_text("{")
    with pytest.raises(CheckpointError, match="no checkpoint verifies"):
        resolve_checkpoint(tmp_path)


def test_a_cut_file_is_named_when_loaded_without_verifying(tmp_path):
    path = _save(tmp_path, 1)
    (path / "optimizer.pt").write_bytes((path / "optimizer.pt").read_bytes()[:40])
    with pytest.raises(CheckpointError, match=r"optimizer\.pt: unreadable"):
        load_checkpoint(path)


def test_stale_temporary_folders_are_cleaned(tmp_path):
    from kohakumoss.checkpoint.folders import clean_stale

    keep = _save(tmp_path, 1)
    stale = [
        tmp_path / ".step_00000002.ab12.tmp",
        tmp_path / ".step_00000001.deleting",
        tmp_path / ".step_00000001.old",
    ]
    for p in stale:
        p.mkdir()
        (p / "f").write_text("x")
    (tmp_path / ".notes.tmp").write_text("not ours")
    assert clean_stale(tmp_path) == sorted(stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".notes.tmp", keep.name]


def test_save_refused_when_the_disk_is_short_and_cleaned_when_it_fills(tmp_path, monkeypatch):
    import errno

    from kohakumoss.checkpoint import write as ckpt_mod
    from kohakumoss_common import io
    from kohakumoss_common.io import DiskSpaceError

    first = _save(tmp_path, 1)
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    monkeypatch.setattr(io, "free_bytes", lambda path: 1000)
    with pytest.raises(
        DiskSpaceError, match=r"step_00000002: not enough disk space: needs 1\.0 MiB, 0\.0 MiB free"
    ):
        _save(tmp_path, 2)
    monkeypatch.undo()

    def fill(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskSpaceError, match="step_00000002: disk full while writing"):
        _save(tmp_path, 2, write_extra=fill)
    monkeypatch.setattr(ckpt_mod, "save_rng", lambda *a: fill(None))
    with pytest.raises(DiskSpaceError):
        _save(tmp_path, 1)  # over an existing checkpoint: the old one stays
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before


def test_a_safetensors_file_cut_by_a_full_disk_is_caught_at_the_save(tmp_path, monkeypatch):
    from kohakumoss_common import io
    from kohakumoss_common.io import DiskSpaceError

    first = _save(tmp_path, 1)
    real = io.save_file

    def cut(tensors, filename, metadata=None):  # a writer that stops early without an error
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(f.seek(0, 2) - 16)

    monkeypatch.setattr(io, "save_file", cut)
    with pytest.raises(
        DiskSpaceError, match=r"trainable\.safetensors: written file is \d+ bytes, its header says"
    ):
        _save(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_checkpoints_are_written_with_the_umask_permissions(tmp_path, umask, file_mode, dir_mode):
    import os
    import stat

    before = os.umask(umask)
    try:
        path = _save(tmp_path, 1)
    finally:
        os.umask(before)
    assert stat.S_IMODE(path.stat().st_mode) == dir_mode
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.iterdir()}
    assert modes and all(m == file_mode for m in modes.values()), modes


def test_checkpoints_past_the_resumed_step_are_set_aside(tmp_path):
    from kohakumoss.checkpoint.folders import set_aside_later

    for step in (1, 2, 3):
        _save(tmp_path, step, keep_last=2)
    (tmp_path / "step_00000003" / "config.json").write_text("{}")
    moved = set_aside_later(tmp_path, 1)
    assert [p.name for p in moved] == ["step_00000002.superseded", "step_00000003.broken"]
    assert [s for s, _ in list_checkpoints(tmp_path)] == []  # step 1 was pruned by keep_last=2
    _save(tmp_path, 2, keep_last=1)  # the new timeline's checkpoints are the only ones counted
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_00000002",
        "step_00000002.superseded",
        "step_00000003.broken",
    ]


def test_a_large_save_is_announced_before_it_writes(tmp_path, caplog, monkeypatch):
    from kohakumoss.checkpoint import write as checkpoint

    monkeypatch.setattr(checkpoint, "ANNOUNCE_BYTES", 1)  # every save counts as large here
    with caplog.at_level("INFO", logger="kohakumoss"):
        path = _save(tmp_path, 3)
    lines = [r.getMessage() for r in caplog.records]
    first = next(i for i, m in enumerate(lines) if m.startswith(f"writing {path} (up to "))
    assert lines[first + 1 :] and lines[first + 1].startswith("step_00000003 written in ")
    caplog.clear()
    monkeypatch.setattr(checkpoint, "ANNOUNCE_BYTES", 1 << 30)  # a small save: no lines
    with caplog.at_level("INFO", logger="kohakumoss"):
        _save(tmp_path, 4)
    assert not [r for r in caplog.records if "written in" in r.getMessage()]


def test_a_checkpoint_whose_parts_name_another_step_is_broken(tmp_path, caplog):
    """A resume takes the step, the data position and the weights from one save: a folder whose meta.json
    or data.json names another step (copied, renamed, a data.json of another save) does not verify."""
    from kohakumoss.checkpoint.folders import verify_checkpoint
    from kohakumoss.checkpoint.write import file_records

    def position(step, micro, accum=2):
        return dict(data_position={"step": step, "micro_step": micro}, config={"GRAD_ACCUM": accum})

    older = save_checkpoint(tmp_path, 2, {"w": torch.zeros(2)}, **position(2, 4))
    newer = save_checkpoint(tmp_path, 4, {"w": torch.ones(2)}, **position(4, 8))
    assert verify_checkpoint(older) is None and verify_checkpoint(newer) is None

    def reseal(folder):  # the files' records written again: only the parts' steps disagree
        meta = json.loads((folder / "meta.json").read_text())
        meta["files"] = {k: v for k, v in file_records(folder).items() if k != "meta.json"}
        (folder / "meta.json").write_text(json.dumps(meta))

    (newer / "data.json").write_text(json.dumps({"step": 2, "micro_step": 4}))  # step 2's position
    reseal(newer)
    assert verify_checkpoint(newer) == f"{newer / 'data.json'}: the data position of another step than 4 " + (
        "({'step': 2, 'micro_step': 4})"
    )
    with caplog.at_level("WARNING", logger="kohakumoss"):
        assert resolve_checkpoint(tmp_path) == older  # 'latest' falls back past it
    (newer / "data.json").write_text(json.dumps({"step": 4, "micro_step": 6}))
    reseal(newer)
    assert "micro-step 6, but step 4 x GRAD_ACCUM 2 is 8" in verify_checkpoint(newer)
    (newer / "data.json").write_text(json.dumps({"step": 4, "micro_step": 8}))
    reseal(newer)
    assert verify_checkpoint(newer) is None
    moved = newer.rename(tmp_path / "step_00000006")
    assert verify_checkpoint(moved) == f"{moved / 'meta.json'}: step 4, but the folder is step_00000006"
    with pytest.raises(CheckpointError, match="step 4, but the folder is step_00000006"):
        resolve_checkpoint(tmp_path, moved)
