"""kohya's caption augmentations, seeded per occurrence: tag shuffle with kept leading tags, dropout."""

from __future__ import annotations

import random


def shuffle_tags(caption: str, rng: random.Random, keep_tokens: int = 0, separator: str = ",") -> str:
    """Shuffle the separator-split tags after the first `keep_tokens` (kohya's shuffle_caption)."""
    tags = [t.strip() for t in caption.split(separator) if t.strip()]
    head, tail = tags[:keep_tokens], tags[keep_tokens:]
    rng.shuffle(tail)
    return f"{separator} ".join(head + tail)


def augment_caption(
    caption: str,
    rng: random.Random,
    dropout: float = 0.0,
    shuffle: bool = False,
    keep_tokens: int = 0,
    separator: str = ",",
) -> str:
    """The caption one occurrence trains with; the same generator state gives the same text."""
    dropped = rng.random() < dropout
    if shuffle:
        caption = shuffle_tags(caption, rng, keep_tokens, separator)
    return "" if dropped else caption
