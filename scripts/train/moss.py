"""Train an adapter (any LyCORIS algorithm) or a full fine-tune of MOSS-Image.

    kogine run scripts/train/moss.py --config configs/user/my-lora.py --set LR=2e-4 --set STEPS=2000

Every setting is a module-level knob below; a config file or --set overrides any of them. The knobs
are checked (names, types, ranges, paths) before any work starts against kohakumoss.config.train's
TrainConfig (one typed field per knob, with the same default; docs/guides/train-knobs.md lists them). The run writes RUNS_DIR/RUN_NAME/: log.txt, metrics.jsonl, tensorboard/ (LOGGERS), loss.png,
samples/, checkpoints/step_XXXXX/ (each with export/) and export/.
"""

import sys

# --- model and weights -------------------------------------------------------------------------
WEIGHTS = ""  # DiT checkpoint: file, index json or folder, any layout (native / hf / comfy)
MODEL_PRESET = (
    ""  # with WEIGHTS empty: random weights of this preset (tiny, moss-image-5b): demos and benchmarks
)
TEXT_ENCODER = (
    ""  # Qwen3.5 text encoder: HF folder or single ComfyUI-style file ("synthetic"/"random": benchmarks)
)
TOKENIZER = ""  # tokenizer folder (empty: the one beside the text encoder, e.g. text_encoders/*/tokenizer)
TEXT_TEMPLATE = ""  # prompt template with {caption}; empty: the encoder's default
TEXT_LAYERS = [-1]  # hidden-state layer(s) of the text encoder (HF numbering)
TEXT_ENCODER_QUANT = "none"  # text encoder linears: none, fp8, fp8_weight, int8, int8_weight
REFERENCES_IN_PROMPT = "picture"  # edit runs: picture (references before the caption, Picture N:) or none (ComfyUI Moss-Image-Edit format)
ENCODER_PRECISION = "auto"  # text encoder and VAE dtype: auto, bf16, fp16, fp32
VAE = ""  # FLUX.2 VAE: diffusers folder or single file ("synthetic"/"random": benchmarks)
DEVICE = "auto"  # auto, cpu, cuda, cuda:N or xpu
PRECISION = "bf16"  # compute precision (autocast); weights of the frozen base follow it
BASE_PRECISION = (
    "same"  # frozen block linears: same, fp8 (sm89+), fp8_weight, int8 (sm80+), int8_weight, mxfp8 (sm100+)
)
# memory plan (docs/concepts/profiles.md): a profile, then per-engine knobs (None: from the profile)
MEMORY_PROFILE = (
    "auto"  # auto (fastest catalog entry that fits the card), speed, balanced, low_vram, minimal, or c0042
)
CARD_GB = 0.0  # card memory in GiB that 'auto' plans for (0: read the GPU)
CHECKPOINTING = None  # none, full block, attn half or mlp half
CHECKPOINT_EVERY = None  # checkpoint every k-th block
STREAM_BLOCKS = None  # blocks whose weights stream from pinned host memory, -1: all
STREAM_SLOTS = None  # GPU slots of the streaming ring, >= 2
ACTIVATION_OFFLOAD = None  # saved activations to host memory: none or on
GRAD_OFFLOAD = None  # grads to host fp32 sums (needs OPTIMIZER_PLACEMENT stream or host)
OPTIMIZER_PLACEMENT = None  # optimizer states and fp32 masters: gpu, stream or host
TEXT_ENCODER_PLACEMENT = None  # resident, streamed or off (off: the text cache must hit)
VAE_PLACEMENT = None  # resident, streamed or off (off: the latent cache must hit)
OPS_BACKEND = "auto"  # kernel registry backend: auto (per-arch priority), eager (the reference), or backend names in order (tilelang, triton, ...; the ones never run on this card's kind are used only so)
DETERMINISTIC = False  # bitwise reproducible steps: torch's deterministic algorithms, fixed cuBLAS workspace, no atomics-adding kernel backends
CUDA_GRAPHS = "auto"  # replay each micro-step from a CUDA graph: auto (where the plan allows), on (refuse otherwise), off
DISTRIBUTED = "none"  # none, ddp (a worker per DEVICES entry, the model whole), fsdp (blocks sharded), pipeline (a worker per stage of blocks) or threaded (one process, a thread per stage)
DEVICES = 1  # workers of this node: a count (0: every visible GPU) or a list ([0, 2], ["cpu", "cpu"])
DIST_TIMEOUT = 1800.0  # seconds a collective waits for a missing rank before the run stops, naming it
PIPELINE_SPLIT = []  # pipeline / threaded: the first block of each stage ([0, 12, 24]); empty: balanced
PIPELINE_SCHEDULE = "gpipe"  # pipeline: gpipe, 1f1b or interleaved (several stages per rank); threaded: gpipe
PIPELINE_CHUNKS = 0  # pipeline / threaded: micro-batches (whole samples) per micro-step; 0: one per stage
GC_EVERY = (
    0  # Python's garbage collector: 0 its own; N: setup frozen, collected every N steps while the GPU works
)
PROFILE_STEPS = []  # [first, last]: torch.profiler over these steps, trace and tables in <run>/profile/

