"""Fit the catalog's step-cost constants (kohakumoss/memory/calibration.py) to measured H200 rows.

    python scripts/bench/fit_step_cost.py          # prints the fitted constants and every profile's cost

Each constant solves one row of scripts/bench/train_step.py (MEASURED below, from docs/performance/
memory.md; every row ran the pre-release block, as kohakumoss/memory/calibration.py says), taken as a
ratio to the LoRA `speed` row of the same session and scaled to REFERENCE_SPEED_S,
so rows of sessions with different kernels can be combined. The constants are solved in the order of
FITS, the whole pass repeated until they settle (a later row depends on the earlier constants). Copy the
printed values into calibration.py; tests/memory/test_cost_fit.py checks they agree.
"""

from __future__ import annotations

from collections.abc import Callable

from kohakumoss.config.train import TrainConfig
from kohakumoss.memory import calibration as cal
from kohakumoss.memory.catalog import find_entry, step_seconds
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.memory.profiles import PROFILES
from kohakumoss.model import get_preset

LORA = TrainConfig.from_knobs(
    {"ALGO": "lora", "TOKENS_PER_STEP": 8704, "PRECISION": "bf16", "RANK": 32, "TARGET_PRESET": "full"}
)
FULL = TrainConfig.from_knobs({"ALGO": "full", "TOKENS_PER_STEP": 8704, "PRECISION": "bf16"})
# lora/speed/latent_text, 2026-12-01: the released block (TRAIN_ROWS=lora/speed/latent_text,lora/minimal/
# latent_text/cap6 BENCH=train_step bash .ci/gpu); the rows below ran the pre-release block (calibration.py)
REFERENCE_SPEED_S = 0.472
# row: (seconds per step, that session's lora/speed seconds)
MEASURED = {
    "lora/minimal/cap6": (1.048, 0.472),  # 2026-12-01, the released block: not fitted (below)
    "lora/balanced": (0.743, 0.526),  # pre-release block
    "lora/low_vram/cap8": (1.020, 0.526),  # pre-release block
    "lora/minimal/cap4": (1.739, 0.485),  # pre-release block: not fitted (below)
    "full/speed": (1.307, 0.526),  # pre-release block
    "full/c0252/cap24": (4.92, 0.479),  # pre-release block
    "full/c0261/cap24": (143.0, 0.463),  # pre-release block: steps 1-2 (147, 139 s) of a row that timed out
    "lora/c0285/cap8": (0.79, 0.463),  # pre-release block: not fitted, printed against the prediction
}
# lora/minimal/cap6 and cap4 are printed against their prediction, not fitted: with every engine at once under a
# 4 GiB cap it runs ~1.6x slower than the model says, while offload alone on an uncapped block costs what
# the model says (memory_calibrate.py), so the excess is not put on any one engine (that run's host AdamW
# was still the foreach kernel, ~9x slower than the fused one on the CI box: likely part of it).
FUSED_ADAMW_S = 0.953e-3  # pre-release block profile of lora/speed: torch's fused AdamW per step ...
FUSED_ADAMW_PARAMS = 99_434_496  # ... over that row's LoRA parameters (r32, pre-release block structure)


def _set(table: str, key: str) -> Callable[[float], None]:
    return lambda v: getattr(cal, table).__setitem__(key, v)  # looked up per call: tests swap the dicts


def _attr(name: str) -> Callable[[float], None]:
    return lambda v: setattr(cal, name, v)


# (constant, setter, plan, knobs, row, search range); the first row is the reference itself
FITS = (
    ("EFFECTIVE_FLOPS", _attr("EFFECTIVE_FLOPS"), "speed", LORA, None, (50e12, 5000e12)),
    ('RECOMPUTE_SHARE["full"]', _set("RECOMPUTE_SHARE", "full"), "balanced", LORA, "lora/balanced", (0, 5)),
    ("STREAM_LOAD_OVERHEAD_S", _attr("STREAM_LOAD_OVERHEAD_S"), "low_vram", LORA, "lora/low_vram/cap8", (0, 0.1)),
    ('GPU_OPT_S_PER_PARAM["muon"]', _set("GPU_OPT_S_PER_PARAM", "muon"), "speed", FULL, "full/speed", (0, 1e-8)),
    ("HOST_GRAD_SUM_S_PER_PARAM", _attr("HOST_GRAD_SUM_S_PER_PARAM"), "c0252", FULL, "full/c0252/cap24", (0, 1e-8)),
    ("FULL_STREAM_BLOCK_S", _attr("FULL_STREAM_BLOCK_S"), "c0261", FULL, "full/c0261/cap24", (0, 100)),
)  # fmt: skip


def plan_of(name: str, depth: int) -> MemoryPlan:
    return PROFILES[name] if name in PROFILES else find_entry(name, depth)


def target_seconds(row: str | None) -> float:
    if row is None:
        return REFERENCE_SPEED_S
    seconds, speed = MEASURED[row]
    return seconds / speed * REFERENCE_SPEED_S


def solve(setter, plan, knobs, config, target: float, lo: float, hi: float) -> float:
    """Bisect the constant so the plan's predicted step equals `target` (the step is monotone in it)."""
    setter(lo)
    falling = step_seconds(plan, knobs, config) > target  # a larger value makes the step shorter
    for _ in range(100):
        mid = (lo + hi) / 2
        setter(mid)
        if (step_seconds(plan, knobs, config) > target) != falling:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def fit(rounds: int = 8) -> dict[str, float]:
    """Set the fitted constants in `calibration` (this process only) and return them by name."""
    config = get_preset("moss-image-5b")
    cal.GPU_OPT_S_PER_PARAM["adamw"] = FUSED_ADAMW_S / FUSED_ADAMW_PARAMS
    out = {'GPU_OPT_S_PER_PARAM["adamw"]': cal.GPU_OPT_S_PER_PARAM["adamw"]}
    for _ in range(rounds):
        for name, setter, plan, knobs, row, (lo, hi) in FITS:
            target = target_seconds(row)
            out[name] = solve(setter, plan_of(plan, config.depth), knobs, config, target, lo, hi)
    return out


def main() -> None:
    fitted = fit()
    config = get_preset("moss-image-5b")
    for name, value in fitted.items():
        print(f"{name} = {value:.4g}")
    for mode, knobs in (("lora", LORA), ("full", FULL)):
        base = step_seconds(PROFILES["speed"], knobs, config)
        for name in ("speed", "balanced", "low_vram", "minimal", "c0252", "c0261", "c0285", "c0290"):
            plan = plan_of(name, config.depth)
            t = step_seconds(plan, knobs, config)
            row = next((r for r in MEASURED if r.startswith(f"{mode}/{name}")), None)
            seen = f"  measured {target_seconds(row):6.3f} s" if row else ""
            print(f"{mode:4s} {name:9s} {t:7.3f} s  x{t / base:5.2f}{seen}  {plan.label()}")


if __name__ == "__main__":
    main()
