"""The process group of one worker: who it is (rank, world size, device), set up and torn down.

The variables are torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT), set
equally by an external `torchrun` and by `launch.py`'s own elastic launcher, so a worker runs the same
code under both. NCCL on GPUs, gloo on CPUs; every collective carries a timeout, so a rank that hangs
stops the others within that time instead of leaving them waiting forever.
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kohakumoss_common.errors import ConfigError, KohakuMossError

from .config import DEFAULT_TIMEOUT_S

ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class DistributedError(KohakuMossError):
    """A rank stopped (died, hung or failed): the message names it."""


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    local_size: int
    device: torch.device
    backend: str  # "nccl" or "gloo"; "" for a single process without a group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1 or self.backend != ""


SINGLE = World(0, 1, 0, 1, torch.device("cpu"), "")


def launched_externally() -> bool:
    """True inside a worker started by torchrun (or by launch.py): the rank variables are set."""
    return all(v in os.environ for v in ENV)


def env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ConfigError("DISTRIBUTED", f"${name} is not set: start the workers with torchrun")
        return default
    try:
        return int(value)
    except ValueError as e:
        raise ConfigError("DISTRIBUTED", f"${name}={value!r} is not an integer") from e


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def setup(local_devices: list[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> World:
    """Join the process group described by the environment; `local_devices[LOCAL_RANK]` is this rank's device."""
    rank, size = env_int("RANK"), env_int("WORLD_SIZE")
    local_rank = env_int("LOCAL_RANK")
    local_size = env_int("LOCAL_WORLD_SIZE", len(local_devices))
    if local_size != len(local_devices):
        raise ConfigError(
            "DEVICES",
            f"{len(local_devices)} device(s) {local_devices} for {local_size} workers on this node "
            "(torchrun --nproc-per-node must match DEVICES)",
        )
    device = torch.device(local_devices[local_rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before any CUDA work: NCCL and the caching allocator bind to it
    backend = backend_for(device)
    if not dist.is_initialized():
        join_group(backend, rank, size, device, timeout_s)
    world = World(rank, size, local_rank, local_size, device, backend)
    beat(world, -1)
    return world


def join_group(backend: str, rank: int, size: int, device: torch.device, timeout_s: float) -> None:
    """init_process_group as env:// does it, with each rank marked in the store first: when the group's
    rendezvous times out, the error names the ranks that never came (hung or died while starting)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, size = next(dist.rendezvous("env://", rank, size, timeout=timeout))
    store.set_timeout(timeout)
    mark = f"kohakumoss/joined/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    store.set(f"{mark}/{rank}", "1")
    try:
        dist.init_process_group(
            backend,
            store=dist.PrefixStore("default_pg", store),  # env://'s prefix: the same keys as without us
            rank=rank,
            world_size=size,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )
    except dist.DistError as e:
        missing = [r for r in range(size) if not store.check([f"{mark}/{r}"])]
        if not missing:
            raise
        names = ", ".join(f"rank {r}" for r in missing)
        raise DistributedError(
            f"{names} never joined the process group within DIST_TIMEOUT={timeout_s:g} s (hung or died "
            f"while starting; the launcher prints a hung rank's stack when it stops it); rank {rank} saw: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from e


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _store():
    return dist.distributed_c10d._get_default_store()


def beat(world: World, step: int) -> None:
    """Record that this rank reached `step` (in the launcher's store, which outlives any worker)."""
    if world.distributed and dist.is_initialized():
        _store().set(f"kohakumoss/step/{world.rank}", str(step))


def _read(store, key: str) -> str | None:
    return store.get(key).decode() if store.check([key]) else None


def silent_ranks(world: World, grace_s: float = 3.0) -> list[int]:
    """The ranks that did not report a failed collective within `grace_s`: the dead or hung ones.

    Every rank that sees a collective fail marks itself in the store, then waits for the others' marks."""
    store = _store()
    store.set(f"kohakumoss/fault/{world.rank}", "1")
    deadline = time.monotonic() + grace_s
    while True:
        silent = [r for r in range(world.size) if _read(store, f"kohakumoss/fault/{r}") is None]
        if not silent or time.monotonic() > deadline:
            return silent
        time.sleep(0.05)


def fault_message(world: World, error: BaseException, grace_s: float = 3.0) -> str:
    """'rank R stopped answering after step S': who stopped the run, read from the launcher's store."""
    try:
        silent = silent_ranks(world, grace_s)
        store = _store()
        steps = {r: _read(store, f"kohakumoss/step/{r}") for r in silent}
    except Exception:  # the store itself is gone (the launcher died): say what this rank saw
        return f"rank {world.rank}: a collective failed and the rendezvous store is unreachable ({error})"
    if not silent:
        return f"rank {world.rank}: a collective failed on every rank ({error})"
    names = ", ".join(f"rank {r} (last finished step {steps[r]})" for r in silent)
    return f"{names} stopped answering (died, hung or timed out); rank {world.rank} saw: {error}"
