"""The run's data: catalog, a held-out validation subset, the plan for all micro-steps, and loaders.

The data package's settings come from the flat knobs through kohakumoss/data_knobs.py (the one conversion,
which also names a data error's knob); the rest is read from the typed config."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

from kohakumoss.config.train import TrainConfig
from kohakumoss.data_knobs import knob_errors, loader_knobs, plan_knobs, scan_knobs
from kohakumoss.encoders.text_cap import cut_captions, report_cut_captions
from kohakumoss_common.errors import ConfigError, DataError
from kohakumoss_common.hashing import sha256_json
from kohakumoss_common.log import get_logger
from kohakumoss_data import Catalog, Loader, Plan, build_plan, open_caches
from kohakumoss_data.cache_keys import item_latent_keys
from kohakumoss_data.catalog import scan
from kohakumoss_data.encode import prompt_text_key
from kohakumoss_data.offline import captions_by_item, fill_latent_cache, fill_text_cache, planned_prompts
from kohakumoss_data.plan import ReferencePromptTokens, item_where
from kohakumoss_data.sources import make_source

from .epochs import resolve_epochs, steps_per_epoch

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
    steps_per_epoch: int  # optimizer steps of one epoch (EPOCHS and *_EVERY_EPOCHS count in them)


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


def prompt_tokenizer(text_encoder: Any) -> Any:
    """The encoder's PromptTokenizer (None: an encoder without a tokenizer, synthetic, or none)."""
    prompts = getattr(text_encoder, "prompts", None)
    if prompts is None:  # CacheOnly wraps the placed encoder
        prompts = getattr(getattr(text_encoder, "encoder", None), "prompts", None)
    return prompts


def template_token_count(text_encoder: Any) -> int:
    """Tokens the encoder's prompt template adds to a caption (the template alone, as an empty caption
    encodes); 0 for encoders without a tokenizer (synthetic) or none."""
    prompts = prompt_tokenizer(text_encoder)
    return 0 if prompts is None else len(prompts(""))


def reference_prompt_counter(text_encoder: Any) -> ReferencePromptTokens | None:
    """What the plan counts for references shown in the prompt (REFERENCES_IN_PROMPT='picture': the
    `Picture N:` labels and the vision tokens of references of given sizes), from the encoder that will
    show them; None when the prompt shows none (a text-to-image plan is then unchanged)."""
    inner = getattr(text_encoder, "encoder", text_encoder)  # CacheOnly wraps the placed encoder
    count = getattr(inner, "reference_prompt_tokens", None)
    if count is None or not getattr(inner, "references_in_prompt", False):
        return None
    return functools.lru_cache(maxsize=4096)(count)  # a dataset repeats few reference sizes


def check_caption_cuts(text_encoder: Any, plans: list[tuple[Plan, Catalog]], cfg: TrainConfig) -> None:
    """Name each planned caption whose templated prompt is over MAX_TEXT_TOKENS (`encoders/text_cap.py`):
    a warning, or an error with a layout-JSON CAPTION_FORMAT."""
    prompts = prompt_tokenizer(text_encoder)
    if prompts is None:
        return
    cap = min(int(prompts.max_length), int(cfg.data.max_text_tokens))
    pairs = (pair for plan, catalog in plans for pair in captions_by_item(plan, catalog))
    report_cut_captions(cut_captions(prompts, pairs, cap), "MAX_TEXT_TOKENS", cfg.data.caption_format)


def check_reference_prompts(text_encoder: Any, plans: list[tuple[Plan, Catalog]], cfg: TrainConfig) -> None:
    """An edit run whose text encoder puts references in the prompt: an item whose references' vision
    tokens reach past MAX_TEXT_TOKENS is refused by name before the first step (the encoder would stop
    there; sizes from the catalog, no image read)."""
    inner = getattr(text_encoder, "encoder", text_encoder)  # CacheOnly wraps the placed encoder
    span = getattr(inner, "reference_span", None)
    if span is None or not getattr(inner, "references_in_prompt", False):
        return
    cap = min(int(prompt_tokenizer(text_encoder).max_length), int(cfg.data.max_text_tokens))
    over: dict[str, int] = {}
    for plan, catalog in plans:
        sizes = {
            it.key: [(int(r["width"]), int(r["height"])) for r in it.references] for it in catalog.usable
        }
        several = catalog.source.get("kind") == "concat"
        for key in dict.fromkeys(it.key for step in plan.steps for it in step):
            if sizes.get(key) and (need := span(sizes[key])) > cap:
                over[item_where(catalog, key, several)] = need
    if over:
        shown = "; ".join(f"{where} needs {n}" for where, n in list(over.items())[:5])
        raise ConfigError(
            "MAX_TEXT_TOKENS",
            f"{len(over)} item(s) whose reference images take more prompt tokens than the {cap} kept "
            f"(REFERENCES_IN_PROMPT='picture': `Picture N:` and up to ~150 vision tokens each): {shown}; "
            "raise MAX_TEXT_TOKENS, or set REFERENCES_IN_PROMPT='none'",
        )


