"""Ctrl-C to a real training run with loader workers: one clean stop, no worker tracebacks, a checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kohakumoss.train.checkpoint import list_checkpoints

from .conftest import tiny_knobs

RUN = """
import json, sys
from kohakumoss.config.knobs import run_checked
from kohakumoss.config.train import TRAIN_SCHEMA
from kohakumoss.train.loop import train
sys.exit(run_checked(TRAIN_SCHEMA, json.load(open(sys.argv[1])), train, "scripts/train/moss.py"))
"""


def test_ctrl_c_to_a_training_run_with_workers(train_world, tmp_path):
    knobs = tiny_knobs(train_world, "ctrl-c", STEPS=400, WORKERS=2, LOG_EVERY=1)
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
        os.killpg(proc.pid, signal.SIGINT)  # the trainer and its workers all get it, as from a terminal
        out, err = proc.communicate(timeout=300)  # a loaded 2-core machine saves slowly; a hang still fails
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = out + err
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert err.strip().splitlines()[-1] == "interrupted"
    assert "continue with RESUME='latest'" in text
    assert list_checkpoints(os.path.join(run_dir, "checkpoints"))
