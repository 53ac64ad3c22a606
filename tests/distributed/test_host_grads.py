"""DDP with GRAD_OFFLOAD on 2 CPU ranks (gloo): the bucketed mean of host buffers, and gradients summed on
the host by GradOffload then averaged over the ranks equal one process's on the same global micro-step."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from kohakumoss.distributed import current
from kohakumoss.distributed.collectives import all_reduce_mean, buckets, host_group
from kohakumoss.distributed.host_grads import HostGradMean, broadcast_trainable
from kohakumoss.distributed.shard import step_shares
from kohakumoss.memory.engines.grad_offload import GradOffload
from kohakumoss.memory.engines.optimizer import PlacedOptimizer
from kohakumoss.optim.combined import CombinedOptimizer

from . import helpers as h
from .knob_run import run_knobs
from .test_engines import ALL, adapter, two_micro_steps

# sizes around the bucket (64 fp32 values): several in one bucket, one alone, one bigger than a bucket
SHAPES = [(3,), (5, 7), (64,), (200,), (1,), (2, 3, 4), (0,)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
BUCKET = 64 * 4


def buffers(rank: int, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for i, shape in enumerate(SHAPES * 2):
        dtype = DTYPES[i % len(DTYPES)]
        t = torch.randn(shape, generator=g, dtype=torch.float64) * (rank + 1)
        out.append(t.to(dtype) if i != 3 else t.to(dtype)[::2])  # one strided view among them
    return out


def on_each_rank(k: dict) -> dict:
    world = current()
    dev = k["DEVICE"]
    group = host_group(world, 60.0)  # NCCL default group: a gloo one for the host tensors
    out = {"backend": world.backend, "own_group": group is not None}
    bufs = buffers(world.rank)
    all_reduce_mean(bufs, group, bucket_bytes=BUCKET)
    out["mean"] = bufs

    # the received flags: a param with a gradient on one rank only counts on every rank
    sums = [torch.full((3,), float(world.rank + 1)), torch.zeros(2)]
    out["received"] = HostGradMean(group)(sums, [True, world.rank == 1])
    out["sums"] = sums

    # gradients summed on the host over two micro-steps, averaged over the ranks
    picks = step_shares(h.items(), world.size)[world.rank]
    for name, full in (("lora", False), ("full", True)):
        model = h.model(device=dev)
        net = model.requires_grad_(True) if full else adapter(model)
        params = [p for p in net.parameters() if p.requires_grad]
        offload = GradOffload(params)
        offload.reduce = HostGradMean(group)
        two_micro_steps(model, picks, world.size)
        out[name] = {n: s.clone() for (n, _), s in zip(named(net), offload.host_grads())}
        offload.remove()

    # rank 0's weights on every rank: the masters over the host group, the params over the default one
    model = h.model(device=dev)
    net = adapter(model)
    if world.rank == 1:
        with torch.no_grad():
            for p in net.parameters():
                p.add_(1.0)
    opt = CombinedOptimizer({"adamw": torch.optim.AdamW(list(net.parameters()), lr=1e-3)})
    streamed = next(iter(net.parameters()))  # held in a streamer's host copy: reached by the write-back
    copies = StreamedCopy(streamed)
    placed = PlacedOptimizer(opt, "host", grad_offload=GradOffload(list(net.parameters())), write_back=copies)
    broadcast_trainable(placed, group)
    out["weights"] = [p.detach().cpu().clone() for p in net.parameters()]
    out["weights"][0] = copies.host.clone()
    out["masters"] = [m.clone() for m in placed.master_params()]
    both = [None, None]
    dist.all_gather_object(both, out, group=group)  # rank 1's results come back through rank 0
    return both


class StreamedCopy:
    """A write-back that owns one parameter: its value lives in `host` (as a streamed block's does)."""

    def __init__(self, param: torch.nn.Parameter):
        self.param, self.host = param, torch.full(param.shape, float("nan"))

    def owns(self, param: torch.nn.Parameter) -> bool:
        return param is self.param

    def __call__(self, param: torch.nn.Parameter, master: torch.Tensor) -> None:
        if param is self.param:
            self.host.copy_(master)
        else:
            param.data.copy_(master)


def named(net: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in net.named_parameters() if p.requires_grad]


def launch(device: str) -> list[dict]:
    """Both ranks' results (rank 0 gathers rank 1's)."""
    k = {"DISTRIBUTED": "ddp", "DEVICES": 2, "DEVICE": device, "DIST_TIMEOUT": 60.0}
    return run_knobs(k, on_each_rank)


@pytest.fixture(scope="module")
def ranks():
    return launch("cpu")


def close(a: dict, b: dict, rtol=1e-5, atol=1e-7) -> None:
    assert a.keys() == b.keys() and a
    for n in a:
        assert torch.allclose(a[n], b[n], rtol=rtol, atol=atol), (n, (a[n] - b[n]).abs().max())


def check_mean(out: dict, rank: int) -> None:
    mine, theirs = buffers(0), buffers(1)
    assert len(out["mean"]) == len(mine)
    for got, a, b in zip(out["mean"], mine, theirs, strict=True):
        assert got.dtype == a.dtype and got.shape == a.shape
        want = ((a.double() + b.double()) / 2).to(a.dtype)
        tol = 1e-12 if a.dtype == torch.float64 else (1e-6 if a.dtype == torch.float32 else 1e-2)
        assert torch.allclose(got.double(), want.double(), rtol=tol, atol=tol), (a.dtype, got - want)
    # the check can fail: one rank's own buffers are not the mean
    own = buffers(rank)
    assert not all(torch.equal(g, a) for g, a in zip(out["mean"], own) if a.numel())


def check_grads(out: dict, device: str = "cpu") -> None:
    model = h.model(device=device)
    net = adapter(model)
    two_micro_steps(model, ALL, 1)
    close(out["lora"], h.grads(net))
    model = h.model(device=device).requires_grad_(True)
    two_micro_steps(model, ALL, 1)
    close(out["full"], h.grads(model))


def check_broadcast(out: dict, device: str = "cpu") -> None:
    net = adapter(h.model(device=device))  # rank 0's weights (rank 1 had moved its own by 1)
    for got, want, master in zip(out["weights"], net.parameters(), out["masters"], strict=True):
        assert torch.equal(got, want.detach().cpu()) and torch.equal(master, got)


def test_buckets_group_by_summing_dtype_and_size():
    bufs = buffers(0)
    runs = buckets(bufs, BUCKET)
    assert sorted(i for group in runs for i in group) == list(range(len(bufs)))
    for group in runs:
        wide = {torch.float64 if bufs[i].dtype == torch.float64 else torch.float32 for i in group}
        assert len(wide) == 1
        if len(group) > 1:
            assert sum(bufs[i].numel() for i in group) * wide.pop().itemsize <= BUCKET
    assert len(runs) < len(bufs) - 3  # flattened: fewer calls than buffers
    with pytest.raises(TypeError, match="floating"):
        all_reduce_mean([torch.zeros(2, dtype=torch.int64)])


def check_ranks(both: list[dict], device: str = "cpu") -> None:
    for rank, out in enumerate(both):
        check_mean(out, rank)
        assert out["received"] == [True, True]
        assert torch.equal(out["sums"][0], torch.full((3,), 1.5))
        check_grads(out, device)
        check_broadcast(out, device)


def test_host_group_is_the_default_gloo_one(ranks):
    assert [(o["backend"], o["own_group"]) for o in ranks] == [("gloo", False)] * 2


def test_host_buffers_become_the_mean_of_the_ranks(ranks):
    for rank, out in enumerate(ranks):
        check_mean(out, rank)
        assert out["received"] == [True, True]  # the second param had a gradient on rank 1 only
        assert torch.equal(out["sums"][0], torch.full((3,), 1.5))


def test_host_summed_gradients_averaged_equal_one_process(ranks):
    for out in ranks:
        check_grads(out)


def test_rank_zero_weights_and_masters_reach_every_rank(ranks):
    for out in ranks:
        check_broadcast(out)
