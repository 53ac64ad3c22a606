"""What accelerator this process runs on: kind, arch name (sm90, xpu, cpu), memory, dtype support."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cuda", "xpu" or "cpu"
    name: str
    arch: str  # "sm90", "sm75", "xpu", "cpu"
    capability: tuple[int, int] | None
    total_memory: int  # bytes; 0 when unknown
    bf16: bool
    fp8: bool

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.kind if self.kind != "cpu" else "cpu")


def arch_name(capability: tuple[int, int] | None, kind: str = "cuda") -> str:
    if kind != "cuda" or capability is None:
        return kind
    return f"sm{capability[0]}{capability[1]}"


def sm_at_least(arch: str, version: int) -> bool:
    """Whether an arch name from `arch_name` is a CUDA card of compute capability `version` (80: sm80) or newer."""
    return arch.startswith("sm") and arch[2:].isdigit() and int(arch[2:]) >= version


def device_info(device: torch.device | str | None = None) -> DeviceInfo:
    """Describe `device` (default: the first CUDA GPU, else XPU, else the CPU)."""
    if device is None:
        if torch.cuda.is_available():
            device = "cuda"
        elif hasattr(torch, "xpu") and torch.xpu.is_available():
            device = "xpu"
        else:
            device = "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        cap = (props.major, props.minor)
        return DeviceInfo(
            "cuda", props.name, arch_name(cap), cap, props.total_memory, cap >= (8, 0), cap >= (8, 9)
        )
    if device.type == "xpu":
        props = torch.xpu.get_device_properties(device)
        return DeviceInfo("xpu", props.name, "xpu", None, props.total_memory, True, False)
    return DeviceInfo("cpu", "cpu", "cpu", None, 0, True, False)


def device_index(device: torch.device) -> int | None:
    """The index `device` means: its own, else the current one of its kind (0 where none is visible)."""
    if device.index is not None or device.type in ("cpu", "meta"):
        return device.index
    backend = getattr(torch, device.type, None)
    if backend is not None and hasattr(backend, "is_available") and backend.is_available():
        return backend.current_device()
    return 0


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether two devices are the same one: torch.device('cuda') and 'cuda:0' are, when 0 is current
    (plain `!=` says they differ: comparing the trainer's device with a parameter's that way once kept
    the on-device skip of non-finite steps off on every GPU)."""
    a, b = torch.device(a), torch.device(b)
    return a.type == b.type and device_index(a) == device_index(b)


def peak_memory_gib(device: torch.device) -> float:
    """The allocator's peak on a CUDA device (GiB), else the process's peak resident memory."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    try:
        import resource  # Unix only
    except ImportError:
        return 0.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
