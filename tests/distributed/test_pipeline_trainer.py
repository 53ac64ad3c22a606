"""The trainer with DISTRIBUTED='pipeline' (2 CPU ranks, gloo) and 'threaded' (one process, two CPU
stages) against one process: the same losses, gradient norms and exports, a checkpoint resumed at the
same stage count replaying the run, and the refused combinations named by their knob."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from kohakumoss.cli.config_check import check_config
from kohakumoss.distributed.rank_run import pipeline_plan_problem
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.train.loop import train_on_devices
from kohakumoss_common.errors import ConfigError

from .test_fsdp_trainer import same_files, same_losses
from .test_trainer import records
from .tiny import tiny_knobs, train_world  # noqa: F401 (the fixture)

STEPS = dict(STEPS=3, GRAD_ACCUM=2, LOGGERS=[], SAVE_EVERY=2, SAVE_FORMAT="both")
PIPELINE = dict(DISTRIBUTED="pipeline", DEVICES=2, DIST_TIMEOUT=120.0)


@pytest.fixture(scope="module")
def lora_one(train_world):  # noqa: F811
    return train_on_devices(tiny_knobs(train_world, "pp-lora-one", **STEPS))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_lora_trains_what_one_process_does(train_world, lora_one, schedule):  # noqa: F811
    """Losses, gradient norms (clipped by every stage's gradients), counts and the exported files of one
    process; the step-2 checkpoint (the one-process format, gathered on rank 0) resumed on 2 ranks
    replays step 3."""
    extra = dict(PIPELINE_SCHEDULE=schedule, **PIPELINE, **STEPS)
    two = train_on_devices(tiny_knobs(train_world, f"pp-lora-{schedule}", **extra))
    log = (two / "log.txt").read_text()
    assert "pipeline: 2 stages (blocks 0-1, 2-3)" in log and "CUDA graphs off" in log
    a, b = records(lora_one), records(two)
    same_losses(a, b)
    assert len({r["loss"] for r in b}) == 3  # the adapter moved
    assert all(len(r["peak_mem_gib_ranks"]) == 2 for r in b)  # each stage's rank
    same_files(lora_one / "export", two / "export", "pp-lora-one", f"pp-lora-{schedule}")
    ckpt = two / "checkpoints" / "step_00000002"
    again = train_on_devices(tiny_knobs(train_world, f"pp-again-{schedule}", RESUME=str(ckpt), **extra))
    same_losses(b[-1:], records(again), rel=1e-6)
    if schedule == "gpipe":  # the one-process format: it resumes in one process too
        alone = train_on_devices(tiny_knobs(train_world, "pp-alone", RESUME=str(ckpt), **STEPS))
        same_losses(records(lora_one)[-1:], records(alone))


def test_threaded_trains_what_one_process_does(train_world, lora_one):  # noqa: F811
    extra = dict(DISTRIBUTED="threaded", DEVICES=["cpu", "cpu"], PIPELINE_CHUNKS=2, **STEPS)
    two = train_on_devices(tiny_knobs(train_world, "th-lora", **extra))
    assert "pipeline: 2 stages (blocks 0-1, 2-3) on cpu, cpu" in (two / "log.txt").read_text()
    same_losses(records(lora_one), records(two))
    assert all(len(r["peak_mem_gib_ranks"]) == 2 for r in records(two))  # each stage's device
    same_files(lora_one / "export", two / "export", "pp-lora-one", "th-lora")


def pixels(path):
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)


def test_threaded_samples_and_validates_as_one_process(train_world):  # noqa: F811
    """The sampler and the validation loss call the backbone's own forward across the stages' devices
    (threaded.spread_forward): the base row, the final row and the validation loss of one process."""
    extra = dict(
        STEPS=1, GRAD_ACCUM=1, LOGGERS=[], SAMPLE_PROMPTS=["a cat", "a dog"], VAL_ITEMS=1, VAL_EVERY=1
    )
    one = train_on_devices(tiny_knobs(train_world, "th-sample-one", **extra))
    split = dict(DISTRIBUTED="threaded", DEVICES=["cpu"] * 3, PIPELINE_SPLIT=[0, 1, 3], PIPELINE_CHUNKS=2)
    two = train_on_devices(tiny_knobs(train_world, "th-sample-two", **split, **extra))
    a, b = records(one), records(two)
    same_losses(a, b)
    assert b and all("val_loss" in r for r in b)
    assert [r["val_loss"] for r in b] == pytest.approx([r["val_loss"] for r in a], rel=1e-5)
    rows = [f"{d}_{i:02d}.png" for d in ("base/base", "step_00000001/sample") for i in range(2)]
    for row in rows:
        x, y = pixels(one / "samples" / row), pixels(two / "samples" / row)
        assert np.abs(x - y).max() <= 1, row  # 8-bit images of the same fp32 forward
    assert (two / "samples" / "grid_step_00000001.png").is_file()
    # the check can fail: another prompt's image differs
    assert np.abs(pixels(one / "samples" / rows[0]) - pixels(two / "samples" / rows[1])).max() > 1


def test_pipeline_full_finetune_trains_what_one_process_does(train_world):  # noqa: F811
    extra = dict(ALGO="full", LR=1e-4, USE_MUON=False, STEPS=2, GRAD_ACCUM=2, LOGGERS=[], SAVE_FORMAT="both")
    one = train_on_devices(tiny_knobs(train_world, "pp-full-one", **extra))
    two = train_on_devices(
        tiny_knobs(train_world, "pp-full-two", PIPELINE_SCHEDULE="1f1b", **PIPELINE, **extra)
    )
    same_losses(records(one), records(two))
    same_files(one / "export", two / "export", "pp-full-one", "pp-full-two")


def test_pipeline_refusals_name_the_knob(train_world):  # noqa: F811
    refused = [
        (dict(CUDA_GRAPHS="on"), "CUDA_GRAPHS: 'on' with DISTRIBUTED"),
        (dict(PRECISION="fp16"), "PRECISION: 'fp16' with DISTRIBUTED='pipeline'"),
        (dict(BASE_PRECISION="int8_weight"), "BASE_PRECISION: 'int8_weight' with DISTRIBUTED='pipeline'"),
        (dict(EMA=True), "EMA: True with DISTRIBUTED='pipeline'"),
        (dict(ALGO="dora"), "ALGO: DoRA with DISTRIBUTED='pipeline'"),
        (dict(ALGO_ARGS={"dora_wd": True}), "ALGO_ARGS: DoRA with DISTRIBUTED='pipeline'"),
        (dict(STREAM_BLOCKS=1), "STREAM_BLOCKS: 1 with DISTRIBUTED='pipeline'"),
        (dict(OPTIMIZER_PLACEMENT="host"), "OPTIMIZER_PLACEMENT: 'host' with DISTRIBUTED='pipeline'"),
        (dict(OPTIMIZER="prodigy"), "OPTIMIZER: 'prodigy' with DISTRIBUTED='pipeline'"),
        (
            dict(SAMPLE_PROMPTS=["a cat"]),
            "SAMPLE_PROMPTS: set with DISTRIBUTED='pipeline'.*'threaded'.*sample.py",
        ),
        (dict(VAL_ITEMS=1), "VAL_ITEMS: 1 with DISTRIBUTED='pipeline'.*DISTRIBUTED='threaded'"),
        (dict(PIPELINE_SPLIT=[0, 5]), r"PIPELINE_SPLIT: \[0, 5\]: block 5 is past the backbone's last block"),
        (dict(PIPELINE_SPLIT=[0, 1, 1]), "PIPELINE_SPLIT: .* must increase"),
        (dict(PIPELINE_SCHEDULE="1f1b", PIPELINE_CHUNKS=1), "PIPELINE_CHUNKS: 1 micro-batches for 2 stages"),
    ]
    for knobs, message in refused:
        with pytest.raises(ConfigError, match=message):
            train_on_devices(tiny_knobs(train_world, "no", **PIPELINE, **knobs))
    with pytest.raises(ConfigError, match="EMA: True with DISTRIBUTED='threaded'"):
        train_on_devices(tiny_knobs(train_world, "no", DISTRIBUTED="threaded", DEVICES=2, EMA=True))
    with pytest.raises(ConfigError, match="PIPELINE_SCHEDULE: '1f1b' with DISTRIBUTED='threaded'"):
        train_on_devices(
            tiny_knobs(train_world, "no", DISTRIBUTED="threaded", DEVICES=2, PIPELINE_SCHEDULE="1f1b")
        )
    with pytest.raises(
        ConfigError, match="PIPELINE_SPLIT: \\[0, 1\\] with DISTRIBUTED='ddp': only the pipelines"
    ):
        train_on_devices(tiny_knobs(train_world, "no", DISTRIBUTED="ddp", DEVICES=2, PIPELINE_SPLIT=[0, 1]))
    # the data plan is checked in the worker: a micro-batch per micro-step needs an image of its own
    with pytest.raises(Exception, match="PIPELINE_CHUNKS: micro-step 0 of the plan holds 2 image"):
        train_on_devices(tiny_knobs(train_world, "no", PIPELINE_CHUNKS=3, **PIPELINE))
    # a plan resolved from MEMORY_PROFILE is checked in the worker, naming the engine's knob
    assert pipeline_plan_problem(MemoryPlan(stream_blocks=-1), "pipeline")[0] == "STREAM_BLOCKS"
    assert pipeline_plan_problem(MemoryPlan(grad_offload=True, optimizer="host"), "threaded")[0] in (
        "GRAD_OFFLOAD",
        "OPTIMIZER_PLACEMENT",
    )
    assert pipeline_plan_problem(MemoryPlan(checkpointing="attn"), "pipeline") is None


def test_config_check_catches_a_bad_split(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("MODEL_PRESET = 'tiny'\nDISTRIBUTED = 'pipeline'\nDEVICES = 2\nPIPELINE_SPLIT = [0, 9]\n")
    found = check_config(path, kind="train").problems
    assert any(k == "PIPELINE_SPLIT" and "past the backbone's last block" in why for k, why in found), found
    path.write_text(
        "MODEL_PRESET = 'tiny'\nDISTRIBUTED = 'pipeline'\nDEVICES = 2\nPIPELINE_SPLIT = [0, 1, 1]\n"
    )
    found = check_config(path, kind="train").problems
    assert any(k == "PIPELINE_SPLIT" and "must increase" in why for k, why in found), found
    path.write_text("MODEL_PRESET = 'tiny'\nDISTRIBUTED = 'pipeline'\nDEVICES = 2\nPIPELINE_SPLIT = [0, 1]\n")
    assert not [p for p in check_config(path, kind="train").problems if p[0].startswith(("PIPELINE", "DIST"))]


@pytest.mark.parametrize("algo", ["lokr", "glora", "oft"])
def test_pipeline_trains_other_adapters_as_one_process(train_world, algo):  # noqa: F811
    """LyCORIS algorithms other than LoRA attach to the staged build (other stages' weights on the meta
    device) and train as one process does; DoRA, which reads them, is refused above."""
    steps = dict(STEPS=2, GRAD_ACCUM=1, LOGGERS=[], SAVE_EVERY=0, ALGO=algo)
    one = train_on_devices(tiny_knobs(train_world, f"pp-{algo}-one", **steps))
    two = train_on_devices(tiny_knobs(train_world, f"pp-{algo}-two", **PIPELINE, **steps))
    same_losses(records(one), records(two))
