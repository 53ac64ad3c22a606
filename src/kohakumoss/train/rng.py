"""A run's random states: defined in kohakumoss.checkpoint.rng (below train and export)."""

from kohakumoss.checkpoint.rng import RNG_JSON, RNG_TENSORS, capture_rng, load_rng, restore_rng, save_rng

__all__ = ["RNG_JSON", "RNG_TENSORS", "capture_rng", "load_rng", "restore_rng", "save_rng"]
