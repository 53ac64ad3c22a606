"""Which of a Triton kernel's launch configs are worth timing on this card, best guess first.

A fresh card's first step compiled every candidate of every kernel it met (333 Triton kernels, 147 s of a
206 s first step on a card with no table). `triton_utils.pick` times only what `prune` keeps:
- configs this card cannot run well are dropped (rules below, each with its reason);
- the rest are ordered by a prior: the pick a shipped table of a card of the same arch made for this very
  key, then how often each config won this kernel in the shipped tables, then the kernel's own order;
- at most `max_variants()` compiled variants are kept (KOHAKUMOSS_TUNE_MAX_VARIANTS; 0: all). Configs
  that differ only in programs per SM share one compiled kernel, so all of a kept variant's stay.
Replayed on the H200's shipped table (every candidate's time kept there), 4 variants by this prior keep
the winner's time within 0.2% on average (worst key 8%) with 38% fewer compiles.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

MAX_VARIANTS_ENV = "KOHAKUMOSS_TUNE_MAX_VARIANTS"
MAX_VARIANTS = 4  # compiled variants timed per kernel and key when nothing is known of this key
MAX_VARIANTS_KNOWN = 2  # where a same-arch card's table picked for this key: that one and one more

# The fields of each kernel's config tuples (by name prefix; others by length: row kernels' (ROWS,
# num_warps), persistent backwards' (ROWS, num_warps, programs per SM)).
FIELDS: dict[str, tuple[str, ...]] = {
    "varlen_attention.": ("block_m", "block_n", "warps", "stages"),
    "lowrank.rows": ("share", "block_k", "stages", "warps"),
    "lowrank.cols": ("block_n", "block_m", "warps", "stages", "per_sm"),
}
GRID_ONLY = ("per_sm",)  # fields that change only the launch grid: no compile of their own


def fields(name: str, config: tuple) -> tuple[str, ...]:
    for prefix, names in FIELDS.items():
        if name.startswith(prefix):
            return names
    return ("rows", "warps", "per_sm")[: len(config)]


def variant(name: str, config: tuple) -> tuple:
    """The part of a config that is compiled: the config without its grid-only fields."""
    return tuple(v for f, v in zip(fields(name, config), config) if f not in GRID_ONLY)


@dataclass(frozen=True)
class CardLimits:
    """What the pruning rules read of a card."""

    sm: int  # compute capability as 80, 86, 90, ...
    warps_per_sm: int  # resident warps one SM holds (64 on sm80/sm90, 48 on sm86/sm89, 32 on sm75)
    shared_bytes: int | None  # shared memory one program may use (the opt-in maximum); None: unknown


@functools.lru_cache(maxsize=8)
def card_limits(device: str) -> CardLimits | None:
    """The limits of a CUDA card; None elsewhere (no rule applies)."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(dev)
    warps = getattr(p, "max_threads_per_multi_processor", 2048) // 32
    return CardLimits(p.major * 10 + p.minor, warps, _shared_bytes(dev, p))


def _shared_bytes(dev: torch.device, props) -> int | None:
    """The opt-in shared memory per program, as Triton checks its kernels against it; torch lists only
    the per-SM figure (1 KiB above it: the driver keeps that much per program) and the 48 KiB default."""
    try:
        from triton.runtime import driver

        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:  # another Triton's driver API, or no Triton: torch's figure
        per_sm = getattr(props, "shared_memory_per_multiprocessor", 0)
        return per_sm - 1024 if per_sm > 1024 else None


def _stage_bytes(name: str, f: Mapping[str, int], key: Sequence) -> int:
    """Bytes of shared memory one pipeline stage of the kernel's streamed operands takes at least."""
    dtypes = [k for k in key if isinstance(k, torch.dtype)]
    size = dtypes[0].itemsize if dtypes else 2
    if name in ("varlen_attention.fwd", "varlen_attention.dq"):  # a K and a V tile per step
        return 2 * f["block_n"] * key[0] * size
    if name == "varlen_attention.dkdv":  # a Q and a dO tile per step
        return 2 * f["block_m"] * key[0] * size
    if name == "lowrank.cols":  # an A tile and a B tile at least 16 columns wide
        return (f["block_m"] * f["block_n"] + f["block_m"] * 16) * size
    return 0


def drop_reason(name: str, config: tuple, key: Sequence, card: CardLimits) -> str | None:
    """Why `config` is not worth timing on `card`, or None."""
    f = dict(zip(fields(name, config), config))
    # programs meant to share an SM that do not fit in it together run as a longer tail of the same kernel
    if "per_sm" in f and f["warps"] * f["per_sm"] > card.warps_per_sm:
        return f"{f['per_sm']} programs of {f['warps']} warps exceed {card.warps_per_sm} warps per SM"
    # Triton pipelines loads through cp.async (sm80+) only: below that a deeper pipeline buys nothing
    if "stages" in f and card.sm < 80 and f["stages"] > 2:
        return f"{f['stages']} stages without async copies (sm{card.sm})"
    # every stage but one holds its tiles in shared memory at once: past the card's limit it cannot compile
    if (
        "stages" in f
        and card.shared_bytes
        and (f["stages"] - 1) * _stage_bytes(name, f, key) > card.shared_bytes
    ):
        return f"{f['stages']} stages need more than the {card.shared_bytes // 1024} KiB of shared memory"
    return None


def max_variants(known: bool) -> int:
    """Compiled variants to time per key (0: all); fewer where a same-arch table already picked this key."""
    value = os.environ.get(MAX_VARIANTS_ENV)
    if value is not None and value.strip():
        return max(0, int(value))
    return MAX_VARIANTS_KNOWN if known else MAX_VARIANTS


def prune(
    name: str,
    key: Sequence,
    candidates: Sequence[tuple],
    card: CardLimits | None,
    known: tuple | None = None,
    wins: Mapping[tuple, float] | None = None,
) -> list[tuple]:
    """The candidates worth timing, best guess first (see the module's docstring).

    known: the config a same-arch card's table picked for this key; wins: compiled variant -> how often
    it won this kernel in the shipped tables. Never empty: if every config is dropped the first stays."""
    kept = [c for c in candidates if card is None or drop_reason(name, c, key, card) is None] or [
        candidates[0]
    ]
    wins = wins or {}
    position = {c: i for i, c in enumerate(kept)}
    known_variant = variant(name, known) if known is not None and tuple(known) in position else None

    def rank(c: tuple) -> tuple:
        v = variant(name, c)
        return (v != known_variant, -wins.get(v, 0), position[c])

    ordered = sorted(kept, key=rank)
    if known_variant is not None:  # the known pick itself first among its variant's grid-only siblings
        ordered.remove(tuple(known))
        ordered.insert(0, tuple(known))
    limit = max_variants(known_variant is not None)
    if not limit:
        return ordered
    variants: list[tuple] = []
    for c in ordered:
        if variant(name, c) not in variants:
            variants.append(variant(name, c))
    allowed = set(variants[:limit])
    return [c for c in ordered if variant(name, c) in allowed]