def run_plan_knobs(cfg: TrainConfig):
    """The plan's settings from the training knobs (the trainer's EPOCHS counts whole runs: STEPS, not the plan)."""
    return plan_knobs(cfg.data, cfg.data.dataset, epochs=1)


def one_epoch_plan(
    catalog: Catalog,
    cfg: TrainConfig,
    template_tokens: int = 0,
    reference_tokens: ReferencePromptTokens | None = None,
) -> Plan:
    """The plan's first epoch (every longer plan starts with it: epochs are planned one by one);
    `template_tokens` and `reference_tokens` count what the text encoder adds to each caption."""
    knobs = dataclasses.replace(
        run_plan_knobs(cfg),
        epochs=1,
        template_tokens=template_tokens,
        reference_prompt_tokens=reference_tokens,
    )
    one = build_plan(catalog, cfg.run.seed, knobs)
    if not one.steps:
        raise DataError("the plan has no steps: no usable items (see the scan report above)")
    return one


def plan_for_steps(
    catalog: Catalog,
    cfg: TrainConfig,
    micro_steps: int,
    template_tokens: int = 0,
    one: Plan | None = None,
    reference_tokens: ReferencePromptTokens | None = None,
) -> Plan:
    """A plan with enough epochs for `micro_steps` steps (the epoch count is derived, so still pure)."""
    one = one or one_epoch_plan(catalog, cfg, template_tokens, reference_tokens)
    knobs, per_epoch = one.knobs, len(one.steps)
    epochs = math.ceil(micro_steps / per_epoch)
    plan = (
        one if epochs == 1 else build_plan(catalog, cfg.run.seed, dataclasses.replace(knobs, epochs=epochs))
    )
    while len(plan.steps) < micro_steps:  # later epochs may pack their shuffle into fewer steps
        epochs += 1
        plan = build_plan(catalog, cfg.run.seed, dataclasses.replace(knobs, epochs=epochs))
    log.info(
        f"plan: {per_epoch} steps per epoch, {epochs} epoch(s) for {micro_steps} micro-steps; sha256 {plan.sha256}"
    )
    return plan


def plan_prefix_sha256(plan: Plan, micro_steps: int) -> str:
    """Digest of the first `micro_steps` steps: what a checkpoint has seen, whatever the plan's length."""
    return sha256_json([[it.to_json() for it in step] for step in plan.steps[:micro_steps]])


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


def validation_plan(
    catalog: Catalog,
    cfg: TrainConfig,
    template_tokens: int = 0,
    reference_tokens: ReferencePromptTokens | None = None,
) -> Plan:
    """One pass over the held-out items, center crops, no flip, no caption dropout."""
    knobs = dataclasses.replace(
        run_plan_knobs(cfg),
        template_tokens=template_tokens,
        reference_prompt_tokens=reference_tokens,
        epochs=1,
        crop="center",
        flip_prob=0.0,
        caption_dropout=0.0,
        shuffle_caption=False,
        shuffle=False,
    )
    return build_plan(catalog, cfg.run.seed, knobs)


def scan_dataset(cfg: TrainConfig) -> tuple[Any, Catalog]:
    """The dataset's source and catalog, before any model loads: a dataset with nothing usable (every file
    a named drop: compressed shards, unreadable folders) is refused here, not after minutes of loading."""
    with knob_errors():  # the data package names its settings' fields: the user set knobs
        source = make_source(cfg.data.dataset)
        catalog = scan(source, scan_knobs(cfg.data), cache_dir=cfg.data.catalog_dir)
    log.info(catalog.report.summary())
    if not catalog.usable:
        raise DataError(f"{source.path}: no usable item in the dataset ({catalog.report.summary()})")
    return source, catalog


def open_run_data(cfg: TrainConfig, image_encoder, text_encoder, scanned: tuple | None = None) -> RunData:
    """The run's data from `scanned` (`scan_dataset`'s source and catalog; scanned here when None)."""
    source, catalog = scanned or scan_dataset(cfg)
    with knob_errors():  # the data package names its settings' fields: the user set knobs
        return _open_run_data(cfg, image_encoder, text_encoder, source, catalog)


def _open_run_data(cfg: TrainConfig, image_encoder, text_encoder, source: Any, catalog: Catalog) -> RunData:
    data, seed = cfg.data, cfg.run.seed
    train_catalog, val_catalog = split_validation(catalog, int(data.val_items), seed)
    template, shown = template_token_count(text_encoder), reference_prompt_counter(text_encoder)
    one = one_epoch_plan(train_catalog, cfg, template, shown)
    epoch_steps = steps_per_epoch(len(one.steps), int(cfg.optim.grad_accum))
    cfg = resolve_epochs(cfg, epoch_steps)  # EPOCHS: the plan is built for the steps they stand for
    micro = int(cfg.optim.steps) * int(cfg.optim.grad_accum)
    plan = plan_for_steps(train_catalog, cfg, micro, template, one=one)
    val_plan = validation_plan(val_catalog, cfg, template, shown) if val_catalog is not None else None
    # one epoch holds every item's captions (later epochs draw the same ones, shuffled or dropped)
    planned = [(one, train_catalog), *([(val_plan, val_catalog)] if val_plan else [])]
    check_caption_cuts(text_encoder, planned, cfg)
    check_reference_prompts(text_encoder, planned, cfg)
    cache_dir = data.cache_dir or None
    latent_cache, text_cache = open_caches(cache_dir, image_encoder, text_encoder)
    return RunData(source, train_catalog, val_catalog, plan, val_plan, latent_cache, text_cache, epoch_steps)