# --- data --------------------------------------------------------------------------------------
DATASET = {
    "kind": "kohya",
    "path": "data/train",
}  # data source: {'kind': kohya|folder|jsonl|parquet|webdataset|shards, 'path': ...}, or a list (docs/concepts/data.md: per-dataset options)
CATALOG_DIR = None  # where the catalog cache lives (None: beside the dataset)
CACHE_DIR = "cache"  # latent and text caches (safetensors shards)
VAE_ENCODE = "auto"  # latents: auto (what the plan misses is encoded before the first step and cached), cache (must hit), online
TEXT_ENCODE = "auto"  # text embeddings: auto, cache or online (as VAE_ENCODE)
MIN_SIDE = 64  # images with a shorter side are dropped
MAX_PIXELS = 178956970  # decompression-bomb limit in pixels
MISSING_CAPTION = "empty"  # error, empty or filename
SCAN_WORKERS = 4  # threads that probe images during the catalog scan
AREA = 1048576  # target pixel area per image (native aspect kept)
MIN_ASPECT = 0.25  # smallest width/height kept
MAX_ASPECT = 4.0  # largest width/height kept
NO_UPSCALE = False  # never enlarge an image past its own size
CROP = "center"  # center or random (seeded) crop to the target size
BUCKETS = None  # None, 'kohya', or a list of [w, h] buckets
TOKENS_PER_STEP = 8192  # token budget per optimizer micro-step (image, text and reference-image tokens)
MAX_TEXT_TOKENS = 256  # caption tokens budgeted per image
FLIP_PROB = 0.0  # horizontal flip probability
CAPTION_DROPOUT = 0.0  # probability of an empty caption (trains the unconditional)
SHUFFLE_CAPTION = False  # shuffle comma-separated tags
KEEP_TOKENS = 0  # leading tags kept in place when shuffling
TAG_DROPOUT = 0.0  # drop each tag after the KEEP_TOKENS kept ones with this probability
CAPTION_FORMAT = "plain"  # plain, auto-json (wrap plain captions in MOSS's layout JSON) or json (captions must be layout JSON)
WORKERS = 2  # loader worker processes
PREFETCH_STEPS = 2  # steps prepared ahead
VAL_ITEMS = 0  # items held out of training for the validation loss (0: none)
VAL_EVERY = 0  # validation loss every N steps (0: never)
VAL_SIGMAS = [0.1, 0.3, 0.5, 0.7, 0.9]  # fixed sigmas of the validation loss

# --- adapter or full fine-tune -----------------------------------------------------------------
ALGO = "lora"  # adapter algorithm (LyCORIS) or 'full' for a full fine-tune
RANK = 16  # adapter rank (block size for OFT / BOFT)
ALPHA = 16.0  # adapter alpha (scale = ALPHA / RANK)
ALGO_ARGS = {}  # extra LyCORIS arguments (factor, block_size, constraint, ...)
TARGET_PRESET = "attn-mlp"  # which modules the adapter wraps
TARGET_PATTERNS = []  # module name regexes or globs for TARGET_PRESET='custom'
DROPOUT = 0.0  # adapter dropout
RANK_DROPOUT = 0.0  # adapter rank dropout
MODULE_DROPOUT = 0.0  # adapter module dropout
LORA_PLUS_RATIO = 0.0  # LoRA+: LR multiplier of the up matrices (0: off)
BYPASS = "auto"  # True: lycoris's bypass forward (base output + adapter output; LoRA / LoCon run the fused kernels), False: the merged-weight forward; auto: bypass where both compute one function (every algorithm but OFT, BOFT, IA3, DyLoRA and DoRA)

# --- optimisation ------------------------------------------------------------------------------
LR = 0.0001  # learning rate (AdamW; adapters and the non-matrix weights of a full fine-tune)
MUON_LR = 0.0  # full fine-tune: Muon LR for hidden matrices (0: same as LR)
USE_MUON = True  # full fine-tune: Muon for hidden 2-D matrices (else AdamW everywhere)
OPTIMIZER = "adamw"  # adamw, adafactor, adamw8bit, paged_adamw8bit, lion8bit, prodigy, schedulefree_adamw, dadapt_adam or package.Class (any case; kohya's spellings such as AdamW8bit too)
OPTIMIZER_ARGS = {}  # keyword arguments of OPTIMIZER (betas, d_coef, warmup_steps, ...)
WEIGHT_DECAY = 0.0  # weight decay
LR_SCHEDULE = (
    "constant"  # constant, constant_with_warmup, linear, cosine, cosine_with_restarts, polynomial or rex
)
LR_WARMUP_STEPS = 0  # linear warmup steps
LR_MIN_RATIO = 0.0  # final LR / LR for the decaying schedules
LR_CYCLES = 1  # cosine_with_restarts: number of cosine cycles (hard restarts)
LR_POWER = 1.0  # polynomial: power of the decay (1: linear)
STEPS = 1000  # optimizer steps
EPOCHS = 0  # train this many epochs of the plan instead of STEPS (0: STEPS decides)
GRAD_ACCUM = 1  # micro-steps per optimizer step
GRAD_CLIP = 1.0  # max gradient norm (0: no clipping)
EMA = False  # keep an EMA of the trainable weights
EMA_DECAY = 0.999  # EMA decay
EMA_WARMUP = 100  # steps over which the EMA decay ramps up
EMA_EVERY = 1  # EMA update interval in steps
EXPORT_EMA = False  # export the EMA weights instead of the raw ones

