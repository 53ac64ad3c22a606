"""T-LoRA's timestep rank mask: fewer active ranks at high noise, all of them near the clean image.

LyCORIS keeps the mask in a process-wide slot (`lycoris.set_timestep_mask`); the trainer sets it from
the step's sigma before the forward. A packed batch mixes sigmas, so one mask per step comes from the
mean sigma (per-sample masks do not fit lycoris's weight-rebuild forward).
"""

from __future__ import annotations

import torch
from lycoris import clear_timestep_mask, compute_timestep_mask, set_timestep_mask

MAX_TIMESTEP = 1000


def tlora_mask(sigma: float, rank: int, min_rank: int = 1, alpha: float = 1.0) -> torch.Tensor:
    """[1, rank] 0/1 mask for noise level sigma in [0, 1] (sigma = 1 is pure noise)."""
    t = int(round(min(max(float(sigma), 0.0), 1.0) * (MAX_TIMESTEP - 1)))
    return compute_timestep_mask(t, MAX_TIMESTEP, rank, min_rank, alpha)


def set_tlora_sigma(sigma: torch.Tensor | float, rank: int, min_rank: int = 1, alpha: float = 1.0) -> None:
    """Install the mask for this step (mean sigma of the batch)."""
    s = sigma.float().mean().item() if isinstance(sigma, torch.Tensor) else float(sigma)
    set_timestep_mask(tlora_mask(s, rank, min_rank, alpha))


def clear_tlora_mask() -> None:
    """Back to all ranks active (inference, export)."""
    clear_timestep_mask()
