"""The trainer with DISTRIBUTED='ddp' on 2 CPU ranks (gloo) against one process: same losses, one run
folder written by rank 0, and a checkpoint of the 2-rank run resumed in one process (reshard, continue)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kohakumoss.distributed import World
from kohakumoss.distributed.rank_run import RankRun
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.train.loop import train_on_devices
from kohakumoss_common.errors import ConfigError

from .tiny import tiny_knobs, train_world  # noqa: F401 (the fixture)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train" / "moss.py"
STEPS = dict(STEPS=3, GRAD_ACCUM=2, LOGGERS=[], SAVE_FORMAT="hf")


def kogine_train(k: dict) -> Path:
    """`kogine run scripts/train/moss.py --config <k as a file>` in a subprocess; the run folder."""
    config = Path(k["RUNS_DIR"]) / f"{k['RUN_NAME']}.py"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("".join(f"{name} = {value!r}\n" for name, value in k.items()))
    kogine = Path(sys.executable).with_name("kogine")
    res = subprocess.run(
        [str(kogine), "run", str(SCRIPT), "--config", str(config)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return Path(k["RUNS_DIR"]) / k["RUN_NAME"]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_ddp_on_two_cpu_ranks_trains_what_one_process_does(train_world):  # noqa: F811
    one = train_on_devices(tiny_knobs(train_world, "ddp-one", **STEPS))
    # the ranks also stream their blocks' weights and optimizer states (low_vram engines, host paths)
    small = dict(MEMORY_PROFILE="low_vram", STREAM_BLOCKS=3, OPTIMIZER_PLACEMENT="stream")
    two_k = tiny_knobs(train_world, "ddp-two", DISTRIBUTED="ddp", DEVICES=2, SAVE_EVERY=2, **small, **STEPS)
    two = kogine_train(two_k)  # the train script itself starts the 2 workers
    log = (two / "log.txt").read_text()
    assert "weight streaming:" in log
    assert "tokens on each of 2 ranks)" in log  # each rank planned for its share of the step
    assert "after the backward" not in log  # not graphed: DDP's reducer, overlapped with the backward
    a, b = records(one), records(two)
    assert [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-4)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-3)
        assert (rb["samples"], rb["tokens"]) == (ra["samples"], ra["tokens"])  # summed over the ranks
    assert len({r["loss"] for r in b}) == 3  # the weights moved: the same loss three times would hide it
    for r in b:  # each rank's peak (here its process's RSS), the record's the largest of them
        assert len(r["peak_mem_gib_ranks"]) == 2 and r["peak_mem_gib"] == max(r["peak_mem_gib_ranks"]) > 0
    assert "peak_mem_gib_ranks" not in a[0]
    exports = sorted(p.name.replace("ddp-two", "") for p in (two / "export").iterdir())
    assert exports == sorted(p.name.replace("ddp-one", "") for p in (one / "export").iterdir()) and exports
    for name in exports:
        if name.endswith(".safetensors"):
            wa, wb = (
                load_file(one / "export" / f"ddp-one{name}"),
                load_file(two / "export" / f"ddp-two{name}"),
            )
            assert wa.keys() == wb.keys()
            for key in wa:
                assert (wa[key].float() - wb[key].float()).abs().max() <= 1e-4 + 1e-3 * wa[key].abs().max()
    # rank 1 wrote only its own log and metrics, under ranks/1/
    assert (two / "ranks" / "1" / "log.txt").is_file() and not (two / "ranks" / "0").exists()
    assert [r["loss"] for r in records(two / "ranks" / "1")] == [r["loss"] for r in b]

    # the 2-rank run's step-2 checkpoint, resumed in one process, continues as the one-process run does
    ckpt = str(two / "checkpoints" / "step_00000002")
    resumed = train_on_devices(tiny_knobs(train_world, "ddp-resumed", RESUME=ckpt, **STEPS))
    assert [r["step"] for r in records(resumed)] == [3]
    assert records(resumed)[0]["loss"] == pytest.approx(a[-1]["loss"], rel=1e-4)
    # and resumed on 2 ranks again, it replays the uninterrupted 2-rank run's step 3
    again = train_on_devices(
        tiny_knobs(train_world, "ddp-again", RESUME=ckpt, DISTRIBUTED="ddp", DEVICES=2, **small, **STEPS)
    )
    assert records(again)[0]["loss"] == pytest.approx(b[-1]["loss"], rel=1e-6)


def test_refused_before_any_work(train_world):  # noqa: F811
    with pytest.raises(ConfigError, match="DISTRIBUTED: 'pipe' is not one of"):
        tiny_knobs(train_world, "no", DISTRIBUTED="pipe", DEVICES=2)
    with pytest.raises(ConfigError, match="DEVICES: 2 workers asked for with DISTRIBUTED='none'"):
        train_on_devices(tiny_knobs(train_world, "no", DEVICES=2))
    with pytest.raises(ConfigError, match="CUDA_GRAPHS: 'on' with DISTRIBUTED='fsdp': FSDP2 all-gathers"):
        train_on_devices(tiny_knobs(train_world, "no", DISTRIBUTED="fsdp", DEVICES=2, CUDA_GRAPHS="on"))
    # under ddp the step is graphed as in one process: 'on' is refused where one process refuses it
    with pytest.raises(Exception, match="CUDA_GRAPHS: 'on' is not possible with this run: DEVICE"):
        train_on_devices(tiny_knobs(train_world, "no-cpu", DISTRIBUTED="ddp", DEVICES=2, CUDA_GRAPHS="on"))
    k = tiny_knobs(train_world, "few", DISTRIBUTED="ddp", DEVICES=3, STEPS=1)  # 2 images a micro-step
    with pytest.raises(
        Exception, match=r"TOKENS_PER_STEP: micro-step 0 of the plan holds 2 image\(s\) for 3 ranks"
    ):
        train_on_devices(k)


def test_a_plan_summing_gradients_on_the_host_is_not_wrapped_in_ddp(monkeypatch):
    """GRAD_OFFLOAD hooks every trainable parameter: DDP's reducer would see no gradient, so the model is
    not wrapped and the optimizer's host sums are averaged instead (test_host_grads*.py); an optimizer that
    leaves a trainable parameter out of the host sums is refused, naming the knob."""
    from kohakumoss.config.train import TrainConfig
    from kohakumoss.distributed import rank_run
    from kohakumoss.memory.engines.grad_offload import GradOffload
    from kohakumoss.memory.engines.optimizer import PlacedOptimizer
    from kohakumoss.optim.combined import CombinedOptimizer

    monkeypatch.setattr(rank_run, "current", lambda: World(0, 2, 0, 2, torch.device("cpu"), "gloo"))
    rr = RankRun(TrainConfig())
    model, extra = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    plan = MemoryPlan(grad_offload=True, optimizer="host")
    assert rr.prepare_model(model, extra, plan) is model and rr.ddp is None
    plain = CombinedOptimizer({"adamw": torch.optim.AdamW(model.parameters())})
    with pytest.raises(ConfigError, match="GRAD_OFFLOAD: the memory plan sums gradients on the host"):
        rr.prepare_optimizer(plain)
    placed = PlacedOptimizer(plain, "host", grad_offload=GradOffload(list(model.parameters())))
    with pytest.raises(ConfigError, match=r"GRAD_OFFLOAD: 2 trainable parameter\(s\) are not summed"):
        rr.prepare_optimizer(placed)  # `extra`'s weight and bias train but are not hooked


def test_a_rank_that_dies_mid_run_stops_the_run_naming_it(train_world, monkeypatch):  # noqa: F811
    """Rank 1 exits at step 2 (the workers are forked: the patch reaches them); rank 0 stops with an
    error naming rank 1, and the step-1 checkpoint it wrote stays whole."""
    import os

    from kohakumoss.checkpoint.folders import verify_checkpoint
    from kohakumoss.distributed import DistributedError, rank_run

    totals = rank_run.RankRun.reduce_step

    def dying(self, step, *args):
        if self.world.rank == 1 and step == 2:
            os._exit(9)
        return totals(self, step, *args)

    monkeypatch.setattr(rank_run.RankRun, "reduce_step", dying)
    k = tiny_knobs(
        train_world, "ddp-dies", DISTRIBUTED="ddp", DEVICES=2, SAVE_EVERY=1, DIST_TIMEOUT=20.0, **STEPS
    )
    with pytest.raises(DistributedError, match=r"rank 1\b"):
        train_on_devices(k)
    ckpt = Path(k["RUNS_DIR"]) / "ddp-dies" / "checkpoints" / "step_00000001"
    assert verify_checkpoint(ckpt) is None
