"""Sample images with MOSS-Image, optionally with adapters (LyCORIS files or checkpoints) at multipliers.

    kogine run scripts/sample/sample.py --config configs/user/my-lora-sample.py \
        --set PROMPT="a lighthouse on a rocky coast at sunset" --set COUNT=4

Writes OUT_DIR/NNNN_seedS.png (prompt and settings in the PNG metadata) and OUT_DIR/grid.png.
"""

import sys

WEIGHTS = ""  # DiT checkpoint: file, index json or folder, any layout
MODEL_PRESET = ""  # with WEIGHTS empty: random weights of this preset (tests only)
TEXT_ENCODER = ""  # Qwen3.5 text encoder: HF folder or single file
TOKENIZER = ""  # tokenizer folder (empty: the one beside the text encoder, e.g. text_encoders/*/tokenizer)
TEXT_TEMPLATE = ""  # prompt template with {caption}; empty: the encoder's default
TEXT_LAYERS = [-1]  # hidden-state layer(s) of the text encoder
TEXT_ENCODER_QUANT = "none"  # text encoder linears: none, fp8, fp8_weight, int8, int8_weight
REFERENCES_IN_PROMPT = "picture"  # references in the prompt: picture (Picture N:, the vision tower) or none (ComfyUI Moss-Image-Edit format)
ENCODER_PRECISION = "auto"  # text encoder and VAE dtype: auto, bf16, fp16, fp32
VAE = ""  # FLUX.2 VAE: diffusers folder or single file
ADAPTERS = []  # adapter files or checkpoint folders; an entry may be [path, multiplier]
PROMPT = ""  # the prompt (or use PROMPT_FILE); kohya flags as in PROMPT_FILE
PROMPT_FILE = ""  # one prompt per line, kohya flags: --n negative --w --h --d seed --l cfg --s steps --ri reference (# comments)
NEGATIVE = ""  # negative prompt (the unconditional side of CFG)
REFERENCE_IMAGES = []  # reference image paths (edit models) for every prompt without its own --ri
CFG = 3.0  # classifier-free guidance scale (1: no guidance; released 3, 3-6 works)
STEPS = 50  # sampler steps (released 50; duplicate sigmas on the grid are dropped)
SEED = 0  # first seed; image i of a prompt uses SEED + i
SEEDS = []  # explicit seeds (override SEED and COUNT)
COUNT = 1  # images per prompt
WIDTH = 1024  # width in px (multiple of 16)
HEIGHT = 1024  # height in px (multiple of 16)
SHIFT = 5.0  # schedule shift, sigmas snapped to the 1000-point training grid (released 5)
UNCOND_SKIP_LAYERS = [22]  # blocks (0-indexed) the unconditional branch skips: skip-layer guidance ([]: off)
SLG_START = 0.0  # skipping runs at steps i with SLG_START <= i/n < SLG_STOP
SLG_STOP = 1.0  # end of that window (fraction of the steps, exclusive)
MAX_TEXT_TOKENS = 4096  # tokens of the templated prompt kept (the rest truncated)
BATCH = 4  # images per packed sampler call
CUDA_GRAPHS = "auto"  # replay each denoising step from a CUDA graph: auto (resident DiT on CUDA), on (refuse otherwise), off
REFERENCE_KV_CACHE = (
    True  # reference images: their keys and values computed once per CFG branch (exact), False: every step
)
OUT_DIR = "samples"  # where PNGs and the grid are written
GRID = True  # also write grid.png of every image
DEVICE = "auto"  # auto, cpu, cuda, cuda:N or xpu
PRECISION = "bf16"  # compute precision
BASE_PRECISION = (
    "same"  # DiT block linears: same, fp8 (sm89+), fp8_weight, int8 (sm80+), int8_weight, mxfp8 (sm100+)
)
STREAM_BLOCKS = (
    None  # DiT blocks streamed from pinned host memory, -1: all (None: all when the card is too small)
)
STREAM_SLOTS = 2  # GPU slots of the streaming ring
CARD_GB = 0.0  # card memory in GiB STREAM_BLOCKS=None plans for (0: read the GPU)
TEXT_ENCODER_PLACEMENT = "streamed"  # resident, or streamed (on the GPU only while it encodes the prompts)
VAE_PLACEMENT = "resident"  # resident or streamed


