"""PROFILE_STEPS: the named steps run under torch.profiler; the run folder gets the trace and the tables,
the metrics mark those steps, and a malformed range is refused by name before anything runs."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from kohakumoss.train.loop import train
from kohakumoss_common.errors import KohakuMossError

from .conftest import tiny_knobs


def test_the_named_steps_are_profiled_into_the_run_folder(train_world):
    run = train(tiny_knobs(train_world, "profiled", STEPS=4, PROFILE_STEPS=[2, 3]))
    trace = json.loads(gzip.decompress((run / "profile" / "trace.json.gz").read_bytes()))
    assert trace["traceEvents"]  # the profiler recorded the steps' operators
    tables = (run / "profile" / "kernels.txt").read_text()
    assert tables.startswith("profiled steps 2-3:") and "aten::" in tables
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("profiled", False) for r in records] == [False, True, True, False]
    assert "profiled steps 2-3" in (run / "log.txt").read_text()


@pytest.mark.parametrize("bad", [[3, 2], [0, 2], [5]])
def test_a_malformed_range_names_the_knob(train_world, bad):
    with pytest.raises(KohakuMossError, match="PROFILE_STEPS"):
        tiny_knobs(train_world, "bad-profile", PROFILE_STEPS=bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_run_reports_the_gpus_busy_and_waiting_time(train_world):
    run = train(tiny_knobs(train_world, "profiled-cuda", STEPS=3, PROFILE_STEPS=[2, 3], DEVICE="cuda",
                           PRECISION="bf16"))  # fmt: skip
    line = next(x for x in (run / "log.txt").read_text().splitlines() if "profiled steps 2-3" in x)
    busy = float(line.split("GPU busy ")[1].split(" ms")[0])
    assert busy > 0 and "GPU waiting for the host" in line
    assert "by device time" in (run / "profile" / "kernels.txt").read_text()
