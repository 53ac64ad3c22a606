"""Which launches are programmatic dependent ones (kohakumoss_kernels.backends.pdl), with the card faked: the
kernels under PDL themselves run in the GPU tests (on by default on the H200)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


def _on(device: str) -> SimpleNamespace:
    return SimpleNamespace(device=torch.device(device))


@pytest.fixture
def pdl(monkeypatch):
    from kohakumoss_kernels.backends import pdl

    monkeypatch.delenv(pdl.ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return pdl


@pytest.mark.parametrize(("major", "expected"), [(9, True), (10, True), (8, False), (7, False)])
def test_pdl_only_from_sm90(pdl, monkeypatch, major, expected):
    monkeypatch.setattr(pdl, "_sm_major", lambda index: major)
    assert pdl.enabled(_on("cuda:0")) is expected
    assert pdl.options(_on("cuda:0")) == ({"PDL": True, "launch_pdl": True} if expected else {})


def test_pdl_off_by_knob_interpreter_and_off_cuda(pdl, monkeypatch):
    monkeypatch.setattr(pdl, "_sm_major", lambda index: 9)
    assert pdl.options(_on("cpu")) == {}
    assert pdl.options(_on("xpu")) == {}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.options(_on("cuda:0")) == {}
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setenv(pdl.ENV, "0")
    assert pdl.options(_on("cuda:0")) == {}


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
)
def test_pdl_on_for_this_card_when_hopper():
    from kohakumoss_kernels.backends import pdl

    x = torch.empty(1, device="cuda")
    assert pdl.enabled(x) is (torch.cuda.get_device_capability()[0] >= 9)
