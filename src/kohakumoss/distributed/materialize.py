"""DISTRIBUTED='fsdp': the backbone built on the meta device, sharded by FSDP2, then only this rank's
shards given storage and values, so no worker ever holds the whole model in host memory.

- From a checkpoint: each shard's rows are read from the file (safetensors slices), dequantized (int8 /
  fp8 scales, ConvRot un-rotated row by row) and cut out of fused layout keys (ComfyUI's qkv), the
  conversions `model.io.load_backbone` applies to whole tensors.
- Random (MODEL_PRESET): every rank replays the one-process draw (`MossBackbone.init_weights`: one
  generator, the parameters in order, on the GPU when there is one) one parameter at a time and keeps
  its rows. The sharded weights then equal the one-process run's bit for bit at any world size, and a
  rank holds at most one whole parameter beside its shards; the cost is that every rank draws every value.
  The global generator is advanced as the one-process build advances it (`ReplayDraws`), so what the
  run draws next (an adapter's initial weights) is the one-process run's too.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.utils._python_dispatch import TorchDispatchMode

from kohakumoss_common.errors import CheckpointError, ConfigError
from kohakumoss_common.io import resolve_files, set_module_tensor
from kohakumoss_common.log import get_logger

from .launch import current
from .wrap import wrap_fsdp

log = get_logger(__name__)

INIT_STD = 0.02  # MODEL_PRESET's random weights (train/components.build_backbone draws the same)


def local(p: torch.Tensor) -> torch.Tensor:
    """The storage this rank holds of `p`: a DTensor's local shard, or the tensor itself."""
    return p.to_local() if isinstance(p, DTensor) else p


def shard_index(p: torch.Tensor) -> tuple[slice, ...]:
    """Where this rank's local shard of `p` sits in the whole tensor (all of it when `p` is plain)."""
    if not isinstance(p, DTensor):
        return tuple(slice(0, n) for n in p.shape)
    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def held_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes of parameters this rank holds, bytes of the whole model's parameters)."""
    here = sum(local(p).numel() * local(p).element_size() for p in model.parameters())
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    return here, whole


def reset_peak_rss() -> bool:
    """Start a new host peak (Linux: writing 5 to clear_refs resets VmHWM); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_gib() -> float:
    """This process's host peak resident set since the last reset_peak_rss (VmHWM), else since start."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux; never reset


# ---- values ---------------------------------------------------------------------------------------

# random ops a module's constructor may call (nn.Linear's kaiming_uniform_ is uniform_)
IN_PLACE_RANDOM = frozenset(
    {"uniform_", "normal_", "bernoulli_", "random_", "exponential_", "geometric_", "log_normal_", "cauchy_"}
)
FACTORY_RANDOM = frozenset(
    {
        "rand",
        "randn",
        "randint",
        "randperm",
        "rand_like",
        "randn_like",
        "randint_like",
        "normal",
        "bernoulli",
        "multinomial",
    }
)


