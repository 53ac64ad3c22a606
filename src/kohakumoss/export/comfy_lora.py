"""The ComfyUI-format adapter: `diffusion_model.<module>.<lycoris key>` on the released module names
(`diffusion_model.layers.N.proj.o.lora_down.weight`, `.lora_up.weight`, `.alpha`: the kohya style of the
published MOSS LoRAs), with q/k/v repacked to Comfy-Org's fused `layers.N.proj.qkv` (`fused=True`, the
default: ComfyUI's generic key map reaches the fused weight by its own name) or kept apart (`fused=False`,
exactly the published files' keys).

Comfy-Org stores q, k, v as one matrix W_qkv = [W_q; W_k; W_v] (rows stacked). Per algorithm:

- LoRA / LoCon / DyLoRA (saved at full rank): dW_i = s_i U_i D_i with s_i = alpha_i / r_i. Then
      dW_qkv = [s_q U_q D_q; s_k U_k D_k; s_v U_v D_v] = blockdiag(s_q U_q, s_k U_k, s_v U_v) @ [D_q; D_k; D_v]
  so the fused LoRA has down = concat of the downs along the rank axis (R = r_q + r_k + r_v rows), up =
  the block-diagonal of the ups (3 out x R). ComfyUI scales by alpha / R; when every s_i equals s the
  file keeps alpha = s R, otherwise s_i / s is folded into each up block with s = 1. A member without
  an adapter contributes zero rows.
- LoHa: dW_i = s_i (A1_i B1_i) * (A2_i B2_i) (elementwise). Stacking rows of Hadamard products is the
  Hadamard product of the stacked factors, and each stack is again block-diagonal @ concat:
  A1 = blockdiag(s_i/s A1_i), B1 = [B1_i], A2 = blockdiag(A2_i), B2 = [B2_i]; alpha = s R.
- LoKr: a row stack of Kronecker products is not a Kronecker product, but each one is an exact LoRA:
  with A = L_A R_A and B = L_B R_B (a factor's own decomposition w*_a w*_b, or the factor beside an
  identity), kron(A, B) = kron(L_A, L_B) @ kron(R_A, R_B). Fused q/k/v become one LoRA of those (scales
  folded into the ups, alpha = rank) while that is smaller than the full difference, else a `diff`.
  Modules stored alone keep their lokr_* keys.
- GLoRA: ComfyUI reads `a1.weight`, `a2.weight`, `b1.weight`, `b2.weight`, `alpha` as lycoris writes them
  (dW = s (W a1 a2 + b1 b2)); fused q/k/v become one LoRA, up_i = s_i [W_i a1_i, b1_i], down_i = [a2_i; b2_i].
  Mixed LoRA / LoKr / GLoRA members of one fused qkv take the same LoRA route.
- OFT (diag-OFT without rescale): ComfyUI's OFT reads `oft_blocks` [blocks, n, n] and `alpha` (its
  constraint) and rotates each block of n output rows, as lycoris does; lycoris's constraint is alpha
  times the output width, ComfyUI's alpha itself. Written with lycoris's constraint already applied
  (blocks = Q / 2, alpha 0), so q, k, v's blocks concatenate into one fused OFT.
- BOFT: ComfyUI's BOFT reads lycoris's `oft_blocks` [stages, blocks, b, b] and `rescale` (the same
  butterfly), written with lycoris's constraint applied like OFT. Its butterfly spans the module's
  rows, so a fused q/k/v of three is a `diff`.
- DoRA, IA3, T-LoRA, a rescaled OFT, BOFT's fused q/k/v and Tucker (mid/t) variants: a `diff` key (the full weight difference
  merged - base, computed by lycoris), which ComfyUI adds as is. (ComfyUI's DoRA normalises per input
  column and lycoris's default per output row, so lycoris's DoRA files have no `dora_scale` form there.)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from kohakumoss.adapters.foreign import is_lycoris_state, to_lycoris_state
from kohakumoss.adapters.io import AdapterSource, adapter_state_dict, read_adapter
from kohakumoss.adapters.merge import dense_weight, weight_diffs
from kohakumoss.adapters.targets import module_name_map
from kohakumoss_common.errors import CheckpointError

from .comfy_keys import COMFY_PREFIX, fused_slot

LORA_KEYS = ("lora_up.weight", "lora_down.weight")
LOHA_KEYS = ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")
GLORA_KEYS = ("a1.weight", "a2.weight", "b1.weight", "b2.weight")
LOW_RANK = ("lora", "lokr", "glora")  # kinds a fused qkv can hold as one exact LoRA


@dataclass
class ComfyAdapter:
    tensors: dict[str, torch.Tensor]
    formats: dict[str, str] = field(default_factory=dict)  # comfy module -> lora | loha | lokr | glora | diff
    deferred: list[str] = field(default_factory=list)  # modules that need a diff, left out (full_diffs=False)


def _kind(entry: dict[str, torch.Tensor]) -> str:
    names = set(entry)
    if set(LORA_KEYS) <= names and not names & {"lora_mid.weight", "dora_scale"}:
        return "lora"
    if set(LOHA_KEYS) <= names and not names & {"hada_t1", "hada_t2", "dora_scale"}:
        return "loha"
    if any(n.startswith("lokr_") for n in names) and "dora_scale" not in names and "lokr_t2" not in names:
        return "lokr"
    if set(GLORA_KEYS) <= names and "dora_scale" not in names:
        return "glora"
    if "oft_blocks" in names and names <= {"oft_blocks", "alpha", "rescale"}:
        dims = entry["oft_blocks"].dim()
        if dims == 4:
            return "boft"
        return "oft" if dims == 3 and "rescale" not in names else "diff"  # ComfyUI's OFT ignores rescale
    return "diff"


def _lycoris_oft_q(entry: dict[str, torch.Tensor]) -> torch.Tensor:
    """lycoris's constrained Q of a diag-OFT entry: its constraint is the saved alpha times the output
    width (ComfyUI reads alpha itself as the constraint, hence alpha 0 in our files)."""
    blocks = entry["oft_blocks"].float()  # [blocks, n, n] (OFT) or [stages, blocks, n, n] (BOFT)
    q = blocks - blocks.transpose(-1, -2)
    constraint = float(entry["alpha"]) * blocks.shape[-3] * blocks.shape[-1] if "alpha" in entry else 0.0
    norm = torch.norm(q) + 1e-8
    return q * constraint / norm if constraint > 0 and norm > constraint else q


def _oft(members: list[str], entries: dict[str, dict], out_dims: list[int]) -> dict | None:
    """One OFT for modules stacked along the rows (or one module): each member's constrained Q halved into
    blocks (blocks - blocks^T = Q again) and concatenated, alpha 0 (no constraint over the concatenation);
    None when the members' block sizes differ."""
    sizes = {entries[m]["oft_blocks"].shape[-1] for m in members if m in entries}
    if len(sizes) != 1:
        return None
    n = sizes.pop()
    parts = [
        _lycoris_oft_q(entries[m]) / 2 if m in entries else torch.zeros(out // n, n, n)
        for m, out in zip(members, out_dims)
    ]
    return {"oft_blocks": torch.cat(parts, 0), "alpha": torch.tensor(0.0)}


def _scale(entry: dict[str, torch.Tensor], rank: int) -> float:
    return float(entry["alpha"]) / rank if "alpha" in entry else 1.0


def _factors(
    entry: dict[str, torch.Tensor], kind: str
) -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """([up factors], [down factors], scale) of one module: one pair for LoRA, two for LoHa."""
    if kind == "lora":
        up, down = [entry["lora_up.weight"]], [entry["lora_down.weight"]]
    else:
        up, down = [entry["hada_w1_a"], entry["hada_w2_a"]], [entry["hada_w1_b"], entry["hada_w2_b"]]
    return up, down, _scale(entry, down[0].shape[0])


def _fuse(members: list[str], entries: dict[str, dict], out_dims: list[int], in_dim: int, kind: str) -> dict:
    """Block-diagonal ups @ concatenated downs (see the module docstring); missing members are rank 0."""
    pairs = 1 if kind == "lora" else 2
    ups: list[list[torch.Tensor]] = [[] for _ in range(pairs)]
    downs: list[list[torch.Tensor]] = [[] for _ in range(pairs)]
    scales: list[float | None] = []
    for name, out in zip(members, out_dims):
        if name in entries:
            up, down, s = _factors(entries[name], kind)
        else:
            up, down, s = [torch.zeros(out, 0)] * pairs, [torch.zeros(0, in_dim)] * pairs, None
        for j in range(pairs):
            ups[j].append(up[j].float())
            downs[j].append(down[j].float())
        scales.append(s)
    known = [s for s in scales if s is not None]
    same = all(abs(s - known[0]) <= 1e-12 * max(1.0, abs(known[0])) for s in known)
    common = known[0] if same else 1.0
    folded = [u * ((s if s is not None else common) / common) for u, s in zip(ups[0], scales)]
    fused_up = [torch.block_diag(*folded)] + [torch.block_diag(*u) for u in ups[1:]]
    fused_down = [torch.cat(d, 0) for d in downs]
    alpha = torch.tensor(common * fused_down[0].shape[0])
    if kind == "lora":
        return {"lora_up.weight": fused_up[0], "lora_down.weight": fused_down[0], "alpha": alpha}
    return {
        "hada_w1_a": fused_up[0],
        "hada_w1_b": fused_down[0],
        "hada_w2_a": fused_up[1],
        "hada_w2_b": fused_down[1],
        "alpha": alpha,
    }


def _split(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """m = left @ right with the smaller inner size: (m, I) or (I, m)."""
    if m.shape[1] <= m.shape[0]:
        return m, torch.eye(m.shape[1])
    return torch.eye(m.shape[0]), m


def _lokr_factor(entry: dict[str, torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """(left, right, decomposed rank or None) of LoKr factor `name` (w1 / w2)."""
    if f"lokr_{name}" in entry:
        return (*_split(entry[f"lokr_{name}"].float()), None)
    a, b = entry[f"lokr_{name}_a"].float(), entry[f"lokr_{name}_b"].float()
    return a, b, b.shape[0]


def _low_rank(
    entry: dict[str, torch.Tensor], kind: str, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(up, down) with up @ down = the module's weight difference at strength 1 (ComfyUI's scaling)."""
    if kind == "lora":
        up, down = entry["lora_up.weight"].float(), entry["lora_down.weight"].float()
        return up * _scale(entry, down.shape[0]), down
    if kind == "glora":
        a1, a2, b1, b2 = (entry[k].float() for k in GLORA_KEYS)
        s = _scale(entry, a2.shape[0])
        # the trained model may sit on the GPU, the entries on the host
        w = weight.to(a1.device, torch.float32)
        return torch.cat([s * (w @ a1), s * b1], 1), torch.cat([a2, b2], 0)
    l1, r1, d1 = _lokr_factor(entry, "w1")
    l2, r2, d2 = _lokr_factor(entry, "w2")
    dim = d2 if d2 is not None else d1  # ComfyUI's alpha / dim: the last decomposed factor's rank
    s = float(entry["alpha"]) / dim if "alpha" in entry and dim is not None else 1.0
    return s * torch.kron(l1, l2), torch.kron(r1, r2)


def _fuse_low_rank(
    members: list[str], entries: dict[str, dict], weights: list[torch.Tensor]
) -> dict[str, torch.Tensor] | None:
    """One LoRA for a fused qkv of LoRA / LoKr / GLoRA members (scales in the ups, alpha = rank), or None
    when it would not be smaller than the full difference."""
    ups, downs = [], []
    for name, w in zip(members, weights):
        if name in entries:
            up, down = _low_rank(entries[name], _kind(entries[name]), w)
        else:
            up, down = torch.zeros(w.shape[0], 0), torch.zeros(0, w.shape[1])
        ups.append(up)
        downs.append(down)
    rank = sum(d.shape[0] for d in downs)
    rows, cols = sum(w.shape[0] for w in weights), weights[0].shape[1]
    if rank * (rows + cols) >= rows * cols:
        return None
    return {
        "lora_up.weight": torch.block_diag(*ups),
        "lora_down.weight": torch.cat(downs, 0),
        "alpha": torch.tensor(float(rank)),
    }


def to_comfy_adapter(
    model: nn.Module,
    source: AdapterSource,
    dtype: torch.dtype | None = None,
    fused: bool = True,
    full_diffs: bool = True,
) -> ComfyAdapter:
    """ComfyUI-format tensors for an adapter on `model` (weights are only read for `diff` fallbacks);
    `fused=False` keeps q, k, v as modules of their own (the published kohya key style); `full_diffs=False`:
    an adapter that needs a full weight difference anywhere comes back empty, those modules in `deferred`."""
    sd, _ = read_adapter(adapter_state_dict(source) if isinstance(source, nn.Module) else source)
    if not is_lycoris_state(sd):  # a published-style LoRA: repacked like our own
        sd = to_lycoris_state(model, sd)
    names = module_name_map(model)
    entries: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for key, t in sd.items():
        prefix, _, rest = key.partition(".")
        if prefix not in names:
            raise CheckpointError(prefix, "adapter module names no module of this model")
        entries[names[prefix]][rest] = t
    groups: dict[str, list[str]] = defaultdict(list)
    singles = []
    for name in entries:
        slot = fused_slot(name) if fused else None
        if slot is None:
            singles.append(name)
        else:
            groups[slot.target] = list(slot.members)
    out = ComfyAdapter({})
    need_diff: dict[str, list[str]] = {}  # comfy module -> native members (one, or the fused group)
    for name in singles:
        kind = _kind(entries[name])
        target = name  # stored on its own: the native (released) name
        if kind == "diff":
            need_diff[target] = [name]
            continue
        out.formats[target] = kind
        entry = entries[name]
        if kind in ("oft", "boft"):  # lycoris's constraint applied, alpha 0 (ComfyUI's differs)
            entry = {**entry, "oft_blocks": _lycoris_oft_q(entry) / 2, "alpha": torch.tensor(0.0)}
        out.tensors.update({f"{COMFY_PREFIX}{target}.{k}": v for k, v in entry.items() if k != "dora_scale"})
    for target, members in groups.items():
        kinds = {_kind(entries[m]) for m in members if m in entries}
        weights = [dense_weight(model.get_submodule(m)) for m in members]
        packed = None
        if len(kinds) == 1 and kinds <= {"lora", "loha"}:
            kind = next(iter(kinds))
            packed = _fuse(members, entries, [w.shape[0] for w in weights], weights[0].shape[1], kind)
        elif kinds <= set(LOW_RANK):
            kind, packed = "lora", _fuse_low_rank(members, entries, weights)
        elif kinds == {"oft"}:
            kind, packed = "oft", _oft(members, entries, [w.shape[0] for w in weights])
        if packed is None:
            need_diff[target] = members
            continue
        out.formats[target] = kind
        out.tensors.update({f"{COMFY_PREFIX}{target}.{k}": v for k, v in packed.items()})
    if need_diff and not full_diffs:  # no partial file: the caller writes none, or the whole one later
        return ComfyAdapter({}, out.formats, sorted(need_diff))
    if need_diff:
        wanted = {m for ms in need_diff.values() for m in ms}
        subset = {k: v for k, v in sd.items() if names[k.partition(".")[0]] in wanted}
        diffs = weight_diffs(model, subset)
        for target, members in need_diff.items():
            parts = [
                diffs.get(f"{m}.weight", torch.zeros(model.get_submodule(m).weight.shape)) for m in members
            ]
            out.tensors[f"{COMFY_PREFIX}{target}.diff"] = torch.cat(parts, 0)
            biases = [diffs.get(f"{m}.bias") for m in members]
            if any(b is not None for b in biases):
                out.tensors[f"{COMFY_PREFIX}{target}.diff_b"] = torch.cat(
                    [
                        b if b is not None else torch.zeros(model.get_submodule(m).weight.shape[0])
                        for b, m in zip(biases, members)
                    ]
                )
            out.formats[target] = "diff"
    if dtype is not None:
        out.tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in out.tensors.items()}
    out.tensors = {k: v.contiguous() for k, v in out.tensors.items()}
    return out
