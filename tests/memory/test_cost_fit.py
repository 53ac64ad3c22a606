"""The catalog's fitted cost constants are what scripts/bench/fit_step_cost.py solves from the measured rows."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

from kohakumoss.memory import calibration as cal

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "fit_step_cost.py"


def test_the_constants_in_calibration_are_the_fit(monkeypatch):
    spec = importlib.util.spec_from_file_location("fit_step_cost", SCRIPT)
    fit_step_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_step_cost)
    committed = {
        "EFFECTIVE_FLOPS": cal.EFFECTIVE_FLOPS,
        'RECOMPUTE_SHARE["full"]': cal.RECOMPUTE_SHARE["full"],
        "STREAM_LOAD_OVERHEAD_S": cal.STREAM_LOAD_OVERHEAD_S,
        'GPU_OPT_S_PER_PARAM["muon"]': cal.GPU_OPT_S_PER_PARAM["muon"],
        'GPU_OPT_S_PER_PARAM["adamw"]': cal.GPU_OPT_S_PER_PARAM["adamw"],
        "HOST_GRAD_SUM_S_PER_PARAM": cal.HOST_GRAD_SUM_S_PER_PARAM,
        "FULL_STREAM_BLOCK_S": cal.FULL_STREAM_BLOCK_S,
    }
    for name in (
        "EFFECTIVE_FLOPS",
        "STREAM_LOAD_OVERHEAD_S",
        "ACT_OFFLOAD_OVERHEAD_S",
        "HOST_GRAD_SUM_S_PER_PARAM",
        "FULL_STREAM_BLOCK_S",
    ):
        monkeypatch.setattr(cal, name, getattr(cal, name) * 3)  # start far off: the fit must find them again
    monkeypatch.setattr(cal, "RECOMPUTE_SHARE", copy.deepcopy(cal.RECOMPUTE_SHARE))
    monkeypatch.setattr(cal, "GPU_OPT_S_PER_PARAM", {"adamw": 0.0, "muon": 0.0})
    fitted = fit_step_cost.fit()
    assert set(fitted) == set(committed)
    for name, value in committed.items():
        assert fitted[name] == pytest.approx(value, rel=0.01), name
