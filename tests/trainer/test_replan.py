"""Resume after files vanished from the data: refused by name, continued along the new plan with RESUME_REPLAN."""

from __future__ import annotations

import json
import shutil

import pytest

from kohakumoss.train.loop import train
from kohakumoss_common.errors import ConfigError

from .conftest import tiny_knobs


def test_a_run_whose_files_vanished_resumes_only_with_resume_replan(train_world, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(train_world["DATASET"]["path"], data)
    world = {**train_world, "DATASET": {"kind": "kohya", "path": str(data)}}
    train(tiny_knobs(world, "replan", STEPS=4, STOP_AT=2))
    for gone in sorted((data / "2_style").glob("wood*")):  # the user deletes one picture and its caption
        gone.unlink()
    with pytest.raises(ConfigError, match=r"the data changed since .*set RESUME_REPLAN=True") as e:
        train(tiny_knobs(world, "replan", STEPS=4, RESUME="latest"))
    assert "from micro-step 2" in str(e.value)
    run = train(tiny_knobs(world, "replan", STEPS=4, RESUME="latest", RESUME_REPLAN=True))
    log = (run / "log.txt").read_text()
    assert "RESUME_REPLAN:" in log and "continuing along the new plan" in log
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    # the checkpoints written after the replan record the new plan: a plain resume of them verifies
    more = train(tiny_knobs(world, "replan", STEPS=5, RESUME="latest", RESUME_ALLOW_CHANGES=["STEPS"]))
    assert "resumed from" in (more / "log.txt").read_text()
