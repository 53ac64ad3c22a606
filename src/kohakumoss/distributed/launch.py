"""Start the workers: the train script's own elastic launcher, or join the ones torchrun started.

    run(par, device, fn)  # par: the run's DistributedConfig, device: its DEVICE; DISTRIBUTED='none':
                          # fn(device) here; else one worker per DEVICES entry, or this process as
                          # one rank when torchrun set RANK / WORLD_SIZE / LOCAL_RANK

Each worker joins the process group (world.py), finds its World with `current()`, and runs `fn(device)`
with its own device ('cuda:1', 'cpu'); the caller makes that rank's config of it (train/loop.py). A worker
whose collective fails raises a DistributedError naming the rank(s) that stopped answering; the launcher
stops the others (SIGTERM, then SIGKILL) and re-raises the first failure. A rank prints every thread's
Python stack when stopped, so one that hung says where.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from kohakumoss_common.errors import KohakuMossError
from kohakumoss_common.log import get_logger

from .config import DistributedConfig, check_knobs, worker_devices
from .world import (
    SINGLE,
    DistributedError,
    World,
    fault_message,
    launched_externally,
    setup,
    teardown,
)

log = get_logger(__name__)
_CURRENT: World = SINGLE
T = TypeVar("T")


def current() -> World:
    """This process's World (SINGLE outside a distributed run)."""
    return _CURRENT


def is_collective_failure(error: BaseException) -> bool:
    """A lost peer or a timed-out collective (gloo and NCCL word these differently), not a bug of ours."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error)
    words = (
        "Connection closed by peer",
        "Connection reset",
        "Timed out",
        "timed out",
        "NCCL",
        "Gloo",
        "gloo",
    )
    return isinstance(error, RuntimeError) and any(w in text for w in words)


def stacks_on_stop() -> None:
    """On SIGTERM (the launcher stopping this rank) print every thread's stack to stderr, then run the
    handler there was: a rank stuck in C never reaches a Python handler, and its stack is the diagnosis."""
    if sys.__stderr__ is not None:  # no signals here (Windows, not the main thread): nothing to register
        with contextlib.suppress(AttributeError, OSError, ValueError):
            faulthandler.register(signal.SIGTERM, file=sys.__stderr__, all_threads=True, chain=True)


@record  # the launcher reads a failed worker's error from the file this writes
def worker(fn: Callable[[str], T], devices: list[str], timeout_s: float) -> T:
    """One rank: join the group, run fn(device) on this rank's device, leave the group."""
    global _CURRENT
    stacks_on_stop()
    world = setup(devices, timeout_s)
    if world.device.type == "cpu":  # CPU workers share the node's cores instead of each taking all
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world.local_size))
    _CURRENT = world
    if world.rank:  # one console: other ranks print warnings and errors (their whole log: ranks/<rank>/)
        for handler in logging.getLogger("kohakumoss").handlers:
            if type(handler) is logging.StreamHandler:
                handler.setLevel(logging.WARNING)
    try:
        return fn(str(world.device))
    except KohakuMossError:
        raise
    except Exception as e:
        if world.size > 1 and is_collective_failure(e):
            raise DistributedError(fault_message(world, e)) from e
        raise
    finally:
        _CURRENT = SINGLE
        teardown()
        if hasattr(faulthandler, "unregister"):
            faulthandler.unregister(signal.SIGTERM)


def launch(
    fn: Callable[..., Any], args: tuple, nprocs: int, start_method: str = "spawn", monitor_s: float = 0.2
) -> dict[int, Any]:
    """Run fn(*args) in `nprocs` local worker processes through torch's elastic launcher; {rank: result}."""
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        run_id=f"kohakumoss-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=monitor_s,
        start_method=start_method,
    )
    if start_method == "fork":  # a forked child must not collect the parent's garbage (torch objects of
        gc.collect()  # an earlier launch crashed a child's first collection)
    try:
        return elastic_launch(config, fn)(*args)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        raise DistributedError(
            f"rank {rank} failed first ({failure_text(failure)}); the others were stopped"
        ) from e


def failure_text(failure) -> str:
    """A failed worker's own error (written by @record), else how its process ended."""
    if failure.error_file_data:
        message = failure.message
        if isinstance(message, dict):
            message = message.get("message", "")
        return str(message).strip().splitlines()[0] if message else f"exit code {failure.exitcode}"
    if failure.exitcode < 0:
        return f"killed by {failure.signal_name()}"
    return f"exited with code {failure.exitcode} without a Python error"


def run(par: DistributedConfig, device: str, fn: Callable[[str], T]) -> T:
    """fn(device) as DISTRIBUTED and DEVICES say (`par`, the run's section), `device` the run's DEVICE
    ('auto', 'cpu', 'cuda', 'cuda:N'): here, or in every worker with the worker's own device (spawned
    workers unpickle `fn`: a module-level function or a partial of one); returns rank 0's result."""
    mode, devices = par.distributed, par.devices
    check_knobs(mode, devices)
    if mode in ("none", "threaded"):  # threaded: one process, a thread per stage (distributed/threaded.py)
        return fn(device)
    timeout_s = float(par.dist_timeout)
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = worker_devices(devices, device, visible)
    if launched_externally():  # torchrun started this process as one rank
        if isinstance(devices, int) and devices == 0 and names[0] != "cpu":
            names = names[: int(os.environ.get("LOCAL_WORLD_SIZE", len(names)))]
        return worker(fn, names, timeout_s)
    log.info(f"DISTRIBUTED='{mode}': starting {len(names)} workers on {', '.join(names)}")
    # forking is quick and safe while this process has touched no GPU; CUDA workers are spawned
    method = "fork" if all(n == "cpu" for n in names) else "spawn"
    return launch(worker, (fn, names, timeout_s), len(names), method)[0]
