"""The distributed knobs: DISTRIBUTED (which engine), DEVICES (how many workers, on which devices), the
collectives' timeout and the pipelines' split, schedule and chunks, as `DistributedConfig` (a section of
`TrainConfig`, config/train.py composes it), with their checks.

Pure checks, no process group: `kohakumoss-config check` and the train script's schema call them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kohakumoss_common.errors import ConfigError
from kohakumoss_common.typed_config import knob

DEFAULT_TIMEOUT_S = 1800.0  # DIST_TIMEOUT's default: what a collective waits for a missing rank
# every engine the issue names; only BUILT ones are accepted, the others are refused by name
MODES = ("none", "ddp", "fsdp", "pipeline", "threaded")
BUILT = MODES
NOT_BUILT: dict[str, str] = {}


def mode_problem(mode: Any) -> str | None:
    """Why DISTRIBUTED=`mode` cannot run, or None."""
    if mode not in MODES:
        return f"{mode!r} is not one of {list(MODES)}"
    return NOT_BUILT.get(mode)


def devices_problem(devices: Any, mode: str = "ddp") -> str | None:
    """Why DEVICES=`devices` is malformed for DISTRIBUTED=`mode`, or None.

    DEVICES is a count (0: every visible GPU of the node) or a list of devices ('cuda:0', 2, 'cpu')."""
    if isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        return f"expected a count or a list of devices, got {type(devices).__name__} {devices!r}"
    if isinstance(devices, int):
        if devices < 0:
            return f"{devices} is below 0 (0: every visible GPU)"
        if mode == "none" and devices != 1:
            return f"{devices} workers asked for with DISTRIBUTED='none'; set DISTRIBUTED='ddp' or 'fsdp'"
        return None
    if not devices:
        return "an empty list; give a count or at least one device"
    try:
        names = [device_name(d) for d in devices]
    except ValueError as e:
        return str(e)
    cuda = [n for n in names if n != "cpu"]
    if len(set(cuda)) != len(cuda):
        return f"a GPU is listed twice in {list(devices)} (one worker per GPU)"
    if cuda and len(cuda) != len(names):
        return f"{list(devices)} mixes CPU and GPU workers"
    if mode == "none":
        return f"{list(devices)} with DISTRIBUTED='none' (DEVICE picks the one device); set DISTRIBUTED='ddp'"
    return None


def device_name(device: Any) -> str:
    """'cuda:N' or 'cpu' for an int, 'cuda:N', 'cuda' (cuda:0) or 'cpu' entry of DEVICES."""
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return f"cuda:{device}"
    if device == "cpu":
        return "cpu"
    if isinstance(device, str) and device.startswith("cuda"):
        index = device[5:] if device.startswith("cuda:") else ("0" if device == "cuda" else "x")
        if index.isdigit():
            return f"cuda:{int(index)}"
    raise ValueError(f"{device!r} is not a device (an index, 'cuda:N' or 'cpu')")


def check_knobs(mode: Any, devices: Any) -> None:
    """Raise ConfigError naming DISTRIBUTED or DEVICES when they cannot run."""
    if problem := mode_problem(mode):
        raise ConfigError("DISTRIBUTED", problem)
    if problem := devices_problem(devices, mode):
        raise ConfigError("DEVICES", problem)


def worker_devices(devices: int | list, device_knob: str, visible_gpus: int) -> list[str]:
    """One device name per local worker: DEVICES resolved against DEVICE and the GPUs this node sees."""
    if isinstance(devices, (list, tuple)):
        names = [device_name(d) for d in devices]
        for n in names:
            if n != "cpu" and int(n[5:]) >= visible_gpus:
                raise ConfigError("DEVICES", f"{n} asked for, but this node sees {visible_gpus} GPU(s)")
        return names
    on_cpu = device_knob == "cpu" or (device_knob == "auto" and visible_gpus == 0)
    if on_cpu:
        if devices == 0:
            raise ConfigError("DEVICES", "0 (every GPU) on the CPU: give the number of CPU workers")
        return ["cpu"] * devices
    if not device_knob.startswith("cuda") and device_knob != "auto":
        raise ConfigError("DEVICE", f"{device_knob!r} with DISTRIBUTED: use 'cpu', 'cuda' or 'auto'")
    count = visible_gpus if devices == 0 else devices
    if count == 0:
        raise ConfigError("DEVICES", "0 (every GPU), but torch sees no CUDA GPU")
    if count > visible_gpus:
        raise ConfigError("DEVICES", f"{count} workers, but this node sees {visible_gpus} GPU(s)")
    return [f"cuda:{i}" for i in range(count)]


def _trainer_mode_problem(value: str) -> str | None:
    from .rank_run import TRAINER_MODES  # imported when checked: the rank helper imports torch.distributed

    if problem := mode_problem(value):
        return problem
    if value not in TRAINER_MODES:
        return f"'{value}' is not driven by the trainer yet (kohakumoss.distributed has it); use 'ddp'"
    return None


def _trainer_devices_problem(value: int | list) -> str | None:
    return devices_problem(value, "ddp")  # DEVICES with DISTRIBUTED='none': the trainer's own check


def _split_problem(value: list) -> str | None:
    from .pipeline import split_problem

    return split_problem(value, None, None)  # its length and the depth: the rank helper's checks


# resume=None throughout: an engine splits the same step over devices, it trains no other function
@dataclass(frozen=True)
class DistributedConfig:
    """Several devices: the engine, its workers, the collectives' timeout, the pipelines' stages."""

    distributed: str = knob(
        "none",
        "none, ddp (one worker process per DEVICES entry, gradients all-reduced), fsdp (the backbone's blocks sharded over them, FSDP2), pipeline (a worker per stage of blocks, torch.distributed.pipelining) or threaded (one process, a thread per stage on each DEVICES entry) (docs/guides/multi-gpu.md)",
        resume=None,
        check=_trainer_mode_problem,
    )
    devices: int | list = knob(
        1,
        "workers of this node: a count (0: every visible GPU) or a list ([0, 2], ['cpu', 'cpu'])",
        resume=None,
        check=_trainer_devices_problem,
    )
    dist_timeout: float = knob(
        DEFAULT_TIMEOUT_S,
        "seconds a collective waits for a missing rank before the run stops, naming it",
        resume=None,
        min=1.0,
    )
    pipeline_split: list = knob(
        [],
        "pipeline / threaded: the first block of each stage ([0, 12, 24]); empty: the blocks balanced over the stages",
        resume=None,
        check=_split_problem,
    )
    pipeline_schedule: str = knob(
        "gpipe",
        "pipeline: torch's schedule, gpipe, 1f1b or interleaved (several stages per rank); threaded runs gpipe",
        resume=None,
        choices=("gpipe", "1f1b", "interleaved"),
    )
    pipeline_chunks: int = knob(
        0,
        "pipeline / threaded: micro-batches (whole samples) per micro-step; 0: one per stage",
        resume=None,
        min=0,
    )
