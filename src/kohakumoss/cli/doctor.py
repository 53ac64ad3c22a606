"""kohakumoss-doctor: check this machine for training, and print the command that fixes each problem.

Exit status 1 when something blocks training, else 0. The checks are pure functions of an `Environment`
snapshot, so tests can fake any machine.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from kohakumoss.distributed.doctor import DistInfo
from kohakumoss.distributed.doctor import checks as distributed_checks
from kohakumoss.distributed.doctor import probe as probe_distributed

INSTALL = (
    r"powershell -ExecutionPolicy Bypass -File scripts\install\install.ps1"
    if os.name == "nt"
    else "bash scripts/install/install.sh"
)


@dataclass
class Environment:
    python: tuple[int, int, int]
    packages: dict[str, str | None]  # distribution name -> version (None: not installed)
    torch_cuda: str | None = None  # torch.version.cuda
    torch_xpu: bool = False
    gpus: list[dict] = field(default_factory=list)  # name, capability (major, minor), memory bytes
    driver: str | None = None
    driver_cuda: str | None = None  # CUDA version the driver supports (nvidia-smi)
    nvidia_smi: bool = False
    host_ram: int = 0
    free_disk: int = 0
    qwen3_5: bool = False  # transformers has the qwen3_5 model
    flux2_vae: bool = False  # diffusers has AutoencoderKLFlux2
    dist: DistInfo | None = None  # NCCL / gloo, P2P access and topology (kohakumoss.distributed.doctor)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    blocking: bool = False


DISTRIBUTIONS = (
    "torch",
    "torchvision",
    "lycoris-lora",
    "kohaku-engine",
    "transformers",
    "diffusers",
    "safetensors",
    "pillow",
    "pyarrow",
    "webdataset",
    "huggingface_hub",
    "triton",
    "triton-windows",
    "tilelang",
)
REQUIRED = (
    "torch",
    "lycoris-lora",
    "kohaku-engine",
    "transformers",
    "diffusers",
    "safetensors",
    "pillow",
    "pyarrow",
    "webdataset",
)


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _nvidia_smi() -> tuple[bool, str | None, str | None]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False, None, None
    try:
        out = subprocess.run([exe], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.SubprocessError):
        return False, None, None
    driver = cuda = None
    for token in out.replace("|", " ").split("  "):
        token = token.strip()
        if token.startswith("Driver Version:"):
            driver = token.split(":", 1)[1].strip()
        if token.startswith("CUDA Version:"):
            cuda = token.split(":", 1)[1].strip()
    return True, driver, cuda


def probe_environment() -> Environment:
    """Read this machine (imports torch; nothing is downloaded)."""
    env = Environment(python=tuple(sys.version_info[:3]), packages={d: _version(d) for d in DISTRIBUTIONS})
    if env.packages["torch"]:
        import torch

        env.torch_cuda = torch.version.cuda
        env.torch_xpu = hasattr(torch, "xpu") and torch.xpu.is_available()
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                env.gpus.append({"name": p.name, "capability": (p.major, p.minor), "memory": p.total_memory})
        env.dist = probe_distributed()
    env.nvidia_smi, env.driver, env.driver_cuda = _nvidia_smi()
    try:
        env.host_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        env.host_ram = 0
    env.free_disk = shutil.disk_usage(".").free
    env.qwen3_5 = importlib.util.find_spec("transformers") is not None and _has("transformers.models.qwen3_5")
    env.flux2_vae = importlib.util.find_spec("diffusers") is not None and _has_attr(
        "diffusers", "AutoencoderKLFlux2"
    )
    return env


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _has_attr(module: str, attr: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), attr)
    except Exception:  # a broken install is reported as missing
        return False


def torch_index_for(driver_cuda: str | None) -> str:
    if not driver_cuda:
        return "cpu"
    major, minor = (int(x) for x in driver_cuda.split(".")[:2])
    v = major * 10 + minor
    return "cu130" if v >= 130 else "cu128" if v >= 128 else "cu126"


def memory_plan_for(gib: float) -> str:
    """What MEMORY_PROFILE 'auto' picks on this card for a LoRA on moss-image-5b with its GPU layer's
    knobs (a prediction of kohakumoss.memory, docs/concepts/profiles.md); '' when it cannot say."""
    try:
        from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig
        from kohakumoss.memory import catalog, fastest_fit
        from kohakumoss.model.presets import get_preset

        from .config_layers import compose, gpu_layer_name, layer_path

        layer = gpu_layer_name(gib)
        layers = [layer_path("gpu", layer), layer_path("algo", "lora"), layer_path("data", "kohya_1mp")]
        knobs = {**TRAIN_SCHEMA.defaults(), **compose(layers)}
        cfg = TrainConfig.from_knobs(knobs)
        best = fastest_fit(catalog(get_preset("moss-image-5b"), cfg), gib * 2**30)
    except Exception:  # the doctor reports the machine; a missing layer folder is not its failure
        return ""
    if best is None:
        return f"layer {layer}: no memory plan fits a LoRA on moss-image-5b (kohakumoss-config profiles)"
    return (
        f"layer {layer}, LoRA on moss-image-5b: MEMORY_PROFILE 'auto' picks {best.id} ({best.label}), "
        f"{best.peak / 2**30:.1f} GiB predicted (kohakumoss-config profiles --gpu-mem {gib:.0f})"
    )


def run_checks(env: Environment) -> list[Check]:
    checks: list[Check] = []
    py_ok = env.python >= (3, 10)
    checks.append(
        Check(
            "python",
            py_ok,
            ".".join(map(str, env.python)),
            "install Python 3.12 and rerun " + INSTALL,
            not py_ok,
        )
    )

    for dist in REQUIRED:
        ver = env.packages.get(dist)
        fix = (
            f'pip install "{dist}"'
            if dist != "torch"
            else f"{INSTALL}   (picks the PyTorch index for your driver)"
        )
        checks.append(Check(dist, ver is not None, ver or "not installed", "" if ver else fix, ver is None))
    torch_ver = env.packages.get("torch")
    if torch_ver:
        base = tuple(int(x) for x in torch_ver.split("+")[0].split(".")[:2])
        ok = (2, 11) <= base < (2, 15)
        checks.append(
            Check("torch version", ok, torch_ver, "" if ok else 'pip install "torch>=2.13,<2.15"', False)
        )
    checks.append(
        Check(
            "transformers qwen3_5",
            env.qwen3_5,
            "Qwen3.5 text encoder support",
            "" if env.qwen3_5 else 'pip install -U "transformers>=5"',
            not env.qwen3_5,
        )
    )
    checks.append(
        Check(
            "diffusers AutoencoderKLFlux2",
            env.flux2_vae,
            "FLUX.2 VAE support",
            "" if env.flux2_vae else 'pip install -U "diffusers>=0.37"',
            not env.flux2_vae,
        )
    )

    if env.gpus:
        build = f"CUDA {env.torch_cuda}" if env.torch_cuda else "no CUDA build"
        checks.append(Check("torch build", env.torch_cuda is not None, build))
        for i, gpu in enumerate(env.gpus):
            major, minor = gpu["capability"]
            arch = f"sm{major}{minor}"
            gib = gpu["memory"] / 2**30
            checks.append(Check(f"gpu {i}", True, f"{gpu['name']}, {arch}, {gib:.1f} GiB"))
            if plan := memory_plan_for(gib):
                checks.append(Check(f"gpu {i} memory plan", True, plan))
            checks.append(
                Check(
                    f"gpu {i} bf16",
                    major >= 8,
                    "bf16" if major >= 8 else "no bf16: training uses fp16 with the residual fix",
                )
            )
            checks.append(
                Check(
                    f"gpu {i} fp8",
                    (major, minor) >= (8, 9),
                    "fp8 compute available" if (major, minor) >= (8, 9) else "no fp8 compute (needs sm89+)",
                )
            )
            if major >= 8:
                has = env.packages.get("triton") or env.packages.get("triton-windows")
                fix = 'pip install "kohakumoss[cuda]"' if not has else ""
                checks.append(
                    Check(
                        "triton",
                        bool(has),
                        has or "not installed: kernels fall back to torch.compile/eager",
                        fix,
                    )
                )
            else:
                has = env.packages.get("tilelang")
                checks.append(
                    Check(
                        "tilelang",
                        bool(has),
                        has or f"not installed: {arch} kernels fall back to torch.compile/eager",
                        "" if has else "pip install tilelang   (and the CUDA toolkit for nvcc)",
                    )
                )
    elif env.torch_xpu:
        checks.append(Check("gpu", True, "Intel XPU"))
    else:
        idx = torch_index_for(env.driver_cuda)
        if env.nvidia_smi:
            fix = f"pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/{idx}"
            checks.append(
                Check(
                    "gpu",
                    False,
                    f"nvidia-smi sees a GPU (driver {env.driver}, CUDA {env.driver_cuda}) but torch does not ({'CPU build' if not env.torch_cuda else 'CUDA ' + env.torch_cuda})",
                    fix,
                )
            )
        else:
            checks.append(
                Check(
                    "gpu",
                    False,
                    "no GPU found: training runs on the CPU (the tiny demo only)",
                    "install the NVIDIA driver (CUDA 12.6+) for GPU training",
                )
            )
    if env.driver_cuda:
        major, minor = (int(x) for x in env.driver_cuda.split(".")[:2])
        ok = (major, minor) >= (12, 6)
        checks.append(
            Check(
                "driver",
                ok,
                f"{env.driver} (CUDA {env.driver_cuda})",
                "" if ok else "update the NVIDIA driver to one for CUDA 12.6 or newer",
                not ok and bool(env.gpus),
            )
        )
    if env.dist is not None:
        checks += [Check(*row) for row in distributed_checks(env.dist, len(env.gpus))]
    ram = env.host_ram / 2**30
    checks.append(
        Check(
            "host RAM",
            ram >= 8 or not env.host_ram,
            f"{ram:.1f} GiB",
            "" if ram >= 8 else "16+ GiB recommended; use the low-VRAM layers with care",
        )
    )
    disk = env.free_disk / 2**30
    checks.append(
        Check(
            "free disk",
            disk >= 20,
            f"{disk:.1f} GiB",
            "" if disk >= 20 else "free 20+ GiB for weights, caches and checkpoints",
        )
    )
    return checks


def report(checks: list[Check]) -> tuple[str, int]:
    lines = []
    for c in checks:
        mark = "ok  " if c.ok else ("FAIL" if c.blocking else "warn")
        lines.append(f"[{mark}] {c.name:<30} {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"       fix: {c.fix}")
    blocking = [c.name for c in checks if c.blocking and not c.ok]
    lines.append("training is blocked by: " + ", ".join(blocking) if blocking else "ready to train")
    return "\n".join(lines), 1 if blocking else 0


def main(argv: list[str] | None = None) -> int:
    text, code = report(run_checks(probe_environment()))
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
