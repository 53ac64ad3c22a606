"""Verified exports: each written file is read back the way its consumer reads it.

- ComfyUI-format adapter: ComfyUI's generic LoRA key map over the Comfy-Org DiT layout (every model key
  `diffusion_model.<module>.weight` is reached as `diffusion_model.<module>` or `lora_unet_<module with _>`),
  and its loaders' entry names (comfy/lora.py `load_lora`, comfy/weight_adapter/*): every file key must be
  consumed by one complete adapter on a weight of the right shape ("lora key not loaded" otherwise).
- LyCORIS file: lycoris's own loader (`create_lycoris_from_weights`, through `adapters.load_adapter`):
  every file key must be a tensor of a rebuilt module.
- Merged / diffusers transformer: the project's loader (`model.io.read_checkpoint` + `check_keys`), the
  layout's keys against the model's.

Then the merged weights of a few adapted layers, as that consumer computes them (ComfyUI's patch math,
`comfy_apply`; lycoris's merge; the file's tensors), are compared with the trainer's own merge of the live
adapter. A file holding inf or NaN fails whatever its merge (NaN compares as no error at all). A file
that fails is an `ExportMismatch`, raised after every file is written and checked.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from lycoris import LycorisNetwork
from safetensors.torch import load_file

from kohakumoss.adapters.io import AdapterSource, adapter_state_dict, load_adapter, read_adapter
from kohakumoss.adapters.merge import dense_tensor, merged_weights
from kohakumoss.adapters.targets import module_name_map
from kohakumoss.model import MossBackbone
from kohakumoss.model.io import check_keys, hf_config_json, read_checkpoint
from kohakumoss.model.layouts import LAYOUTS
from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.io import iter_tensors
from kohakumoss_common.log import get_logger

from .comfy_apply import comfy_entries, glora_rank, patched_weight
from .comfy_keys import COMFY_PREFIX, comfy_module, fused_members

log = get_logger(__name__)

SAMPLED_LAYERS = 4  # adapted modules whose merged weights are compared per file
# relative error of the consumer's merged-weight change against the trainer's, by the file's float width
TOLERANCE = {4: 1e-4, 2: 2e-2, 1: 1e-1}
MERGED_TOLERANCE = 1e-2  # a bf16 merged weight against the float32 merge, relative to the weight

# ComfyUI's loaders, in their order: adapter kind -> (entry names it consumes, names that must all be present)
_COMFY_LOADERS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    (
        "lora",
        ("lora_up.weight", "lora_down.weight", "lora_mid.weight"),
        ("lora_up.weight", "lora_down.weight"),
    ),
    (
        "loha",
        ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2"),
        ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"),
    ),
    ("lokr", ("lokr_w1", "lokr_w2", "lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b", "lokr_t2"), ()),
    (
        "glora",
        ("a1.weight", "a2.weight", "b1.weight", "b2.weight"),
        ("a1.weight", "a2.weight", "b1.weight", "b2.weight"),
    ),
    ("oft", ("oft_blocks", "rescale"), ("oft_blocks",)),
    ("diff", ("diff", "diff_b"), ("diff",)),
)
_COMMON = ("alpha", "dora_scale", "reshape_weight")  # read for any module the key map reaches
_ENTRY = re.compile(
    r"^(?P<module>.+?)\.(?P<name>"
    + "|".join(re.escape(n) for n in sorted({n for _, ns, _ in _COMFY_LOADERS for n in ns} | set(_COMMON)))
    + r")$"
)


class ExportMismatch(CheckpointError):
    """A written export does not load, or does not merge, as the trainer's adapter does."""


@dataclass
class Verified:
    path: Path
    consumer: str
    matched: int
    total: int
    unused: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    layers: list[str] = field(default_factory=list)
    error: float = 0.0  # largest relative error of a compared layer's merged-weight change
    tolerance: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.matched == self.total
            and not self.unused
            and not self.problems
            and self.error <= self.tolerance
        )

    def line(self) -> str:
        text = (
            f"{self.path.name}: {self.consumer}: {self.matched}/{self.total} keys matched, "
            f"{len(self.unused)} unused"
        )
        if self.layers:
            text += (
                f"; merged weights of {len(self.layers)} layers within {self.error:.1e} of the trainer's merge "
                f"(tolerance {self.tolerance:.0e})"
            )
        if self.unused:
            text += f"; unused: {self.unused[:5]}"
        if self.problems:
            text += f"; {'; '.join(self.problems[:5])}"
        return text


