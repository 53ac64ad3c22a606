"""`kohakumoss-config profiles`: the memory catalog for a config and a card, and the fastest entry that fits.

kohakumoss-config profiles --gpu-mem 8
kohakumoss-config profiles --config configs/user/my-lora.py --gpu-mem rtx4090 --all
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
TOP = 12  # fitting entries listed besides the named profiles (--all: every entry)


@dataclass
class CatalogView:
    knobs: dict[str, Any]
    model: Any  # MossConfig
    model_name: str
    params: int | None
    text_encoder_bytes: int
    vae_bytes: int
    card_gb: float | None
    notes: list[str]


def catalog_view(
    config_file: str | None = None, gpu: str | None = None, overrides: dict[str, Any] | None = None
) -> CatalogView:
    """The knobs (schema defaults < the config file < overrides), the DiT and the card to price against."""
    from kohakumoss.config.train import TRAIN_SCHEMA

    from .config_check import CheckResult, _model_files, encoder_bytes
    from .config_gpu import detect_gpu, resolve_gpu
    from .config_layers import load_file

    knobs, metadata = load_file(config_file) if config_file else ({}, {})
    merged = {**TRAIN_SCHEMA.defaults(), **{k: v for k, v in knobs.items() if k in TRAIN_SCHEMA.knobs}}
    merged.update(overrides or {})
    res = CheckResult(config_file or "-", "train")
    model, params = _model_files(merged, res)
    notes = [f"{k}: {m}" for k, m in res.problems] + [
        n for n in res.notes if not n.startswith("DiT size for the memory")
    ]
    name = merged.get("WEIGHTS") or merged.get("MODEL_PRESET") or "moss-image-5b"
    te, vae = encoder_bytes(merged)
    card: float | None = None
    if gpu:
        card = resolve_gpu(gpu).card_gb
    elif float(merged.get("CARD_GB") or 0) > 0:
        card = float(merged["CARD_GB"])
    elif "card_gb" in metadata:
        card = float(metadata["card_gb"])
    elif (found := detect_gpu()) is not None:
        card = round(found[1], 1)
    return CatalogView(merged, model, str(name), params, te, vae, card, notes)


def _row(entry, marks: str, fit: str) -> str:
    return (
        f"{entry.id:<6} {entry.profile or '-':<9} {entry.peak / GIB:8.2f} {entry.cost:6.2f} "
        f"{fit:^4}  {entry.label}{marks}"
    )


def profiles_lines(view: CatalogView, show_all: bool = False, top: int = TOP) -> list[str]:
    """The table `profiles` prints: the named profiles and the fastest fitting entries (or all)."""
    from kohakumoss.config.train import TrainConfig
    from kohakumoss.memory import PROFILES, catalog, fastest_fit
    from kohakumoss.memory.calibration import CARD_MARGIN, CUDA_CONTEXT_BYTES
    from kohakumoss.memory.catalog import card_budget, catalog_plans, fits, make_entry, step_seconds
    from kohakumoss.memory.plan import MemoryPlan, plan_with_overrides

    k, m = view.knobs, view.model
    cfg = TrainConfig.from_knobs(k)
    args = (cfg, m, view.params, view.text_encoder_bytes, view.vae_bytes)
    entries = catalog(m, cfg, view.params, view.text_encoder_bytes, view.vae_bytes)
    algo = k.get("ALGO", "lora")
    what = "full fine-tune" if algo == "full" else f"{algo} r{k.get('RANK')} {k.get('TARGET_PRESET')}"
    lines = [
        f"memory catalog: {view.model_name} ({m.depth} blocks, dim {m.dim}), {what}, "
        f"{k.get('TOKENS_PER_STEP')} tokens/step, {k.get('PRECISION')}, grad accum {k.get('GRAD_ACCUM')}"
    ]
    card = view.card_gb * GIB if view.card_gb is not None else None
    best = fastest_fit(entries, card) if card is not None else None
    if card is None:
        lines.append("card memory unknown: pass --gpu-mem GB (or a card name) to mark what fits")
    else:
        lines.append(
            f"card {view.card_gb:g} GiB: an entry fits when its predicted peak is at most "
            f"{card_budget(card) / GIB:.2f} GiB ({CARD_MARGIN:.0%} kept free, "
            f"{CUDA_CONTEXT_BYTES / GIB:.1f} GiB for the CUDA context)"
        )
    lines.append(f"{'id':<6} {'profile':<9} {'peak GiB':>8} {'cost':>6} {'fits':^4}  plan")

    def fit_mark(e) -> str:
        return "-" if card is None else ("yes" if fits(e, card) else "no")

    def marks(e) -> str:
        return "  <- fastest fit" if best is not None and e.id == best.id else ""

    if show_all:
        lines += [_row(e, marks(e), fit_mark(e)) for e in entries]
    else:
        raw = {p: eid for eid, p in catalog_plans(m.depth)}
        base = step_seconds(MemoryPlan(), cfg, m, view.params)
        for name, plan in PROFILES.items():
            try:
                plan = plan_with_overrides(plan, k)  # the per-engine knobs the config sets
            except Exception as e:  # a pin the profile cannot take: say so in its row
                lines.append(f"{'-':<6} {name:<9} {'':>8} {'':>6} {'':^4}  not usable with these knobs: {e}")
                continue
            entry = make_entry(raw.get(plan, "-"), plan, *args, base_seconds=base)
            lines.append(_row(entry, marks(entry), fit_mark(entry)))
        pool = [e for e in entries if card is None or fits(e, card)]
        pool.sort(key=lambda e: (round(e.cost, 9), e.peak, e.id))
        lines.append(
            f"-- the {min(top, len(pool))} fastest entries{' that fit' if card is not None else ''} "
            f"(--all: all {len(entries)}):"
        )
        lines += [_row(e, marks(e), fit_mark(e)) for e in pool[:top]]
    if card is not None:
        n_fit = sum(fits(e, card) for e in entries)
        if best is not None:
            lines.append(
                f"{n_fit} of {len(entries)} entries fit; the fastest: {best.id} ({best.label}), "
                f"predicted {best.peak / GIB:.2f} GiB, cost {best.cost:.2f}x: MEMORY_PROFILE = {best.id!r}"
            )
        else:
            lines.append(f"no entry fits {view.card_gb:g} GiB: lower TOKENS_PER_STEP or cache the encoders")
    lines.append(
        "peak: kohakumoss.memory.estimate; cost: step time relative to 'speed' (docs/concepts/profiles.md; "
        "constants measured on an H200: memory/calibration.py)"
    )
    return [*lines, *(f"note: {n}" for n in view.notes)]


def chosen_profile(view: CatalogView) -> tuple[str, str] | None:
    """(MEMORY_PROFILE value, one-line comment) for the fastest entry that fits the card, or None."""
    from kohakumoss.config.train import TrainConfig
    from kohakumoss.memory import catalog, fastest_fit

    if view.card_gb is None:
        return None
    cfg = TrainConfig.from_knobs(view.knobs)
    entries = catalog(view.model, cfg, view.params, view.text_encoder_bytes, view.vae_bytes)
    best = fastest_fit(entries, view.card_gb * GIB)
    if best is None:
        smallest = min(entries, key=lambda e: (e.peak, e.cost, e.id))
        return (
            "auto",
            f"nothing in the catalog fits {view.card_gb:g} GiB (smallest: {smallest.id}, "
            f"{smallest.peak / GIB:.1f} GiB): lower TOKENS_PER_STEP",
        )
    value = best.profile or best.id
    return (
        value,
        f"fastest catalog entry that fits {view.card_gb:g} GiB: {best.id}, {best.label}; predicted "
        f"{best.peak / GIB:.1f} GiB, cost {best.cost:.2f}x (kohakumoss-config profiles; 'auto' re-chooses)",
    )
