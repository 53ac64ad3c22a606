"""Every random state a run depends on: python, numpy, torch CPU, CUDA (all devices) and named generators.

Stored as JSON (python, numpy) plus safetensors (torch byte states), so loading runs no pickle.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.io import atomic_write_text, save_safetensors

RNG_JSON, RNG_TENSORS = "rng.json", "rng.safetensors"


def capture_rng(generators: dict[str, torch.Generator] | None = None) -> dict:
    """A snapshot of every RNG state (CUDA only where CUDA is initialised)."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (np_state[0], np_state[1].tolist(), *np_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all()
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else [],
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    return state


def restore_rng(state: dict, generators: dict[str, torch.Generator] | None = None) -> None:
    """Put every state back; a generator the run passes but the snapshot lacks is an error."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    saved = state["generators"]
    for name, g in (generators or {}).items():
        if name not in saved:
            raise CheckpointError("<rng state>", f"no state for generator '{name}'; saved: {sorted(saved)}")
        g.set_state(saved[name])


def save_rng(state: dict, directory: Path) -> None:
    tensors = {"torch": state["torch"]}
    tensors.update({f"cuda.{i}": s for i, s in enumerate(state["cuda"])})
    tensors.update({f"gen.{name}": s for name, s in state["generators"].items()})
    save_safetensors(tensors, directory / RNG_TENSORS)
    version, internal, gauss = state["python"]
    doc = {"python": [version, list(internal), gauss], "numpy": list(state["numpy"])}
    atomic_write_text(directory / RNG_JSON, json.dumps(doc))


def load_rng(directory: Path) -> dict:
    doc = json.loads((directory / RNG_JSON).read_text())
    tensors = load_file(str(directory / RNG_TENSORS))
    cuda = [tensors[f"cuda.{i}"] for i in range(sum(k.startswith("cuda.") for k in tensors))]
    gens = {k[len("gen.") :]: v for k, v in tensors.items() if k.startswith("gen.")}
    return {
        "python": doc["python"],
        "numpy": doc["numpy"],
        "torch": tensors["torch"],
        "cuda": cuda,
        "generators": gens,
    }