def _tolerance(tensors) -> float:
    widths = [t.element_size() for t in tensors if t.is_floating_point() and t.dim() > 0]
    return TOLERANCE.get(min(widths, default=4), TOLERANCE[1])


def _relative(got: torch.Tensor, want: torch.Tensor, base: torch.Tensor) -> float:
    """|got - want| / |want - base| (Frobenius): the error against the size of the adapter's change;
    inf where either side is not finite."""
    got, want, base = (t.detach().cpu().double() for t in (got, want, base))  # model weights may be on a GPU
    change = (want - base).norm()
    return _finite_or_inf(float((got - want).norm() / change.clamp_min(1e-30)))


def _finite_or_inf(error: float) -> float:
    """NaN as inf: `max(0.0, nan)` is 0.0, which once called a NaN adapter verified."""
    return error if math.isfinite(error) else math.inf


def nonfinite_problem(tensors: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The keys of a file's floating-point tensors (a dict, or (key, tensor) pairs read one at a time)
    that hold inf or NaN, as a problem line."""
    pairs = tensors.items() if isinstance(tensors, dict) else tensors
    bad = [k for k, t in pairs if t.is_floating_point() and t.numel() and not _all_finite(t)]
    return f"{len(bad)} tensor(s) hold inf or NaN (first: {sorted(bad)[0]})" if bad else None


def _all_finite(t: torch.Tensor) -> bool:
    if t.element_size() == 1:  # fp8 stores: isfinite is not defined for them
        t = t.float()
    return bool(torch.isfinite(t).all())


def _sample(names: list[str], n: int = SAMPLED_LAYERS) -> list[str]:
    """`n` names spread over the sorted list (first and last included): deterministic, covers both ends."""
    names = sorted(names)
    if len(names) <= n:
        return names
    return sorted({names[round(i * (len(names) - 1) / (n - 1))] for i in range(n)})


def _trainer_merge(model: MossBackbone, source: AdapterSource, modules: set[str]) -> dict[str, torch.Tensor]:
    return merged_weights(model, source, only=modules, dtype=torch.float32)


# ---- ComfyUI ---------------------------------------------------------------------------------------


def comfy_key_map(base_keys) -> dict[str, str]:
    """ComfyUI's generic DiT key map: LoRA-side module name -> model weight key (`diffusion_model.*`)."""
    out = {}
    for key in base_keys:
        if key.endswith(".weight"):
            module = key[: -len(".weight")]
            out[module] = key
            out["lora_unet_" + module[len(COMFY_PREFIX) :].replace(".", "_")] = key
    return out


def comfy_key_check(
    tensors: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]]
) -> tuple[int, list[str], list[str]]:
    """(keys ComfyUI's loaders consume, unused keys, problems) of a ComfyUI-format adapter against the
    Comfy-Org layout's weight shapes (`diffusion_model.<key>` -> shape)."""
    key_map = comfy_key_map(shapes)
    groups: dict[str, dict[str, str]] = {}
    unused = []
    for key in tensors:
        m = _ENTRY.match(key)
        if m is None or m.group("module") not in key_map:
            unused.append(key)
            continue
        groups.setdefault(m.group("module"), {})[m.group("name")] = key
    consumed, problems = 0, []
    for module, names in sorted(groups.items()):
        kinds = [
            k
            for k, ns, need in _COMFY_LOADERS
            if any(n in names for n in ns) and all(n in names for n in need)
        ]
        if not kinds:
            unused.extend(names.values())
            problems.append(f"{module}: no complete adapter ({sorted(names)})")
            continue
        own = next(ns for k, ns, _ in _COMFY_LOADERS if k == kinds[0])
        for name, key in names.items():
            if name in own or name in _COMMON:
                consumed += 1
            else:
                unused.append(key)
        shape = shapes[key_map[module]]
        entry = {n: tensors[k] for n, k in names.items()}
        problem = _shape_problem(entry, kinds[0], shape)
        if problem:
            problems.append(f"{module}: {problem}")
    return consumed, sorted(unused), problems


