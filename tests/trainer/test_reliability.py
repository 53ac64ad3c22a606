"""The trainer under faults and odd input: reused run folders, changed knobs, broken checkpoints, stale
temporary folders, a full disk. Each case was reproduced on the tiny model before the guard existed."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from kohakumoss.checkpoint import write as ckpt_mod
from kohakumoss.checkpoint.folders import list_checkpoints, verify_checkpoint
from kohakumoss.train import trainer
from kohakumoss.train.loop import train
from kohakumoss.train.trainer import Trainer
from kohakumoss_common import io
from kohakumoss_common.errors import CheckpointError, ConfigError
from kohakumoss_common.io import DiskSpaceError

from .conftest import tiny_knobs


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def run_dir(world: dict, name: str) -> Path:
    return Path(world["root"]) / "runs" / name


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_fresh_run_into_a_used_run_folder_is_refused_before_any_work(train_world):
    train(tiny_knobs(train_world, "reused", STEPS=2))
    before = snapshot(run_dir(train_world, "reused"))
    with pytest.raises(ConfigError, match=r"RUN_NAME: .*RESUME='latest'.*another RUN_NAME"):
        train(tiny_knobs(train_world, "reused", STEPS=2))
    assert snapshot(run_dir(train_world, "reused")) == before  # not a byte written, the log included


@pytest.mark.parametrize("name", ["../escaped", "/tmp/absolute-run", "a/b", ".."])
def test_run_name_must_be_a_plain_name(train_world, name):
    with pytest.raises(ConfigError, match="RUN_NAME"):
        tiny_knobs(train_world, name)
    k = tiny_knobs(train_world, "plain")
    k["RUN_NAME"] = name  # the trainer checks too (knobs that skipped the schema)
    with pytest.raises(ConfigError, match="RUN_NAME"):
        train(k)
    assert not (Path(train_world["root"]) / "escaped").exists()


def test_resume_refuses_changed_knobs_by_name_before_loading_weights(train_world, monkeypatch):
    train(tiny_knobs(train_world, "knobs", STEPS=4, STOP_AT=2))
    loaded = []
    monkeypatch.setattr(trainer, "load_trainable_state", lambda *a: loaded.append(a))
    with pytest.raises(ConfigError, match=r"ALPHA 4\.0 -> 8\.0, GRAD_ACCUM 1 -> 2") as e:
        train(tiny_knobs(train_world, "knobs", STEPS=4, RESUME="latest", ALPHA=8.0, GRAD_ACCUM=2))
    assert "RESUME_ALLOW_CHANGES" not in str(e.value)  # neither is safe to allow
    for change in ({"PRECISION": "bf16"}, {"SEED": 1}, {"TOKENS_PER_STEP": 200}):
        with pytest.raises(ConfigError, match=f"{next(iter(change))} "):
            train(tiny_knobs(train_world, "knobs", STEPS=4, RESUME="latest", **change))
    with pytest.raises(ConfigError, match=r"LR 0\.001 -> 0\.002.*RESUME_ALLOW_CHANGES"):
        train(tiny_knobs(train_world, "knobs", STEPS=4, RESUME="latest", LR=2e-3))
    assert loaded == []
    with pytest.raises(ConfigError, match=r"RESUME_ALLOW_CHANGES: .*\['ALPHA'\] change the trained function"):
        tiny_knobs(train_world, "knobs", RESUME_ALLOW_CHANGES=["ALPHA"])
    monkeypatch.undo()
    run = train(
        tiny_knobs(train_world, "knobs", STEPS=4, RESUME="latest", LR=2e-3, RESUME_ALLOW_CHANGES=["LR"])
    )
    assert "resume: LR 0.001 -> 0.002 (RESUME_ALLOW_CHANGES)" in (run / "log.txt").read_text()
    assert len(losses(run)) == 4


@pytest.mark.parametrize("fault", ["truncated", "flipped", "missing"])
def test_resume_falls_back_to_the_newest_checkpoint_that_verifies(train_world, fault):
    knobs = dict(STEPS=6, SAVE_EVERY=2, KEEP_LAST=5)
    straight = losses(train(tiny_knobs(train_world, f"verify-{fault}-straight", **knobs)))
    name = f"verify-{fault}"
    run = train(tiny_knobs(train_world, name, **knobs, STOP_AT=4))
    newest = list_checkpoints(run / "checkpoints")[-1][1]
    assert newest.name == "step_00000004" and verify_checkpoint(newest) is None
    victim = newest / "optimizer.pt"
    data = victim.read_bytes()
    if fault == "truncated":
        victim.write_bytes(data[: len(data) // 2])
    elif fault == "flipped":  # same size, one byte changed: only the checksum sees it
        victim.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        victim.unlink()
    assert str(victim) in verify_checkpoint(newest)
    with pytest.raises(ConfigError, match=f"RESUME: {newest}.*{victim.name}"):  # named: an error
        train(tiny_knobs(train_world, name, **knobs, RESUME=str(newest)))
    run = train(tiny_knobs(train_world, name, **knobs, RESUME="latest"))
    log = (run / "log.txt").read_text()
    assert f"checkpoint step_00000004 is broken, skipped: {victim}" in log
    assert "resumed from" in log and "step_00000002 at step 2" in log
    assert losses(run) == straight  # steps 3 and 4 trained again, bit for bit
    assert f"checkpoint past the resumed step 2 set aside as {newest}.broken" in log
    assert [s for s, _ in list_checkpoints(run / "checkpoints")] == [2, 4, 6]
    assert verify_checkpoint(run / "checkpoints" / "step_00000004") is None  # the new step 4


def test_stale_temporary_folders_are_removed_at_the_next_start(train_world):
    run = train(tiny_knobs(train_world, "stale", STEPS=4, STOP_AT=2))
    root = run / "checkpoints"
    stale = [
        root / ".step_00000004.k3j2_x.tmp",
        root / ".step_00000001.deleting",
        root / ".step_00000002.old",
    ]
    for p in stale:
        (p / "export").mkdir(parents=True)
        (p / "trainable.safetensors").write_bytes(b"half")
    train(tiny_knobs(train_world, "stale", STEPS=4, RESUME="latest"))
    assert sorted(p.name for p in root.iterdir()) == ["step_00000002", "step_00000004"]
    log = (run / "log.txt").read_text()
    for p in stale:
        assert f"removed {p.name}, left in {root} by an interrupted save or prune" in log


def test_a_checkpoint_that_would_not_fit_is_refused_and_the_previous_one_kept(train_world, monkeypatch):
    run = train(tiny_knobs(train_world, "nospace", STEPS=4, STOP_AT=2))
    before = snapshot(run / "checkpoints")
    monkeypatch.setattr(io, "free_bytes", lambda path: 4096)
    with pytest.raises(
        DiskSpaceError, match=r"step_00000004: not enough disk space: needs .* MiB, 0\.0 MiB free"
    ):
        train(tiny_knobs(train_world, "nospace", STEPS=4, RESUME="latest"))
    assert snapshot(run / "checkpoints") == before
    assert "stopped: " in (run / "log.txt").read_text().splitlines()[-1]
    assert "not enough disk space" in (run / "log.txt").read_text().splitlines()[-1]


def test_a_disk_that_fills_during_a_checkpoint_gives_one_line_and_loses_nothing(train_world, monkeypatch):
    run = train(tiny_knobs(train_world, "diskfull", STEPS=4, STOP_AT=2))
    before = snapshot(run / "checkpoints")
    real = ckpt_mod.save_rng

    def full(state, folder):
        real(state, folder)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt_mod, "save_rng", full)
    with pytest.raises(DiskSpaceError) as e:
        train(tiny_knobs(train_world, "diskfull", STEPS=4, RESUME="latest"))
    line = str(e.value)
    assert "\n" not in line and "step_00000004: disk full while writing (No space left on device)" in line
    assert "needs" in line and "free" in line
    assert snapshot(run / "checkpoints") == before  # the temporary folder gone, step 2 as it was
    assert (run / "log.txt").read_text().splitlines()[-1].endswith(f"stopped: {line}")


def test_the_final_export_is_refused_when_it_would_not_fit(train_world, monkeypatch):
    """Where the final checkpoint's exports cannot be linked (another filesystem), they are written again,
    and refused first when they would not fit."""
    real = Trainer.save
    monkeypatch.setattr(
        Trainer,
        "save",
        lambda self, final=False: (real(self, final), monkeypatch.setattr(io, "free_bytes", lambda path: 0))[
            0
        ],
    )
    monkeypatch.setattr(trainer, "link_tree", lambda src, dst: None)
    with pytest.raises(DiskSpaceError, match=r"export: not enough disk space"):
        train(tiny_knobs(train_world, "noexport", STEPS=2))
    run = run_dir(train_world, "noexport")
    assert not (run / "export").exists() and verify_checkpoint(run / "checkpoints" / "step_00000002") is None


def test_the_final_exports_are_the_final_checkpoints_files_linked(train_world):
    """The run's export folder holds the final checkpoint's export files under a second name (the same
    bytes on disk once), written with the final exports' settings; no free space is needed for them."""
    run = train(tiny_knobs(train_world, "linked", STEPS=2, SAVE_FORMAT="both"))
    ckpt = run / "checkpoints" / "step_00000002" / "export"
    names = sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file())
    assert names == sorted(
        p.relative_to(run / "export").as_posix() for p in (run / "export").rglob("*") if p.is_file()
    )
    assert names and "lycoris/linked.safetensors" in names  # the LyCORIS file's own folder is linked too
    for name in names:
        assert (ckpt / name).stat().st_ino == (run / "export" / name).stat().st_ino, name
    assert "exports: " in (run / "log.txt").read_text()


