"""The trainer (`trainer.py`, run by `loop.train`) and its building blocks: the step (`runner.py`), LR
schedules, EMA. Checkpoint folders are `kohakumoss.checkpoint`'s, the optimizers `kohakumoss.optim`'s."""

from .ema import EMA
from .schedule import SCHEDULES, LRSchedule

__all__ = ["EMA", "SCHEDULES", "LRSchedule"]
