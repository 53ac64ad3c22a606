"""Adapters through lycoris-lora: targeting presets, the builder, LoRA+ groups, LyCORIS files (and the
published kohya / PEFT / ComfyUI LoRA key styles), merging."""

from .algos import ALGOS, resolve_algo
from .builder import adapter_spec, build_adapter, build_from_spec
from .foreign import is_lora_state, is_lycoris_state, to_lycoris_state
from .io import adapter_state_dict, load_adapter, read_adapter, read_spec, save_adapter
from .merge import merge_into, merged_state_dict, merged_weights, weight_diffs
from .plus import adapter_param_groups, is_up_param
from .spec import AdapterSpec
from .targets import TARGET_PRESETS, lycoris_name, matched_modules, target_patterns
from .tlora import clear_tlora_mask, set_tlora_sigma, tlora_mask

__all__ = [
    "ALGOS",
    "TARGET_PRESETS",
    "AdapterSpec",
    "adapter_param_groups",
    "adapter_spec",
    "adapter_state_dict",
    "build_adapter",
    "build_from_spec",
    "clear_tlora_mask",
    "is_lora_state",
    "is_lycoris_state",
    "is_up_param",
    "load_adapter",
    "lycoris_name",
    "matched_modules",
    "merge_into",
    "merged_state_dict",
    "merged_weights",
    "read_adapter",
    "read_spec",
    "resolve_algo",
    "save_adapter",
    "set_tlora_sigma",
    "target_patterns",
    "tlora_mask",
    "to_lycoris_state",
    "weight_diffs",
]