def run(k: dict) -> None:
    import torch

    from kohakumoss.config.sample import SampleScriptConfig
    from kohakumoss.diffusion.sample_run import (
        attach_adapters,
        longest_prompt_tokens,
        most_references,
        read_prompts,
        sample_images,
        sampler_config,
        sampler_speed,
    )
    from kohakumoss.diffusion.sampler import use_graphs
    from kohakumoss.encoders.text import load_prompt_tokenizer
    from kohakumoss.export.from_checkpoint import attach
    from kohakumoss.memory.engines.encoders import place_encoder
    from kohakumoss.memory.inference import inference_plan
    from kohakumoss.memory.install import install_memory_plan
    from kohakumoss.precision import fp32_residuals, quantize_frozen_linears, wants_fp32_residuals
    from kohakumoss.train.components import (
        PRECISION_DTYPES,
        build_backbone,
        build_text_encoder,
        build_vae,
        dit_preset,
        model_config,
        references_problem,
        resolve_device,
        text_encoder_config,
    )
    from kohakumoss_common.errors import ConfigError

    cfg = SampleScriptConfig.from_knobs(k)  # the builders shared with the trainer take its sections
    encoders, precision, max_length = cfg.encoders, cfg.device.precision, cfg.sampler.max_text_tokens
    sampler_config(cfg, model_config(cfg.model).depth)  # bad sampler knobs stop here, before anything loads
    read_prompts(cfg)  # and bad prompt lines (unknown flags, sizes off the 16 px grid)
    most_refs = most_references(cfg)  # an edit model's input; the text encoder may show them too
    references = most_refs > 0
    if problem := references_problem(encoders, references):
        raise ConfigError("REFERENCES_IN_PROMPT", problem)  # before anything loads
    if references and not encoders.vae:
        raise ConfigError("REFERENCE_IMAGES", "reference images are VAE-encoded: set VAE")
    device, dtype = resolve_device(cfg.device.device), PRECISION_DTYPES[precision]
    text_tokens = None  # priced at MAX_TEXT_TOKENS unless the prompts can be counted (a real tokenizer)
    if encoders.text_encoder and encoders.text_encoder not in ("synthetic", "random"):
        te_config = text_encoder_config(
            encoders, torch.device("cpu"), device, precision, max_length, references
        )
        tokenizer = load_prompt_tokenizer(te_config)
        text_tokens = longest_prompt_tokens(cfg, tokenizer)
    plan, why = inference_plan(cfg, model_config(cfg.model), device, text_tokens, most_refs)
    print(f"memory: {why}")
    host = torch.device("cpu")
    streamed = plan.stream_blocks != 0
    # a streamed model is loaded on the host, adapters attached there, then placed by the plan
    model = build_backbone(
        cfg.model, host if streamed else device, dtype, fp32_masters=False, seed=cfg.sampler.seed
    )
    # LyCORIS files then wrap it in bypass; an int8 file's own bytes are kept in the int8 modes
    quantize_frozen_linears(model, cfg.device.base_precision, device, source=cfg.model.weights or None)
    fp32_residuals(model, wants_fp32_residuals(precision))  # fp16: the residual streams in float32
    networks = attach_adapters(cfg, model, attach)
    install_memory_plan(plan, model, device)
    speed = sampler_speed(cfg.sampler.cuda_graphs, networks, cfg.sampler.reference_kv_cache)
    if use_graphs(speed, model, device):
        model.ops.set_timing("device")  # graphed steps: kernels chosen by device time, as the graphed trainer
    for network in networks:
        network.to(device)
    te_where = device if plan.text_encoder == "resident" else host
    text_encoder = build_text_encoder(
        encoders,
        te_where,
        model.config.text_dim,
        device,
        precision=precision,
        seed=cfg.sampler.seed,
        max_length=max_length,
        preset=dit_preset(cfg.model),
        references=references,
    )
    vae_where = device if plan.vae == "resident" else host
    vae = build_vae(
        encoders, vae_where, device, precision=precision, seed=cfg.sampler.seed, preset=dit_preset(cfg.model)
    )
    text_encoder = place_encoder(text_encoder, plan.text_encoder, device)
    vae = place_encoder(vae, plan.vae, device)
    for path in sample_images(cfg, model, text_encoder, vae, device, dtype, speed):
        print(path)


def main() -> None:
    from kohakumoss.config.sample import SAMPLE_SCHEMA
    from kohakumoss_common.knobs import run_checked

    sys.exit(run_checked(SAMPLE_SCHEMA, globals(), run, "scripts/sample/sample.py"))


if __name__ == "__main__":
    main()
