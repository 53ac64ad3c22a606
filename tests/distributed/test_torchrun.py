"""The same worker code under an external torchrun: the ranks come from its environment variables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .tiny import tiny_knobs, train_world  # noqa: F401 (the fixture)

JOB = Path(__file__).with_name("torchrun_job.py")
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train" / "moss.py"


def test_an_external_torchrun_starts_the_ranks(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*cmd, str(JOB), str(tmp_path / "out")], capture_output=True, text=True, timeout=240
    )
    # a rank's fatal error (faulthandler's stacks) sits above the launcher's summary: keep both
    fatal = proc.stderr.find("Fatal Python error")
    assert proc.returncode == 0, (proc.stderr[fatal : fatal + 4000] if fatal >= 0 else "") + proc.stderr[
        -3000:
    ]
    seen = [json.loads((tmp_path / f"out.{r}.json").read_text()) for r in range(2)]
    assert seen == [{"rank": r, "size": 2, "device": "cpu", "sum": 3.0} for r in range(2)]


def test_torchrun_starts_the_train_script_through_kogine(train_world, tmp_path):  # noqa: F811
    """The documented command: torchrun --no-python kogine run scripts/train/moss.py, 2 CPU ranks."""
    k = tiny_knobs(
        train_world, "torchrun", STEPS=2, LOGGERS=[], SAVE_FORMAT="hf", DISTRIBUTED="ddp", DEVICES=2
    )
    config = tmp_path / "cfg.py"
    config.write_text("".join(f"{name} = {value!r}\n" for name, value in k.items()))
    kogine = Path(sys.executable).with_name("kogine")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--no-python",
    ]
    proc = subprocess.run(
        [*cmd, str(kogine), "run", str(SCRIPT), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = Path(k["RUNS_DIR"]) / "torchrun"
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (run / "ranks" / "1" / "metrics.jsonl").is_file() and (run / "export").is_dir()
