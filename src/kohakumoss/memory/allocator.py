"""The CUDA caching allocator's settings for an edit run, set before CUDA starts.

An edit / reference step (batches [target | text | references]) under MEMORY_PROFILE auto at 1 MP with one
reference died at the CUDA-graph capture on an H100 (64.4 GiB allocated, 13.4 GiB reserved but unallocated:
fragmentation); with `expandable_segments:True` the same row trained (peak 65.1 GiB). That is one measured
row, so the setting is only made for runs with references, and never over the user's own
PYTORCH_CUDA_ALLOC_CONF. The variable is read at CUDA's first allocation: set it before any CUDA work
(spawned distributed workers inherit it).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

from kohakumoss_common.log import get_logger

log = get_logger(__name__)

ALLOC_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"
EDIT_ALLOC_CONF = "expandable_segments:True"


def dataset_has_references(dataset: Any) -> bool:
    """Whether any entry of a DATASET knob (a dict, or a list of them) names reference images (`references`)."""
    entries = dataset if isinstance(dataset, (list, tuple)) else [dataset]
    return any(isinstance(e, dict) and bool(e.get("references")) for e in entries)


def allocator_for_references(
    has_references: bool, environ: MutableMapping[str, str] | None = None
) -> str | None:
    """Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in `environ` (this process's by default) for a run
    with references, unless the user set the variable; returns the logged line, or None when nothing was set."""
    env = os.environ if environ is None else environ
    if not has_references or ALLOC_CONF_VAR in env:
        return None
    env[ALLOC_CONF_VAR] = EDIT_ALLOC_CONF
    line = (
        f"{ALLOC_CONF_VAR}={EDIT_ALLOC_CONF}: the dataset has reference images, whose step fragmented the CUDA "
        f"allocator at the graph capture (set {ALLOC_CONF_VAR} yourself to choose otherwise)"
    )
    import torch  # the setting is read at CUDA's first allocation: too late once CUDA is in use

    if environ is None and torch.cuda.is_available() and torch.cuda.is_initialized():
        line += "; CUDA is already in use in this process, so it applies to processes started from here only"
    log.info(line)
    return line


def allocator_setting_line(
    has_references: bool, environ: MutableMapping[str, str] | None = None
) -> str | None:
    """For a run's log.txt: the allocator setting an edit run runs with (set by `allocator_for_references`
    or by the user), or None for text-to-image runs and where none is set."""
    env = os.environ if environ is None else environ
    if not has_references or ALLOC_CONF_VAR not in env:
        return None
    return f"CUDA allocator: {ALLOC_CONF_VAR}={env[ALLOC_CONF_VAR]}"
