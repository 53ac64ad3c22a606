"""Logging: one 'kohakumoss' logger tree, console plus an optional run log file."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

_FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"
_configured = False
FILE_ONLY = {"file_only": True}  # `log.info(msg, extra=FILE_ONLY)`: the run's log file, not the console
# third-party loggers that print on every command: only their warnings (and worse) are shown
QUIET = {
    "LyCORIS": logging.WARNING,  # "Loading Modules from state dict...", "N Modules Loaded" per network
    "torchao": logging.WARNING,
    "transformers": logging.WARNING,
    "torch.utils._pytree": logging.ERROR,  # torchao's import: a register_constant deprecation, not the user's
}


class _AtLeast(logging.Filter):
    """Passes a logger's records at `level` or above; a filter, since the libraries set their own levels."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


def quiet_third_party() -> None:
    """Hold the QUIET loggers to their level, whenever the libraries are imported: the level reaches their
    child loggers, the filter outlasts a library that sets its own logger's level at import (LyCORIS)."""
    for name, level in QUIET.items():
        logger = logging.getLogger(name)
        logger.setLevel(max(level, logger.level))
        if not any(isinstance(f, _AtLeast) for f in logger.filters):
            logger.addFilter(_AtLeast(level))


def get_logger(name: str) -> logging.Logger:
    """A child of the 'kohakumoss' logger; the console handler is attached once."""
    global _configured
    root = logging.getLogger("kohakumoss")
    if not _configured:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))
        handler.addFilter(lambda record: not getattr(record, "file_only", False))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
        quiet_third_party()
        _configured = True
    short = name.split(".", 1)[1] if name.startswith("kohakumoss") and "." in name else name
    return root.getChild(short)


def add_file_log(path: str | Path) -> logging.Handler:
    """Mirror every project log line into `path` (for example runs/<name>/log.txt)."""
    get_logger("kohakumoss.log")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(_FORMAT, "%Y-%m-%d %H:%M:%S"))
    logging.getLogger("kohakumoss").addHandler(handler)
    return handler


_once: set[str] = set()


def log_once(logger: logging.Logger, message: str, level: int = logging.INFO) -> None:
    """Log `message` the first time it is seen in this process only."""
    if message not in _once:
        _once.add(message)
        logger.log(level, message)
