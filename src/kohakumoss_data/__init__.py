"""kohakumoss_data: sources, the incremental catalog, the deterministic planner, caches and loader workers.

Imports only kohakumoss_common; the VAE and text encoder are passed in (see `protocols`).
"""

from .batch import HostBatch
from .cache import TensorCache
from .cache_keys import latent_cache_identity, latent_key, text_cache_identity, text_key
from .catalog import Catalog, ScanKnobs, ScanReport, scan
from .loader import Loader, LoaderKnobs, open_caches
from .plan import Plan, PlanKnobs, PlannedItem, build_plan
from .protocols import ImageEncoder, TextEncoder
from .records import CatalogItem
from .sources import Source, make_source

__all__ = [
    "Catalog",
    "CatalogItem",
    "HostBatch",
    "ImageEncoder",
    "Loader",
    "LoaderKnobs",
    "Plan",
    "PlanKnobs",
    "PlannedItem",
    "ScanKnobs",
    "ScanReport",
    "Source",
    "TensorCache",
    "TextEncoder",
    "build_plan",
    "latent_cache_identity",
    "latent_key",
    "make_source",
    "open_caches",
    "scan",
    "text_cache_identity",
    "text_key",
]
