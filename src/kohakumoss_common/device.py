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
