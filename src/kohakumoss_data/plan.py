"""The plan: a pure function of (catalog, seed, knobs) giving every step's items, sizes, crops and flips.

Same inputs, same bytes: `Plan.sha256` is printed so two runs (or a resumed run) can be compared.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from kohakumoss_common.errors import ConfigError
from kohakumoss_common.hashing import canonical_json, sha256_bytes

from .buckets import nearest_bucket
from .caption_aug import augment_caption
from .catalog import Catalog
from .packing import pack_steps
from .records import CatalogItem
from .resolution import cover_size, crop_offset, target_size

PLAN_VERSION = 1


@dataclass(frozen=True)
class PlanKnobs:
    area: int = 1024 * 1024
    multiple: int = 16
    min_aspect: float = 0.25
    max_aspect: float = 4.0
    no_upscale: bool = False
    crop: str = "center"  # center | random
    buckets: tuple[tuple[int, int], ...] | None = None
    tokens_per_step: int = 32768
    patch_px: int = 16  # one image token covers patch_px x patch_px pixels
    max_text_tokens: int = 256
    chars_per_token: float = 4.0  # caption length estimate; the plan must not need a tokenizer
    template_tokens: int = 0  # tokens the text template adds to every caption (the trainer counts them)
    flip_prob: float = 0.0
    caption_dropout: float = 0.0  # probability of training an occurrence with an empty caption
    shuffle_caption: bool = False  # kohya: shuffle comma-separated tags ...
    keep_tokens: int = 0  # ... keeping this many leading tags in place
    caption_separator: str = ","
    epochs: int = 1
    shuffle: bool = True
    drop_last: bool = False

    def validate(self) -> PlanKnobs:
        if self.crop not in ("center", "random"):
            raise ConfigError("CROP", f"must be 'center' or 'random', got {self.crop!r}")
        if self.multiple % self.patch_px:
            raise ConfigError(
                "MULTIPLE", f"{self.multiple} is not a multiple of the patch size {self.patch_px}"
            )
        if not 0 < self.min_aspect <= 1 <= self.max_aspect:
            raise ConfigError("MIN_ASPECT/MAX_ASPECT", "need 0 < MIN_ASPECT <= 1 <= MAX_ASPECT")
        if self.max_text_tokens < 1 or self.template_tokens < 0:
            raise ConfigError("MAX_TEXT_TOKENS", "must be at least 1 (and the template's tokens >= 0)")
        if self.epochs < 1 or self.tokens_per_step < 1 or self.area < self.multiple**2:
            raise ConfigError("EPOCHS/TOKENS_PER_STEP/AREA", "must be positive (AREA at least one patch)")
        for bucket in self.buckets or ():
            if bucket[0] % self.multiple or bucket[1] % self.multiple:
                raise ConfigError("BUCKETS", f"{bucket} is not a multiple of {self.multiple} px")
        return self


@dataclass(frozen=True)
class PlannedItem:
    """One image in one step: which item, which caption, and exactly how its pixels are made."""

    key: str
    hash: str
    caption: str
    target: tuple[int, int]
    resize: tuple[int, int]
    crop: tuple[int, int]
    flip: bool
    image_tokens: int
    text_tokens: int
    epoch: int

    @property
    def tokens(self) -> int:
        return self.image_tokens + self.text_tokens


@dataclass
class Plan:
    seed: int
    knobs: PlanKnobs
    catalog: str  # catalog fingerprint
    steps: list[list[PlannedItem]]
    epoch_steps: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": PLAN_VERSION,
            "seed": self.seed,
            "knobs": asdict(self.knobs),
            "catalog": self.catalog,
            "epoch_steps": self.epoch_steps,
            "steps": [[asdict(it) for it in step] for step in self.steps],
        }

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_json()).encode("utf-8")

    @property
    def sha256(self) -> str:
        return sha256_bytes(self.to_bytes())

    def step_tokens(self) -> list[int]:
        return [sum(it.tokens for it in step) for step in self.steps]


def item_rng(seed: int, epoch: int, key: str, repeat: int) -> random.Random:
    """A generator owned by one occurrence of one item: independent of order and of worker count."""
    digest = hashlib.sha256(f"{seed}/{epoch}/{key}/{repeat}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def text_tokens(caption: str, knobs: PlanKnobs) -> int:
    """The templated caption's tokens as budgeted: template + estimated caption, capped where the
    loader cuts the encoder's output (MAX_TEXT_TOKENS)."""
    estimate = knobs.template_tokens + math.ceil(len(caption.encode("utf-8")) / knobs.chars_per_token)
    return min(knobs.max_text_tokens, max(1, estimate))


def item_target(item: CatalogItem, knobs: PlanKnobs) -> tuple[int, int]:
    if knobs.buckets:
        bucket = nearest_bucket(item.width, item.height, knobs.buckets, knobs.no_upscale)
        if bucket is not None:
            return bucket
    return target_size(
        item.width,
        item.height,
        knobs.area,
        knobs.multiple,
        knobs.min_aspect,
        knobs.max_aspect,
        knobs.no_upscale,
    )


def plan_item(item: CatalogItem, seed: int, epoch: int, repeat: int, knobs: PlanKnobs) -> PlannedItem:
    """Caption choice, size, crop and flip of one occurrence (pure)."""
    rng = item_rng(seed, epoch, item.key, repeat)
    caption = item.captions[rng.randrange(len(item.captions))] if item.captions else ""
    target = item_target(item, knobs)
    resize = cover_size(item.width, item.height, target)
    u = (rng.random(), rng.random())
    crop = crop_offset(resize, target, knobs.crop, u)
    flip = rng.random() < knobs.flip_prob
    caption = augment_caption(
        caption, rng, knobs.caption_dropout, knobs.shuffle_caption, knobs.keep_tokens, knobs.caption_separator
    )
    image_tokens = (target[0] // knobs.patch_px) * (target[1] // knobs.patch_px)
    return PlannedItem(
        item.key,
        item.hash,
        caption,
        target,
        resize,
        crop,
        flip,
        image_tokens,
        text_tokens(caption, knobs),
        epoch,
    )


def epoch_order(items: list[CatalogItem], seed: int, epoch: int, shuffle: bool) -> list[tuple[int, int]]:
    """(item index, repeat index) for every occurrence in one epoch, seeded-shuffled."""
    order = [(i, r) for i, it in enumerate(items) for r in range(max(1, it.repeats))]
    if shuffle:
        random.Random(f"{seed}/{epoch}/shuffle").shuffle(order)
    return order


def build_plan(catalog: Catalog, seed: int, knobs: PlanKnobs) -> Plan:
    """Every step of every epoch; depends on nothing but its arguments."""
    knobs.validate()
    items = sorted(catalog.usable, key=lambda it: it.key)
    if not items:
        raise ConfigError(
            "DATASET", f"{catalog.source.get('path')}: no usable image ({catalog.report.summary()})"
        )
    steps: list[list[PlannedItem]] = []
    epoch_steps = []
    for epoch in range(knobs.epochs):
        planned = [
            plan_item(items[i], seed, epoch, r, knobs)
            for i, r in epoch_order(items, seed, epoch, knobs.shuffle)
        ]
        packed = pack_steps([p.tokens for p in planned], knobs.tokens_per_step, knobs.drop_last)
        steps.extend([planned[i] for i in step] for step in packed)
        epoch_steps.append(len(packed))
    return Plan(seed, knobs, catalog.fingerprint(), steps, epoch_steps)
