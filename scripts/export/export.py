"""Export any checkpoint again: the ComfyUI adapter, the LyCORIS file, merged and diffusers transformers.

    kogine run scripts/export/export.py --set WEIGHTS=ComfyUI/models/diffusion_models/moss_image_base_int8_convrot.safetensors \
        --set ADAPTER=runs/moss/my-lora/checkpoints/step_00001000 --set OUT=exports --set SAVE_MERGED=True

OUT=my-lora.safetensors writes the ComfyUI file there and the others beside it (my-lora-lycoris/my-lora.safetensors,
my-lora-merged/, my-lora-transformer/).
"""

import sys

WEIGHTS = ""  # base DiT checkpoint (any layout) the adapter was trained on
MODEL_PRESET = ""  # with WEIGHTS empty: random weights of this preset (tests only)
ADAPTER = ""  # a checkpoint folder (or its trainable.safetensors), or a LyCORIS file
OUT = "export"  # output folder, or the ComfyUI file (a .safetensors path: the others go beside it)
NAME = ""  # file name stem in the OUT folder (default: RUN_NAME-stepXXXXX, or the adapter file's stem)
SAVE_FORMAT = "both"  # comfy: the ComfyUI LoRA; hf: the LyCORIS file; both
SAVE_MERGED = False  # also write the merged transformer
MERGED_LAYOUT = "comfy"  # key layout of the merged transformer
SAVE_DIFFUSERS = False  # also write a diffusers-layout transformer
USE_EMA = False  # export the checkpoint's EMA weights instead of the raw ones
DTYPE = "bf16"  # dtype of merged / diffusers weights
SEED = 0  # seed of MODEL_PRESET's random weights
SHOW_METADATA = (
    False  # print ADAPTER's metadata (ss_*, modelspec.*; a checkpoint's exports) and write nothing
)


def show_metadata(adapter: str) -> None:
    from pathlib import Path

    from kohakumoss.export.from_checkpoint import checkpoint_folder
    from kohakumoss.export.metadata import describe, read_metadata
    from kohakumoss_common.errors import ConfigError

    folder = checkpoint_folder(adapter) if adapter else None
    files = sorted((folder / "export").glob("*.safetensors")) if folder else [Path(adapter)]
    if not adapter or not files:
        raise ConfigError("ADAPTER", f"'{adapter}' holds no adapter file to show the metadata of")
    for path in files:
        print(f"{path}:")
        print(describe(read_metadata(path)))


def export_bytes(model, k: dict, dtype) -> int:
    """An upper estimate of what the export writes: the adapter files twice (LyCORIS and ComfyUI) at their
    stored size, and each merged / diffusers transformer at `dtype`."""
    from pathlib import Path

    adapter = Path(k["ADAPTER"])
    files = [adapter] if adapter.is_file() else list(adapter.rglob("*.safetensors"))
    adapter_bytes = sum(f.stat().st_size for f in files)
    merged = sum(p.numel() for p in model.parameters()) * dtype.itemsize
    return 2 * adapter_bytes + merged * (int(bool(k["SAVE_MERGED"])) + int(bool(k["SAVE_DIFFUSERS"])))


def check_out(out: str, name: str) -> None:
    """OUT names a folder, or the ComfyUI file (then the file's stem names the rest, and NAME is not used)."""
    from pathlib import Path

    from kohakumoss.export.bundle import names_a_file
    from kohakumoss_common.errors import ConfigError

    if not names_a_file(out):
        return
    if Path(out).is_dir():
        raise ConfigError("OUT", f"'{out}' is a folder; a .safetensors OUT names the ComfyUI file to write")
    if name:
        raise ConfigError("NAME", f"OUT '{out}' names the file itself; leave NAME empty or make OUT a folder")


def run(k: dict) -> None:
    import torch

    from kohakumoss.export.from_checkpoint import export_checkpoint
    from kohakumoss.model import MossBackbone, get_preset
    from kohakumoss.model.io import load_backbone
    from kohakumoss_common.errors import ConfigError
    from kohakumoss_common.io import disk_full_as_error, ensure_free_space

    if k["SHOW_METADATA"]:
        show_metadata(k["ADAPTER"])
        return
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[k["DTYPE"]]
    if not k["ADAPTER"]:
        raise ConfigError("ADAPTER", "set ADAPTER to a checkpoint folder or a LyCORIS file")
    check_out(k["OUT"], k["NAME"])
    if k["WEIGHTS"]:
        model = load_backbone(k["WEIGHTS"], dtype=torch.float32)
    elif k["MODEL_PRESET"]:
        model = MossBackbone(get_preset(k["MODEL_PRESET"])).init_weights(
            0.02, torch.Generator().manual_seed(k["SEED"])
        )
    else:
        raise ConfigError("WEIGHTS", "set WEIGHTS to the base DiT the adapter was trained on")
    model.requires_grad_(False)
    needed = export_bytes(model, k, dtype)
    ensure_free_space(k["OUT"], needed)  # before anything is written: one line with path, needed and free
    with disk_full_as_error(k["OUT"], needed):
        written = export_checkpoint(
            model,
            k["ADAPTER"],
            k["OUT"],
            k["NAME"],
            k["SAVE_MERGED"],
            k["MERGED_LAYOUT"],
            k["SAVE_DIFFUSERS"],
            k["USE_EMA"],
            dtype,
            k["SAVE_FORMAT"],
        )
    for kind, path in written.items():
        print(f"{kind}: {path}")


def main() -> None:
    from kohakumoss.config.export import EXPORT_SCHEMA
    from kohakumoss_common.knobs import run_checked

    sys.exit(run_checked(EXPORT_SCHEMA, globals(), run, "scripts/export/export.py"))


if __name__ == "__main__":
    main()
