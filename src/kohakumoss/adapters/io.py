"""Adapter files in the LyCORIS format (the state dict `LycorisNetwork.save_weights` writes), read by
lycoris's loader.
LoRA files in the published kohya / PEFT / ComfyUI key styles are read too, turned into LyCORIS state
dicts first (`foreign.py`).

Two lycoris-lora 4.1.3 gaps are bridged here, nothing else:
- DyLoRA trains with scale alpha / blocks_used but saves a plain LoRA that readers scale by
  alpha / rank; the saved alpha is multiplied by block_size so the file is DyLoRA at full rank.
- `create_lycoris_from_weights` cannot rebuild IA3 (its make_module_from_state_dict takes one tensor
  and is given two); IA3 entries are rebuilt with lycoris's IA3Module directly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from lycoris import LycorisNetwork, create_lycoris_from_weights
from lycoris.modules.dylora import DyLoraModule
from lycoris.modules.ia3 import IA3Module
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.hashing import safetensors_hashes
from kohakumoss_common.io import read_header, readable_file, save_safetensors

from .foreign import is_lycoris_state, to_lycoris_state
from .spec import SPEC_METADATA_KEY, AdapterSpec
from .targets import module_name_map

AdapterSource = LycorisNetwork | dict | str | Path


@contextmanager
def _dylora_full_rank_alpha(network: LycorisNetwork) -> Iterator[None]:
    mods = [m for m in network.loras if isinstance(m, DyLoraModule)]
    saved = [m.alpha.clone() for m in mods]
    for m in mods:
        m.alpha.mul_(m.block_size)
    try:
        yield
    finally:
        for m, a in zip(mods, saved):
            m.alpha.copy_(a)


@torch.no_grad()
def adapter_state_dict(network: LycorisNetwork) -> dict[str, torch.Tensor]:
    """The tensors `save_weights` writes (lycoris key format), detached copies on the CPU."""
    with _dylora_full_rank_alpha(network):
        return {k: v.detach().to("cpu").clone() for k, v in network.state_dict().items()}


def modelspec_architecture(algo: str) -> str:
    """ModelSpec's architecture of a MOSS-Image adapter: `MOSS-Image/lora`, `MOSS-Image/lokr`, ..."""
    return f"MOSS-Image/{algo}"


def adapter_metadata(network: LycorisNetwork, extra: dict[str, str] | None = None) -> dict[str, str]:
    """kohya/LyCORIS-style metadata (ss_network_*), ModelSpec's fixed keys and the full AdapterSpec;
    `extra` (a run's ss_* / modelspec.* keys, `export/metadata.py`) overrides them."""
    spec: AdapterSpec | None = getattr(network, "kohakumoss_spec", None)
    meta = {
        "ss_network_module": "lycoris.kohya",
        "ss_base_model_version": "moss_image",
        "modelspec.sai_model_spec": "1.0.0",
        "modelspec.architecture": modelspec_architecture(spec.algo if spec is not None else "lycoris"),
        "modelspec.implementation": "https://github.com/KohakuBlueleaf/KohakuMossTrainer",
    }
    if spec is not None:
        args = {"algo": spec.algo, "preset": spec.preset, "dropout": spec.dropout, **spec.algo_args}
        meta.update(
            ss_network_dim=str(spec.rank),
            ss_network_alpha=str(spec.alpha),
            ss_network_args=json.dumps(args),
            **{SPEC_METADATA_KEY: spec.to_json()},
        )
    meta.update(extra or {})
    return meta


