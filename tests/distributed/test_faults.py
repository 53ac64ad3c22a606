"""A rank that dies or hangs stops every rank within a bounded time, with a message naming it."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from kohakumoss.distributed import DistributedError, current
from kohakumoss.distributed.world import beat

from .knob_run import run_knobs

TIMEOUT_S = 3.0


def steps_then(k: dict) -> int:
    """All-reduce a step counter; rank 1 dies or hangs after finishing step 1."""
    world = current()
    for step in range(20):
        if world.rank == 1 and step == 2:
            if k["FAULT"] == "die":
                os._exit(3)
            time.sleep(120)  # hung: never reaches the collective
        t = torch.ones(1, device=k["DEVICE"])
        dist.all_reduce(t)
        if t.is_cuda:  # NCCL queues the collective: wait for it, as a training step's host read does
            torch.cuda.synchronize()
        beat(world, step)
    return step


@pytest.mark.parametrize("fault", ["die", "hang"])
def test_a_lost_rank_stops_the_others_naming_it(fault):
    k = {"DISTRIBUTED": "ddp", "DEVICES": 2, "DEVICE": "cpu", "DIST_TIMEOUT": TIMEOUT_S, "FAULT": fault}
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match=r"rank 1\b") as info:
        run_knobs(k, steps_then)
    elapsed = time.monotonic() - t0
    assert elapsed < 60, elapsed  # bounded: start-up, the collective timeout, the naming grace, the stop
    if fault == "hang":  # rank 0 timed out and named the rank that never answered
        assert "rank 1 (last finished step 1) stopped answering" in str(info.value)


def test_without_faults_every_rank_finishes():
    k = {"DISTRIBUTED": "ddp", "DEVICES": 2, "DEVICE": "cpu", "DIST_TIMEOUT": TIMEOUT_S, "FAULT": "none"}
    assert run_knobs({**k, "FAULT": "none"}, _fine) == 19


def _fine(k: dict) -> int:
    world = current()
    for step in range(20):
        dist.all_reduce(torch.ones(1))
        beat(world, step)
    return step


def test_a_rank_that_never_joins_is_named_and_says_where_it_hangs(monkeypatch, capfd):
    """Rank 1 hangs before joining the group (the workers are forked: the patch reaches them): rank 0's
    rendezvous times out naming it, and rank 1 prints its stack when the launcher stops it."""
    from kohakumoss.distributed import world as world_module

    join = world_module.join_group

    def stuck_before_joining(backend, rank, *args):
        if rank == 1:
            time.sleep(120)
        return join(backend, rank, *args)

    monkeypatch.setattr(world_module, "join_group", stuck_before_joining)
    k = {"DISTRIBUTED": "ddp", "DEVICES": 2, "DEVICE": "cpu", "DIST_TIMEOUT": TIMEOUT_S, "FAULT": "none"}
    t0 = time.monotonic()
    with pytest.raises(
        DistributedError,
        match=r"rank 0 failed first \(DistributedError: rank 1 never joined the process group",
    ):
        run_knobs(k, _fine)
    assert time.monotonic() - t0 < 60
    assert "in stuck_before_joining" in capfd.readouterr().err  # rank 1's stack, dumped on SIGTERM
