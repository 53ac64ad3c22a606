"""Fixtures of the example-script tests: a fake weights folder, a kohya dataset and a run with checkpoints."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "scripts" / "examples"


def load_script(name: str):
    """A file of scripts/examples/ as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dry_run(script: str, *args: str, cwd: Path, tool: str = "none") -> subprocess.CompletedProcess:
    """`bash scripts/examples/SCRIPT ARGS` with DRY_RUN=1; `tool` is the config tool command ('none': missing)."""
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "KOHAKUMOSS_CONFIG": tool}
    return subprocess.run(
        ["bash", str(EXAMPLES / script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30
    )


@pytest.fixture
def weights(tmp_path) -> Path:
    """A ComfyUI models folder with (empty) files where the real ones would be."""
    root = tmp_path / "ComfyUI" / "models"
    for sub, name in (
        ("diffusion_models", "moss_image_base.safetensors"),
        ("text_encoders", "qwen3.5_9b.safetensors"),
        ("vae", "flux2-vae_small.safetensors"),
    ):
        (root / sub).mkdir(parents=True)
        (root / sub / name).write_bytes(b"")
    return root


@pytest.fixture
def dataset(tmp_path) -> Path:
    root = tmp_path / "my_set"
    (root / "10_style").mkdir(parents=True)
    for i, caption in enumerate(["a red lighthouse, watercolor", "a harbour at night, watercolor", "a boat"]):
        (root / "10_style" / f"{i}.png").write_bytes(b"")
        (root / "10_style" / f"{i}.txt").write_text(caption + "\n")
    return root
