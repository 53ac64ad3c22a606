"""scripts/examples/README.md's commands, run for real: train.sh, sample.sh and grid.sh on a tiny Comfy-Org
models folder and a kohya set of real photos, in a fresh "clone", the commands read from the README.

What a CPU run with tiny weights changes is the short list below (fewer steps, small images, the tiny
DiT's block count); everything else runs as the README writes it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_first_lora_guide import bash_commands
from tests.tiny_trees import write_comfy_models, write_photo_set

from .conftest import EXAMPLES, REPO

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

CAPTIONS = ["a harbour at night, mystyle", "a golden grid on glass, mystyle", "orange tiles in rows, mystyle"]
PROMPT = "a lighthouse at dusk"
# `--steps 30 --sample-every 10` of the README, at CPU size: two steps, a checkpoint and a grid after each
TRAIN_SUBSTITUTIONS = {"--steps 30 --sample-every 10": "--steps 2 --sample-every 1"}
TRAIN_KNOBS = {
    "AREA": 64 * 64,
    "MIN_SIDE": 32,
    "GRAD_ACCUM": 1,
    "PRECISION": "fp32",
    "WORKERS": 0,
    "OPS_BACKEND": "eager",
    "SAMPLE_WIDTH": 64,
    "SAMPLE_HEIGHT": 64,
    "SAMPLE_STEPS": 2,
}
# the released default skips block 22 in the unconditional branch: the tiny DiT has 4 blocks
SAMPLE_OPTIONS = "--steps 2 --size 64x64 --set PRECISION=fp32 --set UNCOND_SKIP_LAYERS=[]"


def readme_commands() -> list[str]:
    return bash_commands((EXAMPLES / "README.md").read_text())


def for_cpu(command: str) -> str:
    for old, new in TRAIN_SUBSTITUTIONS.items():
        command = command.replace(old, new)
    if "train.sh" in command:
        return command + "".join(f" --set {k}={v!r}" for k, v in TRAIN_KNOBS.items())
    return command + (" --count 1 " if "sample.sh" in command else " ") + SAMPLE_OPTIONS


def test_readme_commands_are_the_three_scripts():
    assert [shlex.split(c)[:2] for c in readme_commands()] == [
        ["bash", "scripts/examples/train.sh"],
        ["bash", "scripts/examples/sample.sh"],
        ["bash", "scripts/examples/grid.sh"],
    ]
    assert all(old in readme_commands()[0] for old in TRAIN_SUBSTITUTIONS)


def test_examples_readme_runs(tmp_path):
    root = tmp_path / "KohakuMossTrainer"
    (root / "configs").mkdir(parents=True)
    (root / "scripts").symlink_to(REPO / "scripts")
    (root / "configs" / "moss").symlink_to(REPO / "configs" / "moss")
    (root / ".venv").symlink_to(sys.prefix)  # what scripts/install/install.sh makes
    write_comfy_models(root / "ComfyUI" / "models", [*CAPTIONS, PROMPT])
    if write_photo_set(root / "data" / "my_set" / "10_mystyle", CAPTIONS) is None:
        pytest.skip("real photos missing: apt-get install -y gnome-backgrounds")
    env = {
        **os.environ,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO / "src"),
        "HF_HUB_OFFLINE": "1",
        "KOHAKUMOSS_SHIPPED_TABLES": "0",
    }
    outputs = []
    for command in readme_commands():
        command = for_cpu(command)
        r = subprocess.run(
            shlex.split(command), cwd=root, env=env, capture_output=True, text=True, timeout=900
        )
        out = r.stdout + r.stderr
        assert r.returncode == 0, f"`{command}` exited {r.returncode}:\n{out[-6000:]}"
        outputs.append(out)
    run = root / "runs" / "examples" / "train" / "my_set"
    steps = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert steps == ["step_00000001", "step_00000002"]
    assert {p.name for p in (run / "export").iterdir()} >= {"my_set-comfy.safetensors", "lycoris"}
    assert (run / "export" / "lycoris" / "my_set.safetensors").is_file()
    # the README's command has no --cache: on the no-GPU (6 GB) layer, which trains from the caches only,
    # train.sh fills them first
    assert "trains from the caches only" in outputs[0]
    assert list((root / "runs" / "examples" / "sample").rglob("*.png")), "sample.sh wrote no image"
    grids = [m for m in re.findall(r"\S*grid\S*\.png", outputs[2]) if (root / m).exists() or Path(m).exists()]
    assert grids or list((root / "runs" / "examples").rglob("grid*.png")), "grid.sh wrote no grid"
