"""One copy of the host masters per node (distributed/host_share.py) on 2 CPU ranks (gloo): the ranks'
masters are one storage, each rank holds the optimizer states of its run of parameters only, the shared
steps give one process's weights, and rank 0 gathers the one-process optimizer state for a checkpoint."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from kohakumoss.distributed import current
from kohakumoss.distributed.host_share import runs, share_on_node
from kohakumoss.memory.engines.optimizer import PlacedOptimizer
from kohakumoss.optim.combined import CombinedOptimizer

from .knob_run import run_knobs

STEPS = 3


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 5), nn.Linear(5, 3))


def grads(step: int, params: list[nn.Parameter]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(10 + step)
    return [torch.randn(p.shape, generator=g) for p in params]


def placed(placement: str, model: nn.Module) -> PlacedOptimizer:
    opt = CombinedOptimizer({"adamw": torch.optim.AdamW(list(model.parameters()), lr=1e-2)})
    return PlacedOptimizer(opt, placement, chunk_bytes=64)  # 'stream': several chunks


def train(opt: PlacedOptimizer, model: nn.Module) -> None:
    params = list(model.parameters())
    for step in range(STEPS):
        for p, g in zip(params, grads(step, params), strict=True):
            p.grad = g
        opt.step()
        opt.zero_grad()


def state_elements(opt: PlacedOptimizer) -> int:
    states = (s for o in opt.optimizers.values() for s in o.state.values())
    return sum(v.numel() for s in states for v in s.values() if torch.is_tensor(v) and v.dim())


def on_each_rank(k: dict) -> dict:
    world = current()
    model = net()
    if world.rank == 1:  # rank 0's masters reach every rank
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    opt = placed(k["PLACEMENT"], model)
    share = share_on_node(opt, world, lambda: None, broadcast=True)
    masters = opt.master_params()
    out = {"mine": share.mine, "start": [m.clone() for m in masters]}

    # one storage: what rank 1 writes into a master, rank 0 reads
    dist.barrier()
    if world.rank == 1:
        masters[-1].view(-1)[0] = 1234.0
    dist.barrier()
    out["seen"] = float(masters[-1].view(-1)[0])
    dist.barrier()
    if world.rank == 1:
        masters[-1].view(-1)[0] = out["start"][-1].view(-1)[0]
    dist.barrier()

    train(opt, model)
    out["weights"] = [p.detach().clone() for p in model.parameters()]
    out["state_elements"] = state_elements(opt)
    with share.main_holds_states(opt):
        if world.rank == 0:
            out["state"] = opt.state_dict()
    out["after_save"] = state_elements(opt)  # rank 0 dropped the states it received
    both = [None, None]
    dist.all_gather_object(both, out)
    return both


@pytest.fixture(scope="module", params=["host", "stream"])
def ranks(request):
    k = {"DISTRIBUTED": "ddp", "DEVICES": 2, "DEVICE": "cpu", "DIST_TIMEOUT": 60.0}
    return request.param, run_knobs({**k, "PLACEMENT": request.param}, on_each_rank)


def test_runs_split_the_parameters_into_contiguous_balanced_runs():
    assert runs([10, 10, 10, 10], 2) == [[0, 1], [2, 3]]
    assert runs([100, 1, 1, 1], 2) == [[0], [1, 2, 3]]
    assert runs([1, 1, 1], 4) == [[0], [], [1], [2]]  # a part may be empty
    assert sorted(i for r in runs([5, 0, 7, 3, 9], 3) for i in r) == [0, 1, 2, 3, 4]


def test_the_ranks_masters_are_one_storage(ranks):
    _, (r0, r1) = ranks
    assert r0["seen"] == r1["seen"] == 1234.0  # rank 1's write, read by rank 0
    for a, b in zip(r0["start"], r1["start"], strict=True):
        assert torch.equal(a, b)  # rank 0's masters, not rank 1's (+1)
    one = [p.detach() for p in net().parameters()]
    for a, b in zip(r0["start"], one, strict=True):
        assert torch.equal(a, b)


def test_each_rank_steps_and_holds_only_its_run_and_both_train_what_one_process_does(ranks):
    placement, (r0, r1) = ranks
    sizes = [p.numel() for p in net().parameters()]
    assert r0["mine"] and r1["mine"] and sorted(r0["mine"] + r1["mine"]) == list(range(len(sizes)))
    for r in (r0, r1):  # AdamW: exp_avg and exp_avg_sq of the rank's own parameters only
        assert r["state_elements"] == 2 * sum(sizes[i] for i in r["mine"])
        assert r["after_save"] == r["state_elements"]

    model = net()
    opt = placed(placement, model)
    train(opt, model)
    for r in (r0, r1):
        for a, b in zip(r["weights"], model.parameters(), strict=True):
            assert torch.allclose(a, b.detach(), rtol=1e-6, atol=1e-7)
    # rank 0's checkpoint state is the one-process state (every parameter's AdamW states, the masters)
    want, got = opt.state_dict(), r0["state"]
    assert sorted(got["adamw"]["state"]) == sorted(want["adamw"]["state"]) == list(range(len(sizes)))
    for i, st in want["adamw"]["state"].items():
        for key, v in st.items():
            assert torch.allclose(got["adamw"]["state"][i][key], v, rtol=1e-6, atol=1e-8), (i, key)
    for a, b in zip(got["__masters__"], want["__masters__"], strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def alone_on_each_rank(k: dict) -> dict:
    world = current()
    model = net()
    opt = placed("host", model)
    share = share_on_node(opt, world, lambda: None, broadcast=True)
    train(opt, model)
    return {"shared": share is not None, "states": state_elements(opt)}


def test_without_room_in_shared_memory_every_rank_keeps_its_own_copy(monkeypatch):
    """Rank 0's node lacks the room (a container's small /dev/shm): no rank shares (the ranks' barriers
    stay matched) and each steps every parameter (the forked workers inherit the patch)."""
    from kohakumoss.distributed import host_share

    monkeypatch.setattr(host_share, "free_bytes", lambda folder: 0)
    k = {"DISTRIBUTED": "ddp", "DEVICES": 2, "DEVICE": "cpu", "DIST_TIMEOUT": 60.0}
    out = run_knobs(k, alone_on_each_rank)
    assert out == {"shared": False, "states": 2 * sum(p.numel() for p in net().parameters())}
