"""Logging: one 'kohakumoss' logger tree, console plus an optional run log file."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

_FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"
_configured = False


def get_logger(name: str) -> logging.Logger:
    """A child of the 'kohakumoss' logger; the console handler is attached once."""
    global _configured
    root = logging.getLogger("kohakumoss")
    if not _configured:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
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