def test_link_tree_links_every_file_or_nothing(tmp_path, monkeypatch):
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a")
    (src / "sub" / "b.bin").write_bytes(b"b")
    dst.mkdir()
    (dst / "a.bin").write_bytes(b"old")  # replaced
    linked = io.link_tree(src, dst)
    assert sorted(p.relative_to(dst).as_posix() for p in linked) == ["a.bin", "sub/b.bin"]
    assert (dst / "a.bin").read_bytes() == b"a" and (dst / "sub" / "b.bin").stat().st_nlink == 2
    calls = []

    def refuse(a, b):  # a filesystem without hard links, failing on the second file
        calls.append(a)
        if len(calls) == 2:
            raise OSError(18, "Invalid cross-device link")
        return real_link(a, b)

    real_link = os.link
    monkeypatch.setattr(os, "link", refuse)
    other = tmp_path / "other"
    assert io.link_tree(src, other) is None
    assert [p for p in other.rglob("*") if p.is_file()] == []  # the first link taken back


def test_an_unexpected_error_is_recorded_in_the_log(train_world, monkeypatch):
    def boom(*a, **kw):
        raise RuntimeError("boom in the step")

    monkeypatch.setattr(trainer, "flow_loss", boom)
    with pytest.raises(RuntimeError, match="boom"):
        train(tiny_knobs(train_world, "boom", STEPS=2))
    last = (run_dir(train_world, "boom") / "log.txt").read_text().splitlines()[-1]
    assert last.endswith("stopped by RuntimeError: boom in the step")


