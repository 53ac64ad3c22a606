"""Find the DiT, text encoder, tokenizer and VAE inside a weights folder, and check each one's layout.

Three shapes of folder are understood:
- a ComfyUI models folder: `diffusion_models/*.safetensors`, `text_encoders/*.safetensors`, `vae/*.safetensors`;
- an HF (diffusers-style) folder: `transformer/`, `text_encoder/` (+ `tokenizer/`), `vae/`;
- a DiT checkpoint on its own (a file, an index json or a folder of shards, any layout).
Only headers are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kohakumoss.encoders.tokenizer_folder import TOKENIZER_MARKERS, find_tokenizer  # noqa: F401
from kohakumoss_common.errors import KohakuMossError


@dataclass
class WeightsFound:
    kind: str  # "comfy", "hf", "checkpoint" or "missing"
    dit: str = ""
    dit_layout: str = ""
    dit_config: Any = None  # MossConfig inferred from the DiT's headers
    dit_params: int = 0
    text_encoder: str = ""
    tokenizer: str = ""
    vae: str = ""
    problems: list[tuple[str, str]] = field(default_factory=list)  # (knob, message)
    notes: list[str] = field(default_factory=list)

    def knobs(self) -> dict[str, str]:
        return {
            "WEIGHTS": self.dit,
            "TEXT_ENCODER": self.text_encoder,
            "TOKENIZER": self.tokenizer,
            "VAE": self.vae,
        }


def inspect_dit(path: str | Path) -> tuple[str, Any, int]:
    """(layout name, MossConfig, parameter count) of a DiT checkpoint; raises CheckpointError."""
    import math

    from kohakumoss.model.io import inspect_checkpoint

    layout, config, entries = inspect_checkpoint(path)
    return layout.name, config, sum(math.prod(shape) for _, shape in entries.values())


TOKENIZER_REPO = "OpenMOSS-Team/MOSS-Image-Base"  # its tokenizer/ is Qwen3.5's; the Comfy-Org files hold none


def tokenizer_command(text_encoders: Path) -> str:
    """The command that puts the released tokenizer where `find_tokenizer` looks."""
    target = (text_encoders / "qwen3.5_tokenizer").as_posix()
    return f"hf download {TOKENIZER_REPO} --include 'tokenizer/*' --local-dir {target}"


def no_tokenizer_message(text_encoders: Path) -> str:
    return (
        f"no tokenizer folder under '{text_encoders}' (the Comfy-Org text encoder file holds none); "
        f"get Qwen3.5's: {tokenizer_command(text_encoders)}"
    )


def _safetensors(folder: Path, prefer: tuple[str, ...]) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    return sorted(files, key=lambda f: not any(w in f.name.lower() for w in prefer))


def _header_keys(path: Path) -> list[str]:
    from kohakumoss_common.io import read_header

    return list(read_header(path)[0])


def check_text_encoder(path: str | Path) -> str | None:
    """None when `path` holds Qwen-style text-encoder weights in a quantization the encoder reads
    (plain, int8 / fp8, ConvRot, ComfyUI W4A8), else the problem."""
    from kohakumoss_common.io import read_header
    from kohakumoss_common.quant import plan_quantization

    try:
        header, metadata = read_header(Path(path))
    except (KohakuMossError, OSError, ValueError) as e:
        return f"cannot read '{path}': {e}"
    if not any("embed_tokens" in k or ".layers." in k for k in header):
        return f"'{path}' does not look like a Qwen3.5 text encoder (first keys: {sorted(header)[:4]})"
    try:  # the text encoder's own reading of the markers (encoders/text.py)
        plan_quantization(path, header, rotations=True, packed=True, metadata=metadata)
    except KohakuMossError as e:
        return str(e)
    return None


def check_vae(path: str | Path) -> str | None:
    """None when `path` holds FLUX.2 VAE weights (diffusers or BFL names), else the problem."""
    try:
        keys = _header_keys(Path(path))
    except (KohakuMossError, OSError, ValueError) as e:
        return f"cannot read '{path}': {e}"
    if not any(k.split(".", 2)[0] in ("encoder", "decoder") or ".encoder." in k for k in keys):
        return f"'{path}' does not look like a VAE (first keys: {sorted(keys)[:4]})"
    return None


def _pick_dit(found: WeightsFound, candidates: list[Path]) -> None:
    errors = []
    for c in candidates:
        try:
            found.dit_layout, found.dit_config, found.dit_params = inspect_dit(c)
            found.dit = str(c)
            return
        except (KohakuMossError, OSError, ValueError) as e:
            errors.append(str(e))
    found.dit = str(candidates[0]) if candidates else ""
    found.problems.append(
        ("WEIGHTS", "no DiT checkpoint in a recognised layout: " + ("; ".join(errors) or "none found"))
    )


def find_weights(root: str | Path) -> WeightsFound:
    """Locate and check the model files under `root`; problems are named by knob, never raised."""
    root = Path(root).expanduser().resolve()
    if not root.exists():
        return WeightsFound("missing", problems=[("WEIGHTS", f"weights folder '{root}' does not exist")])
    if (root / "diffusion_models").is_dir():
        found = WeightsFound("comfy")
        _pick_dit(found, _safetensors(root / "diffusion_models", ("moss",)))
        te = _safetensors(root / "text_encoders", ("qwen",)) if (root / "text_encoders").is_dir() else []
        vae = _safetensors(root / "vae", ("flux2",)) if (root / "vae").is_dir() else []
        found.text_encoder = str(te[0]) if te else ""
        found.vae = str(vae[0]) if vae else ""
        tok = find_tokenizer(root / "text_encoders")
        found.tokenizer = str(tok) if tok else ""
        if found.text_encoder and not found.tokenizer:
            found.problems.append(("TOKENIZER", no_tokenizer_message(root / "text_encoders")))
    elif (root / "transformer").is_dir():
        found = WeightsFound("hf")
        _pick_dit(found, [root / "transformer"])
        te_dir = next((root / n for n in ("text_encoder", "text_encoders") if (root / n).is_dir()), None)
        found.text_encoder = str(te_dir) if te_dir else ""
        found.tokenizer = str(root / "tokenizer") if (root / "tokenizer").is_dir() else ""
        found.vae = str(root / "vae") if (root / "vae").is_dir() else ""
    else:
        found = WeightsFound("checkpoint")
        _pick_dit(found, [root])
        found.notes.append("a DiT checkpoint on its own: set TEXT_ENCODER, TOKENIZER and VAE in the config")
    if found.kind != "checkpoint":
        if not found.text_encoder:
            found.problems.append(
                ("TEXT_ENCODER", f"no text encoder under '{root}' (text_encoders/ or text_encoder/)")
            )
        elif msg := check_text_encoder(found.text_encoder):
            found.problems.append(("TEXT_ENCODER", msg))
        if not found.vae:
            found.problems.append(("VAE", f"no VAE under '{root}' (vae/)"))
        elif msg := check_vae(found.vae):
            found.problems.append(("VAE", msg))
    return found