class ReplayDraws(TorchDispatchMode):
    """A model built on the meta device under this mode advances `device`'s default generator exactly as
    building it there would (each random fill drawn into a scratch tensor there and dropped): what the
    run draws next from the global generator (an adapter's initial weights) then equals the one-process
    run's, which builds the model on its device. One parameter's scratch at a time."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in IN_PLACE_RANDOM and args and args[0].is_meta:
            func(torch.empty(args[0].shape, dtype=args[0].dtype, device=self.device), *args[1:], **kwargs)
        elif name in FACTORY_RANDOM and any(t.is_meta for t in _tensors(out)):
            real = [torch.empty_like(a, device=self.device) if _is_meta(a) else a for a in args]
            moved = {k: (self.device if k == "device" else v) for k, v in kwargs.items()}
            func(*real, **moved)
        return out


def _is_meta(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_meta


def _tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]


def fill_random(
    model: nn.Module, seed: int, draw: torch.device, dtype: torch.dtype, std: float = INIT_STD
) -> None:
    """This rank's shards of `MossBackbone.init_weights(std, Generator(draw).manual_seed(seed))` followed
    by `.to(dtype)`: each parameter drawn whole in float32 (the draw's order and shape), its rows kept."""
    generator = torch.Generator(device=draw).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            full = torch.empty(p.shape, dtype=torch.float32, device=draw).normal_(
                0.0, std, generator=generator
            )
            if p.ndim == 1 and not name.endswith("bias"):  # norm weights around 1, as init_weights
                full.add_(1.0)
            local(p).copy_(full[shard_index(p)].to(dtype))
            del full


class FileRows:
    """Slices of the native tensors of a checkpoint (`model.io.CheckpointInfo`), read without the rest:
    each native key's file, its layout key and its first row there (a part of a fused tensor)."""

    def __init__(self, info, stack: ExitStack):
        self.info = info
        self.where: dict[str, tuple[Any, str, int]] = {}
        self.handles: dict[str, Any] = {}
        layout = info.layout
        for file in resolve_files(info.path):
            handle = stack.enter_context(safe_open(str(file), framework="pt"))
            for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                self.handles[key] = handle
                if key in info.quant.dropped:
                    continue
                parts = layout.fused_parts(key)
                if parts is None:
                    self.where[layout.key_to_native(key)] = (handle, key, 0)
                else:
                    rows = handle.get_slice(key).get_shape()[0] // len(parts)
                    for i, native in enumerate(parts):
                        self.where[native] = (handle, key, i * rows)

    def read(
        self, native: str, index: tuple[slice, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """The native tensor's `index` part in `dtype` on `device`, dequantized as `native_tensors` does."""
        if native not in self.where:
            raise CheckpointError(
                self.info.path, f"holds no tensor for '{native}' ({self.info.layout.name} layout)"
            )
        handle, key, first = self.where[native]
        rows = (slice(first + index[0].start, first + index[0].stop), *index[1:]) if index else ()
        part = handle.get_slice(key)[rows] if rows else handle.get_tensor(key)
        plan = self.info.quant
        if key not in plan.scales:
            return part.to(device=device, dtype=dtype)
        scale = self.handles[plan.scales[key]].get_tensor(plan.scales[key])
        if scale.numel() > 1:  # per row: the shard's rows of it
            scale = scale.reshape(-1)[rows[0]]
        return plan.dequantize(key, part.to(device), scale.to(device), dtype).to(device)


def fill_from_checkpoint(model: nn.Module, info, dtype: torch.dtype, device: torch.device) -> None:
    """This rank's shards of every parameter from the checkpoint `info` (`model.io.read_checkpoint`)."""
    with ExitStack() as stack, torch.no_grad():
        rows = FileRows(info, stack)
        for name, p in model.named_parameters():
            local(p).copy_(rows.read(name, shard_index(p), dtype, device))


# ---- building -------------------------------------------------------------------------------------


def build_sharded(
    config,
    ops,
    device: torch.device,
    param_dtype: torch.dtype,
    fill: Callable[[nn.Module], None],
    replay: torch.device | None = None,
) -> nn.Module:
    """A MossBackbone built on the meta device, `fully_shard` per block and at the root (computing in
    `param_dtype`), its shards allocated on `device` and filled by `fill(model)`; frozen.
    replay: advance this device's global generator as building the model there would (ReplayDraws)."""
    from kohakumoss.model import MossBackbone
    from kohakumoss.model.rope import rope_bands

    with torch.device("meta"), ReplayDraws(replay) if replay is not None else nullcontext():
        model = MossBackbone(config, ops=ops)
    wrap_fsdp(model, param_dtype=param_dtype)
    model.to_empty(device=device)  # FSDP2 re-points its shards at the new storage
    fill(model)
    set_module_tensor(model, "rope.bands", rope_bands(config.head_dim, config.rope_theta, device))
    return model.requires_grad_(False)


def wants_sharded_build(k: dict[str, Any]) -> bool:
    """DISTRIBUTED='fsdp' on more than one rank: the backbone is built shard by shard."""
    return k.get("DISTRIBUTED", "none") == "fsdp" and current().size > 1


def sharded_backbone(
    k: dict[str, Any],
    plan,
    device: torch.device,
    dtype: torch.dtype,
    fp32_masters: bool,
    backend: str,
) -> nn.Module | None:
    """The trainer's backbone under DISTRIBUTED='fsdp' (None otherwise): this rank's shards of WEIGHTS
    (or of MODEL_PRESET's random weights), stored in float32 for a full fine-tune's masters, else in
    `dtype` (PRECISION), which is also what FSDP2 computes in. A memory plan FSDP2 cannot run is refused
    before anything is built; the rank's held bytes and host peak RSS are logged."""
    if not wants_sharded_build(k):
        return None
    from kohakumoss.model import get_preset
    from kohakumoss.model.io import check_keys, read_checkpoint
    from kohakumoss_kernels import OpSet

    from .trainer import fsdp_plan_problem

    if plan is not None and (problem := fsdp_plan_problem(plan)):
        raise ConfigError(*problem)
    store = torch.float32 if fp32_masters else dtype
    rss_before = peak_rss_gib()
    if k["WEIGHTS"]:
        info = read_checkpoint(k["WEIGHTS"])
        check_keys(info, info.config)
        quant = f", {info.quant.scheme}" if info.quant.scales else ""
        config, source = info.config, f"{info.path} ({info.layout.name} layout{quant})"
        replay = None  # load_backbone builds on the meta device too: no global draws to match

        def fill(model):
            fill_from_checkpoint(model, info, store, device)
    elif k["MODEL_PRESET"]:
        config, source = get_preset(k["MODEL_PRESET"]), f"random {k['MODEL_PRESET']} weights (MODEL_PRESET)"
        draw = device if device.type == "cuda" else torch.device("cpu")
        replay = device  # build_backbone builds the model on the device: its constructors' draws

        def fill(model):
            fill_random(model, int(k["SEED"]), draw, store)
    else:
        raise ConfigError("WEIGHTS", "set WEIGHTS to a DiT checkpoint (or MODEL_PRESET for random weights)")
    model = build_sharded(config, OpSet(backend), device, dtype, fill, replay)
    here, whole = held_bytes(model)
    log.info(
        f"FSDP2 build: rank {current().rank} holds {here / 2**20:.1f} MiB of the DiT's "
        f"{whole / 2**20:.1f} MiB ({source}, built on the meta device, its shards read or drawn alone); "
        f"host peak RSS {peak_rss_gib():.2f} GiB (before the build {rss_before:.2f} GiB)"
    )
    return model
