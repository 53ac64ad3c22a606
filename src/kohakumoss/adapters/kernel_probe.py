"""LyCORIS's fused kernels tried in a child process before a run trains with them.

lycoris-lora tunes its Triton kernels in the first step that meets a shape. A launch config that faults
(an illegal memory access) ends the whole CUDA context, and the run with it. The probe runs the run's
adapter on each linear shape it wraps, forward and backward at the rows that linear sees in a step, in a
child process that shares lycoris's tuning table: the run then finds those shapes tuned. If the child
dies, the run switches lycoris to its torch backend and names the shape. The outcome is kept under the
cache folder, keyed by adapter, shapes, dtype, card and versions, so later runs skip the child.

Adapters that run through the kernel registry (LoRA, LoCon: `fast.py`) need no probe.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn

from kohakumoss_common.hashing import sha256_json
from kohakumoss_common.io import atomic_write_text
from kohakumoss_common.log import get_logger
from kohakumoss_kernels import tuning
from kohakumoss_kernels.tuning import software_versions

from .algos import ALGOS
from .spec import AdapterSpec
from .targets import matched_modules, target_patterns

log = get_logger(__name__)

BACKEND_ENV = "LYCORIS_KERNEL_BACKEND"  # read by lycoris at each call
START, DONE = "probe-start ", "probe-done "


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    seconds: float
    failed: tuple[int, int, int] | None = None  # (fan_in, fan_out, rows) the child was running when it died
    message: str = ""
    cached: bool = False


def needs_probe(spec: AdapterSpec) -> bool:
    """LoRA and LoCon run through the kernel registry; every other algorithm through lycoris's kernels."""
    return not ALGOS[spec.algo].project_kernels


def probe_shapes(model: nn.Module, spec: AdapterSpec, rows_of) -> list[tuple[int, int, int]]:
    """Distinct (fan_in, fan_out, rows) of the linears `spec` wraps in `model`; `rows_of(module_name)` gives
    the rows that linear sees in one step."""
    out = set()
    for name in matched_modules(model, *target_patterns(spec.preset, spec.patterns)):
        module = model.get_submodule(name)
        out.add((module.in_features, module.out_features, int(rows_of(name))))
    return sorted(out)


def _record_path(
    cache_dir: Path, spec: AdapterSpec, shapes, dtype: torch.dtype, device: torch.device
) -> Path:
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    key = sha256_json(
        [
            spec.to_json(),
            shapes,
            str(dtype),
            card,
            {**software_versions(), "lycoris-lora": importlib.metadata.version("lycoris-lora")},
        ]
    )[:16]
    return cache_dir / "lycoris-probe" / f"{key}.json"


def probe_lycoris_kernels(
    spec: AdapterSpec,
    shapes: list[tuple[int, int, int]],
    dtype: torch.dtype,
    device: torch.device,
    cache_dir: Path,
    timeout_s: float = 900.0,
) -> ProbeResult:
    """Run the child once per (adapter, shapes, dtype, card, versions); on a failure set lycoris's torch
    backend for this process. The result is returned and logged."""
    record = _record_path(cache_dir, spec, shapes, dtype, device)
    if record.exists():
        result = replace(ProbeResult(**_read_record(record)), cached=True)
    else:
        result = _run_child(spec, shapes, dtype, device, timeout_s)
        atomic_write_text(record, json.dumps(asdict(result)))
    if result.ok:
        if not result.cached:
            log.info(
                f"LyCORIS kernels: {len(shapes)} {spec.algo} shapes tuned in a child in {result.seconds:.0f} s"
            )
        return result
    os.environ[BACKEND_ENV] = "torch"
    where = (
        f"in={result.failed[0]} out={result.failed[1]} rows={result.failed[2]}" if result.failed else "start"
    )
    log.warning(
        f"LyCORIS's fused kernels failed for {spec.algo} at {where} ({result.message}); this run uses "
        f"lycoris's torch backend ({BACKEND_ENV}=torch: slower, same results)"
        + (f". Recorded in {record}: delete it to try again" if result.cached else "")
    )
    return result


def _read_record(path: Path) -> dict:
    data = json.loads(path.read_text())
    if data.get("failed") is not None:
        data["failed"] = tuple(data["failed"])
    data.pop("cached", None)
    return data


def child_command(payload: str) -> list[str]:
    return [sys.executable, "-m", "kohakumoss.adapters.kernel_probe", payload]


def _run_child(spec, shapes, dtype, device, timeout_s) -> ProbeResult:
    dtype_name = str(dtype).removeprefix("torch.")
    payload = json.dumps(
        {"spec": spec.to_json(), "shapes": shapes, "dtype": dtype_name, "device": str(device)}
    )
    t0 = time.perf_counter()
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the parent's imports
        done = subprocess.run(
            child_command(payload), capture_output=True, text=True, timeout=timeout_s, env=env
        )
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        code, stdout, stderr = None, _text(e.stdout), f"no answer in {timeout_s:.0f} s"
    seconds = time.perf_counter() - t0
    started = [json.loads(line[len(START) :]) for line in stdout.splitlines() if line.startswith(START)]
    if code == 0 and DONE.strip() in stdout:
        return ProbeResult(True, seconds)
    return ProbeResult(False, seconds, tuple(started[-1]) if started else None, _error_line(stderr, code))


def _error_line(stderr: str, code: int | None) -> str:
    """The child's exception line (a CUDA error is followed by lines of advice), else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"[\w.]+(Error|Exception)\b", line)]
    return ((errors or lines)[-1:] or [f"exit code {code}"])[0][:300]


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


class _One(nn.Module):
    def __init__(self, fan_in: int, fan_out: int):
        super().__init__()
        self.proj = nn.Linear(fan_in, fan_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def _child(payload: dict) -> None:
    from .builder import build_from_spec

    spec = AdapterSpec(**{**json.loads(payload["spec"]), "preset": "custom", "patterns": ("proj",)})
    device, dtype = torch.device(payload["device"]), getattr(torch, payload["dtype"])
    with tuning.tuning_window():  # lycoris times its launch configs here, as in the run's first step
        for fan_in, fan_out, rows in payload["shapes"]:
            print(START + json.dumps([fan_in, fan_out, rows]), flush=True)
            model = _One(fan_in, fan_out).to(device, dtype)
            build_from_spec(model, spec).to(device)  # fp32 adapter weights, as the trainer keeps them
            x = torch.randn(rows, fan_in, device=device, dtype=dtype, requires_grad=True)
            model(x).float().square().mean().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # a fault shows here, under this shape's line
    print(DONE, flush=True)


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
