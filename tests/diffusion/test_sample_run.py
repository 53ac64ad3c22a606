"""What the sample script prices its memory plan by: the longest templated prompt it will encode."""

from __future__ import annotations

from kohakumoss.config.sample import SampleScriptConfig
from kohakumoss.diffusion.sample_run import longest_prompt_tokens


def test_longest_prompt_tokens_counts_prompts_and_the_negative():
    words = lambda text: list(range(3 + len(text.split())))  # noqa: E731 (a template of 3 tokens)
    k = {"PROMPT": "a b", "PROMPT_FILE": "", "SEEDS": [], "SEED": 0, "COUNT": 2, "WIDTH": 64, "HEIGHT": 64,
         "NEGATIVE": ""}  # fmt: skip
    assert longest_prompt_tokens(SampleScriptConfig.from_knobs(k), words) == 5
    assert longest_prompt_tokens(SampleScriptConfig.from_knobs({**k, "NEGATIVE": "x y z w"}), words) == 7
