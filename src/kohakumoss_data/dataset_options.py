"""Per-dataset options in a dataset entry, beside the source's own keys (kohya's subset settings).

    [
        {"kind": "kohya", "path": "data/char", "caption_dropout": 0.1, "mask": "alpha"},
        {"kind": "folder", "path": "data/reg", "reg": True, "loss_weight": 0.5, "repeats": 2},
    ]

repeats multiplies each item's own repeats; the caption options replace the plan's settings for that
dataset's items; `reg` marks regularization (prior) images, trained as often per epoch as the other
images and with their own `loss_weight`; `mask` is "alpha" (the image's alpha channel) or a folder of
mask files (same relative name, .png: white trains, black is ignored).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from kohakumoss_common.errors import ConfigError


@dataclass(frozen=True)
class DatasetOptions:
    repeats: int = 1
    caption_dropout: float | None = None  # None: the plan's caption_dropout
    shuffle_caption: bool | None = None  # None: the plan's shuffle_caption
    keep_tokens: int | None = None  # None: the plan's keep_tokens
    tag_dropout: float | None = None  # None: the plan's tag_dropout
    caption_separator: str | None = None  # None: the plan's caption_separator
    reg: bool = False
    loss_weight: float = 1.0
    mask: str = ""  # "": none; "alpha"; or a folder of mask files

    def validate(self, where: str) -> DatasetOptions:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"{where}.{key}", why)

        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise bad("repeats", f"must be a whole number >= 1, got {self.repeats!r}")
        for key in ("caption_dropout", "tag_dropout"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not 0 <= float(value) <= 1):
                raise bad(key, f"must be a probability in [0, 1], got {value!r}")
        if self.keep_tokens is not None and (not isinstance(self.keep_tokens, int) or self.keep_tokens < 0):
            raise bad("keep_tokens", f"must be a whole number >= 0, got {self.keep_tokens!r}")
        if isinstance(self.loss_weight, bool) or not isinstance(self.loss_weight, (int, float)):
            raise bad("loss_weight", f"must be a number, got {self.loss_weight!r}")
        if self.loss_weight < 0:
            raise bad("loss_weight", f"must be >= 0, got {self.loss_weight}")
        if not isinstance(self.reg, bool):
            raise bad("reg", f"must be True or False, got {self.reg!r}")
        if not isinstance(self.mask, str):
            raise bad("mask", f"must be '', 'alpha' or a folder of mask files, got {self.mask!r}")
        return self


OPTION_KEYS = tuple(f.name for f in fields(DatasetOptions))


def split_options(spec: dict[str, Any], where: str = "dataset") -> tuple[dict[str, Any], DatasetOptions]:
    """(the source's own keys, the per-dataset options) of one dataset entry."""
    source = {k: v for k, v in spec.items() if k not in OPTION_KEYS}
    options = DatasetOptions(**{k: v for k, v in spec.items() if k in OPTION_KEYS})
    return source, options.validate(where)


def dataset_options(spec: Any) -> tuple[DatasetOptions, ...]:
    """Options of every dataset entry (a dict: one dataset; a list: several, in order)."""
    if not isinstance(spec, (list, tuple)):
        return (split_options(spec)[1] if isinstance(spec, dict) else DatasetOptions(),)
    return tuple(
        split_options(e, f"dataset[{i}]")[1] if isinstance(e, dict) else DatasetOptions()
        for i, e in enumerate(spec)
    )
