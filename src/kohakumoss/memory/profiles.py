"""How MEMORY_PROFILE becomes a plan (the named profiles are in named.py).

MEMORY_PROFILE is 'auto' (the cheapest catalog entry whose predicted peak fits the card; 'speed' without
a GPU), one of the profile names, or a catalog id ('c0042'). The per-engine knobs (CHECKPOINTING,
STREAM_BLOCKS, ...) set in a config then override single fields (for 'auto' they pin them before the
choice, so the choice respects them).

When 'auto' finds nothing that fits, the run is refused before anything loads, and the refusal lists the
changes (caching the text, fewer tokens per step, an 8-bit base, a smaller rank, dropping the pins, ...)
with which the estimate finds an entry that fits. A profile or entry named explicitly is taken as asked,
with a warning when its predicted peak is above the card.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from kohakumoss_common.errors import ConfigError
from kohakumoss_common.log import get_logger
from kohakumoss_common.typed_config import with_knobs

from . import calibration as cal
from .catalog import (
    CATALOG_SIZE,
    CatalogEntry,
    card_budget,
    catalog,
    entry_id,
    fastest_fit,
    find_entry,
    plan_refusal,
)
from .estimate import estimate_plan, references_per_target
from .named import PROFILES
from .plan import MemoryPlan, memory_pins, plan_with_overrides

log = get_logger(__name__)

PROFILE_CHOICES = ("auto", *PROFILES)
ENTRY_ID = re.compile(r"c\d{4}")


def profile_problem(value: Any) -> str | None:
    """Why `value` is not a MEMORY_PROFILE, or None."""
    if not isinstance(value, str):
        return f"expected str, got {type(value).__name__} {value!r}"
    if value in PROFILE_CHOICES:
        return None
    if ENTRY_ID.fullmatch(value):
        if int(value[1:]) < CATALOG_SIZE:
            return None
        return f"no catalog entry {value!r}: ids run c0000 ... {entry_id(CATALOG_SIZE - 1)}"
    return f"{value!r} is not one of {list(PROFILE_CHOICES)} or a catalog id like 'c0042'"


def card_memory_gb(card_gb: float | None, device: Any = None) -> float | None:
    """CARD_GB's `card_gb` when set (> 0), else the memory of `device` (default: the first GPU); None on a CPU."""
    if float(card_gb or 0) > 0:
        return float(card_gb)
    from kohakumoss_common.device import device_info

    info = device_info(device)
    if info.kind == "cpu" or not info.total_memory:
        return None
    return info.total_memory / cal.GIB


def rank_share(cfg: Any, world: int) -> tuple[Any, int]:
    """(the run's config as one rank of a data-parallel run (DISTRIBUTED 'ddp' or 'fsdp') sees its step,
    the FSDP2 shards). The rank holds a share of TOKENS_PER_STEP (the whole step's budget): the share
    bounds what `distributed.shard.assign` gives any rank: list scheduling keeps each rank within the mean
    plus (1 - 1/world) of the largest sample (`largest_sample`). Under FSDP the
    weights, grads and states are sharded over the `world` ranks: the estimate prices the shards
    (`shards`), and the catalog offers only the plans FSDP2 runs (MemoryPlan.fsdp_refusal). Other engines
    and one rank: the config unchanged, one shard."""
    mode = cfg.parallel.distributed
    if world <= 1 or mode not in ("ddp", "fsdp"):
        return cfg, 1
    return with_knobs(cfg, {"TOKENS_PER_STEP": rank_tokens(cfg, world)}), (world if mode == "fsdp" else 1)


def largest_sample(cfg: Any) -> int:
    """Tokens of the largest sample a step can hold, as `assign` weighs it (a planned item's `tokens`):
    AREA's image tokens, MAX_TEXT_TOKENS, and the references the estimate prices, each at the target's
    area (`estimate.references_per_target`)."""
    image = int(cfg.data.area) // 256
    return image * (1 + references_per_target(cfg)) + int(cfg.data.max_text_tokens)


def rank_tokens(cfg: Any, world: int) -> int:
    """The most tokens of a step one of `world` data-parallel ranks holds (see rank_share); the
    whole TOKENS_PER_STEP on one rank."""
    tokens = int(cfg.data.tokens_per_step)
    return min(tokens, math.ceil(tokens / world + largest_sample(cfg) * (1 - 1 / world)))


def _with_algo(cfg: Any, full_ft: bool) -> Any:
    algo = cfg.adapter.algo
    if full_ft != (algo == "full"):
        return with_knobs(cfg, {"ALGO": "full" if full_ft else "lora"})
    return cfg


def _set_knobs(cfg: Any) -> str:
    pins = [f"{k}={v!r}" for k, v in memory_pins(cfg.memory).items()]
    return f"; set by knobs: {', '.join(pins)}" if pins else ""


