"""Memory: the plan (where every byte of a step lives), its named profiles, the catalog of engine
combinations, and the predicted peak of each."""

from .catalog import CATALOG_SIZE, CatalogEntry, catalog, fastest_fit, step_seconds
from .estimate import MemoryEstimate, encoder_file_bytes, estimate_peak, estimate_plan, file_bytes
from .plan import PLAN_KNOBS, MemoryPlan, plan_with_overrides
from .profiles import PROFILES, card_memory_gb, resolve_plan

__all__ = [
    "CATALOG_SIZE",
    "PLAN_KNOBS",
    "PROFILES",
    "CatalogEntry",
    "MemoryEstimate",
    "MemoryPlan",
    "card_memory_gb",
    "catalog",
    "encoder_file_bytes",
    "estimate_peak",
    "estimate_plan",
    "fastest_fit",
    "file_bytes",
    "plan_with_overrides",
    "resolve_plan",
    "step_seconds",
]
