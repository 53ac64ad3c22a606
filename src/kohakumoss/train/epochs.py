"""EPOCHS, SAVE_EVERY_EPOCHS and SAMPLE_EVERY_EPOCHS as the steps they stand for: resolved once, before the
plan is built, into STEPS, SAVE_EVERY and SAMPLE_EVERY (the trainer then reads only steps).

An epoch is the plan's first epoch in optimizer steps (its micro-steps over GRAD_ACCUM, rounded up, as
kohya counts them); later epochs pack their own shuffle into about as many steps.
"""

from __future__ import annotations

import dataclasses
import math

from kohakumoss.config.train import TrainConfig


def steps_per_epoch(micro_steps_per_epoch: int, grad_accum: int) -> int:
    """Optimizer steps of one epoch of `micro_steps_per_epoch` micro-steps."""
    return max(1, math.ceil(micro_steps_per_epoch / max(1, grad_accum)))


def resolve_epochs(cfg: TrainConfig, epoch_steps: int) -> TrainConfig:
    """`cfg` with each *_EPOCHS knob that is set turned into its steps knob (a pure function)."""
    optim, run, samples = cfg.optim, cfg.run, cfg.samples
    if optim.epochs:
        optim = dataclasses.replace(optim, steps=int(optim.epochs) * epoch_steps)
    if run.save_every_epochs:
        run = dataclasses.replace(run, save_every=int(run.save_every_epochs) * epoch_steps)
    if samples.sample_every_epochs:
        samples = dataclasses.replace(samples, sample_every=int(samples.sample_every_epochs) * epoch_steps)
    return dataclasses.replace(cfg, optim=optim, run=run, samples=samples)
