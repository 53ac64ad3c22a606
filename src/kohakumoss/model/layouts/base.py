"""KeyLayout: a rename table between native keys and a file layout, with fused tensors split and joined.

A rule maps a native key pattern to a layout key pattern; `{i}` stands for a block index. A fused rule
maps several native keys (joined along dim 0, in order) to one layout key, like ComfyUI's qkv.
Prefixes a file may carry are stripped when reading; `save_prefix` is put in front when writing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache

import torch

from kohakumoss_common.errors import CheckpointError

# the prefixes ComfyUI files put in front of the DiT's keys (a full checkpoint's, a diffusion model's)
COMFY_PREFIXES = ("model.diffusion_model.", "diffusion_model.")


@cache
def _pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)") + "$")


def _fill(template: str, m: re.Match) -> str:
    return template.replace("{i}", m.group("i")) if "{i}" in template else template


@dataclass(frozen=True)
class KeyLayout:
    name: str
    renames: tuple[tuple[str, str], ...] = ()  # (native template, layout template)
    fused: tuple[tuple[tuple[str, ...], str], ...] = ()  # ((native templates...), layout template)
    strip_prefixes: tuple[str, ...] = ()  # prefixes a file may carry (removed when reading)
    save_prefix: str = ""  # put in front of every key when writing
    marker_keys: tuple[str, ...] = ()  # layout keys (block 0) whose presence identifies this layout

    # ---- native -> layout -----------------------------------------------------------------
    def from_native(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rename (and fuse) a full native state dict into this layout (no prefix)."""
        out: dict[str, torch.Tensor] = {}
        used: set[str] = set()
        for parts, target in self.fused:
            first = _pattern(parts[0])
            for key in state:
                m = first.match(key)
                if not m:
                    continue
                names = [_fill(p, m) for p in parts]
                absent = [n for n in names if n not in state]
                if absent:
                    raise CheckpointError(
                        "<state dict>", f"cannot fuse {names} into '{_fill(target, m)}': {absent} absent"
                    )
                out[_fill(target, m)] = torch.cat([state[n] for n in names], 0)
                used.update(names)
        for key, tensor in state.items():
            if key not in used:
                out[self.key_from_native(key)] = tensor
        return out

    def key_from_native(self, key: str) -> str:
        for native, target in self.renames:
            m = _pattern(native).match(key)
            if m:
                return _fill(target, m)
        return key

    # ---- layout -> native -----------------------------------------------------------------
    def strip(self, key: str) -> str:
        for prefix in self.strip_prefixes:
            if key.startswith(prefix):
                return key[len(prefix) :]
        return key

    def fused_parts(self, key: str) -> list[str] | None:
        """The native keys a fused layout key holds, in row order (None when `key` is not fused)."""
        key = self.strip(key)
        for parts, target in self.fused:
            m = _pattern(target).match(key)
            if m:
                return [_fill(p, m) for p in parts]
        return None

    def split_fused(self, key: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None:
        """If `key` is a fused layout key, its native parts (equal split along dim 0)."""
        names = self.fused_parts(key)
        if names is None:
            return None
        if tensor.shape[0] % len(names):
            raise CheckpointError(
                "<checkpoint>", f"'{key}' has {tensor.shape[0]} rows, not divisible into {len(names)} parts"
            )
        return list(zip(names, tensor.chunk(len(names), dim=0)))

    def key_to_native(self, key: str) -> str:
        key = self.strip(key)
        for native, target in self.renames:
            m = _pattern(target).match(key)
            if m:
                return _fill(native, m)
        return key

    def to_native(self, items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Stream (layout key, tensor) into (native key, tensor), splitting fused tensors."""
        for key, tensor in items:
            parts = self.split_fused(key, tensor)
            if parts is not None:
                yield from parts
            else:
                yield self.key_to_native(key), tensor

    def native_shapes(self, shapes: dict[str, list[int]]) -> dict[str, list[int]]:
        """Layout key -> shape, as native key -> shape (no tensor data read)."""
        out: dict[str, list[int]] = {}
        for key, shape in shapes.items():
            names = self.fused_parts(key)
            if names is not None:
                for name in names:
                    out[name] = [shape[0] // len(names), *shape[1:]]
            else:
                out[self.key_to_native(key)] = list(shape)
        return out

    def layout_keys(self, native_keys: Iterable[str]) -> set[str]:
        """The (unprefixed) keys a file of this layout holds for these native keys."""
        keys = set(native_keys)
        out: set[str] = set()
        for parts, target in self.fused:
            first = _pattern(parts[0])
            for key in sorted(keys):
                m = first.match(key)
                if m and all(_fill(p, m) in keys for p in parts):
                    out.add(_fill(target, m))
                    keys -= {_fill(p, m) for p in parts}
        return out | {self.key_from_native(k) for k in keys}

    def matches(self, keys: Iterable[str]) -> bool:
        stripped = {self.strip(k) for k in keys}
        return all(m in stripped for m in self.marker_keys)
