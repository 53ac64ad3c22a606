"""From a script's knobs to a scanned catalog and a plan: the shared first steps of every data script."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kohakumoss_common.log import get_logger

from .catalog import Catalog, scan
from .plan import Plan, build_plan
from .settings import plan_knobs, scan_knobs
from .sources import Source, make_source

log = get_logger(__name__)


def upper_knobs(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The UPPER_CASE module-level names of a kogine script (its knobs)."""
    return {k: v for k, v in namespace.items() if k.isupper() and not k.startswith("_")}


def open_dataset(knobs: Mapping[str, Any]) -> tuple[Source, Catalog]:
    """DATASET (+ CATALOG_DIR and the scan knobs) -> the source and its incremental catalog."""
    source = make_source(knobs["DATASET"])
    return source, scan(source, scan_knobs(knobs), cache_dir=knobs.get("CATALOG_DIR"))


def plan_dataset(knobs: Mapping[str, Any], catalog: Catalog) -> Plan:
    """SEED and the plan knobs -> the plan; its sha256 is printed as `plan sha256 <hex>`."""
    plan = build_plan(catalog, int(knobs.get("SEED", 0)), plan_knobs(knobs))
    print(f"plan sha256 {plan.sha256}")
    return plan
