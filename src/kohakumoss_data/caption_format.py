"""Caption formats (the plan's `caption_format`): plain text, MOSS-Image's native layout JSON, or both.

MOSS-Image reads captions as plain text or as its layout JSON (summary, items with centred `yxyx` pixel
boxes). `auto-json` wraps a plain caption in that layout, as SimpleTuner's `moss_image_auto_json`:
`{"summary":{"canvas":"single","caption":...},"items":[],"bbox_coord_space":"abs_centralized",
"bbox_format":"yxyx"}`, compact, non-ASCII kept; a caption that already is JSON is validated and written
back compactly; the empty (dropout) caption stays empty. `json`: every non-empty caption must already be
layout JSON, validated and kept as written. `LayoutCaption` is the layout's schema: unknown keys are
refused, a box must have a positive size, a `text` item needs its text. Box ranges are not checked: a
caption does not say which canvas size its pixels belong to.
"""

from __future__ import annotations

import functools
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from kohakumoss_common.errors import ConfigError, DataError

CAPTION_FORMATS = ("plain", "auto-json", "json")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class LayoutSummary(_Strict):
    meta: list[str] | None = None
    canvas: Literal["single", "multi_panel", "collage"]
    caption: str
    palette: list[str] | None = None


class LayoutItem(_Strict):
    label: Literal["object", "character", "text"]
    caption: str
    text: str | None = Field(None, validate_default=True)  # checked even when absent: a text item needs it
    bbox: tuple[int, int, int, int]  # y_min, x_min, y_max, x_max in pixels from the canvas centre
    tags: list[str] | None = None
    palette: list[str] | None = None

    @field_validator("text")
    @classmethod
    def _text_item_has_text(cls, text: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("label") == "text" and not text:
            raise ValueError("an item labelled 'text' needs its 'text'")
        return text

    @field_validator("bbox")
    @classmethod
    def _box_has_area(cls, bbox: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        y0, x0, y1, x1 = bbox
        if y1 <= y0 or x1 <= x0:
            raise ValueError(f"bbox {list(bbox)} has no area (y_min < y_max and x_min < x_max)")
        return bbox


class LayoutCaption(_Strict):
    summary: LayoutSummary
    items: list[LayoutItem]
    bbox_coord_space: Literal["abs_centralized"]
    bbox_format: Literal["yxyx"]


def check_caption_format(name: str) -> str:
    if name not in CAPTION_FORMATS:
        raise ConfigError("caption_format", f"must be one of {CAPTION_FORMATS}, got {name!r}")
    return name


def is_json_caption(caption: str) -> bool:
    """A caption written as JSON (SimpleTuner's test: it starts with '{')."""
    return caption.lstrip().startswith("{")


def _key_path(loc: tuple) -> str:
    """('items', 0, 'bbox') -> 'items[0].bbox'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_layout(caption: str, where: str) -> LayoutCaption:
    """The caption as MOSS layout JSON; DataError naming `where` (the item) and the JSON key at fault."""
    try:
        json.loads(caption)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: caption is not JSON ({e})") from None
    try:
        return LayoutCaption.model_validate_json(caption)
    except ValidationError as e:
        first = e.errors()[0]
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise DataError(
            f"{where}: caption is not MOSS layout JSON: key {_key_path(first['loc'])}: {first['msg']}{more}"
        ) from None


def check_caption(caption: str, fmt: str, where: str) -> None:
    """Refuse a caption `fmt` cannot train (json: not layout JSON; auto-json: JSON that is not layout)."""
    if fmt == "json" and caption and not is_json_caption(caption):
        raise DataError(f"{where}: caption is plain text, but CAPTION_FORMAT 'json' needs MOSS layout JSON")
    if fmt != "plain" and is_json_caption(caption):
        parse_layout(caption, where)


def wrap_plain(caption: str) -> str:
    """A plain caption in the native layout (SimpleTuner's converter's exact bytes)."""
    layout = {
        "summary": {"canvas": "single", "caption": caption},
        "items": [],
        "bbox_coord_space": "abs_centralized",
        "bbox_format": "yxyx",
    }
    return json.dumps(layout, separators=(",", ":"), ensure_ascii=False)


@functools.lru_cache(maxsize=4096)
def _canonical(caption: str) -> str:
    layout = parse_layout(caption, "caption")
    return json.dumps(layout.model_dump(exclude_none=True), separators=(",", ":"), ensure_ascii=False)


def format_caption(caption: str, fmt: str) -> str:
    """The text one occurrence trains with under `fmt` (validated by `check_caption` beforehand)."""
    if fmt == "plain" or not caption:
        return caption
    if fmt == "json":
        return caption
    return _canonical(caption) if is_json_caption(caption) else wrap_plain(caption)
