"""The plan: a pure function of (catalog, seed, knobs) giving every step's items, sizes, crops and flips.

An item with reference images (edit training) plans each reference too: resized to about its target's
area at the reference's own aspect (SimpleTuner's `reference_loose`; its sampler's rule: each side
scaled by sqrt(target area / reference area), rounded to the nearest `multiple` px), centre-cropped by
the rounding only, flipped with its target; its tokens count in the step budget. A text encoder that
shows the references in its prompt (`Picture N:` and the vision tower's tokens before the caption) adds
those tokens to the item's text: `PlanKnobs.reference_prompt_tokens` counts them from the references'
sizes (a pure function the trainer takes from its encoder; the data package knows no encoder).

Same inputs, same bytes: `Plan.sha256` is printed so two runs (or a resumed run) can be compared.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kohakumoss_common.errors import ConfigError
from kohakumoss_common.hashing import canonical_json, sha256_bytes

from .buckets import nearest_bucket
from .caption_aug import SEPARATOR, augment_caption
from .caption_format import check_caption, check_caption_format, format_caption, is_json_caption
from .catalog import Catalog
from .dataset_options import DatasetOptions
from .packing import pack_steps
from .records import CatalogItem
from .resolution import cover_size, crop_offset, target_size

PLAN_VERSION = 1

# the prompt tokens a text encoder adds for references of these (width, height), in order (0: none)
ReferencePromptTokens = Callable[[tuple[tuple[int, int], ...]], int]


@dataclass(frozen=True)
class PlanKnobs:
    area: int = 1024 * 1024
    multiple: int = 16
    min_aspect: float = 0.25
    max_aspect: float = 4.0
    no_upscale: bool = False
    crop: str = "center"  # center | random
    buckets: tuple[tuple[int, int], ...] | None = None
    tokens_per_step: int = 8192
    patch_px: int = 16  # one image token covers patch_px x patch_px pixels
    max_text_tokens: int = 256
    chars_per_token: float = 4.0  # caption length estimate; the plan must not need a tokenizer
    template_tokens: int = 0  # tokens the text template adds to every caption (the trainer counts them)
    flip_prob: float = 0.0
    caption_dropout: float = 0.0  # probability of training an occurrence with an empty caption
    shuffle_caption: bool = False  # kohya: shuffle comma-separated tags ...
    keep_tokens: int = 0  # ... keeping this many leading tags in place
    caption_separator: str = SEPARATOR
    tag_dropout: float = 0.0  # kohya: drop each tag after the kept ones with this probability
    caption_format: str = "plain"  # plain | auto-json | json (caption_format.py)
    datasets: tuple[DatasetOptions, ...] = ()  # per-dataset options, in the datasets' order (() : defaults)
    epochs: int = 1
    shuffle: bool = True
    drop_last: bool = False
    # references in the text prompt: their tokens (None: the prompt holds none); not written to the plan's
    # JSON, its items' text_tokens carry what it counted
    reference_prompt_tokens: ReferencePromptTokens | None = field(default=None, compare=False, repr=False)

    def validate(self) -> PlanKnobs:
        if self.crop not in ("center", "random"):
            raise ConfigError("crop", f"must be 'center' or 'random', got {self.crop!r}")
        if self.multiple % self.patch_px:
            raise ConfigError(
                "multiple", f"{self.multiple} is not a multiple of the patch size {self.patch_px}"
            )
        if not 0 < self.min_aspect <= 1 <= self.max_aspect:
            raise ConfigError("min_aspect/max_aspect", "need 0 < min_aspect <= 1 <= max_aspect")
        check_caption_format(self.caption_format)
        if not 0 <= self.tag_dropout <= 1:
            raise ConfigError("tag_dropout", f"must be a probability in [0, 1], got {self.tag_dropout}")
        if self.max_text_tokens < 1 or self.template_tokens < 0:
            raise ConfigError("max_text_tokens", "must be at least 1 (and the template's tokens >= 0)")
        if self.epochs < 1 or self.tokens_per_step < 1 or self.area < self.multiple**2:
            raise ConfigError("epochs/tokens_per_step/area", "must be positive (area at least one patch)")
        for bucket in self.buckets or ():
            if bucket[0] % self.multiple or bucket[1] % self.multiple:
                raise ConfigError("buckets", f"{bucket} is not a multiple of {self.multiple} px")
        return self


@dataclass(frozen=True)
class PlannedReference:
    """One reference image of a planned item: its content and exactly how its pixels are made (the
    item's `flip` applies to it too)."""

    hash: str
    target: tuple[int, int]
    resize: tuple[int, int]
    crop: tuple[int, int]
    tokens: int  # image tokens it adds to the sequence


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
    loss_weight: float = 1.0  # the dataset's (regularization images: their own weight)
    mask: str = ""  # "": none; "alpha": the image's alpha channel; else the mask file's path
    references: tuple[PlannedReference, ...] = ()  # edit training: the item's references, in order

    @property
    def reference_tokens(self) -> int:
        return sum(r.tokens for r in self.references)

    def to_json(self) -> dict[str, Any]:
        """Its fields; `references` only when it has some, so plans (and checkpoints' digests of them)
        made before references existed keep their bytes."""
        out = asdict(self)
        if not self.references:
            del out["references"]
        return out

    @property
    def tokens(self) -> int:
        return self.image_tokens + self.text_tokens + self.reference_tokens


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
            "knobs": {  # caption_format only when not plain: older plans keep their bytes
                k: v
                for k, v in asdict(dataclasses.replace(self.knobs, reference_prompt_tokens=None)).items()
                if (k, v) != ("caption_format", "plain") and k != "reference_prompt_tokens"
            },
            "catalog": self.catalog,
            "epoch_steps": self.epoch_steps,
            "steps": [[it.to_json() for it in step] for step in self.steps],
        }

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_json()).encode("utf-8")

    @property
    def sha256(self) -> str:
        return sha256_bytes(self.to_bytes())

    def step_tokens(self) -> list[int]:
        return [sum(it.tokens for it in step) for step in self.steps]

    def most_references(self) -> int:
        """The most reference images any planned item has (0: a text-to-image plan)."""
        return max((len(it.references) for step in self.steps for it in step), default=0)


