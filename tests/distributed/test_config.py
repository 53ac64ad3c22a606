"""DISTRIBUTED and DEVICES: malformed values and engines not built are refused by knob name."""

from __future__ import annotations

import pytest

from kohakumoss.distributed.config import check_knobs, devices_problem, mode_problem, worker_devices
from kohakumoss.distributed.world import launched_externally
from kohakumoss_common.errors import ConfigError


def test_every_mode_is_built_and_a_typo_is_refused_by_name():
    for mode in ("none", "ddp", "fsdp", "pipeline", "threaded"):
        assert mode_problem(mode) is None
    assert "not one of" in mode_problem("dpp")
    with pytest.raises(ConfigError, match="DISTRIBUTED: 'pipe' is not one of"):
        check_knobs("pipe", 2)


@pytest.mark.parametrize(
    ("devices", "mode", "needle"),
    [
        (-1, "ddp", "below 0"),
        (2, "none", "DISTRIBUTED='none'"),
        (0, "none", "0 workers asked for with DISTRIBUTED='none'"),
        (["cuda:1"], "none", "DEVICE picks the one device"),
        ([], "ddp", "empty list"),
        (["cuda:0", 0], "ddp", "listed twice"),
        (["cpu", "cuda:1"], "ddp", "mixes CPU and GPU"),
        (["gpu0"], "ddp", "is not a device"),
        ("2", "ddp", "expected a count or a list"),
        (True, "ddp", "expected a count or a list"),
    ],
)
def test_bad_devices(devices, mode, needle):
    assert needle in devices_problem(devices, mode)
    with pytest.raises(ConfigError, match="DEVICES"):
        check_knobs(mode, devices)


def test_good_devices():
    for devices in (0, 1, 2, ["cuda:0", "cuda:2"], [1, 3], ["cpu", "cpu"]):
        assert devices_problem(devices, "ddp") is None
    assert devices_problem(1, "none") is None


def test_worker_devices_resolve_against_the_node():
    assert worker_devices(2, "cpu", 8) == ["cpu", "cpu"]
    assert worker_devices(2, "auto", 0) == ["cpu", "cpu"]
    assert worker_devices(0, "auto", 4) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert worker_devices(2, "cuda", 4) == ["cuda:0", "cuda:1"]
    assert worker_devices([3, "cuda:1"], "cuda", 4) == ["cuda:3", "cuda:1"]
    with pytest.raises(ConfigError, match="DEVICES: 3 workers, but this node sees 2 GPU"):
        worker_devices(3, "cuda", 2)
    with pytest.raises(ConfigError, match="DEVICES: cuda:5 asked for"):
        worker_devices(["cuda:5"], "cuda", 2)
    with pytest.raises(ConfigError, match="DEVICES: 0 .* give the number of CPU workers"):
        worker_devices(0, "cpu", 0)
    with pytest.raises(ConfigError, match="DEVICES: 0 .* no CUDA GPU"):
        worker_devices(0, "cuda", 0)


def test_torchrun_variables_are_detected(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not launched_externally()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert launched_externally()
