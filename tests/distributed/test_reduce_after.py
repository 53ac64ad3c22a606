"""DDP whose gradients are averaged after the backward, the path a graphed DDP step takes (no DDP wrapper:
each rank's micro-steps accumulate into its own `.grad` buffers, one bucketed all-reduce per step). CUDA
graphs need a GPU, so on 2 CPU ranks (gloo) the path is forced (`RankRun.REDUCE_AFTER_BACKWARD`): the
trainer logs one process's losses and gradient norms (LoRA and full fine-tune, two accumulated
micro-steps, an EMA exported) and its checkpoint resumes at world size 2 and 1; a non-finite loss on one
rank skips the step on every rank; the reduction of the `.grad` buffers equals the ranks' mean, in place."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from kohakumoss.distributed import current
from kohakumoss.distributed.collectives import host_group
from kohakumoss.distributed.rank_run import RankRun
from kohakumoss.distributed.wrap import average_grads, broadcast_params
from kohakumoss.train.loop import train_on_devices

from .knob_run import run_knobs
from .test_fsdp_trainer import same_losses
from .test_trainer import records
from .tiny import tiny_knobs, train_world  # noqa: F401 (the fixture)

STEPS = dict(STEPS=3, GRAD_ACCUM=2, LOGGERS=[], SAVE_FORMAT="hf")
CASES = {
    "lora": dict(EMA=True, EMA_WARMUP=0, EMA_DECAY=0.5, EXPORT_EMA=True),  # the exports are the EMA's
    "full": dict(ALGO="full", USE_MUON=False, LR=1e-4),
}
# sizes around the 64-value test bucket: several in one bucket, one alone, one bigger than a bucket
SHAPES = [(3,), (5, 7), (64,), (200,), (1,), (2, 3, 4)]
DTYPES = [torch.float32, torch.bfloat16, torch.float32, torch.float32, torch.float16, torch.float32]
LOGGED = "trainable gradients averaged over 2 ranks after the backward"


def params(rank: int, device: torch.device | str = "cpu") -> list[torch.nn.Parameter]:
    """Parameters whose .grad differ per rank (and whose values differ: the broadcast makes them rank 0's)."""
    g = torch.Generator().manual_seed(200 + rank)
    out = []
    for shape, dtype in zip(SHAPES, DTYPES):
        p = torch.nn.Parameter(torch.randn(shape, generator=g).to(device, dtype))
        p.grad = (torch.randn(shape, generator=g, dtype=torch.float64) * (rank + 1)).to(device, dtype)
        out.append(p)
    return out


def same_exports(one: Path, two: Path) -> None:
    names = sorted(p.name.replace(one.name, "") for p in (one / "export").iterdir())
    assert names == sorted(p.name.replace(two.name, "") for p in (two / "export").iterdir()) and names
    for name in names:
        if name.endswith(".safetensors"):
            wa, wb = (
                load_file(one / "export" / f"{one.name}{name}"),
                load_file(two / "export" / f"{two.name}{name}"),
            )
            assert wa.keys() == wb.keys() and wa
            for key in wa:
                assert (wa[key].float() - wb[key].float()).abs().max() <= 1e-5 + 1e-4 * wa[key].abs().max()


def on_each_rank(k: dict) -> dict:
    world = current()
    ps = params(world.rank, world.device)  # NCCL: on the rank's GPU
    grads = [p.grad for p in ps]
    average_grads(ps)
    out = {
        "device": str(ps[0].grad.device),
        "grads": [p.grad.cpu() for p in ps],
        "same_tensors": all(p.grad is g for p, g in zip(ps, grads)),  # what a CUDA graph writes into
    }
    broadcast_params(ps)
    out["weights"] = [p.detach().cpu() for p in ps]
    ps[world.rank].grad = None  # a parameter without a gradient (rank 0: the first, rank 1: the second)
    try:
        average_grads(ps)
    except RuntimeError as e:  # raised before any collective, on both ranks
        out["missing"] = str(e)
    both = [None, None]
    dist.all_gather_object(both, out, group=host_group(world, 60.0))  # rank 1's, back through rank 0
    return both


def launch(device: str) -> list[dict]:
    return run_knobs(
        {"DISTRIBUTED": "ddp", "DEVICES": 2, "DEVICE": device, "DIST_TIMEOUT": 60.0}, on_each_rank
    )


@pytest.fixture(scope="module")
def reduced() -> list[dict]:
    return launch("cpu")


def check_rank(out: dict, rank: int) -> None:
    a, b = params(0), params(1)
    for got, pa, pb in zip(out["grads"], a, b, strict=True):
        want = ((pa.grad.double() + pb.grad.double()) / 2).to(pa.grad.dtype)
        tol = 1e-6 if pa.grad.dtype == torch.float32 else 1e-2
        assert got.dtype == pa.grad.dtype and got.shape == pa.grad.shape
        assert torch.allclose(got.double(), want.double(), rtol=tol, atol=tol), (got - want).abs().max()
    own = params(rank)
    assert not any(torch.equal(g, p.grad) for g, p in zip(out["grads"], own))  # not the rank's own
    assert out["same_tensors"]
    for got, p in zip(out["weights"], a, strict=True):
        assert torch.equal(got, p.detach())  # rank 0's weights
    assert "1 trainable parameter(s) received no gradient" in out["missing"]


@pytest.mark.parametrize("rank", [0, 1])
def test_grad_buffers_become_the_mean_of_the_ranks_in_place(reduced, rank):
    assert reduced[rank]["device"] == "cpu"
    check_rank(reduced[rank], rank)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)
