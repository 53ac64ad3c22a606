"""One call that writes every export of a run or checkpoint into a folder.

<name>-lycoris.safetensors   LyCORIS file (adapter runs)
<name>-comfy.safetensors     ComfyUI-format adapter, q/k/v fused as in Comfy-Org's DiT (adapter runs)
merged/                      merged transformer in `merged_layout` (optional; always for full FT)
transformer/                 the HF transformer/ folder: released names, config.json (optional)

Every file is read back as its consumer reads it and compared with the trainer's merge (`verify.py`);
one that fails raises `ExportMismatch` after all are written, nothing deleted. `save_format` keeps one
adapter file ("comfy" drops the LyCORIS file only once the ComfyUI file verified; "hf" writes no ComfyUI
file). `full_diffs=False` (checkpoints, COMFY_DIFFS='end') writes no ComfyUI file for an adapter that
needs full weight differences there (DoRA, BOFT, IA3, T-LoRA: a full-size matrix per module); the
LyCORIS file stays, and the run's final export writes the ComfyUI file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from lycoris import LycorisNetwork

from kohakumoss.adapters.io import adapter_metadata, adapter_state_dict, save_adapter
from kohakumoss.model import MossBackbone
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.io import save_safetensors
from kohakumoss_common.log import get_logger

from .comfy_lora import to_comfy_adapter
from .merged import save_merged
from .verify import Verified, raise_on_mismatch, verify_comfy, verify_lycoris, verify_merged

log = get_logger(__name__)
SAVE_FORMATS = ("comfy", "hf", "both")  # the trainer's SAVE_FORMAT: which adapter files stay


def save_comfy_adapter(
    model: MossBackbone,
    network: LycorisNetwork | dict,
    path: str | Path,
    dtype: torch.dtype | None = None,
    fused: bool = True,
    metadata: dict[str, str] | None = None,
    full_diffs: bool = True,
) -> dict[str, str] | None:
    """Write the ComfyUI-format adapter (`fused=False`: q, k, v apart, the published kohya key style)
    with `metadata` (ss_* / modelspec.*) added; returns {comfy module: format} (lora, loha, lokr, glora or
    diff), or None (nothing written) when `full_diffs` is False and the adapter needs a diff somewhere."""
    comfy = to_comfy_adapter(model, network, dtype, fused, full_diffs)
    if comfy.deferred:
        log.info(
            f"{Path(path).name}: not written here: {len(comfy.deferred)} modules need a full weight difference "
            f"({comfy.deferred[:3]}...); the run's final export writes it (COMFY_DIFFS='end')"
        )
        return None
    meta = (
        adapter_metadata(network, metadata) if isinstance(network, LycorisNetwork) else dict(metadata or {})
    )
    meta.update(
        kohakumoss_format="comfy" if fused else "kohya",
        kohakumoss_comfy_formats=json.dumps(comfy.formats, sort_keys=True),
    )
    save_safetensors(comfy.tensors, path, meta)
    return comfy.formats


def export_all(
    model: MossBackbone,
    network: LycorisNetwork | None,
    directory: str | Path,
    name: str,
    save_merged_model: bool = False,
    merged_layout: str = "comfy",
    save_diffusers: bool = False,
    dtype: torch.dtype | None = torch.bfloat16,
    adapter_dtype: torch.dtype | None = None,
    metadata: dict[str, str] | None = None,
    verify: bool = True,
    save_format: str = "both",
    full_diffs: bool = True,
) -> dict[str, Path]:
    """Write the exports of an adapter run (network given) or a full fine-tune (network None);
    `metadata` (ss_* / modelspec.*, `export/metadata.py`) goes into every adapter file. With `verify`
    each file is checked after it is written (one log line per file; ExportMismatch when one fails).
    `save_format` / `full_diffs`: see the module docstring."""
    if save_format not in SAVE_FORMATS:
        raise ConfigError("SAVE_FORMAT", f"'{save_format}' is not one of {SAVE_FORMATS}")
    directory = Path(directory)
    written: dict[str, Path] = {}
    checks: list[Verified] = []
    source = None
    if network is not None:
        source = adapter_state_dict(network)
        lycoris = directory / f"{name}-lycoris.safetensors"
        written["lycoris"] = save_adapter(network, lycoris, adapter_dtype, metadata)
        if verify:
            checks.append(verify_lycoris(model, source, lycoris))
        comfy = directory / f"{name}-comfy.safetensors"
        if save_format != "hf" and save_comfy_adapter(
            model, network, comfy, adapter_dtype, metadata=metadata, full_diffs=full_diffs
        ):
            written["comfy"] = comfy
            if verify:
                checks.append(verify_comfy(model, source, comfy))
    if save_merged_model or network is None:
        save_merged(model, source, directory / "merged", merged_layout, dtype)
        written["merged"] = directory / "merged"
        if verify:
            checks.append(verify_merged(model, source, written["merged"], merged_layout))
    if save_diffusers:
        save_merged(model, source, directory / "transformer", "hf", dtype)
        written["diffusers"] = directory / "transformer"
        if verify:
            checks.append(verify_merged(model, source, written["diffusers"], "hf"))
    raise_on_mismatch(checks)
    if save_format == "comfy" and "comfy" in written:  # verified (or unchecked when asked): one file stays
        written.pop("lycoris").unlink()
    return written
