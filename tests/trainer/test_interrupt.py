"""Ctrl-C or SIGTERM to a real training run with loader workers: one clean stop, no worker tracebacks, a
checkpoint; a second signal inside a step's update waits for its count, so the checkpoint is that step's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kohakumoss.checkpoint.folders import list_checkpoints
from kohakumoss.train import runner as runner_mod
from kohakumoss.train.interrupt import StepInterrupt, Terminated
from kohakumoss.train.loop import train
from kohakumoss_common.io import load_tensors

from .conftest import tiny_knobs

RUN = """
import json, sys
from kohakumoss_common.knobs import run_checked
from kohakumoss.config.train import TRAIN_SCHEMA
from kohakumoss.train.loop import train
sys.exit(run_checked(TRAIN_SCHEMA, json.load(open(sys.argv[1])), train, "scripts/train/moss.py"))
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_to_a_training_run_with_workers(train_world, tmp_path, signum):
    """SIGTERM (schedulers, `docker stop`) stops like Ctrl-C: with a checkpoint, exit status 128 + signal."""
    name = signal.Signals(signum).name
    knobs = tiny_knobs(train_world, f"stop-{name}", STEPS=400, WORKERS=2, LOG_EVERY=1)
    (tmp_path / "knobs.json").write_text(json.dumps(knobs))
    run_dir = os.path.join(knobs["RUNS_DIR"], knobs["RUN_NAME"])
    metrics = os.path.join(run_dir, "metrics.jsonl")
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, str(tmp_path / "knobs.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if os.path.exists(metrics) and len(Path(metrics).read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signum)  # the trainer and its workers all get it, as from a terminal or Slurm
        out, err = proc.communicate(timeout=300)  # a loaded 2-core machine saves slowly; a hang still fails
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = out + err
    assert proc.returncode == 128 + signum, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert err.strip().splitlines()[-1] == ("interrupted" if signum == signal.SIGINT else "terminated")
    assert f"{name}: stopping after this step, with a checkpoint" in text
    assert "continue with RESUME='latest'" in text
    assert list_checkpoints(os.path.join(run_dir, "checkpoints"))


def signals_inside_the_update(monkeypatch, at_step: int, count: int) -> None:
    """`count` Ctrl-C's land right after step `at_step`'s update, before the trainer counts the step."""
    real = runner_mod.StepRunner.run

    def run(self, step):
        result = real(self, step)
        if step == at_step:
            for _ in range(count):
                os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(runner_mod.StepRunner, "run", run)


def trainable(run: Path, step: int) -> dict:
    return load_tensors(run / "checkpoints" / f"step_{step:08d}" / "trainable.safetensors")


def test_a_second_ctrl_c_after_an_update_saves_it_under_its_own_step(train_world, monkeypatch):
    straight = train(tiny_knobs(train_world, "ctrl-c-straight", STEPS=6, STOP_AT=3))
    signals_inside_the_update(monkeypatch, at_step=2, count=2)  # step 3's update (steps count from 1)
    knobs = tiny_knobs(train_world, "ctrl-c-twice", STEPS=6)
    with pytest.raises(KeyboardInterrupt):
        train(knobs)
    run = Path(knobs["RUNS_DIR"]) / knobs["RUN_NAME"]
    assert [s for s, _ in list_checkpoints(run / "checkpoints")] == [3]
    saved, expected = trainable(run, 3), trainable(straight, 3)
    assert saved.keys() == expected.keys()
    assert all(saved[k].equal(expected[k]) for k in saved)  # step 3's weights, not step 2's name on them


def test_a_third_ctrl_c_inside_an_update_stops_without_a_checkpoint(train_world, monkeypatch):
    signals_inside_the_update(monkeypatch, at_step=1, count=3)
    knobs = tiny_knobs(train_world, "ctrl-c-thrice", STEPS=6)
    with pytest.raises(KeyboardInterrupt):
        train(knobs)
    run = Path(knobs["RUNS_DIR"]) / knobs["RUN_NAME"]
    assert list_checkpoints(run / "checkpoints") == []  # no state of one step to save
    assert "interrupted inside a step's update: the last checkpoint stands" in (run / "log.txt").read_text()


def test_step_interrupt_holds_a_second_signal_until_the_critical_block_ends():
    before = signal.getsignal(signal.SIGTERM)  # another test's process may have installed one
    with StepInterrupt() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        reached = []
        with pytest.raises(Terminated), stop.critical():
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("after the second signal")
        assert reached == ["after the second signal"] and not stop.torn
        with pytest.raises(Terminated):
            stop.check()
    assert signal.getsignal(signal.SIGTERM) is before  # the handler it replaced is back
