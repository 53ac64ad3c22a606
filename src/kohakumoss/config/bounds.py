"""Bounds that several scripts' knobs share: seeds within what the generators take, devices torch can parse.

Checked by the schema before any work starts (a field's `min` / `max` / `check`); whether the device is
present on this machine is the trainer's and the sampler's check (`train/components.resolve_device`), so
`kohakumoss-config check` on another machine does not refuse a config written for a GPU.
"""

from __future__ import annotations

# torch.manual_seed takes [-2**63, 2**64 - 1]; the sampler adds each image's index to SEED and the trainer
# derives its per-step seeds from it, so a seed stays below 2**63
SEED_MIN, SEED_MAX = 0, 2**63 - 1
DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps")


def device_problem(value: str) -> str | None:
    """DEVICE: 'auto' or what `torch.device` parses into a type this project runs on ('cuda:1')."""
    import torch

    if value == "auto":
        return None
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError) as e:
        return f"{value!r} is not a device: auto, cpu, cuda, cuda:N, xpu or mps ({e})"
    if device.type not in DEVICE_TYPES:
        return f"{value!r} is a {device.type} device; the model runs on auto, cpu, cuda, cuda:N, xpu or mps"
    return None


def seeds_problem(value: list) -> str | None:
    """A list of seeds: each an int in [SEED_MIN, SEED_MAX]."""
    bad = [s for s in value if isinstance(s, bool) or not isinstance(s, int) or not SEED_MIN <= s <= SEED_MAX]
    return f"seeds {bad[:3]} are not integers in [{SEED_MIN}, 2**63 - 1]" if bad else None
