"""Which MOSS modules an adapter wraps: named presets and custom patterns, as a LyCORIS preset dict.

Module names are the released checkpoint's (`layers.N.proj.q`, `text_embedder.blocks.N.qkv`, ...).
Patterns are full-name regexes (anchored at both ends) over `MossBackbone.named_modules()`; a custom
preset may use globs instead (`layers.*.proj.q`). Only nn.Linear modules are ever adapted.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from torch import nn

from kohakumoss_common.errors import ConfigError

LORA_PREFIX = "lycoris"

_ATTN = [r"layers\.\d+\.proj\.(q|k|v|o)"]
_MLP = [r"layers\.\d+\.proj\.(ffn_up_gate|ffn_down)"]
_REFINER = [r"text_embedder\.proj", r"text_embedder\.blocks\.\d+\.(qkv|proj|ffn_gate|ffn_up|ffn_down)"]
_REST = [
    r"video_embedder",
    r"time_embedding\.(0|2)",
    r"shared_block_modulation",
    r"video_head_modulation",
    r"final_linear_video",
]

TARGET_PRESETS: dict[str, list[str]] = {
    "attn": _ATTN,
    "attn-mlp": _ATTN + _MLP,  # the six block projections the published MOSS LoRAs train
    "full": _ATTN + _MLP + _REFINER + _REST,
}


def target_patterns(preset: str, patterns: Sequence[str] | None = None) -> tuple[list[str], bool]:
    """(patterns, use_fnmatch) for a preset name; 'custom' takes `patterns` (globs if any has '*')."""
    if preset == "custom":
        if not patterns:
            raise ConfigError("TARGET_PATTERNS", "preset 'custom' needs at least one module name pattern")
        globs = any("*" in p or "?" in p for p in patterns) and not any("\\" in p for p in patterns)
        return list(patterns), globs
    if preset not in TARGET_PRESETS:
        raise ConfigError("TARGET_PRESET", f"unknown preset '{preset}'; known: {[*TARGET_PRESETS, 'custom']}")
    return list(TARGET_PRESETS[preset]), False


def lycoris_preset(patterns: Sequence[str], use_fnmatch: bool) -> dict:
    """The LyCORIS preset dict (for `LycorisNetwork.apply_preset`) that targets exactly these names."""
    names = list(patterns) if use_fnmatch else [f"(?:{p})$" for p in patterns]
    return {
        "enable_conv": False,
        "target_module": [],
        "target_name": names,
        "module_algo_map": {},
        "name_algo_map": {},
        "exclude_name": [],
        "use_fnmatch": use_fnmatch,
        "lora_prefix": LORA_PREFIX,
    }


def matched_modules(model: nn.Module, patterns: Sequence[str], use_fnmatch: bool) -> list[str]:
    """Names of the nn.Linear modules the patterns select (what the adapter will wrap)."""
    if use_fnmatch:
        hit = lambda name: any(fnmatch.fnmatch(name, p) for p in patterns)  # noqa: E731
    else:
        compiled = [re.compile(f"(?:{p})$") for p in patterns]
        hit = lambda name: any(c.match(name) for c in compiled)  # noqa: E731
    return [n for n, m in model.named_modules() if n and isinstance(m, nn.Linear) and hit(n)]


def lycoris_name(module_name: str) -> str:
    """LyCORIS's key prefix for a module: 'layers.0.proj.q' -> 'lycoris_layers_0_proj_q'."""
    return f"{LORA_PREFIX}_{module_name}".replace(".", "_")


def module_name_map(model: nn.Module) -> dict[str, str]:
    """lycoris name -> native module name, for every module of the model."""
    return {lycoris_name(n): n for n, _ in model.named_modules() if n}


def rank_problem(
    model: nn.Module, algo: str, rank: int, preset: str, patterns: Sequence[str] = ()
) -> str | None:
    """RANK against the narrowest linear the adapter wraps: a low rank no larger than min(in, out)
    features, an OFT block no larger than the output features (a larger one only costs memory)."""
    from .algos import resolve_algo

    name, algo_record = resolve_algo(algo)
    if not algo_record.has_rank:
        return None
    found, globs = target_patterns(preset, patterns)
    widths = {}
    for module in matched_modules(model, found, globs):
        linear = model.get_submodule(module)
        outputs = algo_record.rank_on_outputs
        widths[module] = linear.out_features if outputs else min(linear.in_features, linear.out_features)
    if not widths:
        return None  # no target: TARGET_PRESET's own check names it
    narrowest = min(widths, key=widths.get)
    if rank <= widths[narrowest]:
        return None
    what = "output features" if algo_record.rank_on_outputs else "min(in, out) features"
    return (
        f"{rank} is above the width of the narrowest targeted layer, {narrowest} ({widths[narrowest]} "
        f"{what}) of TARGET_PRESET '{preset}'; use RANK <= {widths[narrowest]} ({name})"
    )