def test_a_run_that_failed_during_setup_may_start_again_in_its_folder(train_world, monkeypatch):
    def no_data(*a, **kw):
        raise trainer.DataError("no data here")

    monkeypatch.setattr(trainer, "open_run_data", no_data)
    with pytest.raises(trainer.DataError):
        train(tiny_knobs(train_world, "setup-failed", STEPS=1))
    assert sorted(p.name for p in run_dir(train_world, "setup-failed").iterdir()) == [
        ".lock",  # the run folder's lock file: released with its process, the file stays
        "config.json",
        "log.txt",
    ]
    monkeypatch.undo()
    assert len(losses(train(tiny_knobs(train_world, "setup-failed", STEPS=1)))) == 1


KILLED_SAVE = """
import json, os, sys, time
from kohakumoss.checkpoint import write as checkpoint
from kohakumoss.train import loop
real = checkpoint.save_rng
def slow(state, folder):
    real(state, folder)
    if folder.name.startswith(".step_00000004."):
        open(sys.argv[2], "w").write(str(folder))
        time.sleep(120)
checkpoint.save_rng = slow
loop.train(json.load(open(sys.argv[1])))
"""


def test_kill_9_inside_a_checkpoint_write_keeps_the_previous_one_and_cleans_up(train_world, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    knobs = tiny_knobs(train_world, "killed", STEPS=6, SAVE_EVERY=2)
    (tmp_path / "knobs.json").write_text(json.dumps(knobs))
    marker = tmp_path / "in-write"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(tmp_path / "knobs.json"), str(marker)])
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), f"the run never reached the step 4 save (exit {proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    root = run_dir(train_world, "killed") / "checkpoints"
    tmp_dir = Path(marker.read_text())
    assert tmp_dir.is_dir() and [s for s, _ in list_checkpoints(root)] == [2]  # the half-written save
    run = train(tiny_knobs(train_world, "killed", STEPS=6, SAVE_EVERY=2, RESUME="latest"))
    assert not tmp_dir.exists() and f"removed {tmp_dir.name}" in (run / "log.txt").read_text()
    assert "resumed from" in (run / "log.txt").read_text()
    assert [s for s, _ in list_checkpoints(root)] == [2, 4, 6]


