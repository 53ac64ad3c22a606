"""Ctrl-C (SIGINT) or SIGTERM during the training loop stops the run after the step in flight.

Python raises KeyboardInterrupt wherever the main thread happens to be when SIGINT arrives. Inside a
destructor the garbage collector runs, it is printed ("Exception ignored in ...") and dropped, and the run
goes on as if nothing was pressed (a CI run trained all its steps that way). So while the loop runs,
SIGINT only sets a flag that the loop reads after each step; a second one raises at once. SIGTERM (what
job schedulers and `docker stop` send) is handled the same way, so it stops the run with a checkpoint too.

A second signal never lands between a step's update and its count: inside `critical()` it is held until
the block ends, so the checkpoint the stop writes holds the weights of the step it is named after. A third
signal there stops at once and marks the state `torn`: the trainer then saves nothing (a hung step can
still be left).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from kohakumoss_common.log import get_logger

log = get_logger("kohakumoss.train.interrupt")

# SIGTERM: what schedulers (Slurm, Kubernetes) and `docker stop` send before they kill
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM") if hasattr(signal, name))


class Terminated(KeyboardInterrupt):
    """The run stopped on SIGTERM: a KeyboardInterrupt to every handler, `signum` for the exit status."""

    signum = int(getattr(signal, "SIGTERM", 15))


class StepInterrupt:
    """`with StepInterrupt() as stop:` ... `with stop.critical(): <update, count>` ... `stop.check()` after
    each step raises KeyboardInterrupt (Terminated for SIGTERM) once a stop signal came. Outside the main
    thread (where no handler can be set) Python's defaults stand."""

    def __init__(self):
        self.requested: int | None = None  # the first stop signal's number
        self.torn = False  # a stop landed inside a critical block: the state is not one step's
        self._previous: dict[int, object] = {}
        self._critical = 0
        self._held = 0  # signals held inside the critical block

    def __enter__(self) -> StepInterrupt:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _stop(self) -> KeyboardInterrupt:
        return Terminated() if self.requested == getattr(signal, "SIGTERM", None) else KeyboardInterrupt()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is None:
            self.requested = signum
            log.info(f"{name}: stopping after this step, with a checkpoint ({name} again: at once)")
            return
        if self._critical:
            self._held += 1
            if self._held == 1:
                log.info(f"{name}: stopping once this step's update is counted (again: without a checkpoint)")
                return
            self.torn = True  # the third: the user wants out of a step that does not end
        raise self._stop()

    @contextmanager
    def critical(self) -> Iterator[None]:
        """A block a stop must not split (a step's update and its count): a second signal waits for its end."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1
        if self._held and not self._critical:
            self._held = 0
            raise self._stop()

    def check(self) -> None:
        if self.requested is not None:
            raise self._stop()