def _shape_problem(entry: dict[str, torch.Tensor], kind: str, shape: tuple[int, ...]) -> str | None:
    """Why ComfyUI's patch of this entry would not fit a weight of `shape` (it logs and skips it)."""
    rows, cols = shape[0], int(torch.Size(shape[1:]).numel())
    if kind == "lora":
        got = (entry["lora_up.weight"].shape[0], entry["lora_down.weight"].flatten(1).shape[1])
    elif kind == "loha":
        got = (entry["hada_w1_a"].shape[0], entry["hada_w1_b"].shape[1])
    elif kind == "glora":
        a1, a2, b1, b2 = (entry[f"{n}.weight"] for n in ("a1", "a2", "b1", "b2"))
        try:
            glora_rank(a1, a2, b1, b2, shape)
        except CheckpointError as e:
            return str(e)
        got = (b1.shape[0], b2.shape[1])
    elif kind == "oft":
        blocks = entry["oft_blocks"]
        rows_of = {3: blocks.shape[0] * blocks.shape[-1], 4: blocks.shape[1] * blocks.shape[-1]}
        got = (rows_of.get(blocks.dim(), 0), cols)
    elif kind == "diff":
        got = (entry["diff"].shape[0], int(entry["diff"][0].numel()) if entry["diff"].dim() > 1 else 1)
    else:
        w1 = entry.get("lokr_w1")
        w1 = w1 if w1 is not None else entry["lokr_w1_a"] @ entry["lokr_w1_b"]
        w2 = entry.get("lokr_w2")
        w2 = w2 if w2 is not None else entry["lokr_w2_a"] @ entry["lokr_w2_b"]
        got = (w1.shape[0] * w2.shape[0], w1.shape[1] * w2.shape[1])
    if got != (rows, cols):
        return f"{kind} patch of shape {got} on a weight of shape {tuple(shape)}"
    if "dora_scale" in entry and entry["dora_scale"].numel() != cols:
        return f"dora_scale of {entry['dora_scale'].numel()} values for {cols} input columns"
    return None


def comfy_shapes(model: MossBackbone) -> dict[str, tuple[int, ...]]:
    """`diffusion_model.<key>` -> shape of the Comfy-Org layout of `model` (an fp8 linear counts as its
    dense weight: the released file is bf16; no scales)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for key, t in model.state_dict().items():
        if key.endswith(".weight_scale"):
            continue
        module = _module(key)
        slot = comfy_module(module)
        if slot != module and key.endswith(".weight"):
            fused = COMFY_PREFIX + slot + ".weight"
            rows = shapes.get(fused, (0, t.shape[1]))[0]
            shapes[fused] = (rows + t.shape[0], t.shape[1])
        else:
            shapes[COMFY_PREFIX + key] = tuple(t.shape)
    return shapes


def _comfy_base(model: MossBackbone, comfy_modules: list[str]) -> dict[str, torch.Tensor]:
    """Dense float32 Comfy-layout weights of these ComfyUI modules."""
    out = {}
    for module in comfy_modules:
        members = fused_members(module) or (module,)
        weights = [dense_tensor(model, f"{m}.weight").detach().cpu() for m in members]  # beside the file's
        out[f"{module}.weight"] = torch.cat(weights, 0)
    return out


def verify_comfy(model: MossBackbone, source: AdapterSource, path: str | Path) -> Verified:
    """The ComfyUI-format file at `path` read as ComfyUI reads it, its merge compared with the trainer's."""
    path = Path(path)
    tensors = load_file(str(path))
    consumed, unused, problems = comfy_key_check(tensors, comfy_shapes(model))
    if problem := nonfinite_problem(tensors):
        problems.append(problem)
    result = Verified(
        path, "ComfyUI", consumed, len(tensors), unused, problems, tolerance=_tolerance(tensors.values())
    )
    if problems or unused:
        return result
    entries = comfy_entries(tensors)
    layers = _sample(list(entries))
    base = _comfy_base(model, layers)
    native = {n for c in layers for n in (fused_members(c) or (c,))}
    merged = _trainer_merge(model, source, native)
    for module in layers:
        members = fused_members(module) or (module,)
        want = torch.cat(
            [merged.get(f"{m}.weight", dense_tensor(model, f"{m}.weight")).float() for m in members], 0
        )
        got = patched_weight(entries[module], base[f"{module}.weight"])
        result.error = max(result.error, _relative(got, want, base[f"{module}.weight"]))
    result.layers = layers
    return result


def _module(key: str) -> str:
    return key.rsplit(".", 1)[0]


# ---- LyCORIS ---------------------------------------------------------------------------------------


