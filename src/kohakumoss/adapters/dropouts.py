"""Which dropout knobs each lycoris forward applies: a dropout the chosen forward cannot apply switches
the adapter to the bypass forward when that one applies it, and is refused by name otherwise.

lycoris-lora 4.1.3 accepts every dropout for every algorithm but applies them only in some forwards:
its merged-weight forward (BYPASS=False) rebuilds the weight and never sees the input, so plain DROPOUT
(on the adapter's input) has nowhere to act there; several algorithms also skip rank or module dropout,
and diag-OFT's bypass forward fails with dropout. What each forward applies is the algorithm's
`Algo.dropouts` (adapters/algos.py), measured by tests/adapters/test_knobs.py, which fails when lycoris
changes this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kohakumoss_common.errors import ConfigError

from .algos import DROPOUT_KNOBS as KNOBS
from .algos import resolve_algo

if TYPE_CHECKING:
    from .config import AdapterConfig


def resolve_bypass(
    algo: str, bypass: bool, forced: bool, values: dict[str, float], auto: bool = False
) -> bool:
    """The forward to run (True: bypass) for these dropout `values`: `bypass` (the forward BYPASS resolved
    to, `Algo.bypass`) when it applies every non-zero one, the bypass forward when only it does (merged
    asked), the merged one when only it does and BYPASS was 'auto' (`auto`), else a ConfigError naming the
    first knob that would not act. `forced`: a quantized (fp8 / int8) base, always bypassed."""
    asked = [k for k in KNOBS if values.get(k)]
    merged, bypassed = resolve_algo(algo)[1].dropouts
    chosen = bypass or forced
    for candidate in (chosen, not chosen if auto and not forced else True):
        if all(k in (bypassed if candidate else merged) for k in asked):
            return candidate
    applied = bypassed if chosen else merged
    knob = next(k for k in asked if k not in applied)
    options = [(b, f) for b, f in ((False, merged), (True, bypassed)) if knob in f and not (forced and not b)]
    where = "; ".join(
        f"BYPASS={b} applies it" + (f" but not {[k for k in asked if k not in f]}" if set(asked) - f else "")
        for b, f in options
    )
    fallback = (
        "only the merged-weight forward applies it, which a quantized base never runs"
        if forced and knob in merged
        else "no forward of this algorithm applies it"
    )
    forward = (
        ("bypass forward" + (" (forced by the quantized base)" if forced else ""))
        if chosen
        else "merged-weight forward"
    )
    raise ConfigError(
        knob.upper(),
        f"lycoris's {forward} of ALGO='{algo}' does not apply {knob}={values[knob]} (it would train without it); "
        f"{where or fallback}; set {knob.upper()}=0",
    )


def dropout_check(adapter: AdapterConfig, base_precision: str) -> tuple[str, str] | None:
    """The dropout refusal `build_adapter` would raise for this adapter on this BASE_PRECISION, as
    (knob, message) or None, for a check before anything loads (next to algos.base_precision_check)."""
    if adapter.algo == "full":
        return None
    try:
        name, algo = resolve_algo(str(adapter.algo))
        values = {k: float(getattr(adapter, k) or 0.0) for k in KNOBS}
        forced = base_precision != "same"
        preferred = algo.bypass(adapter.bypass, dict(adapter.algo_args or {}))
        resolve_bypass(name, preferred, forced, values, auto=adapter.bypass == "auto")
    except ConfigError as e:
        return e.knob, str(e).removeprefix(f"{e.knob}: ")
    return None
