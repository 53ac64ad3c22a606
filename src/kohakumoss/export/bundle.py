"""One call that writes every export of a run or checkpoint into a folder, or to a named file.

Into a folder (`export_paths`, the one naming rule):
<name>-comfy.safetensors     ComfyUI-format adapter, q/k/v fused as in Comfy-Org's DiT (adapter runs)
lycoris/<name>.safetensors   LyCORIS file (adapter runs): this project's and lycoris's loaders read it,
                             ComfyUI none of its keys, so it never sits beside the ComfyUI file
merged/                      merged transformer in `merged_layout` (optional; always for full FT)
transformer/                 the HF transformer/ folder: released names, config.json (optional)
To a file `<stem>.safetensors`: the ComfyUI adapter is that file; the others go beside it as
`<stem>-lycoris/<stem>.safetensors`, `<stem>-merged/`, `<stem>-transformer/`. The only adapter file at
the top is the one ComfyUI reads.

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
from kohakumoss.config.export import ExportScriptConfig
from kohakumoss.config.train import SAVE_FORMATS
from kohakumoss.model import MossBackbone
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.hashing import safetensors_hashes
from kohakumoss_common.io import save_safetensors
from kohakumoss_common.log import get_logger

from .comfy_lora import to_comfy_adapter
from .merged import save_merged
from .verify import Verified, raise_on_mismatch, verify_comfy, verify_lycoris, verify_merged

log = get_logger(__name__)
ADAPTER_SUFFIX = ".safetensors"


def names_a_file(out: str | Path) -> bool:
    """Whether an export target names the ComfyUI file itself (a `.safetensors` path) rather than a folder."""
    return Path(out).suffix.lower() == ADAPTER_SUFFIX


def export_paths(out: str | Path, name: str) -> dict[str, Path]:
    """Where each export kind goes: in the folder `out` under `name`, or (`out` a .safetensors file) the
    ComfyUI adapter at `out` and the others beside it, named by its stem (module docstring)."""
    out = Path(out)
    if names_a_file(out):
        stem = out.parent / out.stem
        return {
            "comfy": out,
            "lycoris": Path(f"{stem}-lycoris") / f"{out.stem}{ADAPTER_SUFFIX}",
            "merged": Path(f"{stem}-merged"),
            "diffusers": Path(f"{stem}-transformer"),
        }
    return {
        "comfy": out / f"{name}-comfy{ADAPTER_SUFFIX}",
        "lycoris": out / "lycoris" / f"{name}{ADAPTER_SUFFIX}",
        "merged": out / "merged",
        "diffusers": out / "transformer",
    }


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
    meta.update(safetensors_hashes(comfy.tensors, meta))
    save_safetensors(comfy.tensors, path, meta)
    return comfy.formats


def export_all(
    model: MossBackbone,
    network: LycorisNetwork | None,
    out: str | Path,
    name: str,
    save_merged_model: bool = False,
    merged_layout: str = ExportScriptConfig.merged_layout,
    save_diffusers: bool = False,
    dtype: torch.dtype | None = torch.bfloat16,
    adapter_dtype: torch.dtype | None = None,
    metadata: dict[str, str] | None = None,
    verify: bool = True,
    save_format: str = ExportScriptConfig.save_format,
    full_diffs: bool = True,
) -> dict[str, Path]:
    """Write the exports of an adapter run (network given) or a full fine-tune (network None);
    `metadata` (ss_* / modelspec.*, `export/metadata.py`) goes into every adapter file. With `verify`
    each file is checked after it is written (one log line per file; ExportMismatch when one fails).
    `out`: a folder, or the ComfyUI file (`export_paths`); `save_format` / `full_diffs`: see the module
    docstring."""
    if save_format not in SAVE_FORMATS:
        raise ConfigError("SAVE_FORMAT", f"'{save_format}' is not one of {SAVE_FORMATS}")
    paths = export_paths(out, name)
    written: dict[str, Path] = {}
    checks: list[Verified] = []
    source = None
    if network is not None:
        source = adapter_state_dict(network)
        lycoris = paths["lycoris"]
        written["lycoris"] = save_adapter(network, lycoris, adapter_dtype, metadata)
        if verify:
            checks.append(verify_lycoris(model, source, lycoris))
        comfy = paths["comfy"]
        if save_format != "hf" and save_comfy_adapter(
            model, network, comfy, adapter_dtype, metadata=metadata, full_diffs=full_diffs
        ):
            written["comfy"] = comfy
            if verify:
                checks.append(verify_comfy(model, source, comfy))
    if save_merged_model or network is None:
        save_merged(model, source, paths["merged"], merged_layout, dtype)
        written["merged"] = paths["merged"]
        if verify:
            checks.append(verify_merged(model, source, written["merged"], merged_layout))
    if save_diffusers:
        save_merged(model, source, paths["diffusers"], "hf", dtype)
        written["diffusers"] = paths["diffusers"]
        if verify:
            checks.append(verify_merged(model, source, written["diffusers"], "hf"))
    raise_on_mismatch(checks)
    if save_format == "comfy" and "comfy" in written:  # verified (or unchecked when asked): one file stays
        dropped = written.pop("lycoris")
        dropped.unlink()
        if not any(dropped.parent.iterdir()):
            dropped.parent.rmdir()
    if "lycoris" in written:  # two adapter files: say which one ComfyUI loads
        comfy_file = (
            f"ComfyUI's is {written['comfy'].name}"
            if "comfy" in written
            else "SAVE_FORMAT='both' writes ComfyUI's"
        )
        log.info(
            f"{written['lycoris'].parent.name}/{written['lycoris'].name}: LyCORIS format, for this project's scripts and lycoris; ComfyUI loads none of its keys ({comfy_file})"
        )
    return written
