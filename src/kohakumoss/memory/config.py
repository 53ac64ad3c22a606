"""MemoryConfig: the memory knobs of a training run (MEMORY_PROFILE, CARD_GB, the per-engine overrides).

A section of `TrainConfig` (config/train.py composes it); the memory plan is resolved from it and the rest
of the run's config (`memory/profiles.resolve_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kohakumoss_common.typed_config import knob

from .plan import ACTIVATION_OFFLOAD_MODES, CHECKPOINT_MODES, ENCODER_PLACEMENTS, OPTIMIZER_PLACEMENTS
from .profiles import profile_problem


# resume=None throughout: a plan places bytes, each engine computes the plain path's step (tests/memory)
@dataclass(frozen=True)
class MemoryConfig:
    """The memory plan (docs/concepts/profiles.md): a profile, then per-engine knobs (None: from the profile)."""

    memory_profile: str = knob(
        "auto",
        "auto (fastest catalog entry that fits the card), speed, balanced, low_vram, minimal, or an id like c0042",
        resume=None,
        check=profile_problem,
    )
    card_gb: float = knob(
        0.0, "card memory in GiB that MEMORY_PROFILE 'auto' plans for (0: read the GPU)", resume=None, min=0.0
    )
    checkpointing: str | None = knob(
        None,
        "activation checkpointing: none, full block, attn half or mlp half (None: from the profile)",
        resume=None,
        choices=(None, *CHECKPOINT_MODES),
    )
    checkpoint_every: int | None = knob(
        None, "checkpoint every k-th block (None: from the profile)", resume=None, min=1
    )
    stream_blocks: int | None = knob(
        None,
        "blocks whose weights stream from pinned host memory, -1: all (None: from the profile)",
        resume=None,
        min=-1,
    )
    stream_slots: int | None = knob(
        None, "GPU slots of the streaming ring, >= 2 (None: from the profile)", resume=None, min=2
    )
    activation_offload: str | None = knob(
        None,
        "saved activations to host memory: none or on (None: from the profile)",
        resume=None,
        choices=(None, *ACTIVATION_OFFLOAD_MODES),
    )
    grad_offload: bool | None = knob(
        None,
        "grads to host fp32 sums (needs OPTIMIZER_PLACEMENT stream or host; None: from the profile)",
        resume=None,
    )
    optimizer_placement: str | None = knob(
        None,
        "optimizer states and fp32 masters: gpu, stream or host (None: from the profile)",
        resume=None,
        choices=(None, *OPTIMIZER_PLACEMENTS),
    )
    text_encoder_placement: str | None = knob(
        None,
        "text encoder: resident, streamed or off (off: not on the device while training; the text cache is filled first; None: from the profile)",
        resume=None,
        choices=(None, *ENCODER_PLACEMENTS),
    )
    vae_placement: str | None = knob(
        None,
        "VAE: resident, streamed or off (off: not on the device while training; the latent cache is filled first; None: from the profile)",
        resume=None,
        choices=(None, *ENCODER_PLACEMENTS),
    )
