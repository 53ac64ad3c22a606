"""DETERMINISTIC: torch's deterministic algorithms, a fixed cuBLAS workspace, no atomics-adding backends.
The GPU test runs the trainer twice and once stopped and resumed, in fresh processes, and compares bits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kohakumoss.config.train import TrainConfig
from kohakumoss.train.components import ops_backend
from kohakumoss_kernels.registry import candidate_names
from kohakumoss_kernels.runtime.deterministic import ATOMIC_BACKENDS, backends_for, set_deterministic

from .conftest import tiny_knobs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def restore():
    yield
    set_deterministic(False)


def test_the_backend_list_drops_the_atomics_and_keeps_the_order():
    for arch in ("sm90", "sm80", "sm75", "sm70", "xpu"):
        names = backends_for(arch).split(",")
        assert not set(names) & set(ATOMIC_BACKENDS) and names[-1] == "eager"
        full = candidate_names("lora_linear", arch)
        assert [n for n in full if n not in ATOMIC_BACKENDS] == candidate_names(
            "lora_linear", arch, ",".join(names)
        )
    assert "addmm_lowrank" in candidate_names("lora_linear", "sm90")  # what the list removes exists
    assert backends_for("cpu") == "eager"


def test_the_knob_switches_torch_and_the_kernel_list(restore):
    set_deterministic(True)
    assert torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] in (":4096:8", ":16:8")
    set_deterministic(False)
    assert not torch.are_deterministic_algorithms_enabled()
    k = {"DETERMINISTIC": True, "OPS_BACKEND": "auto", "DEVICE": "cpu"}
    cfg = TrainConfig.from_knobs
    assert ops_backend(cfg(k)) == "eager" and ops_backend(cfg({**k, "DETERMINISTIC": False})) == "auto"
    assert ops_backend(cfg({**k, "OPS_BACKEND": "eager"})) == "eager"


def _adapter_bits(run: Path) -> dict[str, bytes]:
    from safetensors.torch import load_file

    ckpt = sorted((run / "checkpoints").glob("step_*"))[-1]
    files = sorted(ckpt.rglob("*.safetensors"))
    assert files, ckpt
    return {
        f"{f.name.replace(run.name, '<run>')}/{k}": t.reshape(-1).view(torch.uint8).numpy().tobytes()
        for f in files
        for k, t in load_file(f).items()
    }


def _losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def test_a_deterministic_cpu_run_trains(train_world, restore):
    from kohakumoss.train.loop import train

    run = train(tiny_knobs(train_world, "deterministic-cpu", STEPS=2, DETERMINISTIC=True))
    assert len(_losses(run)) == 2 and "DETERMINISTIC: torch deterministic" in (run / "log.txt").read_text()


RUN = """
import json, sys
from kohakumoss.train.loop import train
train(json.load(open(sys.argv[1])))
"""


def _train_in_a_fresh_process(knobs: dict, tmp: Path) -> Path:
    """cuBLAS reads its workspace setting when its first handle is made: each run gets its own process."""
    path = tmp / f"{knobs['RUN_NAME']}-{knobs.get('RESUME') or 'fresh'}.json"
    path.write_text(json.dumps(knobs))
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    done = subprocess.run([sys.executable, "-c", RUN, str(path)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return Path(knobs["RUNS_DIR"]) / knobs["RUN_NAME"]


@pytest.mark.gpu
@cuda
def test_gpu_runs_are_bitwise_equal_and_so_is_a_resumed_one(train_world, tmp_path):
    gpu = dict(DEVICE="cuda", PRECISION="bf16", OPS_BACKEND="auto", DETERMINISTIC=True, STEPS=6, SAVE_EVERY=0)
    a = _train_in_a_fresh_process(tiny_knobs(train_world, "det-a", **gpu), tmp_path)
    b = _train_in_a_fresh_process(tiny_knobs(train_world, "det-b", **gpu), tmp_path)
    _train_in_a_fresh_process(tiny_knobs(train_world, "det-c", **gpu, STOP_AT=3), tmp_path)
    c = _train_in_a_fresh_process(tiny_knobs(train_world, "det-c", **gpu, RESUME="latest"), tmp_path)
    print("losses", _losses(a), _losses(b), _losses(c))
    assert _losses(a) == _losses(b) == _losses(c)  # exact float equality, every step
    bits = _adapter_bits(a)
    assert bits == _adapter_bits(b) and bits == _adapter_bits(c)
