"""The step budget of an edit plan holds what the step will hold: the target, the caption's prompt with
the references a text encoder shows in it (`PlanKnobs.reference_prompt_tokens`, a pure count of the
references' sizes) and the reference latents at the target's area; a text-to-image plan is unchanged."""

from __future__ import annotations

import dataclasses

from kohakumoss_data import build_plan
from kohakumoss_data.plan import text_tokens

from .test_references import KNOBS, kohya_refs, scanned  # noqa: F401  (kohya_refs: the fixture)

BUDGET = dataclasses.replace(KNOBS, max_text_tokens=4096, tokens_per_step=200, epochs=1)


def shown(sizes: tuple[tuple[int, int], ...]) -> int:
    """A stand-in encoder's count: 5 label tokens and one vision token per 16x16 px of each reference."""
    return sum(5 + (w // 16) * (h // 16) for w, h in sizes)


def test_the_plan_counts_the_references_shown_in_the_prompt(kohya_refs, tmp_path):  # noqa: F811
    root, refs = kohya_refs
    _, catalog = scanned({"kind": "kohya", "path": str(root), "references": str(refs)}, tmp_path)
    sizes = {it.key: tuple((r["width"], r["height"]) for r in it.references) for it in catalog.usable}
    hidden = build_plan(catalog, 3, BUDGET)
    counted = build_plan(catalog, 3, dataclasses.replace(BUDGET, reference_prompt_tokens=shown))
    before = {it.key: it for step in hidden.steps for it in step}
    after = {it.key: it for step in counted.steps for it in step}
    assert after.keys() == before.keys() and sizes["2_edit/a.png"] == ((80, 64), (64, 96), (64, 64))
    for key, it in after.items():
        assert it.text_tokens == before[key].text_tokens + shown(sizes[key])  # a: 15 + 20 + 24 + 16
        assert it.tokens == it.image_tokens + it.text_tokens + it.reference_tokens
    # the budget packs what the step holds: no step over it, and the larger items need more steps
    assert all(n <= BUDGET.tokens_per_step for n in counted.step_tokens())
    assert len(counted.steps) > len(hidden.steps)
    assert counted.sha256 != hidden.sha256  # the items' text tokens are the plan's bytes
    assert build_plan(catalog, 3, dataclasses.replace(BUDGET, reference_prompt_tokens=shown)).sha256 == (
        counted.sha256
    )  # still a pure function of data, seed and knobs
    assert b"reference_prompt_tokens" not in counted.to_bytes()


def test_the_shown_references_are_cut_with_the_caption_at_max_text_tokens():
    knobs = dataclasses.replace(BUDGET, max_text_tokens=30, template_tokens=4, reference_prompt_tokens=shown)
    assert text_tokens("make it a", knobs) == 4 + 3  # no references: the count is not asked
    assert text_tokens("make it a", knobs, ((32, 32),)) == 4 + 3 + 9
    assert text_tokens("make it a", knobs, ((96, 96),)) == 30  # 4 + 3 + 41, cut where the loader cuts


def test_a_text_to_image_plan_is_the_same_with_the_count(kohya_refs, tmp_path):  # noqa: F811
    """No item has references: the count is never asked and the plan's bytes do not change."""
    _, catalog = scanned({"kind": "kohya", "path": str(kohya_refs[0])}, tmp_path)

    def refuse(sizes):
        raise AssertionError(f"asked for references {sizes} of a text-to-image item")

    plain = build_plan(catalog, 5, dataclasses.replace(BUDGET, epochs=2))
    with_count = build_plan(catalog, 5, dataclasses.replace(BUDGET, epochs=2, reference_prompt_tokens=refuse))
    assert with_count.to_bytes() == plain.to_bytes()