def test_a_second_trainer_on_a_run_folder_in_use_is_refused_naming_the_pid(train_world):
    from kohakumoss_common.lock import FolderInUse, FolderLock

    folder = run_dir(train_world, "in-use")
    with FolderLock(folder):  # another trainer's hold (flock refuses a second open file, even in one process)
        with pytest.raises(FolderInUse, match=rf"{folder}: in use by process {os.getpid()}"):
            train(tiny_knobs(train_world, "in-use", STEPS=2, RESUME="latest"))
        assert not (folder / "metrics.jsonl").exists() and not (folder / "log.txt").exists()
    train(tiny_knobs(train_world, "in-use", STEPS=2, RESUME="latest"))  # released with its holder


def test_a_resave_killed_between_its_renames_resumes_from_that_step(train_world):
    """KEEP_LAST=1: the re-saved step was the only checkpoint; the kill left it as `.step_X.old` beside the
    new copy's temporary folder. Both were removed at the next start, which began again at step 0."""
    run = train(tiny_knobs(train_world, "resave", STEPS=4, STOP_AT=2, KEEP_LAST=1))
    root = run / "checkpoints"
    os.replace(root / "step_00000002", root / ".step_00000002.old")
    (root / ".step_00000002.x1y2.tmp").mkdir()
    run = train(tiny_knobs(train_world, "resave", STEPS=4, KEEP_LAST=1, RESUME="latest"))
    log = (run / "log.txt").read_text()
    assert "step_00000002 restored: a save of it was interrupted between its renames" in log
    assert "step_00000002 at step 2" in log
    assert [s for s, _ in list_checkpoints(root)] == [4]


def test_a_torn_last_metrics_line_does_not_block_resume(train_world):
    run = train(tiny_knobs(train_world, "torn", STEPS=4, STOP_AT=2))
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 0.1')  # killed mid-line
    run = train(tiny_knobs(train_world, "torn", STEPS=4, RESUME="latest"))
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [
        1,
        2,
        3,
        4,
    ]
    assert "line(s) [3] are not JSON records" in (run / "log.txt").read_text()


def test_folders_that_are_files_or_names_too_long_are_named_before_any_work(train_world, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match=r"RUN_NAME: the name r{24}\.\.\. is 300 bytes long"):
        train(tiny_knobs(train_world, "r" * 300))
    for knob in ("RUNS_DIR", "CACHE_DIR"):
        k = tiny_knobs(train_world, f"file-{knob}")
        k[knob] = str(blocker / "inside")
        with pytest.raises(ConfigError, match=rf"{knob}: {blocker} is a file, not a folder"):
            train(k)
    assert not run_dir(train_world, "file-CACHE_DIR").exists()


def test_an_encoder_pointed_at_another_models_file_is_named(train_world):
    k = tiny_knobs(train_world, "foreign-vae", STEPS=2)
    k["VAE"], k["TEXT_ENCODER"] = train_world["TEXT_ENCODER"], train_world["VAE"]
    with pytest.raises(CheckpointError, match=r"expected a (VAE|text encoder).*; this file holds a"):
        train(k)
