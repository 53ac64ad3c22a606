"""The knobs of scripts/sample/sample.py."""

from __future__ import annotations

from kohakumoss.precision import BASE_PRECISIONS

from .knobs import Knob, Schema
from .train import ENCODER_KNOBS, PRECISIONS


def _prompt_file(value: str) -> str | None:
    from kohakumoss.diffusion.prompts import prompt_file_problem

    return prompt_file_problem(value, "PROMPT_FILE")


def _block_indices(value: list) -> str | None:
    if all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        return None
    return f"block indices are whole numbers >= 0, got {value!r}"


SAMPLE_KNOBS = [
    Knob("WEIGHTS", "", "DiT checkpoint: file, index json or folder, any layout", path="any"),
    Knob("MODEL_PRESET", "", "with WEIGHTS empty: random weights of this preset (tests only)"),
    *ENCODER_KNOBS,
    Knob(
        "ADAPTERS", [], "adapter files or checkpoint folders; an entry may be [path, multiplier]", type=list
    ),
    Knob("PROMPT", "", "the prompt (or use PROMPT_FILE); kohya flags as in PROMPT_FILE"),
    Knob(
        "PROMPT_FILE",
        "",
        "one prompt per line, kohya flags: --n negative --w --h --d seed --l cfg --s steps (# comments)",
        path="file",
        check=_prompt_file,
    ),
    Knob("NEGATIVE", "", "negative prompt (the unconditional side of CFG)"),
    Knob("CFG", 3.0, "classifier-free guidance scale (1: no guidance; released 3, 3-6 works)", min=0.0),
    Knob("STEPS", 50, "sampler steps (released 50; duplicate sigmas on the grid are dropped)", min=1),
    Knob("SEED", 0, "first seed; image i of a prompt uses SEED + i"),
    Knob("SEEDS", [], "explicit seeds (override SEED and COUNT)", type=list),
    Knob("COUNT", 1, "images per prompt", min=1),
    Knob("WIDTH", 1024, "width in px (multiple of 16)", min=16),
    Knob("HEIGHT", 1024, "height in px (multiple of 16)", min=16),
    Knob(
        "SHIFT", 5.0, "schedule shift, sigmas snapped to the 1000-point training grid (released 5)", min=1e-3
    ),
    Knob(
        "UNCOND_SKIP_LAYERS",
        [22],
        "blocks (0-indexed) the unconditional branch skips: skip-layer guidance ([]: off)",
        type=list,
        check=_block_indices,
    ),
    Knob("SLG_START", 0.0, "skipping runs at steps i with SLG_START <= i/n < SLG_STOP", min=0.0, max=1.0),
    Knob("SLG_STOP", 1.0, "end of that window (fraction of the steps, exclusive)", min=0.0, max=1.0),
    Knob("MAX_TEXT_TOKENS", 4096, "tokens of the templated prompt kept (the rest truncated)", min=1),
    Knob("BATCH", 4, "images per packed sampler call", min=1),
    Knob(
        "CUDA_GRAPHS",
        "auto",
        "replay each denoising step from a CUDA graph: auto (resident DiT on CUDA), on (refuse otherwise), off",
        choices=("auto", "on", "off"),
    ),
    Knob("OUT_DIR", "samples", "where PNGs and the grid are written"),
    Knob("GRID", True, "also write grid.png of every image"),
    Knob("DEVICE", "auto", "auto, cpu, cuda, cuda:N or xpu"),
    Knob("PRECISION", "bf16", "compute precision", choices=PRECISIONS),
    Knob(
        "BASE_PRECISION",
        "same",
        "DiT block linears: same (as PRECISION), fp8 (fp8 storage and GEMMs, sm89+), fp8_weight (fp8 storage), "
        "int8 (int8 storage and forward GEMMs, sm80+), int8_weight (int8 storage) or mxfp8 (block-scaled, sm100+)",
        choices=BASE_PRECISIONS,
    ),
    Knob(
        "STREAM_BLOCKS",
        None,
        "DiT blocks streamed from pinned host memory, -1: all (None: all when the card is too small)",
        type=(int, type(None)),
        min=-1,
    ),
    Knob("STREAM_SLOTS", 2, "GPU slots of the streaming ring", min=2),
    Knob("CARD_GB", 0.0, "card memory in GiB STREAM_BLOCKS=None plans for (0: read the GPU)", min=0.0),
    Knob(
        "TEXT_ENCODER_PLACEMENT",
        "streamed",
        "resident, or streamed (on the GPU only while it encodes the prompts)",
        choices=("resident", "streamed"),
    ),
    Knob("VAE_PLACEMENT", "resident", "resident or streamed", choices=("resident", "streamed")),
]

SAMPLE_SCHEMA = Schema(SAMPLE_KNOBS)
