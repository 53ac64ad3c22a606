"""The four named memory profiles, from fastest to smallest, and how MEMORY_PROFILE becomes a plan.

    speed     nothing checkpointed, streamed or offloaded
    balanced  every block checkpointed (only its input kept); everything resident
    low_vram  every block checkpointed, 32 blocks (of 42) streamed, optimizer states on the host
    minimal   every block checkpointed and streamed, activations and grads offloaded, optimizer on
              the host, text encoder and VAE off (both caches must hit)

MEMORY_PROFILE is 'auto' (the cheapest catalog entry whose predicted peak fits the card; 'speed' without
a GPU), one of the names above, or a catalog id ('c0042'). The per-engine knobs (CHECKPOINTING,
STREAM_BLOCKS, ...) set in a config then override single fields (for 'auto' they pin them before the
choice, so the choice respects them).
"""

from __future__ import annotations

import re
from typing import Any

from kohakumoss_common.errors import ConfigError

from . import calibration as cal
from .catalog import CATALOG_SIZE, catalog, entry_id, fastest_fit, find_entry, plan_refusal
from .plan import PLAN_KNOBS, MemoryPlan, plan_with_overrides

PROFILES: dict[str, MemoryPlan] = {
    "speed": MemoryPlan(),
    "balanced": MemoryPlan(checkpointing="full"),
    "low_vram": MemoryPlan(checkpointing="full", stream_blocks=32, optimizer="host"),
    "minimal": MemoryPlan(
        checkpointing="full",
        stream_blocks=-1,
        activation_offload="on",
        grad_offload=True,
        optimizer="host",
        text_encoder="off",
        vae="off",
    ),
}
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


def card_memory_gb(knobs: dict[str, Any], device: Any = None) -> float | None:
    """CARD_GB when set (> 0), else the memory of `device` (default: the first GPU); None on a CPU."""
    if float(knobs.get("CARD_GB") or 0) > 0:
        return float(knobs["CARD_GB"])
    from kohakumoss_common.device import device_info

    info = device_info(device)
    if info.kind == "cpu" or not info.total_memory:
        return None
    return info.total_memory / cal.GIB


def _algo_knobs(knobs: dict[str, Any], full_ft: bool) -> dict[str, Any]:
    algo = knobs.get("ALGO", "lora")
    if full_ft != (algo == "full"):
        algo = "full" if full_ft else "lora"
    return {**knobs, "ALGO": algo}


def _set_knobs(knobs: dict[str, Any]) -> str:
    pins = [f"{k}={knobs[k]!r}" for k in PLAN_KNOBS if knobs.get(k) is not None]
    return f"; set by knobs: {', '.join(pins)}" if pins else ""


def _check_encoders(plan: MemoryPlan, knobs: dict[str, Any]) -> None:
    for field, knob, encode in (
        ("text_encoder", "TEXT_ENCODER_PLACEMENT", "TEXT_ENCODE"),
        ("vae", "VAE_PLACEMENT", "VAE_ENCODE"),
    ):
        if getattr(plan, field) == "off" and knobs.get(encode) == "online":
            raise ConfigError(
                knob,
                f"'off' (from the plan) needs the cache: {encode} is 'online' (set it to 'auto' or 'cache')",
            )


def resolve_plan(
    knobs: dict[str, Any],
    model_config: Any,
    card_gb: float | None,
    full_ft: bool,
    params: int | None = None,
    text_encoder_bytes: int = 0,
    vae_bytes: int = 0,
    margin: float = cal.CARD_MARGIN,
) -> tuple[MemoryPlan, str]:
    """The memory plan MEMORY_PROFILE and the per-engine knobs give, and one line saying why."""
    knobs = _algo_knobs(knobs, full_ft)
    choice = knobs.get("MEMORY_PROFILE") or "auto"
    if problem := profile_problem(choice):
        raise ConfigError("MEMORY_PROFILE", problem)
    if choice in PROFILES:
        base, why = PROFILES[choice], f"profile '{choice}'"
    elif choice != "auto":
        base, why = find_entry(choice, model_config.depth), f"catalog entry {choice}"
    elif card_gb is None:
        base, why = PROFILES["speed"], "auto without a GPU: profile 'speed'"
    else:
        entries = catalog(model_config, knobs, params, text_encoder_bytes, vae_bytes)
        if not entries:
            raise ConfigError(
                "MEMORY_PROFILE", f"no catalog entry can take the per-engine knobs{_set_knobs(knobs)}"
            )
        best = fastest_fit(entries, card_gb * cal.GIB, margin)
        if best is not None:
            named = f" (profile '{best.profile}')" if best.profile else ""
            why = (
                f"auto: catalog entry {best.id}{named}, the fastest that fits {card_gb:g} GiB "
                f"(predicted {best.peak / cal.GIB:.1f} GiB, cost {best.cost:.2f}x)"
            )
        else:
            best = min(entries, key=lambda e: (e.peak, e.cost, e.id))
            why = (
                f"auto: nothing fits {card_gb:g} GiB; catalog entry {best.id} has the smallest predicted "
                f"peak ({best.peak / cal.GIB:.1f} GiB)"
            )
        base = best.plan
    plan = plan_with_overrides(base, knobs)
    _check_encoders(plan, knobs)
    if refusal := plan_refusal(plan, knobs, model_config.depth):
        raise ConfigError(*refusal)
    return plan, f"{why}: {plan.label()}{_set_knobs(knobs)}"