def save_adapter(
    network: LycorisNetwork,
    path: str | Path,
    dtype: torch.dtype | None = None,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write the LyCORIS file: the state dict `save_weights` writes (cast to `dtype`), written as every
    project file is (`save_safetensors`: atomic, the umask's mode, its length checked), its data's hashes
    in the metadata (`sshs_model_hash`, `modelspec.hash_sha256`)."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise CheckpointError(path, "adapter files are .safetensors")
    meta = adapter_metadata(network, metadata)
    with torch.no_grad(), _dylora_full_rank_alpha(network):  # copies: DyLoRA's alpha is restored after
        tensors = {
            k: v.detach().to("cpu", dtype or v.dtype, copy=True) for k, v in network.state_dict().items()
        }
    meta.update(safetensors_hashes(tensors, meta))
    save_safetensors(tensors, path, meta)
    return path


def read_adapter(source: dict | str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(lycoris state dict, metadata) from a file or an in-memory state dict."""
    if isinstance(source, dict):
        return source, {}
    path = Path(source)
    if not path.is_file():
        raise CheckpointError(path, "no such adapter file")
    read_header(path)  # a file cut short: named, with its length and the header's
    with readable_file(path), safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
    with readable_file(path):
        return load_file(str(path)), metadata


def _implied_shape(sd: dict[str, torch.Tensor], p: str) -> tuple[int, int] | None:
    """(out, in) of the linear a LoRA / LoHa / LoKr / full-difference module's tensors were made for."""

    def dims(name: str) -> tuple[int, ...] | None:
        t = sd.get(f"{p}.{name}")
        return tuple(t.shape) if t is not None else None

    if (up := dims("lora_up.weight")) and (down := dims("lora_down.weight")):
        return up[0], down[1]
    if (a := dims("hada_w1_a")) and (b := dims("hada_w1_b")):
        return a[0], b[1]
    if (diff := dims("diff")) and len(diff) >= 2:
        return diff[0], diff[1]
    w1 = dims("lokr_w1") or ((x[0], y[1]) if (x := dims("lokr_w1_a")) and (y := dims("lokr_w1_b")) else None)
    w2 = dims("lokr_w2") or ((x[0], y[1]) if (x := dims("lokr_w2_a")) and (y := dims("lokr_w2_b")) else None)
    if w1 and w2 and len(w1) == 2 and len(w2) == 2:
        return w1[0] * w2[0], w1[1] * w2[1]
    return None


def shape_mismatch(model: nn.Module, known: dict[str, str], sd: dict[str, torch.Tensor]) -> str | None:
    """The first adapter module made for a linear of another shape than the model's, named, or None."""
    for p in sorted({k.split(".", 1)[0] for k in sd if "." in k}):
        linear = model.get_submodule(known[p]) if p in known else None
        if not isinstance(linear, nn.Linear) or (shape := _implied_shape(sd, p)) is None:
            continue
        if shape != (linear.out_features, linear.in_features):
            return (
                f"module {known[p]} was trained as a {shape[0]}x{shape[1]} linear (out x in); this model's is "
                f"{linear.out_features}x{linear.in_features}"
            )
    return None


def read_spec(path: str | Path) -> AdapterSpec | None:
    _, metadata = read_adapter(path)
    return AdapterSpec.from_json(metadata[SPEC_METADATA_KEY]) if SPEC_METADATA_KEY in metadata else None


def _ia3_modules(model: nn.Module, sd: dict, names: set[str], multiplier: float) -> list[IA3Module]:
    by_name = module_name_map(model)
    out = []
    for name in sorted(names):
        on_input = bool(int(sd[f"{name}.on_input"]))
        module = IA3Module(name, model.get_submodule(by_name[name]), multiplier, train_on_input=on_input)
        module.weight.data.copy_(sd[f"{name}.weight"])
        out.append(module)
    return out


def load_adapter(
    model: nn.Module,
    source: AdapterSource,
    multiplier: float = 1.0,
    apply: bool = True,
    strict: bool = True,
    device: torch.device | str | None = None,
) -> LycorisNetwork:
    """Rebuild a network from a LyCORIS file (or state dict, or a live network's state) onto `model`;
    a kohya / PEFT / ComfyUI-fused LoRA file becomes LoCon modules (`strict`: its unusable keys are an
    error, else a warning). The modules go to `device` (None: the model's; exports that only read the
    network keep it on the host beside the trained one on the card)."""
    if isinstance(source, LycorisNetwork):
        source = adapter_state_dict(source)
    sd, _ = read_adapter(source)
    where = source if isinstance(source, (str, Path)) else "<state dict>"
    if not is_lycoris_state(sd):
        sd = to_lycoris_state(model, sd, where, strict)
    prefixes = {k.split(".", 1)[0] for k in sd if "." in k}
    known = module_name_map(model)
    foreign = sorted(prefixes - set(known))
    if foreign:
        raise CheckpointError(
            where, f"{len(foreign)} adapter modules name no module of this model: {foreign[:5]}"
        )
    if mismatch := shape_mismatch(model, known, sd):
        raise CheckpointError(where, f"{mismatch}: an adapter trained on a model of another size")
    ia3 = {p for p in prefixes if f"{p}.on_input" in sd}
    rest = {k: v for k, v in sd.items() if k.split(".", 1)[0] not in ia3}
    try:
        network, _ = create_lycoris_from_weights(multiplier, "", model, weights_sd=rest)
    except RuntimeError as e:  # a shape no check above knows (another algorithm's tensors)
        raise CheckpointError(
            where, f"lycoris cannot rebuild it on this model ({e}): another model size?"
        ) from e
    network.loras.extend(_ia3_modules(model, sd, ia3, multiplier))
    loaded = {m.lora_name for m in network.loras}
    if loaded != prefixes:
        raise CheckpointError(
            where, f"lycoris could not rebuild {sorted(prefixes - loaded)[:5]} (unknown algorithm?)"
        )
    device = device or next(model.parameters()).device
    for module in network.loras:  # not yet registered on the network: move each one
        module.to(device)
    if apply:
        network.apply_to()
    network.requires_grad_(False)
    return network
