"""Tensor-subclass optimizer states as plain tensors (kohakumoss/optim/portable.py): the saved form reads
under weights_only with no class registered, rebuilds to equal components, and what cannot be stored or
rebuilt is a CheckpointError naming where."""

from __future__ import annotations

import io

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

from kohakumoss.optim.portable import MARK, portable_state, restore_state
from kohakumoss_common.errors import CheckpointError


class OddContext(TwoTensor):
    """A subclass whose flatten context is an object weights_only could not load."""

    def __tensor_flatten__(self):
        return ["a", "b"], object()


def _state(t: torch.Tensor) -> dict:
    return {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": t}},
        "param_groups": [{"lr": 1e-3, "params": [0]}],
    }


def test_subclass_states_round_trip_through_a_weights_only_file():
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    plain = portable_state(_state(TwoTensor(a, b)))
    saved = plain["state"][0]["exp_avg"]
    assert saved[MARK].endswith(":TwoTensor") and set(saved["tensors"]) == {"a", "b"}
    buf = io.BytesIO()
    torch.save(plain, buf)
    buf.seek(0)
    registered = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        loaded = torch.load(buf, weights_only=True)
    finally:
        torch.serialization.add_safe_globals(registered)
    back = restore_state(loaded)
    t = back["state"][0]["exp_avg"]
    assert type(t) is TwoTensor and t.shape == (4, 3)
    assert torch.equal(t.a, a) and torch.equal(t.b, b)
    assert back["param_groups"] == [{"lr": 1e-3, "params": [0]}]
    assert torch.equal(back["state"][0]["step"], torch.tensor(3.0))


def test_plain_states_pass_unchanged():
    state = _state(torch.randn(2))
    out = portable_state(state)
    assert out["state"][0]["exp_avg"] is state["state"][0]["exp_avg"]
    assert restore_state(out)["state"][0]["exp_avg"] is state["state"][0]["exp_avg"]


def test_a_context_that_is_not_plain_data_is_refused_by_name():
    t = OddContext(torch.zeros(2), torch.zeros(2))
    with pytest.raises(CheckpointError, match=r"adamw\.state\.0\.exp_avg.*OddContext.*not plain data"):
        portable_state(_state(t), "adamw")


def test_a_class_from_a_module_not_imported_is_not_imported_from_the_file():
    plain = portable_state(_state(TwoTensor(torch.zeros(2), torch.zeros(2))))
    plain["state"][0]["exp_avg"][MARK] = "kohakumoss_no_such_module:OptimState8bit"
    with pytest.raises(CheckpointError, match="kohakumoss_no_such_module.*not imported"):
        restore_state(plain)
    plain["state"][0]["exp_avg"][MARK] = "torch.nn:Linear"
    with pytest.raises(CheckpointError, match="'torch.nn:Linear' is not a tensor subclass"):
        restore_state(plain)


@pytest.mark.parametrize(
    "cls_name", ["subclass_8bit.OptimState8bit", "subclass_4bit.OptimState4bit", "subclass_fp8.OptimStateFp8"]
)
def test_torchao_low_bit_states_round_trip(cls_name):
    """torchao's three low-bit AdamW state classes: components and dequantized values equal after the
    weights_only file, and the rebuilt state moves like the original (load_state_dict calls .to)."""
    pytest.importorskip("torchao")
    import importlib

    module, name = cls_name.split(".")
    cls = getattr(importlib.import_module(f"torchao.optim.{module}"), name)
    t = cls.zeros((64, 128), device="cpu")
    t.copy_(torch.randn(64, 128, generator=torch.Generator().manual_seed(0)))  # quantized into the state
    buf = io.BytesIO()
    torch.save(portable_state(_state(t)), buf)
    buf.seek(0)
    registered = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()  # torchao registers its classes; a reader without it has none
    try:
        loaded = torch.load(buf, weights_only=True)
    finally:
        torch.serialization.add_safe_globals(registered)
    back = restore_state(loaded)["state"][0]["exp_avg"]
    assert type(back) is cls and back.shape == t.shape and back.dtype == t.dtype
    for part in t.__tensor_flatten__()[0]:
        assert torch.equal(getattr(back, part), getattr(t, part)), part
    assert torch.equal(back.dequantize(), t.dequantize())
    assert type(back.to(dtype=torch.float32, device="cpu")) is cls
