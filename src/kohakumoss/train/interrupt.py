"""Ctrl-C during the training loop stops the run after the step in flight.

Python raises KeyboardInterrupt wherever the main thread happens to be when SIGINT arrives. Inside a
destructor the garbage collector runs, it is printed ("Exception ignored in ...") and dropped, and the run
goes on as if nothing was pressed (a CI run trained all its steps that way). So while the loop runs,
SIGINT only sets a flag that the loop reads after each step; a second Ctrl-C raises at once.
"""

from __future__ import annotations

import signal
import threading

from kohakumoss_common.log import get_logger

log = get_logger("kohakumoss.train.interrupt")


class StepInterrupt:
    """`with StepInterrupt() as stop:` ... `stop.check()` after each step raises KeyboardInterrupt once
    Ctrl-C was pressed. Outside the main thread (where no handler can be set) Python's default stands."""

    def __init__(self):
        self.requested = False
        self._previous = None
        self._installed = False

    def __enter__(self) -> StepInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.info("Ctrl-C: stopping after this step, with a checkpoint (Ctrl-C again: at once)")

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt
