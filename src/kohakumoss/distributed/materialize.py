"""The backbone built on the meta device, then only what this worker holds given storage and values,
so no worker (or device) ever holds the whole model:

- DISTRIBUTED='fsdp' (`sharded_backbone`): sharded by FSDP2, each rank's shards materialized;
- DISTRIBUTED='pipeline' / 'threaded' (`staged_backbone`): whole parameters materialized by name on
  their stage's device (`materialize`); a pipeline rank's other stages stay on the meta device.

The values, either way:

- From a checkpoint: each shard's rows (or each held parameter) are read from the file (safetensors slices), dequantized (int8 /
  fp8 scales, ConvRot un-rotated row by row) and cut out of fused layout keys (ComfyUI's qkv), the
  conversions `model.io.load_backbone` applies to whole tensors.
- Random (MODEL_PRESET): every rank replays the one-process draw (`MossBackbone.init_weights`: one
  generator, the parameters in order, on the GPU when there is one) one parameter at a time and keeps
  its rows (a parameter left on the meta device is drawn and dropped). The sharded weights then equal the one-process run's bit for bit at any world size, and a
  rank holds at most one whole parameter beside its shards; the cost is that every rank draws every value.
  Neither build draws from the global generator (the one-process build too starts on the meta device),
  so what the run draws next (an adapter's initial weights) is the one-process run's.
"""

from __future__ import annotations

import resource
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

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
            if p.is_meta:  # not held here: drawn only so that the next parameters' draws are the same
                continue
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


def fill_from_checkpoint(model: nn.Module, info, dtype: torch.dtype) -> None:
    """This rank's shards (or held parameters) from the checkpoint `info` (`model.io.read_checkpoint`),
    each read onto its own device; parameters on the meta device are not read."""
    with ExitStack() as stack, torch.no_grad():
        rows = FileRows(info, stack)
        for name, p in model.named_parameters():
            if not p.is_meta:
                local(p).copy_(rows.read(name, shard_index(p), dtype, local(p).device))


# ---- building -------------------------------------------------------------------------------------


def build_sharded(
    config,
    ops,
    device: torch.device,
    param_dtype: torch.dtype,
    fill: Callable[[nn.Module], None],
) -> nn.Module:
    """A MossBackbone built on the meta device, `fully_shard` per block and at the root (computing in
    `param_dtype`), its shards allocated on `device` and filled by `fill(model)`; frozen."""
    from kohakumoss.model import MossBackbone
    from kohakumoss.model.rope import rope_bands

    with torch.device("meta"):
        model = MossBackbone(config, ops=ops)
    wrap_fsdp(model, param_dtype=param_dtype)
    model.to_empty(device=device)  # FSDP2 re-points its shards at the new storage
    fill(model)
    set_module_tensor(model, "rope.bands", rope_bands(config.head_dim, config.rope_theta, device))
    return model.requires_grad_(False)


@dataclass
class Source:
    """Where a distributed build's values come from: WEIGHTS or MODEL_PRESET."""

    config: Any  # MossConfig
    text: str  # for the build's log line
    fill: Callable[[nn.Module], None]  # fills every materialized parameter (shard or whole)


def weights_source(cfg: Any, store: torch.dtype, draw: torch.device) -> Source:
    """WEIGHTS (read slice by slice) or MODEL_PRESET (the one-process draw replayed on `draw`'s kind of
    device: the GPU when there is one), filling parameters stored in `store`."""
    from kohakumoss.model import get_preset
    from kohakumoss.model.io import check_keys, read_checkpoint

    weights, preset = cfg.model.weights, cfg.model.model_preset
    if weights:
        info = read_checkpoint(weights)
        check_keys(info, info.config)
        quant = f", {info.quant.scheme}" if info.quant.scales else ""
        # load_backbone builds on the meta device too: no global draws to match
        return Source(
            info.config,
            f"{info.path} ({info.layout.name} layout{quant})",
            lambda model: fill_from_checkpoint(model, info, store),
        )
    if preset:
        where, seed = (draw if draw.type == "cuda" else torch.device("cpu")), int(cfg.run.seed)
        return Source(
            get_preset(preset),
            f"random {preset} weights (MODEL_PRESET)",
            lambda model: fill_random(model, seed, where, store),
        )
    raise ConfigError("WEIGHTS", "set WEIGHTS to a DiT checkpoint (or MODEL_PRESET for random weights)")


def wants_sharded_build(cfg: Any) -> bool:
    """DISTRIBUTED='fsdp' on more than one rank: the backbone is built shard by shard."""
    return cfg.parallel.distributed == "fsdp" and current().size > 1


def sharded_backbone(
    cfg: Any,
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
    if not wants_sharded_build(cfg):
        return None
    from kohakumoss_kernels import OpSet

    from .rank_run import fsdp_plan_problem

    if plan is not None and (problem := fsdp_plan_problem(plan)):
        raise ConfigError(*problem)
    store = torch.float32 if fp32_masters else dtype
    rss_before = peak_rss_gib()
    src = weights_source(cfg, store, device)
    model = build_sharded(src.config, OpSet(backend), device, dtype, src.fill)
    here, whole = held_bytes(model)
    log.info(
        f"FSDP2 build: rank {current().rank} holds {here / 2**20:.1f} MiB of the DiT's "
        f"{whole / 2**20:.1f} MiB ({src.text}, built on the meta device, its shards read or drawn alone); "
        f"host peak RSS {peak_rss_gib():.2f} GiB (before the build {rss_before:.2f} GiB)"
    )
    return model


# ---- whole parameters by name: the pipelines' stages ----------------------------------------------


def materialize(model: nn.Module, where: Mapping[str, torch.device]) -> None:
    """The parameters named in `where` given storage (uninitialized, their dtype) on their device, whole;
    every other parameter stays on the meta device (no storage)."""
    for name, p in list(model.named_parameters()):
        if name in where:
            set_module_tensor(model, name, torch.empty(p.shape, dtype=p.dtype, device=where[name]))


def build_staged(
    config,
    ops,
    where: Callable[[str], torch.device | None],
    store: torch.dtype,
    fill: Callable[[nn.Module], None],
    bands: torch.device | None = None,
) -> nn.Module:
    """A MossBackbone built on the meta device in `store`, each parameter `name` with `where(name)` a
    device materialized there and filled by `fill(model)`, the others left on the meta device; frozen.
    bands: where `rope.bands` (a derived constant) is put."""
    from kohakumoss.model import MossBackbone
    from kohakumoss.model.rope import rope_bands

    with torch.device("meta"):
        model = MossBackbone(config, ops=ops)
    model.to(store)
    placed = {n: d for n, _ in model.named_parameters() if (d := where(n)) is not None}
    materialize(model, placed)
    fill(model)
    if bands is not None:
        set_module_tensor(model, "rope.bands", rope_bands(config.head_dim, config.rope_theta, bands))
    return model.requires_grad_(False)


def stage_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of the parameters held per device ('meta': those with no storage)."""
    out: dict[str, int] = {}
    for p in model.parameters():
        out[str(p.device)] = out.get(str(p.device), 0) + p.numel() * p.element_size()
    return out


def wants_staged_build(cfg: Any) -> bool:
    """DISTRIBUTED='threaded', or 'pipeline' on more than one rank: the backbone is built stage by stage."""
    mode = cfg.parallel.distributed
    return mode == "threaded" or (mode == "pipeline" and current().size > 1)


def staged_backbone(
    cfg: Any,
    plan,
    device: torch.device,
    dtype: torch.dtype,
    fp32_masters: bool,
    backend: str,
) -> nn.Module | None:
    """The trainer's backbone under the pipelines (None otherwise), built on the meta device with only
    what this process holds materialized, read from WEIGHTS or drawn as MODEL_PRESET's one-process draw:
    - 'pipeline': this rank's stages (its blocks; stage 0 the embedders and conditioning, the last stage
      the head) on its device, plus the video embedder on every rank (in_channels x dim: the adapter
      builder places the adapter on the backbone's first parameter's device); the rest stays meta;
    - 'threaded': every stage on its own device, so no device holds the whole model.
    A memory plan the pipelines cannot run is refused before anything is built."""
    if not wants_staged_build(cfg):
        return None
    from kohakumoss_kernels import OpSet

    from .pipeline import owner_stage
    from .rank_run import pipeline_plan_problem, pipeline_starts, threaded_devices

    mode, world = cfg.parallel.distributed, current()
    if plan is not None and (problem := pipeline_plan_problem(plan, mode)):
        raise ConfigError(*problem)
    store = torch.float32 if fp32_masters else dtype
    rss_before = peak_rss_gib()
    src = weights_source(cfg, store, device)
    starts = pipeline_starts(cfg, src.config.depth, world.size)
    if mode == "threaded":
        devices = [torch.device(d) for d in threaded_devices(cfg)]

        def where(name: str) -> torch.device | None:
            return devices[owner_stage(name, starts)]
    else:
        local = {s for s in range(len(starts)) if s % world.size == world.rank}

        def where(name: str) -> torch.device | None:
            held = owner_stage(name, starts) in local or name.startswith("video_embedder.")
            return device if held else None

    model = build_staged(src.config, OpSet(backend), where, store, src.fill, device)
    held = stage_bytes(model)
    whole = sum(held.values())
    spread = ", ".join(f"{n / 2**20:.1f} MiB on {d}" for d, n in sorted(held.items()) if d != "meta")
    who = "this process" if mode == "threaded" else f"rank {world.rank}"
    log.info(
        f"pipeline build: {who} holds {spread} of the DiT's {whole / 2**20:.1f} MiB ({src.text}, built "
        f"on the meta device, each stage read or drawn onto its device alone); host peak RSS "
        f"{peak_rss_gib():.2f} GiB (before the build {rss_before:.2f} GiB)"
    )
    return model


@contextmanager
def only_on(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Inside: the parameters that are not on `device` (another stage's device, or the meta device) are
    hidden from `model.parameters()`, so code that places the whole model (the memory plan's install)
    leaves them where they are; put back on exit."""
    from kohakumoss_common.device import same_device

    hidden = []
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and (p.is_meta or not same_device(p.device, device)):
                hidden.append((module, name, p))
                module._parameters[name] = None
    try:
        yield
    finally:
        for module, name, p in hidden:
            module._parameters[name] = p
