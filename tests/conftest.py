"""Shared test setup: no hub access ever, GPU tests skip cleanly without CUDA."""

import os

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
