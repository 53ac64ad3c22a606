"""Resume compares BYPASS by the function its forward trains (adapters/algos.trained_forward): where
lycoris's bypass and merged forwards compute one function any value resumes any other (a run saved with the
old default BYPASS=False resumes under 'auto'); where they differ (OFT, IA3, DoRA, ...) the forward counts."""

from __future__ import annotations

import pytest

from kohakumoss.adapters.algos import ALGOS, trained_forward
from kohakumoss.train.resume import changed_knobs

SAME = [a for a, r in ALGOS.items() if r.bypass("auto", {})]  # bypass computes the merged forward's function
DIFFERENT = [a for a in ALGOS if a not in SAME]


@pytest.mark.parametrize("algo", SAME)
def test_a_forward_that_trains_the_same_function_resumes_any_bypass(algo):
    for saved in (False, True, "auto"):
        for now in (False, True, "auto"):
            assert changed_knobs({"ALGO": algo, "BYPASS": saved}, {"ALGO": algo, "BYPASS": now}) == {}


def test_where_the_forwards_differ_the_forward_counts():
    assert {"oft", "boft", "ia3", "dylora", "dora"} <= set(DIFFERENT)
    assert {"lora", "locon", "loha", "lokr", "glora", "tlora"} <= set(SAME)
    for algo in DIFFERENT:
        # 'auto' keeps the merged forward there: the old default's runs resume
        assert changed_knobs({"ALGO": algo, "BYPASS": False}, {"ALGO": algo, "BYPASS": "auto"}) == {}
        assert changed_knobs({"ALGO": algo, "BYPASS": True}, {"ALGO": algo, "BYPASS": "auto"}) == {
            "BYPASS": (True, "auto")
        }
    dora = {"ALGO": "lora", "ALGO_ARGS": {"dora_wd": True}}  # DoRA through ALGO_ARGS: merged only
    assert trained_forward({**dora, "BYPASS": "auto"}) is False
    assert changed_knobs({**dora, "BYPASS": False}, {**dora, "BYPASS": "auto"}) == {}


def test_a_full_fine_tune_has_no_adapter_forward():
    assert changed_knobs({"ALGO": "full", "BYPASS": False}, {"ALGO": "full", "BYPASS": "auto"}) == {}
    assert changed_knobs({"ALGO": "lora", "RANK": 4}, {"ALGO": "lora", "RANK": 8}) == {"RANK": (4, 8)}