def _check_encoders(plan: MemoryPlan, cfg: Any) -> None:
    for field, knob, encode in (
        ("text_encoder", "TEXT_ENCODER_PLACEMENT", "TEXT_ENCODE"),
        ("vae", "VAE_PLACEMENT", "VAE_ENCODE"),
    ):
        if getattr(plan, field) == "off" and getattr(cfg.data, encode.lower()) == "online":
            raise ConfigError(
                knob,
                f"'off' (from the plan) needs the cache: {encode} is 'online' (set it to 'auto' or 'cache')",
            )


# A knob change the refusal tries: (what to tell the user, the knobs it sets: `with_knobs`).
Change = tuple[str, dict[str, Any]]
MIN_TOKENS = 256  # fewer tokens per step than this is no training step worth suggesting


def _halvings(value: int, floor: int) -> list[int]:
    out = []
    while value // 2 >= floor:
        value //= 2
        out.append(value)
    return out


def _base_precision_ok(cfg: Any) -> bool:
    from kohakumoss.adapters.algos import base_precision_check

    return base_precision_check(cfg.adapter, "fp8") is None


CACHE_TEXT = "TEXT_ENCODE='cache' (encode the captions first: scripts/data/cache_text.py)"
CACHE_LATENTS = "VAE_ENCODE='cache' (encode the images first: scripts/data/cache_latents.py)"
QUANT_TEXT = "TEXT_ENCODER_QUANT='fp8' (sm89+; 'int8_weight' elsewhere)"
QUANT_BASE = "BASE_PRECISION='fp8' (sm89+; 'int8' on sm80, 'fp8_weight' / 'int8_weight' elsewhere)"


def fit_changes(cfg: Any, text_encoder_bytes: int, vae_bytes: int) -> list[list[Change]]:
    """The knob changes the refusal tries, grouped: each group is one way out, its changes from the
    mildest on (the refusal reports the mildest of a group that fits)."""
    groups: list[list[Change]] = []
    if text_encoder_bytes and cfg.data.text_encode != "cache":
        groups.append([(CACHE_TEXT, {"TEXT_ENCODE": "cache"})])
        if cfg.encoders.text_encoder_quant in ("none", None):
            groups.append([(QUANT_TEXT, {"TEXT_ENCODER_QUANT": "fp8"})])
    if vae_bytes and cfg.data.vae_encode != "cache":
        groups.append([(CACHE_LATENTS, {"VAE_ENCODE": "cache"})])
    tokens = int(cfg.data.tokens_per_step)
    groups.append([(f"TOKENS_PER_STEP={t}", {"TOKENS_PER_STEP": t}) for t in _halvings(tokens, MIN_TOKENS)])
    full = cfg.adapter.algo == "full"
    if not full and cfg.device.base_precision == "same" and _base_precision_ok(cfg):
        groups.append([(QUANT_BASE, {"BASE_PRECISION": "fp8"})])
    if not full:
        groups.append([(f"RANK={r}", {"RANK": r}) for r in _halvings(int(cfg.adapter.rank), 1)])
    if cfg.optim.ema:
        groups.append([("EMA=False", {"EMA": False})])
    if pins := list(memory_pins(cfg.memory)):
        label = f"another profile: unset {', '.join(pins)} (let 'auto' pick every engine)"
        groups.append([(label, dict.fromkeys(pins))])
    return [g for g in groups if g]


def first_fit(
    cfg: Any,
    groups: list[list[Change]],
    fit: Callable[[Any], CatalogEntry | None],
) -> list[tuple[str, CatalogEntry]]:
    """Per group, the mildest change to `cfg` with which `fit` finds an entry (and that entry)."""
    out = []
    for group in groups:
        for label, change in group:
            if (entry := fit(with_knobs(cfg, change))) is not None:
                out.append((label, entry))
                break
    return out


def fit_together(
    cfg: Any,
    groups: list[list[Change]],
    fit: Callable[[Any], CatalogEntry | None],
) -> tuple[list[str], CatalogEntry] | None:
    """A combination of changes (at most one per group) with which `fit` finds an entry: from the strongest
    of every group, each group in turn left out or made as mild as the fit allows; None when even the
    strongest of all does not fit."""
    chosen: list[int | None] = [len(g) - 1 for g in groups]

    def applied(picks: list[int | None]) -> Any:
        changes: dict[str, Any] = {}
        for group, pick in zip(groups, picks, strict=True):
            if pick is not None:
                changes.update(group[pick][1])
        return with_knobs(cfg, changes)

    if not groups or (entry := fit(applied(chosen))) is None:
        return None
    for i, group in enumerate(groups):
        for pick in [None, *range(len(group) - 1)]:
            trial = [*chosen[:i], pick, *chosen[i + 1 :]]
            if (found := fit(applied(trial))) is not None:
                chosen, entry = trial, found
                break
    labels = [group[pick][0] for group, pick in zip(groups, chosen, strict=True) if pick is not None]
    return labels, entry


def _gib(b: float) -> str:
    return f"{b / cal.GIB:.1f} GiB"