def test_grad_buffers_on_two_gpus_become_the_mean_over_nccl():
    both = launch("cuda")
    for rank, out in enumerate(both):
        assert out["device"] == f"cuda:{rank}"
        check_rank(out, rank)


@pytest.mark.parametrize("case", list(CASES))
def test_ddp_reducing_after_the_backward_trains_what_one_process_does(train_world, case, monkeypatch):  # noqa: F811
    monkeypatch.setattr(RankRun, "REDUCE_AFTER_BACKWARD", True)  # the workers are forked: it reaches them
    extra = {**STEPS, **CASES[case]}
    one = train_on_devices(tiny_knobs(train_world, f"after-{case}-one", **extra))
    two_k = tiny_knobs(train_world, f"after-{case}-two", DISTRIBUTED="ddp", DEVICES=2, SAVE_EVERY=2, **extra)
    two = train_on_devices(two_k)
    log = (two / "log.txt").read_text()
    assert LOGGED in log and "forced" in log, log
    a, b = records(one), records(two)
    assert [r["step"] for r in b] == [1, 2, 3]
    same_losses(a, b, rel=1e-5, grad_rel=1e-4)
    assert len({r["loss"] for r in b}) == 3  # the weights moved
    assert [r["loss"] for r in records(two / "ranks" / "1")] == [r["loss"] for r in b]
    same_exports(one, two)

    ckpt = str(two / "checkpoints" / "step_00000002")
    resumed = train_on_devices(tiny_knobs(train_world, f"after-{case}-resumed", RESUME=ckpt, **extra))
    assert [r["step"] for r in records(resumed)] == [3]
    assert records(resumed)[0]["loss"] == pytest.approx(a[-1]["loss"], rel=1e-5)
    again = train_on_devices(
        tiny_knobs(train_world, f"after-{case}-again", RESUME=ckpt, DISTRIBUTED="ddp", DEVICES=2, **extra)
    )
    assert LOGGED in (again / "log.txt").read_text()
    assert records(again)[0]["loss"] == pytest.approx(b[-1]["loss"], rel=1e-6)


def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(train_world, monkeypatch):  # noqa: F811
    """Rank 1's loss turns NaN in step 2 (its third micro-step): every rank skips that step (the losses
    agree after each micro-step, eagerly; the averaged NaN gradients are skipped on the device) and the
    run logs what one process logs when its step 2 is NaN."""
    from kohakumoss.train import trainer as ttrainer

    real, calls = ttrainer.flow_loss, [0]

    def flaky(*a, **kw):
        calls[0] += 1
        loss = real(*a, **kw)
        rank = dist.get_rank() if dist.is_initialized() else 1
        return loss * float("nan") if rank == 1 and calls[0] == 3 else loss

    monkeypatch.setattr(ttrainer, "flow_loss", flaky)
    monkeypatch.setattr(RankRun, "REDUCE_AFTER_BACKWARD", True)
    extra = dict(STEPS=4, GRAD_ACCUM=2, LOGGERS=[], MAX_BAD_STEPS=2)
    one = train_on_devices(tiny_knobs(train_world, "after-nan-one", **extra))
    calls[0] = 0  # the workers fork from here: each counts its own calls
    two = train_on_devices(tiny_knobs(train_world, "after-nan-two", DISTRIBUTED="ddp", DEVICES=2, **extra))
    for folder in (one, two, two / "ranks" / "1"):
        assert "non-finite loss or gradients, step skipped (1 in a row)" in (folder / "log.txt").read_text()
    a, b = records(one), records(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 3, 4]
    for ra, rb in zip(a, b, strict=True):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-4)
