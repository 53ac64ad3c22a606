"""KeyLayout: a rename table between native keys and a file layout, with fused tensors split and joined.

A rule maps a native key pattern to a layout key pattern; `{i}` stands for a block index. A fused rule
maps several native keys (joined along dim 0, in order) to one layout key, like ComfyUI's qkv.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch


def _pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)") + "$")


@dataclass(frozen=True)
class KeyLayout:
    name: str
    renames: tuple[tuple[str, str], ...]  # (native template, layout template)
    fused: tuple[tuple[tuple[str, ...], str], ...] = ()  # ((native templates...), layout template)
    strip_prefixes: tuple[str, ...] = ()  # prefixes a file may carry (removed when reading)
    marker_keys: tuple[str, ...] = ()  # layout keys (block 0) whose presence identifies this layout

    # ---- native -> layout -----------------------------------------------------------------
    def from_native(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rename (and fuse) a full native state dict into this layout."""
        out: dict[str, torch.Tensor] = {}
        used: set[str] = set()
        for parts, target in self.fused:
            first = _pattern(parts[0])
            for key in state:
                m = first.match(key)
                if not m:
                    continue
                names = [p.replace("{i}", m.group("i")) if "{i}" in p else p for p in parts]
                if all(n in state for n in names):
                    out[target.replace("{i}", m.groupdict().get("i") or "")] = torch.cat(
                        [state[n] for n in names], 0
                    )
                    used.update(names)
        for key, tensor in state.items():
            if key not in used:
                out[self.key_from_native(key)] = tensor
        return out

    def key_from_native(self, key: str) -> str:
        for native, target in self.renames:
            m = _pattern(native).match(key)
            if m:
                return target.replace("{i}", m.group("i")) if "{i}" in target else target
        return key

    # ---- layout -> native -----------------------------------------------------------------
    def strip(self, key: str) -> str:
        for prefix in self.strip_prefixes:
            if key.startswith(prefix):
                return key[len(prefix) :]
        return key

    def split_fused(self, key: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None:
        """If `key` is a fused layout key, its native parts (equal split along dim 0)."""
        key = self.strip(key)
        for parts, target in self.fused:
            m = _pattern(target).match(key)
            if m:
                names = [p.replace("{i}", m.group("i")) if "{i}" in p else p for p in parts]
                return list(zip(names, tensor.chunk(len(names), dim=0)))
        return None

    def key_to_native(self, key: str) -> str:
        key = self.strip(key)
        for native, target in self.renames:
            m = _pattern(target).match(key)
            if m:
                return native.replace("{i}", m.group("i")) if "{i}" in native else native
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
            parts = self.split_fused(key, torch.empty(0))
            if parts is not None:
                n = len(parts)
                for name, _ in parts:
                    out[name] = [shape[0] // n, *shape[1:]]
            else:
                out[self.key_to_native(key)] = list(shape)
        return out

    def matches(self, keys: Iterable[str]) -> bool:
        stripped = {self.strip(k) for k in keys}
        return all(m in stripped for m in self.marker_keys)
