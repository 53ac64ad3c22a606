"""The prompt token cap: a caption whose templated prompt is longer than the encoder keeps is named.

MOSS-Image reads at most 4096 tokens of the whole chat-templated prompt (the template's own tokens
count) and every port cuts the rest on the right, silently, with the template's end (`<|im_end|>`, the
assistant turn, `<think>`) (moss-image-edit-facts.md, section 3.4). Training cuts at MAX_TEXT_TOKENS the
same way. `cut_captions` counts each planned caption's prompt without cutting it; `report_cut_captions`
logs a warning per item whose caption is cut (naming the dataset item and the counts) and refuses
them instead with the layout-JSON caption formats, where a cut caption is JSON with its end missing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kohakumoss_common.errors import DataError
from kohakumoss_common.log import get_logger
from kohakumoss_data.plan import PlanKnobs

log = get_logger(__name__)
SHOWN = 20  # items named one by one; the rest counted


@dataclass(frozen=True)
class CaptionCut:
    where: str  # the dataset item (its dataset's path and key)
    tokens: int  # the templated prompt's tokens, uncut
    cap: int


def prompt_tokens(prompts: Any, caption: str) -> int:
    """Tokens of `caption`'s whole templated prompt, uncut (`PromptTokenizer`'s formatting)."""
    text = prompts.format(caption)
    return len(prompts.tokenizer(text)["input_ids"]) if text else 1


def cut_captions(prompts: Any, captions: Iterable[tuple[str, str]], cap: int) -> list[CaptionCut]:
    """(where, caption) pairs -> one CaptionCut per item whose longest prompt is over `cap` tokens."""
    counted: dict[str, int] = {}
    longest: dict[str, int] = {}
    for where, caption in captions:
        if caption not in counted:
            counted[caption] = prompt_tokens(prompts, caption)
        longest[where] = max(longest.get(where, 0), counted[caption])
    return [CaptionCut(where, n, cap) for where, n in longest.items() if n > cap]


def report_cut_captions(
    cuts: list[CaptionCut], knob: str, caption_format: str = PlanKnobs.caption_format
) -> None:
    """A warning per cut caption (the first SHOWN named, the rest counted); a DataError naming them
    instead when `caption_format` is a layout-JSON one (a cut caption is JSON without its end)."""
    if not cuts:
        return
    lines = [
        f"{c.where}: caption is {c.tokens} tokens with the prompt template, over {knob} {c.cap}: "
        f"its last {c.tokens - c.cap} tokens (and the template's end) are cut"
        for c in cuts
    ]
    more = f" and {len(cuts) - SHOWN} more" if len(cuts) > SHOWN else ""
    if caption_format != "plain":
        raise DataError(
            f"CAPTION_FORMAT {caption_format!r}: {len(cuts)} caption(s) would be cut mid-JSON: "
            + "; ".join(lines[:SHOWN])
            + more
            + f" (shorten them, or raise {knob}: MOSS-Image reads up to 4096)"
        )
    for line in lines[:SHOWN]:
        log.warning(line)
    if more:
        log.warning(f"{len(cuts) - SHOWN} more captions are cut at {knob} {cuts[0].cap} tokens")
