"""What a training run refuses before anything loads, as (knob, problem) pairs: one list that the trainer
raises from (`check_run`), `build_components` raises from (its share: `components.component_problems`)
and `kohakumoss-config check` reports, so the three never disagree.

Each check reads the typed config and the DiT's config (from the checkpoint's headers or the preset:
`components.model_config`), never a weight.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from kohakumoss.config.train import TrainConfig
from kohakumoss.distributed.pipeline import REFERENCES_UNSUPPORTED
from kohakumoss.model import MossConfig

from .components import Problem, component_problems, refuse


def run_problems(cfg: TrainConfig, model: MossConfig | None = None) -> list[Problem]:
    """`component_problems` and what only a training run needs: a text encoder and a VAE (the caches'
    identity comes from them, and the samples and online encoding use them)."""
    out: list[Problem] = []
    for knob, value in (("TEXT_ENCODER", cfg.encoders.text_encoder), ("VAE", cfg.encoders.vae)):
        if not value:
            out.append(
                (
                    knob,
                    f"training needs {knob} (the caches are keyed by it and it encodes what they miss): "
                    "set a path, or 'synthetic' / 'random' for a benchmark",
                )
            )
    if cfg.parallel.distributed in ("pipeline", "threaded") and has_references(cfg.data.dataset):
        out.append(("DISTRIBUTED", REFERENCES_UNSUPPORTED))
    return out + component_problems(cfg, model)


def has_references(dataset: dict | list) -> bool:
    """Whether a DATASET entry (or one of its list) asks for reference images (edit training)."""
    entries = dataset if isinstance(dataset, list) else [dataset]
    return any(isinstance(e, dict) and e.get("references") for e in entries)


def check_run(cfg: TrainConfig) -> None:
    """The trainer's check before it loads anything: every `run_problems` entry, the first one's knob named."""
    refuse(run_problems(cfg))


RUNTIME_KEY = "_runtime"  # config.json's record of what no knob sets; resume and the schema skip `_` names
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCH_NUM_THREADS")


def runtime_record() -> dict[str, Any]:
    """What changes a CPU run's numbers without a knob: torch's intra-op threads (a 1-thread and a
    2-thread CPU run part after a few steps: reductions sum in another order) and the variables that set them."""
    record: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "torch": torch.__version__,
    }
    record.update({name: os.environ[name] for name in _THREAD_VARIABLES if name in os.environ})
    return record
