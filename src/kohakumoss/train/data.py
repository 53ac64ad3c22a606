"""The run's data: catalog, a held-out validation subset, the plan for all micro-steps, and loaders."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kohakumoss.data_knobs import knob_errors, loader_knobs, plan_knobs, scan_knobs
from kohakumoss_common.errors import ConfigError, DataError
from kohakumoss_common.hashing import sha256_json
from kohakumoss_common.log import get_logger
from kohakumoss_data import Catalog, Loader, Plan, build_plan, open_caches
from kohakumoss_data.catalog import scan
from kohakumoss_data.sources import make_source

log = get_logger(__name__)


@dataclass
class RunData:
    source: Any
    catalog: Catalog  # training items only
    val_catalog: Catalog | None
    plan: Plan
    val_plan: Plan | None
    latent_cache: Any
    text_cache: Any


def split_validation(catalog: Catalog, n: int, seed: int) -> tuple[Catalog, Catalog | None]:
    """Hold out `n` usable items, chosen by a seeded hash of their keys (stable as the dataset grows)."""
    if n == 0:
        return catalog, None
    usable = catalog.usable
    if n >= len(usable):
        raise ConfigError("VAL_ITEMS", f"{n} held out of {len(usable)} usable items leaves none to train on")
    held = {it.key for it in sorted(usable, key=lambda it: sha256_json([seed, it.key]))[:n]}
    train = dataclasses.replace(catalog, items=[it for it in catalog.items if it.key not in held])
    val = dataclasses.replace(catalog, items=[it for it in catalog.items if it.key in held])
    return train, val


def template_token_count(text_encoder: Any) -> int:
    """Tokens the encoder's prompt template adds to a caption (the template alone, as an empty caption
    encodes); 0 for encoders without a tokenizer (synthetic) or none."""
    prompts = getattr(text_encoder, "prompts", None)
    if prompts is None:  # CacheOnly wraps the placed encoder
        prompts = getattr(getattr(text_encoder, "encoder", None), "prompts", None)
    if prompts is None:
        return 0
    return len(prompts(""))


def plan_for_steps(catalog: Catalog, k: dict[str, Any], micro_steps: int, template_tokens: int = 0) -> Plan:
    """A plan with enough epochs for `micro_steps` steps (the epoch count is derived, so still pure)."""
    knobs = dataclasses.replace(plan_knobs(k), epochs=1, template_tokens=template_tokens)
    one = build_plan(catalog, int(k["SEED"]), knobs)
    per_epoch = len(one.steps)
    if per_epoch == 0:
        raise DataError("the plan has no steps: no usable items (see the scan report above)")
    epochs = math.ceil(micro_steps / per_epoch)
    plan = (
        one if epochs == 1 else build_plan(catalog, int(k["SEED"]), dataclasses.replace(knobs, epochs=epochs))
    )
    log.info(
        f"plan: {per_epoch} steps per epoch, {epochs} epoch(s) for {micro_steps} micro-steps; sha256 {plan.sha256}"
    )
    return plan


def plan_prefix_sha256(plan: Plan, micro_steps: int) -> str:
    """Digest of the first `micro_steps` steps: what a checkpoint has seen, whatever the plan's length."""
    return sha256_json([[dataclasses.asdict(it) for it in step] for step in plan.steps[:micro_steps]])


def check_data_position(plan: Plan, position: dict[str, Any], checkpoint: Any, replan: bool) -> None:
    """A checkpoint must have seen this plan's first steps; with RESUME_REPLAN the run goes on along the
    plan of today's data from the checkpoint's micro-step (the knobs were compared already, so only the
    data changed: files vanished, were added or edited)."""
    seen, micro = position.get("seen_sha256"), int(position.get("micro_step", 0))
    if seen is None or seen == plan_prefix_sha256(plan, micro):
        return
    if not replan:
        raise ConfigError(
            "RESUME",
            f"{checkpoint} saw other batches than this plan's first ones: the data changed since "
            f"(files removed, added or edited; SEED and the data knobs were compared). To continue on the "
            f"plan of the data as it is now from micro-step {micro}, set RESUME_REPLAN=True; or start "
            "fresh under another RUN_NAME",
        )
    log.warning(
        f"RESUME_REPLAN: {checkpoint} saw another plan's first {micro} micro-steps (the data changed); "
        f"continuing along the new plan (sha256 {plan.sha256[:16]}) from micro-step {micro}"
    )


def validation_plan(catalog: Catalog, k: dict[str, Any], template_tokens: int = 0) -> Plan:
    """One pass over the held-out items, center crops, no flip, no caption dropout."""
    knobs = dataclasses.replace(
        plan_knobs(k),
        template_tokens=template_tokens,
        epochs=1,
        crop="center",
        flip_prob=0.0,
        caption_dropout=0.0,
        shuffle_caption=False,
        shuffle=False,
    )
    return build_plan(catalog, int(k["SEED"]), knobs)


def open_run_data(k: dict[str, Any], image_encoder, text_encoder) -> RunData:
    with knob_errors():  # the data package names its settings' fields: the user set knobs
        return _open_run_data(k, image_encoder, text_encoder)


def _open_run_data(k: dict[str, Any], image_encoder, text_encoder) -> RunData:
    source = make_source(k["DATASET"])
    catalog = scan(source, scan_knobs(k), cache_dir=k["CATALOG_DIR"])
    log.info(catalog.report.summary())
    train_catalog, val_catalog = split_validation(catalog, int(k["VAL_ITEMS"]), int(k["SEED"]))
    template = template_token_count(text_encoder)
    plan = plan_for_steps(train_catalog, k, int(k["STEPS"]) * int(k["GRAD_ACCUM"]), template)
    val_plan = validation_plan(val_catalog, k, template) if val_catalog is not None else None
    cache_dir = k["CACHE_DIR"] or None
    latent_cache, text_cache = open_caches(cache_dir, image_encoder, text_encoder)
    return RunData(source, train_catalog, val_catalog, plan, val_plan, latent_cache, text_cache)


def make_loader(data: RunData, k: dict[str, Any], image_encoder, text_encoder, start_step: int) -> Loader:
    knobs = loader_knobs(k)
    if k["VAE_ENCODE"] == "online" and k["TEXT_ENCODE"] == "online":
        knobs = dataclasses.replace(knobs, write_back=False)
    latent_cache = None if k["VAE_ENCODE"] == "online" else data.latent_cache
    text_cache = None if k["TEXT_ENCODE"] == "online" else data.text_cache
    return Loader(
        data.plan,
        data.catalog,
        data.source,
        image_encoder,
        text_encoder,
        latent_cache,
        text_cache,
        knobs,
        start_step,
    )


def validation_batches(data: RunData, k: dict[str, Any], image_encoder, text_encoder) -> list:
    if data.val_plan is None:
        return []
    knobs = dataclasses.replace(loader_knobs(k), workers=0)
    loader = Loader(
        data.val_plan,
        data.val_catalog,
        data.source,
        image_encoder,
        text_encoder,
        data.latent_cache,
        data.text_cache,
        knobs,
    )
    return list(loader)
