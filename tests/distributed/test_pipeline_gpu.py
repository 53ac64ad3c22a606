"""The pipeline engines on 2 GPUs (NCCL between ranks; the threaded one across cuda:0 and cuda:1): the
CPU tests' checks, on CUDA, against one process. Skipped with fewer than 2 GPUs."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.config.train import TrainConfig
from kohakumoss.distributed.pipeline import stage_starts
from kohakumoss.distributed.threaded import ThreadedEngine
from kohakumoss.train.loop import train_on_devices

from ..trainer.conftest import tiny_knobs, train_world  # noqa: F401 (the fixture)
from . import test_pipeline as tp
from .knob_run import run_knobs
from .test_engines import close
from .test_fsdp_trainer import same_losses
from .test_trainer import records

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
    ),
]


def near(result, full: bool) -> None:
    """The stages ran on GPUs, the reference on the CPU: fp32 within GPU tolerance."""
    losses, grads = result
    ref_losses, ref_grads = tp.one_process(full)
    print("pipeline:", losses, "one process:", ref_losses)
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    close(grads, ref_grads, rtol=1e-3, atol=1e-5)


@pytest.fixture(scope="module")
def ranks():
    k = {"DISTRIBUTED": "pipeline", "DEVICES": 2, "DEVICE": "cuda", "DIST_TIMEOUT": 120.0}
    return run_knobs(k, tp.on_each_rank)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_pipeline_on_two_gpus_equals_one_process(ranks, schedule):
    near(ranks[(schedule, False)], full=False)


def test_pipeline_full_finetune_on_two_gpus_equals_one_process(ranks):
    near(ranks[("1f1b", True)], full=True)


def test_threaded_on_two_gpus_equals_one_process():
    for full in (False, True):

        def engine_of(m, net, loss, prediction):
            starts = stage_starts(tp.CFG.depth, 2)
            return ThreadedEngine(
                m, net, starts, ["cuda:0", "cuda:1"], 2, torch.float32, loss, prediction, tp.ACCUM, "token"
            )

        near(tp.pipelined(engine_of, full), full)


@pytest.mark.parametrize(
    "mode", [dict(DISTRIBUTED="pipeline", DEVICES=2), dict(DISTRIBUTED="threaded", DEVICES=[0, 1])]
)
def test_trainer_pipelines_on_two_gpus_log_the_losses_of_one(train_world, mode):  # noqa: F811
    """The trainer end to end (fp32, eager ops, tiny model) against one GPU."""
    base = dict(DEVICE="cuda", STEPS=3, GRAD_ACCUM=2, LOGGERS=[], SAVE_FORMAT="both", SAVE_EVERY=2)
    name = mode["DISTRIBUTED"]
    one = train_on_devices(tiny_knobs(train_world, f"gpu-{name}-one", **base))
    two = train_on_devices(tiny_knobs(train_world, f"gpu-{name}-two", **mode, **base))
    a, b = records(one), records(two)
    print(f"{name}: one GPU", [r["loss"] for r in a], "two GPUs", [r["loss"] for r in b])
    same_losses(a, b, rel=1e-3)


def test_threaded_build_puts_each_stage_on_its_gpu_and_samples_across_them():
    """DISTRIBUTED='threaded' over cuda:0 / cuda:1: each stage's parameters materialized on its own GPU
    (none on the meta device, none elsewhere), the values the one-GPU build's; the backbone's forward
    through spread_forward equals the one-GPU forward."""
    from kohakumoss.distributed.materialize import stage_bytes, staged_backbone
    from kohakumoss.distributed.pipeline import owner_stage
    from kohakumoss.distributed.threaded import spread_forward

    from .test_materialize import KNOBS, build_backbone

    knobs = {
        **KNOBS,
        "MODEL_PRESET": "tiny",
        "DISTRIBUTED": "threaded",
        "DEVICES": [0, 1],
        "DEVICE": "cuda:0",
    }
    cuda = torch.device("cuda:0")
    model = staged_backbone(TrainConfig.from_knobs(knobs), None, cuda, torch.float32, False, "eager")
    one = build_backbone({**knobs, "DISTRIBUTED": "none"}, cuda, torch.float32, False, draw=cuda)
    starts = stage_starts(model.config.depth, 2)
    for name, p in model.named_parameters():
        assert p.device == torch.device(f"cuda:{owner_stage(name, starts)}"), name
        assert torch.equal(p.cpu(), dict(one.named_parameters())[name].cpu()), name
    held = stage_bytes(model)
    whole = sum(held.values())
    print("threaded build on 2 GPUs:", {d: f"{n / 2**20:.1f} MiB" for d, n in held.items()})
    assert set(held) == {"cuda:0", "cuda:1"} and max(held.values()) < whole
    batch, sigma, _ = tp.draws(0)
    cfg = model.config
    x0 = torch.randn(batch.x0.shape[0], cfg.in_channels, generator=torch.Generator().manual_seed(3))
    text = torch.randn(batch.text.shape[0], cfg.text_dim, generator=torch.Generator().manual_seed(4))
    args = (x0.to(cuda), text.to(cuda), sigma.to(cuda), batch.seq.to(cuda))
    with torch.no_grad():
        want = one(*args)
        with spread_forward(model, None, starts, ["cuda:0", "cuda:1"]):
            got = model(*args)
    assert got.device == cuda
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_trainer_threaded_on_two_gpus_samples_and_validates_as_one(train_world):  # noqa: F811
    """The trainer under 'threaded' over 2 GPUs: the validation losses and sample rows of one GPU."""
    import numpy as np
    from PIL import Image

    base = dict(
        DEVICE="cuda", STEPS=1, GRAD_ACCUM=1, LOGGERS=[], SAMPLE_PROMPTS=["a cat"], VAL_ITEMS=1, VAL_EVERY=1
    )
    one = train_on_devices(tiny_knobs(train_world, "gpu-th-sample-one", **base))
    two = train_on_devices(
        tiny_knobs(train_world, "gpu-th-sample-two", DISTRIBUTED="threaded", DEVICES=[0, 1], **base)
    )
    a, b = records(one), records(two)
    assert [r["val_loss"] for r in b] == pytest.approx([r["val_loss"] for r in a], rel=1e-3)
    for row in ("base/base_00.png", "step_00000001/sample_00.png"):
        x, y = (np.asarray(Image.open(d / "samples" / row), dtype=np.int16) for d in (one, two))
        print(row, "max pixel difference", np.abs(x - y).max())
        assert np.abs(x - y).max() <= 2, row