# --- objective ---------------------------------------------------------------------------------
TIMESTEP_SAMPLING = "logit_normal"  # sigma distribution
LOGIT_MEAN = 0.0  # logit-normal mean
LOGIT_STD = 1.0  # logit-normal std
TIMESTEP_SHIFT = "resolution"  # none, static or resolution-dependent shift
STATIC_SHIFT = 3.0  # shift for TIMESTEP_SHIFT='static'
MODE_SCALE = 1.29  # s of TIMESTEP_SAMPLING='mode' (SD3; 0: uniform, > 0: more mid sigmas)
LOSS_WEIGHTING = "none"  # per-sigma loss weight
LOSS_REDUCTION = "token"  # token: every image token alike; sample: every sample alike
MIN_SNR_GAMMA = 5.0  # gamma of LOSS_WEIGHTING='min_snr'
LOSS_TYPE = "l2"  # velocity error: l2, l1, huber or pseudo_huber
HUBER_C = 0.1  # c of LOSS_TYPE huber / pseudo_huber (l2 below c, linear beyond)
MAX_BAD_STEPS = 5  # stop after this many non-finite losses in a row

# --- run, checkpoints, samples, exports --------------------------------------------------------
SEED = 0  # seed of the plan, the sigmas and the noise
RUN_NAME = "moss-lora"  # run folder name under RUNS_DIR (a plain name, no path)
RUNS_DIR = "runs/moss"  # where runs are written
SAVE_EVERY = 500  # checkpoint every N steps (0: only at the end)
SAVE_EVERY_EPOCHS = 0  # checkpoint every N epochs instead of SAVE_EVERY (0: SAVE_EVERY decides)
KEEP_LAST = 3  # checkpoints kept (older ones deleted)
RESUME = ""  # '' (fresh run), 'latest' or a checkpoint folder
RESUME_ALLOW_CHANGES = []  # knobs that may differ from the checkpoint's on resume: only LR / schedule / STEPS / GRAD_CLIP / EMA_* / dropouts / moved WEIGHTS, TEXT_ENCODER, TOKENIZER, VAE are safe
RESUME_REPLAN = False  # resume a run whose data changed (files removed or added): continue along today's plan from the checkpoint's step
STOP_AT = 0  # stop this invocation at this step with a checkpoint (0: run to STEPS); resume later
LOG_EVERY = 1  # metrics line every N steps
LOGGERS = ["tensorboard"]  # trackers: tensorboard (events in RUN/tensorboard/), wandb (pip install wandb)
SAMPLE_EVERY = 0  # sample grid every N steps (0: only at the end, if prompts are set)
SAMPLE_EVERY_EPOCHS = 0  # sample grid every N epochs instead of SAMPLE_EVERY (0: SAMPLE_EVERY decides)
SAMPLE_PROMPTS = []  # prompts of the sample grid (one column each); kohya flags as in SAMPLE_PROMPTS_FILE
SAMPLE_PROMPTS_FILE = ""  # more sample prompts, one a line: prompt --n neg --w W --h H --d seed --l cfg --s steps --ri reference (# comments)
SAMPLE_SEEDS = []  # one seed per prompt (default: 0, 1, 2, ...)
SAMPLE_NEGATIVE = ""  # negative prompt of the samples
SAMPLE_STEPS = 20  # sampler steps
SAMPLE_CFG = 3.0  # classifier-free guidance scale
SAMPLE_SHIFT = 5.0  # sampler schedule shift (5: as released)
SAMPLE_WIDTH = 1024  # sample width in px (multiple of 16)
SAMPLE_HEIGHT = 1024  # sample height in px (multiple of 16)
SAVE_FORMAT = "comfy"  # comfy: the ComfyUI LoRA; hf: the LyCORIS file; both
COMFY_DIFFS = "end"  # full-difference ComfyUI files (DoRA, BOFT, IA3, ...): end (final export only) | every
SAVE_MERGED = False  # also write the merged transformer
SAVE_DIFFUSERS = False  # also write a diffusers-layout transformer
TRIGGER_PHRASE = ""  # the adapter files' modelspec.trigger_phrase (empty: none)


def main() -> None:
    from kohakumoss.config.train import TRAIN_SCHEMA
    from kohakumoss.train.loop import train_on_devices
    from kohakumoss_common.knobs import run_checked

    # DISTRIBUTED: this process starts the workers (or is one, under torchrun); else train(k) here
    sys.exit(run_checked(TRAIN_SCHEMA, globals(), train_on_devices, "scripts/train/moss.py"))


if __name__ == "__main__":
    main()