def nothing_fits(
    cfg: Any,
    entries: list[CatalogEntry],
    card_gb: float,
    fit: Callable[[Any], CatalogEntry | None],
    text_encoder_bytes: int,
    vae_bytes: int,
) -> ConfigError:
    """The refusal when 'auto' finds no entry for the card: the smallest prediction, and what would fit."""
    small = min(entries, key=lambda e: (e.peak, e.cost, e.id))
    budget = card_budget(card_gb * cal.GIB)
    head = (
        f"'auto' found no memory plan that fits the card ({card_gb:g} GiB: {_gib(budget)} for the step after "
        f"the CUDA context and a {cal.CARD_MARGIN:.0%} margin); the smallest predicted peak is catalog entry "
        f"{small.id} at {_gib(small.peak)}{_set_knobs(cfg)}"
    )
    groups = fit_changes(cfg, text_encoder_bytes, vae_bytes)
    if found := first_fit(cfg, groups, fit):
        ways = "; ".join(f"{label} -> {e.id} at {_gib(e.peak)}" for label, e in found)
        return ConfigError("MEMORY_PROFILE", f"{head}. Changes with which the estimate finds a fit: {ways}")
    if (combined := fit_together(cfg, groups, fit)) is not None:
        labels, entry = combined
        why = f"No single change fits; these together do ({entry.id} at {_gib(entry.peak)}): {'; '.join(labels)}"
        return ConfigError("MEMORY_PROFILE", f"{head}. {why}")
    return ConfigError(
        "MEMORY_PROFILE", f"{head}. No change the estimate knows of fits: a card with more memory"
    )


def _explicit_check(
    plan: MemoryPlan, cfg, model_config, card_gb, params, text_encoder_bytes, vae_bytes, margin, shards
) -> str:
    """A warning (logged, and returned for the plan's line) when an explicitly named plan's predicted peak
    is above the card; '' when it fits or the card is unknown."""
    if card_gb is None:
        return ""
    peak = estimate_plan(plan, cfg, model_config, params, text_encoder_bytes, vae_bytes, shards).total
    budget = card_budget(card_gb * cal.GIB, margin)
    if peak <= budget:
        return ""
    warning = (
        f"MEMORY_PROFILE={cfg.memory.memory_profile!r}: predicted peak {_gib(peak)} is above the card's "
        f"{card_gb:g} GiB ({_gib(budget)} for the step after the CUDA context and margin); running it as asked "
        f"(MEMORY_PROFILE='auto' picks a plan that fits)"
    )
    log.warning(warning)
    return f"; WARNING: predicted peak {_gib(peak)} above the card's {card_gb:g} GiB"


def resolve_plan(
    cfg: Any,
    model_config: Any,
    card_gb: float | None,
    full_ft: bool,
    params: int | None = None,
    text_encoder_bytes: int = 0,
    vae_bytes: int = 0,
    margin: float = cal.CARD_MARGIN,
    shards: int = 1,
) -> tuple[MemoryPlan, str]:
    """The memory plan MEMORY_PROFILE and the per-engine knobs of the run `cfg` (its TrainConfig) give, and
    one line saying why; `shards`: FSDP2's ranks (`rank_share`). 'auto' with nothing that fits the card: a
    ConfigError naming the changes that would fit (nothing is loaded yet)."""
    cfg = _with_algo(cfg, full_ft)
    choice = cfg.memory.memory_profile or "auto"
    if problem := profile_problem(choice):
        raise ConfigError("MEMORY_PROFILE", problem)
    explicit = choice != "auto"
    if choice in PROFILES:
        base, why = PROFILES[choice], f"profile '{choice}'"
    elif choice != "auto":
        base, why = find_entry(choice, model_config.depth), f"catalog entry {choice}"
    elif card_gb is None:
        base, why = PROFILES["speed"], "auto without a GPU: profile 'speed'"
    else:
        entries = catalog(model_config, cfg, params, text_encoder_bytes, vae_bytes, shards)
        if not entries:
            raise ConfigError(
                "MEMORY_PROFILE", f"no catalog entry can take the per-engine knobs{_set_knobs(cfg)}"
            )
        best = fastest_fit(entries, card_gb * cal.GIB, margin)
        if best is None:

            def fit(changed: Any) -> CatalogEntry | None:
                found = catalog(model_config, changed, params, text_encoder_bytes, vae_bytes, shards)
                return fastest_fit(found, card_gb * cal.GIB, margin) if found else None

            raise nothing_fits(cfg, entries, card_gb, fit, text_encoder_bytes, vae_bytes)
        named = f" (profile '{best.profile}')" if best.profile else ""
        why = (
            f"auto: catalog entry {best.id}{named}, the fastest that fits {card_gb:g} GiB "
            f"(predicted {best.peak / cal.GIB:.1f} GiB, cost {best.cost:.2f}x)"
        )
        base = best.plan
    plan = plan_with_overrides(base, memory_pins(cfg.memory))
    _check_encoders(plan, cfg)
    if refusal := plan_refusal(plan, cfg, model_config.depth, shards):
        raise ConfigError(*refusal)
    warning = ""
    if explicit:
        warning = _explicit_check(
            plan, cfg, model_config, card_gb, params, text_encoder_bytes, vae_bytes, margin, shards
        )
    return plan, f"{why}: {plan.label()}{_set_knobs(cfg)}{warning}"
