"""Group a shuffled sequence of items into steps that each fill a token budget."""

from __future__ import annotations

from collections.abc import Sequence

from kohakumoss_common.errors import ConfigError


def pack_steps(tokens: Sequence[int], budget: int, drop_last: bool = False) -> list[list[int]]:
    """Indices into `tokens`, in order, cut into steps whose sum stays within `budget`."""
    steps: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, n in enumerate(tokens):
        if n > budget:
            raise ConfigError(
                "tokens_per_step",
                f"{budget} is smaller than one item ({n} tokens); raise it or lower the area",
            )
        if used + n > budget:
            steps.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current and not drop_last:
        steps.append(current)
    return steps
