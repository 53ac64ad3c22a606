"""The predicted peak GPU memory of one training step under a memory plan: a documented sum of parts.

Every constant is in `calibration.py`, tagged measured, derived or placeholder. The parts:

- DiT weights: the non-streamed blocks (`layers`: six linears and four norms each, `block_params`) and
  every non-block parameter in PRECISION, plus the streaming ring (slots x one block). Streaming moves
  only `layers`: the text embedder with its two refiner blocks (~2 x 113M in moss-image-5b), the shared
  block modulation (56.6M), the embedders and the head stay resident (`nonblock_params`). With
  BASE_PRECISION fp8 / fp8_weight the blocks' six linears take one byte per parameter and a float32
  scale per row (`block_weight_bytes`). A full fine-tune with OPTIMIZER_PLACEMENT 'gpu' trains fp32
  weights on the card (today's trainer), so its weights are fp32 and streaming saves nothing;
- trainable weights, grads and optimizer states: adapters RANK x (in + out) over the targeted linears
  (an upper bound for LoKr / IA3 / OFT, which train fewer), a full fine-tune every parameter; fp32
  weights and grads with the optimizer on the GPU, PRECISION copies with host masters; AdamW keeps
  two fp32 moments, Muon one; 'stream' keeps a couple of blocks' states on the card during the
  optimizer step only (the activations are gone by then: the peak is the larger phase), 'host' none;
  GRAD_OFFLOAD keeps a staging ring of a couple of blocks' grads instead of all of them;
- saved activations: TOKENS_PER_STEP x dim x ACTIVATIONS[mode, precision]['kept'] per block
  (checkpointed blocks keep less), all blocks' on the card, or with ACTIVATION_OFFLOAD only a window
  of blocks; with reference images (a dataset entry's `references`; per target the most any item of
  the scanned dataset has, `references_per_target`) the keys and values the attention gathers for the
  reference segments, REFERENCE_KV_ROWS x dim per reference token in the blocks whose attention half
  keeps activations (`reference_kv_saved`);
- outside the blocks: FIXED_PER_TOKEN_DIM per token and dim (embedders, head, loss, rotary tables), and
  what the text refiner keeps over the text tokens when it runs a backward (REFINER_SAVED);
- adapters run by lycoris's modules (LoKr, LoHa, ...: not LoRA / LoCon) keep their linears' inputs for
  their own backward, `Algo.saved_per_fan_in` (adapters/algos.py) x sum(fan_in) per token and block, in the blocks that keep
  activations (and once more in the block being recomputed);
- the backward working set: the extra peak of one block's backward (a checkpointed block re-creates
  what it did not keep), ACTIVATIONS[...]['working'], counted once;
- a full fine-tune's fp32 weights on the card under bf16 / fp16 autocast: autocast caches the cast of
  each weight (a trained leaf) until the forward ends, a PRECISION copy of the model alive with every
  saved activation at the forward's end (the third phase beside the backward and the optimizer step:
  the peak of the H200's full fine-tune rows, the first step whose forward finds grads and states there);
- the text encoder and the VAE when they run in the step (TEXT_ENCODE / VAE_ENCODE not 'cache') and
  are resident (streamed: a fraction; off: nothing), from their files' sizes;
- x ALLOCATOR_SLACK for fragmentation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import calibration as cal
from .allocator import dataset_has_references
from .plan import MemoryPlan, memory_pins, plan_with_overrides
from .references import scanned_references

GIB = cal.GIB
ACTIVATIONS = cal.ACTIVATIONS
ALLOCATOR_SLACK = cal.ALLOCATOR_SLACK


# What exists only while the step runs forward and backward: freed before the optimizer step.
BACKWARD_ONLY = (
    "grad staging ring",
    "saved activations",
    "outside the blocks",
    "adapter activations",
    "backward working set",
    "FSDP gathered blocks",
)


@dataclass
class MemoryEstimate:
    parts: dict[str, float] = field(default_factory=dict)  # name -> bytes, alive during the backward
    step_parts: dict[str, float] = field(default_factory=dict)  # alive only in the optimizer step
    forward_parts: dict[str, float] = field(default_factory=dict)  # alive until the forward ends

    @property
    def backward_peak(self) -> float:
        return sum(self.parts.values())

    @property
    def forward_peak(self) -> float:
        """At the forward's end: the saved activations are all there, the backward's working set not yet."""
        if not self.forward_parts:
            return 0.0
        kept = sum(b for name, b in self.parts.items() if name != "backward working set")
        return kept + sum(self.forward_parts.values())

    @property
    def optimizer_peak(self) -> float:
        kept = sum(b for name, b in self.parts.items() if name not in BACKWARD_ONLY)
        return kept + sum(self.step_parts.values())

    def phases(self) -> dict[str, float]:
        return {
            "forward": self.forward_peak,
            "backward": self.backward_peak,
            "optimizer step": self.optimizer_peak,
        }

    @property
    def total(self) -> float:
        """The largest phase's sum, with the allocator's slack."""
        return max(self.phases().values()) * ALLOCATOR_SLACK

    def lines(self) -> list[str]:
        rows = [f"  {name:<24} {b / GIB:7.2f} GiB" for name, b in self.parts.items() if b]
        rows += [f"  {name + ' (fwd)':<24} {b / GIB:7.2f} GiB" for name, b in self.forward_parts.items() if b]
        rows += [f"  {name + ' (step)':<24} {b / GIB:7.2f} GiB" for name, b in self.step_parts.items() if b]
        if self.step_parts or self.forward_parts:
            phases = self.phases()
            rows.append(f"  {'peak phase':<24} {max(phases, key=phases.get)}")
        slack = f"total (+{round((ALLOCATOR_SLACK - 1) * 100)}%)"
        return [*rows, f"  {slack:<24} {self.total / GIB:7.2f} GiB"]


EVERY_LINEAR = "attn-mlp"  # the preset that wraps every linear of a block (not TARGET_PRESET's default)


def block_linears(config: Any, target_preset: str) -> list[tuple[int, int]]:
    """(in, out) of the linears of one block (`layers.N.proj`) an adapter wraps: q, k, v, o ('attn'),
    and ffn_up_gate, ffn_down (every other preset)."""
    d, h = config.dim, config.mlp_hidden
    attn = [(d, d)] * 4
    return attn if target_preset == "attn" else [*attn, (d, 2 * h), (h, d)]


def outside_linears(config: Any, target_preset: str = "full") -> list[tuple[int, int]]:
    """(in, out) of the linears outside the blocks an adapter wraps: none but for TARGET_PRESET 'full'
    (the text embedder and its refiner blocks, the embedders, the time embedding, both modulations, the head)."""
    if target_preset != "full":
        return []
    d, h, c = config.dim, config.mlp_hidden, config.in_channels
    refiner = [(d, 3 * d), (d, d), (d, h), (d, h), (h, d)]  # qkv, proj, ffn_gate, ffn_up, ffn_down
    return [
        (config.text_dim, d),  # text_embedder.proj
        *refiner * config.refiner_depth,
        (c, d),  # video_embedder
        (config.time_freq_dim, d),  # time_embedding.0
        (d, d),  # time_embedding.2
        (d, 6 * d),  # shared_block_modulation
        (d, 2 * d),  # video_head_modulation
        (d, c),  # final_linear_video
    ]


def block_params(config: Any) -> int:
    """Parameters of one block (`layers.N`): its six bias-free linears, norm1 and norm2 (d each), q_norm and
    k_norm (head_dim each). The modulation is shared by every block and lives outside them."""
    return sum(i * o for i, o in block_linears(config, EVERY_LINEAR)) + 2 * config.dim + 2 * config.head_dim


def refiner_block_params(config: Any) -> int:
    """Parameters of one text refiner block: fused qkv, proj, ffn_gate, ffn_up, ffn_down (all with bias), and
    norm1, norm2, q_norm, k_norm."""
    d, h = config.dim, config.mlp_hidden
    linears = (d + 1) * 3 * d + (d + 1) * d + 2 * (d + 1) * h + (h + 1) * d
    return linears + 2 * d + 2 * config.head_dim


def nonblock_params(config: Any, params: int | None = None) -> int:
    """Parameters outside the blocks: the measured rest of `params`, else from the config (the text
    embedder with its refiner blocks, the video embedder, time embedding, shared block modulation, head)."""
    if params is not None:
        return max(int(params) - config.depth * block_params(config), 0)
    d, c = config.dim, config.in_channels
    text = (config.text_dim + 1) * d + config.refiner_depth * refiner_block_params(config)
    time = (config.time_freq_dim + 1) * d + (d + 1) * d  # Linear, SiLU, Linear
    head = d + (d + 1) * 2 * d + d * c  # final_norm_video, video_head_modulation, final_linear_video
    return (c + 1) * d + text + time + (d + 1) * 6 * d + head


def model_params(config: Any) -> int:
    """Every parameter of the backbone."""
    return config.depth * block_params(config) + nonblock_params(config)


def quantized_linear_bytes(mode: str, rows: int, cols: int) -> float:
    """Bytes of one frozen [rows, cols] linear stored by BASE_PRECISION `mode`: one byte per weight, plus
    a float32 scale per row (fp8, int8 and their *_weight forms), or MXFP8's one-byte scale per 32 inputs
    twice (the scales as stored and in the GEMM's 128 x 4 tile layout)."""
    if mode == "mxfp8":
        blocks = cols // cal.MXFP8_BLOCK
        tiled = math.ceil(rows / 128) * 128 * math.ceil(blocks / 4) * 4
        return rows * cols + rows * blocks + tiled
    return rows * cols + cal.ROW_SCALE_BYTES * rows


def block_weight_bytes(config: Any, precision: str, base_precision: str = "same") -> float:
    """Bytes of one block's frozen weights (what streaming moves per block): PRECISION's, the 8-bit
    linears (BASE_PRECISION; 'same' for a full fine-tune, whose weights train) as
    `quantized_linear_bytes` says. Training and sampling price their blocks with it."""
    wb = cal.WEIGHT_BYTES.get(precision, 2)
    bp = block_params(config)
    mode = base_precision
    if mode == "same":
        return bp * wb
    sizes = block_linears(config, EVERY_LINEAR)  # the linears precision/fp8_base.py quantizes, as [out, in]
    quantized = sum(i * o for i, o in sizes)
    return (bp - quantized) * wb + sum(quantized_linear_bytes(mode, o, i) for i, o in sizes)


def trainable_params(cfg: Any, config: Any, params: int | None = None) -> int:
    """Trained parameters: every one for a full fine-tune, else RANK x (in + out) over the targets."""
    if cfg.adapter.algo == "full":
        return int(params) if params is not None else model_params(config)
    rank = int(cfg.adapter.rank)
    preset = cfg.adapter.target_preset
    per_block = sum(i + o for i, o in block_linears(config, preset))
    return rank * (per_block * config.depth + sum(i + o for i, o in outside_linears(config, preset)))


def refiner_trains(cfg: Any) -> bool:
    """Whether the text refiner runs a backward (and so keeps activations): a full fine-tune, or an adapter
    on it (TARGET_PRESET 'full', or custom patterns naming text_embedder)."""
    if cfg.adapter.algo == "full" or cfg.adapter.target_preset == "full":
        return True
    patterns = cfg.adapter.target_patterns or ()
    return cfg.adapter.target_preset == "custom" and any("text_embedder" in str(p) for p in patterns)


def references_per_target(cfg: Any) -> int:
    """Reference images per target the estimate prices, each at the target's area: none when no dataset
    entry names references; else the most any usable item of the dataset has, the worst step the plan
    can meet (`memory/references.py`: its catalog cache, which the trainer's scan writes before it
    plans memory); ASSUMED_REFERENCES where no scan of the dataset is cached yet."""
    if not dataset_has_references(cfg.data.dataset):
        return 0
    counted = scanned_references(cfg.data)
    return cal.ASSUMED_REFERENCES if counted is None else counted


def text_tokens(cfg: Any) -> float:
    """Text tokens of a step: TOKENS_PER_STEP x the text share of a sample of AREA and MAX_TEXT_TOKENS
    (and its references, each at the target's area)."""
    image = int(cfg.data.area) // 256
    text = int(cfg.data.max_text_tokens)
    return int(cfg.data.tokens_per_step) * text / (image * (1 + references_per_target(cfg)) + text)


def reference_tokens(cfg: Any) -> float:
    """Reference-image tokens of a step: TOKENS_PER_STEP x their share of a sample (references are resized
    to the target's area, so each adds AREA / 256 tokens); 0 for text-to-image."""
    refs = references_per_target(cfg)
    image = int(cfg.data.area) // 256
    text = int(cfg.data.max_text_tokens)
    return int(cfg.data.tokens_per_step) * refs * image / (image * (1 + refs) + text)


def reference_kv_saved(mode: str, cfg: Any, config: Any, offload: bool = False) -> float:
    """Bytes a block of checkpoint `mode` keeps beyond ACTIVATIONS with reference images: its attention
    gathers keys and values to the key segments (model/blocks.attention: target and text queries read every
    key, reference queries the references' again), so the k and v the attention keeps have
    REFERENCE_KV_ROWS more rows per reference token. Kept where the attention half keeps its activations
    ('none', 'mlp'); with ACTIVATION_OFFLOAD, the share of the block's kept bytes that stays on the card."""
    if mode not in ("none", "mlp"):
        return 0.0
    vb = cal.WEIGHT_BYTES.get(cfg.device.precision, 2)
    extra = reference_tokens(cfg) * cal.REFERENCE_KV_ROWS * config.dim * vb
    if offload:
        plain = activation(mode, cfg.device.precision)["kept"]
        extra *= activation(mode, cfg.device.precision, True)["kept"] / plain if plain else 0.0
    return extra


def refiner_saved(cfg: Any, config: Any) -> float:
    """Bytes the text refiner keeps for the backward over the step's text tokens (0 when it is frozen)."""
    if not refiner_trains(cfg):
        return 0.0
    vb = cal.WEIGHT_BYTES.get(cfg.device.precision, 2)
    wide_d, wide_h = cal.REFINER_SAVED
    per_token = (wide_d * config.dim + wide_h * config.mlp_hidden) * vb
    return config.refiner_depth * text_tokens(cfg) * per_token


def activation(mode: str, precision: str, offload: bool = False) -> dict[str, float]:
    """{'kept': ..., 'working': ...} bytes per token and model dim of one block (calibration tables)."""
    table = cal.ACTIVATIONS_OFFLOADED if offload else ACTIVATIONS
    return table.get((mode, precision), table[(mode, "bf16")])


def checkpointed_blocks(plan: MemoryPlan, depth: int) -> int:
    """Blocks 0, k, 2k, ... are checkpointed."""
    return 0 if plan.checkpointing == "none" else math.ceil(depth / int(plan.checkpoint_every))


def saved_per_block(plan: MemoryPlan, cfg: Any, config: Any) -> tuple[float, float]:
    """Bytes one (checkpointed, plain) block keeps for the backward."""
    precision = cfg.device.precision
    per_dim = int(cfg.data.tokens_per_step) * config.dim
    off = plan.activation_offload == "on"
    plain = per_dim * kept_per_dim("none", precision, off) + reference_kv_saved("none", cfg, config, off)
    ckpt = per_dim * kept_per_dim(plan.checkpointing, precision, off)
    ckpt += reference_kv_saved(plan.checkpointing, cfg, config, off)
    return ckpt, plain


def kept_per_dim(mode: str, precision: str, offload: bool = False) -> float:
    """What a block of checkpoint `mode` keeps per token and dim; PRECISION fp16 adds its float32 residual
    streams (FP16_RESIDUAL_EXTRA; with offload, the share of it that stays on the card)."""
    kept = activation(mode, precision, offload)["kept"]
    if precision != "fp16":
        return kept
    extra = cal.FP16_RESIDUAL_EXTRA[mode]
    if offload:  # the float32 copies leave the card in the same share as the rest of what the block keeps
        plain = activation(mode, precision)["kept"]
        extra *= kept / plain if plain else 0.0
    return kept + extra


def lycoris_saved(plan: MemoryPlan, cfg: Any, config: Any) -> float:
    """What an adapter run by lycoris's modules keeps for its own backward over the blocks' linears:
    every block that keeps activations on the card, plus one being recomputed or in its backward."""
    from kohakumoss.adapters.algos import adapter_algo  # deferred: the adapters load lycoris

    algo = adapter_algo(cfg.adapter.algo)
    if algo is None or algo.project_kernels:  # a full fine-tune, or the project's LoRA kernels
        return 0.0
    fan_in = sum(i for i, _ in block_linears(config, cfg.adapter.target_preset))
    per_block = (
        int(cfg.data.tokens_per_step)
        * fan_in
        * cal.WEIGHT_BYTES.get(cfg.device.precision, 2)
        * algo.saved_per_fan_in
    )
    c = checkpointed_blocks(plan, config.depth)
    kept = 0 if plan.activation_offload == "on" else config.depth - c  # offloaded: they leave the card
    return per_block * (kept + 1)


def working_set(plan: MemoryPlan, cfg: Any, config: Any) -> float:
    """The largest extra peak of one block's backward (one block is in its backward at a time)."""
    precision = cfg.device.precision
    per_dim = int(cfg.data.tokens_per_step) * config.dim
    c = checkpointed_blocks(plan, config.depth)
    modes = ([plan.checkpointing] if c else []) + (["none"] if c < config.depth else [])
    off = plan.activation_offload == "on"
    # a recomputed attention half re-creates its gathered keys and values (reference_kv_saved's bytes)
    recomputed = (
        reference_kv_saved("none", cfg, config) if c and plan.checkpointing in ("attn", "full") else 0.0
    )
    return per_dim * max(activation(m, precision, off)["working"] for m in modes) + recomputed


def file_bytes(path: str | Path) -> int:
    """Bytes of the safetensors weights at `path` (a file or a folder of them); 0 when absent."""
    p = Path(path) if path else None
    if p is None or not p.exists():
        return 0
    files = [p] if p.is_file() else list(p.rglob("*.safetensors"))
    return sum(f.stat().st_size for f in files)


def encoder_file_bytes(cfg: Any) -> tuple[int, int]:
    """(text encoder, VAE) sizes of TEXT_ENCODER / VAE for the estimate: their files', or for 'random' the
    parameter bytes of the architecture MODEL_PRESET sizes; 0 when unset or synthetic."""

    def size(value: str | None, kind: str) -> int:
        if value in ("", "synthetic", None):
            return 0
        if value != "random":
            return file_bytes(value)
        import torch

        from kohakumoss.encoders.random_weights import random_encoder_bytes, random_size

        preset = "" if cfg.model.weights else cfg.model.model_preset or ""
        auto_fp32 = cfg.encoders.encoder_precision == "auto" and cfg.device.device == "cpu"
        wide = cfg.encoders.encoder_precision == "fp32" or auto_fp32  # components.encoder_dtype's choice
        return random_encoder_bytes(kind, random_size(preset), torch.float32 if wide else torch.bfloat16)

    return size(cfg.encoders.text_encoder, "text"), size(cfg.encoders.vae, "vae")


def _encoder(placement: str, encode: str, size: float) -> float:
    if encode == "cache" or not size or placement == "off":
        return 0.0
    return size * (cal.ENCODER_STREAM_FRACTION if placement == "streamed" else 1.0)


def text_encoder_resident_bytes(cfg: Any, size: int) -> float:
    """The text encoder's bytes on the card from its file's `size`: with TEXT_ENCODER_QUANT its decoder
    blocks' linears take one byte per weight plus a row scale (TEXT_ENCODER_QUANT_FRACTION)."""
    if cfg.encoders.text_encoder_quant in ("none", None):
        return float(size)
    return size * cal.TEXT_ENCODER_QUANT_FRACTION


def ema_bytes(plan: MemoryPlan, cfg: Any, config: Any, params: int | None = None) -> float:
    """EMA's float32 copy of the trainable weights, kept where they live (train/ema.py): on the card,
    but for a full fine-tune's streamed blocks, whose weights live on the host."""
    if not cfg.optim.ema:
        return 0.0
    n = trainable_params(cfg, config, params)
    if cfg.adapter.algo == "full" and plan.optimizer != "gpu":
        n -= plan.streamed_count(config.depth) * block_params(config)
    return max(n, 0) * cal.MASTER_BYTES


def estimate_plan(
    plan: MemoryPlan,
    cfg: Any,
    config: Any,
    params: int | None = None,
    text_encoder_bytes: int = 0,
    vae_bytes: int = 0,
    shards: int = 1,
) -> MemoryEstimate:
    """Peak bytes of one training step under `plan` for the run `cfg` (its TrainConfig) on a DiT of
    `config` (a MossConfig); `shards`: the FSDP2 ranks its weights, grads and states are sharded over."""
    precision = cfg.device.precision
    wb = cal.WEIGHT_BYTES.get(precision, 2)
    full = cfg.adapter.algo == "full"
    depth = config.depth
    bp, nb = block_params(config), nonblock_params(config, params)
    streamed, slots = plan.streamed_count(depth), plan.slots(depth)
    gpu_opt = plan.optimizer == "gpu"
    est = MemoryEstimate()

    # weights
    block = block_weight_bytes(config, precision, "same" if full else cfg.device.base_precision)
    if shards > 1:  # FSDP2: this rank's shards, and the blocks (and root) gathered in the compute dtype
        stored = (depth * bp + nb) * cal.MASTER_BYTES if full else depth * block + nb * wb
        est.parts["DiT weights (FSDP shards)"] = stored / shards
        # the running block and the one prefetched, the root, and a block's grads reduced in fp32
        est.parts["FSDP gathered blocks"] = (cal.FSDP_GATHERED_BLOCKS * bp + nb) * wb + (
            bp * (wb + cal.GRAD_BYTES_FP32) if full else 0
        )
    elif full and gpu_opt:  # the trained fp32 weights compute on the card: nothing to stream
        est.parts["DiT weights (fp32)"] = (depth * bp + nb) * cal.MASTER_BYTES
        if precision in ("bf16", "fp16"):  # autocast caches each trained weight's cast until the forward ends
            est.forward_parts["autocast weight copies"] = (depth * bp + nb) * wb
    else:
        est.parts["DiT weights"] = (depth - streamed) * block + nb * wb
        est.parts["streaming slots"] = slots * block

    # trainable state
    n = trainable_params(cfg, config, params)
    per_block = n / depth
    sharded = shards if full else 1  # adapters stay whole on every rank, their grads all-reduced
    if not full:  # adapter weights train in fp32 on the card whatever the optimizer placement
        est.parts["trainable weights"] = n * cal.MASTER_BYTES
    grad_bytes = cal.GRAD_BYTES_FP32 if (gpu_opt or not full) else wb
    if plan.grad_offload:
        est.parts["grad staging ring"] = min(cal.GRAD_STAGING_BLOCKS, depth) * per_block * grad_bytes
    else:
        est.parts["grads"] = n * grad_bytes / sharded
    state = cal.MUON_STATE_BYTES if (full and cfg.optim.use_muon) else cal.ADAMW_STATE_BYTES
    if plan.optimizer == "gpu":
        est.parts["optimizer states"] = n * state / sharded
    elif plan.optimizer == "stream":
        est.step_parts["optimizer stream chunks"] = (  # after the backward has freed its activations
            min(cal.OPT_STREAM_CHUNKS, depth) * per_block * (state + cal.MASTER_BYTES)
        )

    est.parts["EMA"] = ema_bytes(plan, cfg, config, params)

    # activations
    ckpt, plain = saved_per_block(plan, cfg, config)
    c = checkpointed_blocks(plan, depth)
    est.parts["saved activations"] = c * ckpt + (depth - c) * plain
    tokens = int(cfg.data.tokens_per_step)
    fixed = tokens * config.dim * cal.FIXED_PER_TOKEN_DIM * (wb / 2)
    est.parts["outside the blocks"] = fixed + refiner_saved(cfg, config)
    est.parts["adapter activations"] = lycoris_saved(plan, cfg, config)
    est.parts["backward working set"] = working_set(plan, cfg, config)

    # encoders
    est.parts["text encoder"] = _encoder(
        plan.text_encoder,
        cfg.data.text_encode,
        text_encoder_resident_bytes(cfg, text_encoder_bytes),
    )
    est.parts["VAE"] = _encoder(plan.vae, cfg.data.vae_encode, vae_bytes)
    return est


def estimate_peak(
    cfg: Any,
    config: Any,
    params: int | None = None,
    text_encoder_bytes: int = 0,
    vae_bytes: int = 0,
    plan: MemoryPlan | None = None,
    shards: int = 1,
) -> MemoryEstimate:
    """`estimate_plan` with the plan the per-engine knobs alone give (unset fields: the 'speed' plan)."""
    plan = plan if plan is not None else plan_with_overrides(MemoryPlan(), memory_pins(cfg.memory))
    return estimate_plan(plan, cfg, config, params, text_encoder_bytes, vae_bytes, shards)
