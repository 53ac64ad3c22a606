"""The four named memory profiles, from fastest to smallest (profiles.py resolves MEMORY_PROFILE with
them; catalog.py names its entries by them).

    speed     nothing checkpointed, streamed or offloaded
    balanced  every block checkpointed (only its input kept); everything resident
    low_vram  every block checkpointed, 32 blocks (of 42) streamed, optimizer states on the host
    minimal   every block checkpointed and streamed, activations and grads offloaded, optimizer on
              the host, text encoder and VAE off (the trainer fills their caches first)
"""

from __future__ import annotations

from .plan import MemoryPlan

PROFILES: dict[str, MemoryPlan] = {
    "speed": MemoryPlan(),
    "balanced": MemoryPlan(checkpointing="full"),
    "low_vram": MemoryPlan(checkpointing="full", stream_blocks=32, optimizer="host"),
    "minimal": MemoryPlan(
        checkpointing="full",
        stream_blocks=-1,
        activation_offload="on",
        grad_offload=True,
        optimizer="host",
        text_encoder="off",
        vae="off",
    ),
}


def profile_of(plan: MemoryPlan) -> str:
    """The name of the profile with exactly this plan, or ''."""
    return next((name for name, p in PROFILES.items() if p == plan), "")
