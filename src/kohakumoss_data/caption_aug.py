"""kohya's caption augmentations, seeded per occurrence: tag shuffle and tag dropout with kept leading
tags, caption dropout."""

from __future__ import annotations

import random

SEPARATOR = ","  # between a caption's tags (kohya's; PlanKnobs.caption_separator's default)


def shuffle_tags(caption: str, rng: random.Random, keep_tokens: int = 0, separator: str = SEPARATOR) -> str:
    """Shuffle the separator-split tags after the first `keep_tokens` (kohya's shuffle_caption)."""
    tags = [t.strip() for t in caption.split(separator) if t.strip()]
    head, tail = tags[:keep_tokens], tags[keep_tokens:]
    rng.shuffle(tail)
    return f"{separator} ".join(head + tail)


def drop_tags(
    caption: str, rng: random.Random, rate: float, keep_tokens: int = 0, separator: str = SEPARATOR
) -> str:
    """Drop each tag after the first `keep_tokens` with probability `rate` (kohya's caption_tag_dropout_rate)."""
    tags = [t.strip() for t in caption.split(separator) if t.strip()]
    head, tail = tags[:keep_tokens], tags[keep_tokens:]
    return f"{separator} ".join(head + [t for t in tail if rng.random() >= rate])


def augment_caption(
    caption: str,
    rng: random.Random,
    dropout: float = 0.0,
    shuffle: bool = False,
    keep_tokens: int = 0,
    separator: str = SEPARATOR,
    tag_dropout: float = 0.0,
) -> str:
    """The caption one occurrence trains with; the same generator state gives the same text."""
    dropped = rng.random() < dropout
    if shuffle:
        caption = shuffle_tags(caption, rng, keep_tokens, separator)
    if tag_dropout > 0:  # no draw otherwise: plans without it stay as they were
        caption = drop_tags(caption, rng, tag_dropout, keep_tokens, separator)
    return "" if dropped else caption
