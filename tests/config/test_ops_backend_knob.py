"""OPS_BACKEND: auto, eager, or registry backend names, so a backend off the default priority (TileLang
on sm70/sm75, Triton on XPU: never run on those cards) stays selectable by name."""

from __future__ import annotations

from kohakumoss.config.train import TRAIN_SCHEMA


def test_backend_names_are_accepted():
    for value in ("auto", "eager", "tilelang", "tilelang,triton", "triton,sdpa_groups,eager"):
        assert TRAIN_SCHEMA.problems({"OPS_BACKEND": value}) == [], value


def test_unknown_names_are_refused_naming_the_knob():
    for value in ("tilelang,cuda", "", 3):
        problems = TRAIN_SCHEMA.problems({"OPS_BACKEND": value})
        assert [name for name, _ in problems] == ["OPS_BACKEND"], value
    ((_, why),) = TRAIN_SCHEMA.problems({"OPS_BACKEND": "tilelang,cuda"})
    assert "cuda" in why and "tilelang" in why  # the bad name, and the known ones
