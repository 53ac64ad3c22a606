"""The project's error types: each names the file, key or knob at fault."""

from __future__ import annotations


class KohakuMossError(Exception):
    """Base of every error the project raises on purpose (bad input, not a bug)."""


class ConfigError(KohakuMossError, ValueError):
    """A knob or config field is unknown, of the wrong type or out of range."""

    def __init__(self, knob: str, message: str):
        self.knob = knob
        super().__init__(f"{knob}: {message}")


class CheckpointError(KohakuMossError):
    """A checkpoint file is missing, malformed or does not match the model."""

    def __init__(self, path: object, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class DataError(KohakuMossError):
    """A dataset, source or cache is unusable as configured."""
