"""The knobs of scripts/sample/sample.py as one typed config, `SampleScriptConfig` (see kohakumoss_common/typed_config.py)."""

from __future__ import annotations

from dataclasses import dataclass

from kohakumoss.diffusion.generate import GenerationRequest
from kohakumoss.diffusion.sampler import SamplerConfig as Sampler
from kohakumoss.diffusion.sampler import SamplerSpeed
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.precision import BASE_PRECISIONS
from kohakumoss_common.knobs import Schema
from kohakumoss_common.typed_config import ScriptConfig, config_knobs, knob, section

from .bounds import SEED_MAX, SEED_MIN, device_problem, seeds_problem
from .train import PRECISIONS, EncoderConfig


def _prompt_file(value: str) -> str | None:
    from kohakumoss.diffusion.prompts import prompt_file_problem

    return prompt_file_problem(value, "PROMPT_FILE")


def _reference_images(value: list) -> str | None:
    from pathlib import Path

    for i, path in enumerate(value):
        if not isinstance(path, str) or not Path(path).expanduser().is_file():
            return f"REFERENCE_IMAGES[{i}] {path!r} is not an image file"
    return None


def _block_indices(value: list) -> str | None:
    if all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        return None
    return f"block indices are whole numbers >= 0, got {value!r}"


@dataclass(frozen=True)
class SampleModelConfig:
    """The DiT's weights."""

    weights: str = knob("", "DiT checkpoint: file, index json or folder, any layout", path="any")
    model_preset: str = knob("", "with WEIGHTS empty: random weights of this preset (tests only)")


@dataclass(frozen=True)
class SampleAdapterConfig:
    """Adapters applied to the DiT."""

    adapters: list = knob([], "adapter files or checkpoint folders; an entry may be [path, multiplier]")


@dataclass(frozen=True)
class PromptConfig:
    """What to draw."""

    prompt: str = knob("", "the prompt (or use PROMPT_FILE); kohya flags as in PROMPT_FILE")
    prompt_file: str = knob(
        "",
        "one prompt per line, kohya flags: --n negative --w --h --d seed --l cfg --s steps --ri reference (# comments)",
        path="file",
        check=_prompt_file,
    )
    negative: str = knob("", "negative prompt (the unconditional side of CFG)")
    reference_images: list = knob(
        [],
        "reference image paths (edit models) for every prompt without its own --ri; both CFG branches get them",
        check=_reference_images,
    )


@dataclass(frozen=True)
class SamplerConfig:
    """The sampler: guidance, steps, seeds, sizes, schedule, batching."""

    cfg: float = knob(
        Sampler.cfg_scale, "classifier-free guidance scale (1: no guidance; released 3, 3-6 works)", min=0.0
    )
    steps: int = knob(
        Sampler.steps, "sampler steps (released 50; duplicate sigmas on the grid are dropped)", min=1
    )
    seed: int = knob(0, "first seed; image i of a prompt uses SEED + i", min=SEED_MIN, max=SEED_MAX)
    seeds: list = knob([], "explicit seeds (override SEED and COUNT)", check=seeds_problem)
    count: int = knob(1, "images per prompt", min=1)
    width: int = knob(GenerationRequest.width, "width in px (multiple of 16)", min=16)
    height: int = knob(GenerationRequest.height, "height in px (multiple of 16)", min=16)
    shift: float = knob(
        Sampler.shift, "schedule shift, sigmas snapped to the 1000-point training grid (released 5)", min=1e-3
    )
    uncond_skip_layers: list = knob(
        list(Sampler.uncond_skip_layers),
        "blocks (0-indexed) the unconditional branch skips: skip-layer guidance ([]: off)",
        check=_block_indices,
    )
    slg_start: float = knob(
        Sampler.slg_start, "skipping runs at steps i with SLG_START <= i/n < SLG_STOP", min=0.0, max=1.0
    )
    slg_stop: float = knob(
        Sampler.slg_stop, "end of that window (fraction of the steps, exclusive)", min=0.0, max=1.0
    )
    max_text_tokens: int = knob(4096, "tokens of the templated prompt kept (the rest truncated)", min=1)
    batch: int = knob(4, "images per packed sampler call", min=1)
    cuda_graphs: str = knob(
        SamplerSpeed.cuda_graphs,
        "replay each denoising step from a CUDA graph: auto (resident DiT on CUDA), on (refuse otherwise), off",
        choices=("auto", "on", "off"),
    )
    reference_kv_cache: bool = knob(
        True,
        "reference images: their keys and values computed once per CFG branch (exact), False: every step",
    )


@dataclass(frozen=True)
class SampleOutputConfig:
    """Where the images go."""

    out_dir: str = knob("samples", "where PNGs and the grid are written")
    grid: bool = knob(True, "also write grid.png of every image")


@dataclass(frozen=True)
class SampleDeviceConfig:
    """Device, precision and where the weights live."""

    device: str = knob("auto", "auto, cpu, cuda, cuda:N or xpu", check=device_problem)
    precision: str = knob("bf16", "compute precision", choices=PRECISIONS)
    base_precision: str = knob(
        "same",
        "DiT block linears: same (as PRECISION), fp8 (fp8 storage and GEMMs, sm89+), fp8_weight (fp8 storage), "
        "int8 (int8 storage and forward GEMMs, sm80+), int8_weight (int8 storage) or mxfp8 (block-scaled, sm100+)",
        choices=BASE_PRECISIONS,
    )
    stream_blocks: int | None = knob(
        None,
        "DiT blocks streamed from pinned host memory, -1: all (None: all when the card is too small)",
        min=-1,
    )
    stream_slots: int = knob(MemoryPlan.stream_slots, "GPU slots of the streaming ring", min=2)
    card_gb: float = knob(0.0, "card memory in GiB STREAM_BLOCKS=None plans for (0: read the GPU)", min=0.0)
    text_encoder_placement: str = knob(
        "streamed",
        "resident, or streamed (on the GPU only while it encodes the prompts)",
        choices=("resident", "streamed"),
    )
    vae_placement: str = knob("resident", "resident or streamed", choices=("resident", "streamed"))


@dataclass(frozen=True)
class SampleScriptConfig(ScriptConfig):
    """Every knob of scripts/sample/sample.py, by section."""

    model: SampleModelConfig = section(SampleModelConfig)
    encoders: EncoderConfig = section(EncoderConfig)
    adapters: SampleAdapterConfig = section(SampleAdapterConfig)
    prompts: PromptConfig = section(PromptConfig)
    sampler: SamplerConfig = section(SamplerConfig)
    output: SampleOutputConfig = section(SampleOutputConfig)
    device: SampleDeviceConfig = section(SampleDeviceConfig)


SAMPLE_KNOBS = config_knobs(SampleScriptConfig)
SAMPLE_SCHEMA = Schema(SAMPLE_KNOBS)
