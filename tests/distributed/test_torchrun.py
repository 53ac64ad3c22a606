"""The same worker code under an external torchrun: the ranks come from its environment variables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

JOB = Path(__file__).with_name("torchrun_job.py")


def test_an_external_torchrun_starts_the_ranks(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*cmd, str(JOB), str(tmp_path / "out")], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads((tmp_path / f"out.{r}.json").read_text()) for r in range(2)]
    assert seen == [{"rank": r, "size": 2, "device": "cpu", "sum": 3.0} for r in range(2)]