def fill_caches_first(data: RunData, cfg: TrainConfig, vae, text_encoder, fill: bool = True) -> bool:
    """VAE_ENCODE / TEXT_ENCODE 'auto': the cache entries the plans miss are encoded before the first step
    (the encoder on the device for this pass only when it is placed 'off'), so the training steps read
    caches and no loader thread encodes beside them (which slowed host-bound steps 2-3x on the CPU while
    it ran). An encoder placed 'off' cannot encode in the loader at all. With `fill` False (a rank other
    than 0) the caches are only re-read, after rank 0 filled them. Returns whether any cache was filled."""
    plans = [(data.plan, data.catalog)] + ([(data.val_plan, data.val_catalog)] if data.val_plan else [])
    filled = False
    for encoder, cache, encode, knob in (
        (vae, data.latent_cache, cfg.data.vae_encode, "VAE_ENCODE"),
        (text_encoder, data.text_cache, cfg.data.text_encode, "TEXT_ENCODE"),
    ):
        if encoder is not None and encode == "cache":
            check_cached(data, encoder, cache, knob, int(cfg.optim.steps) * int(cfg.optim.grad_accum))
        if encoder is None or encode != "auto":
            continue  # 'online' encodes every step; 'cache' must hit as it is
        off = getattr(encoder, "placement", None) == "off"
        if cache is None:
            if off:
                raise ConfigError(
                    "CACHE_DIR", f"empty, but {encoder.knob}='off' needs a cache to read from ({knob})"
                )
            continue  # no cache: the loader encodes every step
        filled = True
        if not fill:
            cache.refresh()
            continue
        with encoder.on_device():
            for plan, catalog in plans:
                if encoder.kind == "vae":
                    report = fill_latent_cache(plan, catalog, data.source, encoder, cache, cfg.data.workers)
                else:
                    captions, references = planned_prompts(plan, catalog, data.source)
                    report = fill_text_cache(captions, encoder, cache, references=references)
                log.info(f"{knob}='auto': cache filled before the first step: {report.summary(encoder.kind)}")
    return filled


CACHE_SCRIPTS = {"VAE_ENCODE": "scripts/data/cache_latents.py", "TEXT_ENCODE": "scripts/data/cache_text.py"}


def check_cached(data: RunData, encoder, cache, knob: str, micro_steps: int) -> None:
    """VAE_ENCODE / TEXT_ENCODE 'cache': every entry the run's micro-steps (and validation) read is in the
    cache, checked before the first step: a miss stops the run here, not in a later epoch."""
    steps = data.plan.steps[:micro_steps] + (data.val_plan.steps if data.val_plan else [])
    items = [it for step in steps for it in step]
    if knob == "VAE_ENCODE":
        keys = (k for it in items for k in item_latent_keys(it, encoder.identity))  # references too
        kind, wanted = "latent", dict.fromkeys(keys)
    else:
        keys = (prompt_text_key(it.caption, encoder, [r.hash for r in it.references]) for it in items)
        kind, wanted = "text", dict.fromkeys(keys)
    missing = [k for k in wanted if cache is None or k not in cache]
    if missing:
        where = f"the cache in {cache.dir}" if cache is not None else "no cache (CACHE_DIR is empty)"
        raise DataError(
            f"{knob}='cache' but {len(missing)} of the {len(wanted)} {kind} entries this run reads are "
            f"not in {where}: run {CACHE_SCRIPTS[knob]} with this run's data config first (`kohakumoss-config "
            f"new data --train CONFIG` writes it from the training config), or set {knob}='auto'"
        )


def make_loader(data: RunData, cfg: TrainConfig, image_encoder, text_encoder, start_step: int) -> Loader:
    knobs = loader_knobs(cfg.data)
    vae_online, text_online = cfg.data.vae_encode == "online", cfg.data.text_encode == "online"
    if vae_online and text_online:
        knobs = dataclasses.replace(knobs, write_back=False)
    latent_cache = None if vae_online else data.latent_cache
    text_cache = None if text_online else data.text_cache
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


def validation_batches(data: RunData, cfg: TrainConfig, image_encoder, text_encoder) -> list:
    if data.val_plan is None:
        return []
    knobs = dataclasses.replace(loader_knobs(cfg.data), workers=0)
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