def verify_lycoris(model: MossBackbone, source: AdapterSource, path: str | Path) -> Verified:
    """The LyCORIS file at `path` rebuilt by lycoris's loader, its merge compared with the trainer's."""
    path = Path(path)
    tensors = load_file(str(path))
    result = Verified(path, "LyCORIS", 0, len(tensors), tolerance=_tolerance(tensors.values()))
    if problem := nonfinite_problem(tensors):
        result.problems.append(problem)
        return result
    try:
        network = load_adapter(model, path, apply=False, device="cpu")  # read for its keys only
    except Exception as e:  # lycoris's loader fails on the file: a mismatch like any other
        result.problems.append(f"lycoris's loader fails on it: {type(e).__name__}: {e}")
        return result
    loaded = {f"{m.lora_name}.{k}" for m in network.loras for k in m.state_dict()}
    loaded |= {f"{m.lora_name}.on_input" for m in network.loras if hasattr(m, "train_on_input")}
    result.matched = sum(k in loaded for k in tensors)
    result.unused = sorted(k for k in tensors if k not in loaded)
    if result.unused:
        return result
    names = module_name_map(model)
    layers = _sample([names[m.lora_name] for m in network.loras])
    got = merged_weights(model, path, only=set(layers), dtype=torch.float32)
    want = _trainer_merge(model, source, set(layers))
    for key, w in want.items():
        result.error = max(result.error, _relative(got[key], w, dense_tensor(model, key)))
    result.layers = layers
    return result


# ---- merged transformers ---------------------------------------------------------------------------


def _adapted(model: MossBackbone, source: AdapterSource) -> list[str]:
    """Native names of the modules an adapter source changes."""
    if isinstance(source, LycorisNetwork):
        source = adapter_state_dict(source)
    sd, _ = read_adapter(source)
    names = module_name_map(model)
    return sorted({names[k.split(".", 1)[0]] for k in sd if k.split(".", 1)[0] in names})


def verify_merged(
    model: MossBackbone, source: AdapterSource | None, directory: str | Path, layout: str
) -> Verified:
    """The merged transformer in `directory` read by the project's loader (keys of `layout` against the
    model's), a few adapted layers (any block layers without `source`) compared with the trainer's merge,
    relative to the weight (the file is bf16: its rounding is relative to the whole weight)."""
    directory = Path(directory)
    info = read_checkpoint(directory)
    name = f"{LAYOUTS[layout].name} transformer"
    result = Verified(directory, name, 0, len(info.entries), tolerance=MERGED_TOLERANCE)
    if info.layout.name != LAYOUTS[layout].name:
        result.problems.append(f"read as the {info.layout.name} layout, written as {layout}")
    try:
        check_keys(info, model.config)
    except CheckpointError as e:
        result.problems.append(str(e))
    if layout in ("hf", "native"):  # a diffusers transformer/ folder: config.json with the released fields
        config = directory / "config.json"
        if not config.is_file() or json.loads(config.read_text()) != hf_config_json(model.config):
            result.problems.append(f"{config.name} absent or not the released fields of this model")
    if result.problems:
        return result
    result.matched = len(info.entries)
    if source is not None:
        layers = _sample(_adapted(model, source))
        want = _trainer_merge(model, source, set(layers))
    else:
        blocks = [n for n, m in model.named_modules() if n.startswith("layers.") and hasattr(m, "weight")]
        layers = _sample(blocks)
        want = {f"{m}.weight": dense_tensor(model, f"{m}.weight") for m in layers}
    layout = info.layout
    needed = {  # only the file tensors that hold a compared weight are read
        key for key in info.entries if set(layout.fused_parts(key) or [layout.key_to_native(key)]) & set(want)
    }
    got = {k: t for k, t in layout.to_native(iter_tensors(info.path, keys=needed)) if k in want}
    # every tensor, not only the sampled layers': one at a time, memory-mapped
    if problem := nonfinite_problem(iter_tensors(info.path)):
        result.problems.append(problem)
    for key, w in want.items():
        if key not in got:
            result.problems.append(f"'{key}' absent")
            continue
        # the trainer's weights may be on a GPU, the file's are read to the host
        w = w.detach().cpu().double()
        result.error = max(result.error, _finite_or_inf(float((got[key].double() - w).norm() / w.norm())))
    result.layers = layers
    return result


def raise_on_mismatch(results: list[Verified]) -> None:
    """Log each file's line; one ExportMismatch naming every file that failed."""
    bad = [r for r in results if not r.ok]
    for r in results:
        (log.error if not r.ok else log.info)(r.line())
    if bad:
        raise ExportMismatch(
            bad[0].path,
            "export does not load as its consumer reads it: "
            + " | ".join(r.line() for r in bad)
            + "; every file is kept as written (the LyCORIS file and the checkpoint's own weights are unaffected)",
        )


__all__ = [
    "ExportMismatch",
    "Verified",
    "comfy_key_check",
    "comfy_key_map",
    "comfy_module",
    "nonfinite_problem",
    "raise_on_mismatch",
    "verify_comfy",
    "verify_lycoris",
    "verify_merged",
]
