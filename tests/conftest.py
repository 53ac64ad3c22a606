"""Shared test setup: no hub access ever, GPU tests skip cleanly without CUDA."""

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Triton launch-config timing is a per-shape prewarm: the many small test shapes would each pay it
os.environ.setdefault("KOHAKUMOSS_TRITON_PICK", "0")
# tests time their kernels from an empty table: the shipped one (kohakumoss_kernels/tuning/tables) would answer
# on the H200 and hide the tuning path they check
os.environ.setdefault("KOHAKUMOSS_SHIPPED_TABLES", "0")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200 through the device tool)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """Each failure written as it happens (KOHAKUMOSS_TEST_FAILURES): a GPU area killed at its time limit
    keeps the tracebacks of the tests that failed before it."""
    path = os.environ.get("KOHAKUMOSS_TEST_FAILURES")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


def _beside(name: str) -> types.ModuleType:
    """A module file next to this conftest, by path (the conftest also runs copied into a test's folder)."""
    spec = importlib.util.spec_from_file_location(
        f"_kohakumoss_{name}", Path(__file__).with_name(f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


exit_guard = _beside("exit_guard")
_pool_leaks: list[str] = []
_session_status = 0


@pytest.fixture(autouse=True)
def _process_pool_leak_check(request):
    """Name each test that leaves a process pool's manager running (its join could hang the exit)."""
    before = exit_guard.live_pool_managers()
    yield
    if left := exit_guard.new_pool_managers(before):
        _pool_leaks.append(f"{request.node.nodeid}: {len(left)} process pool(s) still running")


def pytest_sessionfinish(session, exitstatus):
    global _session_status
    _session_status = int(exitstatus)


def pytest_terminal_summary(terminalreporter):
    if _pool_leaks:
        terminalreporter.section("process pools left running by a test")
        for line in _pool_leaks:
            terminalreporter.write_line(line)


def pytest_unconfigure(config):
    """The process always exits (tests/exit_guard.py): leftover pool workers ended, then a watchdog."""
    if killed := exit_guard.end_leftover_workers():
        print(f"exit_guard: ended {len(killed)} leftover worker process(es): {killed}", file=sys.stderr)
    exit_guard.arm_exit_watchdog(_session_status)
