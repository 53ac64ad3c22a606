"""The trainer's garbage-collection policy: setup frozen, no automatic collections, young generations
collected on the steps it names, Python's collector back as it was afterwards."""

from __future__ import annotations

import gc
import weakref

import pytest

from kohakumoss.train.collector import StepCollector
from kohakumoss_common.errors import ConfigError


class _Node:
    pass


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # only the cycle collector frees these
    return weakref.ref(a)


def test_collects_only_on_its_steps_and_restores_the_collector():
    assert gc.isenabled()
    with StepCollector(3) as collector:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        ref = _cycle()
        for _ in range(5000):  # enough allocations to trigger an automatic collection, were it on
            _Node()
        collector.after_launch(4)
        assert ref() is not None
        collector.after_launch(6)
        assert ref() is None
        assert collector.take_paused_ms() > 0 and collector.take_paused_ms() == 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_zero_leaves_python_alone_but_times_its_pauses():
    with StepCollector(0) as collector:
        assert gc.isenabled() and gc.get_freeze_count() == 0
        collector.after_launch(0)
        gc.collect()
        assert collector.paused_ms > 0
    assert gc.isenabled()


def test_negative_names_the_knob():
    with pytest.raises(ConfigError, match="GC_EVERY"):
        StepCollector(-1)