def item_rng(seed: int, epoch: int, key: str, repeat: int) -> random.Random:
    """A generator owned by one occurrence of one item: independent of order and of worker count."""
    digest = hashlib.sha256(f"{seed}/{epoch}/{key}/{repeat}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def text_tokens(caption: str, knobs: PlanKnobs, reference_sizes: tuple[tuple[int, int], ...] = ()) -> int:
    """The templated prompt's tokens as budgeted: template + the references shown in it (when the knobs'
    `reference_prompt_tokens` counts them) + estimated caption, capped where the loader cuts the
    encoder's output (max_text_tokens)."""
    estimate = knobs.template_tokens + math.ceil(len(caption.encode("utf-8")) / knobs.chars_per_token)
    if reference_sizes and knobs.reference_prompt_tokens is not None:
        estimate += int(knobs.reference_prompt_tokens(reference_sizes))
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


def reference_size(width: int, height: int, area: int, multiple: int) -> tuple[int, int]:
    """SimpleTuner's rule for a reference: scaled by sqrt(area / its own area), each side rounded to the
    nearest multiple (at least one)."""
    scale = math.sqrt(area / (width * height))
    return tuple(max(multiple, round(side * scale / multiple) * multiple) for side in (width, height))  # type: ignore[return-value]


def plan_reference(ref: dict[str, Any], target: tuple[int, int], knobs: PlanKnobs) -> PlannedReference:
    """A reference at about `target`'s area at its own aspect: resized to cover that size, centre-cropped
    by the rounding only."""
    w, h = int(ref["width"]), int(ref["height"])
    size = reference_size(w, h, target[0] * target[1], knobs.multiple)
    resize = cover_size(w, h, size)
    tokens = (size[0] // knobs.patch_px) * (size[1] // knobs.patch_px)
    return PlannedReference(
        ref["hash"], size, resize, crop_offset(resize, size, "center", (0.0, 0.0)), tokens
    )


def reference_item(item: PlannedItem, ref: PlannedReference) -> PlannedItem:
    """A reference as a planned image of its own (what the loader's workers and the latent cache take)."""
    return dataclasses.replace(
        item,
        hash=ref.hash,
        caption="",
        target=ref.target,
        resize=ref.resize,
        crop=ref.crop,
        image_tokens=ref.tokens,
        text_tokens=0,
        mask="",
        references=(),
    )


def dataset_of(key: str, several: bool) -> tuple[int, str]:
    """(dataset index, key inside that dataset): several datasets prefix their keys with 'i/'."""
    if not several:
        return 0, key
    head, _, rest = key.partition("/")
    return int(head), rest


def item_where(catalog: Catalog, key: str, several: bool) -> str:
    """An item as an error names it: its dataset's path and its key there."""
    i, rel = dataset_of(key, several)
    source = catalog.source["sources"][i] if several else catalog.source
    return f"{source.get('path', '?')}: {rel}"


def options_for(key: str, knobs: PlanKnobs, several: bool) -> tuple[DatasetOptions, str]:
    i, rel = dataset_of(key, several)
    return (knobs.datasets[i] if i < len(knobs.datasets) else DatasetOptions()), rel


def mask_ref(options: DatasetOptions, rel: str) -> str:
    """'' , 'alpha' or the mask file of an item: the mask folder mirrors the dataset's relative names."""
    if options.mask in ("", "alpha"):
        return options.mask
    return str(Path(options.mask) / Path(rel).with_suffix(".png"))


def plan_item(
    item: CatalogItem,
    seed: int,
    epoch: int,
    repeat: int,
    knobs: PlanKnobs,
    options: DatasetOptions | None = None,
    rel: str | None = None,
) -> PlannedItem:
    """Caption choice, size, crop and flip of one occurrence (pure); `options` are its dataset's."""
    options = options or DatasetOptions()
    rng = item_rng(seed, epoch, item.key, repeat)
    caption = item.captions[rng.randrange(len(item.captions))] if item.captions else ""
    target = item_target(item, knobs)
    resize = cover_size(item.width, item.height, target)
    u = (rng.random(), rng.random())
    crop = crop_offset(resize, target, knobs.crop, u)
    flip = rng.random() < knobs.flip_prob

    def pick(name: str):
        value = getattr(options, name)
        return getattr(knobs, name) if value is None else value

    layout = knobs.caption_format != "plain" and is_json_caption(caption)  # JSON has no tags to shuffle
    caption = augment_caption(
        caption,
        rng,
        pick("caption_dropout"),
        pick("shuffle_caption") and not layout,
        pick("keep_tokens"),
        pick("caption_separator"),
        0.0 if layout else pick("tag_dropout"),
    )
    caption = format_caption(caption, knobs.caption_format)
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
        text_tokens(caption, knobs, tuple((int(r["width"]), int(r["height"])) for r in item.references)),
        epoch,
        float(options.loss_weight),
        mask_ref(options, item.key if rel is None else rel),
        tuple(plan_reference(ref, target, knobs) for ref in item.references),
    )


def epoch_order(
    items: list[CatalogItem],
    seed: int,
    epoch: int,
    shuffle: bool,
    repeats: list[int] | None = None,
    reg: list[bool] | None = None,
) -> list[tuple[int, int]]:
    """(item index, repeat index) for every occurrence in one epoch, seeded-shuffled.

    Regularization items (`reg`) take as many places per epoch as the other occurrences (kohya's
    balance): their occurrences are shuffled per epoch and cycled or cut to that count."""
    repeats = repeats or [max(1, it.repeats) for it in items]
    reg = reg or [False] * len(items)
    order = [(i, r) for i in range(len(items)) if not reg[i] for r in range(repeats[i])]
    prior = [(i, r) for i in range(len(items)) if reg[i] for r in range(repeats[i])]
    if prior and order:
        random.Random(f"{seed}/{epoch}/reg").shuffle(prior)
        n = len(prior)  # a cycled occurrence gets a fresh repeat index: its own crop and caption draw
        order += [
            (prior[j % n][0], prior[j % n][1] + (j // n) * repeats[prior[j % n][0]])
            for j in range(len(order))
        ]
    else:
        order += prior
    if shuffle:
        random.Random(f"{seed}/{epoch}/shuffle").shuffle(order)
    return order


def build_plan(catalog: Catalog, seed: int, knobs: PlanKnobs) -> Plan:
    """Every step of every epoch; depends on nothing but its arguments."""
    knobs.validate()
    items = sorted(catalog.usable, key=lambda it: it.key)
    if not items:
        raise ConfigError(
            "dataset", f"{catalog.source.get('path')}: no usable image ({catalog.report.summary()})"
        )
    several = catalog.source.get("kind") == "concat"
    if knobs.caption_format != "plain":  # a caption the format cannot train is named before any work
        for it in items:
            for caption in it.captions:
                check_caption(caption, knobs.caption_format, item_where(catalog, it.key, several))
    scoped = [options_for(it.key, knobs, several) for it in items]
    repeats = [max(1, it.repeats) * opts.repeats for it, (opts, _) in zip(items, scoped)]
    reg = [opts.reg for opts, _ in scoped]
    steps: list[list[PlannedItem]] = []
    epoch_steps = []
    for epoch in range(knobs.epochs):
        planned = [
            plan_item(items[i], seed, epoch, r, knobs, *scoped[i])
            for i, r in epoch_order(items, seed, epoch, knobs.shuffle, repeats, reg)
        ]
        packed = pack_steps([p.tokens for p in planned], knobs.tokens_per_step, knobs.drop_last)
        steps.extend([planned[i] for i in step] for step in packed)
        epoch_steps.append(len(packed))
    return Plan(seed, knobs, catalog.fingerprint(), steps, epoch_steps)
