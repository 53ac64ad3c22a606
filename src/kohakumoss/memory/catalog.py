"""The catalog: every combination of the memory engines, each with its predicted peak and step cost.

300 entries, in a fixed order (ids c0000 ... c0299 never change meaning):
    6 checkpoint variants  (none, mlp/1, attn/1, full/3, full/2, full/1)
  x 5 streaming amounts    (0, 1/4, 1/2, 3/4 of the blocks, all; 2 slots)
  x 2 activation offload   (none, on)
  x 5 optimizer / grads    (gpu, stream, stream + grad offload, host, host + grad offload)
The per-engine knobs that a config sets pin their fields in every entry. Entries made invalid by a pin,
or that the engines refuse for this run (a full fine-tune streaming blocks with the optimizer on the
GPU), are left out; the others keep their ids.

The cost model (relative step cost: predicted step time / the 'speed' plan's step time, same cfg).
Per block, forward and backward, the time is the largest of its compute and its transfers (the ring
copies the next block while this one computes), summed over the blocks:
- compute: 2 x tokens x multiply-adds of the block / EFFECTIVE_FLOPS; the backward is BACKWARD_FACTOR
  x the forward (1x for a frozen base: input grads only; 2x for a full fine-tune), plus the recompute
  of a checkpointed block (RECOMPUTE_SHARE: the whole forward, or its attention or MLP half by their
  share of the multiply-adds);
- outside the blocks, once per step and the same in every plan: the text refiner and text projection
  over the text tokens (their backward only when they train: estimate.refiner_trains), the video
  embedder over the image and reference tokens and the head over the image tokens (flops.py has the
  model's whole count, for MFU); an edit step's attention reads its references' keys too;
- transfers at H2D_BYTES_PER_S / D2H_BYTES_PER_S (the two ways are separate): a streamed block's
  weights come in for the forward and again for the backward, offloaded activations go out in the
  forward and come back (sharing the way in with the weights) in the backward, offloaded grads go out
  in the backward;
- plus what the engines cost beyond their copies: STREAM_LOAD_OVERHEAD_S per streamed load,
  ACT_OFFLOAD_OVERHEAD_S per offloaded block each way, HOST_GRAD_SUM_S_PER_PARAM for the host's fp32
  grad sums;
- plus, per optimizer step (/ GRAD_ACCUM), the update (GPU_OPT_S_PER_PARAM where it runs on the GPU) and
  its traffic: 'stream' moves masters and states in and out (and the offloaded grad sums in), 'host'
  moves grads out (unless offloaded) and weights back, and runs the update on the CPU
  (HOST_OPT_S_PER_PARAM).
The constants (calibration.py) are fitted to the H200 rows of scripts/bench/train_step.py, one row
per constant; only their ratios order the entries.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kohakumoss_common.errors import ConfigError

from . import calibration as cal
from . import flops
from .estimate import (
    MemoryEstimate,
    block_weight_bytes,
    estimate_plan,
    reference_tokens,
    references_per_target,
    refiner_trains,
    saved_per_block,
    text_tokens,
    trainable_params,
)
from .named import profile_of
from .plan import MemoryPlan, memory_pins, plan_with_overrides

CHECKPOINT_VARIANTS = (("none", 1), ("mlp", 1), ("attn", 1), ("full", 3), ("full", 2), ("full", 1))
STREAM_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
ACT_OFFLOADS = ("none", "on")
OPTIMIZER_GRADS = (("gpu", False), ("stream", False), ("stream", True), ("host", False), ("host", True))
CATALOG_SIZE = len(CHECKPOINT_VARIANTS) * len(STREAM_FRACTIONS) * len(ACT_OFFLOADS) * len(OPTIMIZER_GRADS)


@dataclass(frozen=True)
class CatalogEntry:
    id: str  # "c0042"
    plan: MemoryPlan
    peak: float  # predicted peak bytes (allocator slack included)
    cost: float  # predicted step time relative to the 'speed' plan
    estimate: MemoryEstimate
    profile: str = ""  # the named profile with this plan, if any

    @property
    def label(self) -> str:
        return self.plan.label()


def entry_id(index: int) -> str:
    return f"c{index:04d}"


def stream_amount(fraction: float, depth: int) -> int:
    """Blocks streamed for a fraction of the depth: 0, rounded half up, or -1 for all."""
    if fraction >= 1.0:
        return -1
    return int(depth * fraction + 0.5)


def catalog_plans(depth: int) -> list[tuple[str, MemoryPlan]]:
    """The raw combinations, in id order, for a DiT of `depth` blocks."""
    out = []
    for mode, every in CHECKPOINT_VARIANTS:
        for frac in STREAM_FRACTIONS:
            for act in ACT_OFFLOADS:
                for opt, grads in OPTIMIZER_GRADS:
                    plan = MemoryPlan(
                        checkpointing=mode,
                        checkpoint_every=every,
                        stream_blocks=stream_amount(frac, depth),
                        stream_slots=2,
                        activation_offload=act,
                        grad_offload=grads,
                        optimizer=opt,
                    )
                    out.append((entry_id(len(out)), plan))
    return out


def sample_tokens(cfg: Any) -> tuple[int, int, int]:
    """(image, text, reference) tokens of one sample: AREA / 256, MAX_TEXT_TOKENS, and AREA / 256 per
    reference the estimate prices (`references_per_target`)."""
    image = int(cfg.data.area) // 256
    return image, int(cfg.data.max_text_tokens), image * references_per_target(cfg)


def block_macs(config: Any, cfg: Any) -> tuple[float, float]:
    """Multiply-adds per token of one block's (attention half, MLP half): q, k, v, o and attention within
    the sample (the target's and text's queries read every key of it, the references' queries the
    references' keys: flops.step_flops' pairs); ffn_up_gate and ffn_down (flops.block_macs is their sum
    without attention)."""
    d = config.dim
    image, text, refs = sample_tokens(cfg)
    # a step smaller than one sample holds a smaller one
    scale = min(1.0, int(cfg.data.tokens_per_step) / (image + text + refs))
    joint, refs = (image + text) * scale, refs * scale
    pairs_per_token = (joint * (joint + refs) + refs * refs) / (joint + refs)
    attn = 4 * d * d + 2 * pairs_per_token * d
    mlp = flops.block_macs(config) - 4 * d * d
    return float(attn), float(mlp)


def outside_macs(config: Any, cfg: Any) -> tuple[float, float]:
    """Multiply-adds of one step's forward outside the blocks: (text side: the text projection and the
    refiner blocks over the text tokens, attention within each sample's text; image side: the video
    embedder over the image and reference tokens, the head over the image tokens)."""
    tokens = int(cfg.data.tokens_per_step)
    text = int(cfg.data.max_text_tokens)
    n_text, n_ref = text_tokens(cfg), reference_tokens(cfg)
    d, c = config.dim, config.in_channels
    refiner = config.refiner_depth * (flops.refiner_macs(config) + 2 * min(text, tokens) * d)
    return n_text * (refiner + config.text_dim * d), (tokens - n_text - n_ref) * 2 * c * d + n_ref * c * d


def offloaded_per_block(plan: MemoryPlan, cfg: Any, config: Any) -> tuple[float, float]:
    """Bytes activation offload moves per (checkpointed, plain) block each way: what the block would
    keep on the card less what stays there with offload on."""
    if plan.activation_offload != "on":
        return 0.0, 0.0
    kept_off = saved_per_block(plan, cfg, config)
    kept_on = saved_per_block(replace(plan, activation_offload="none"), cfg, config)
    return tuple(max(on - off, 0.0) for on, off in zip(kept_on, kept_off, strict=True))


def step_seconds(plan: MemoryPlan, cfg: Any, config: Any, params: int | None = None) -> float:
    """Predicted seconds of one micro-step (plus its share of the optimizer step) under `plan`."""
    precision = cfg.device.precision
    wb = cal.WEIGHT_BYTES.get(precision, 2)
    full = cfg.adapter.algo == "full"
    depth = config.depth
    tokens = int(cfg.data.tokens_per_step)
    attn, mlp = block_macs(config, cfg)
    fwd = 2 * tokens * (attn + mlp) / cal.EFFECTIVE_FLOPS
    backward = cal.BACKWARD_FACTOR["full" if full else "adapter"]
    share = cal.RECOMPUTE_SHARE.get(plan.checkpointing)
    if share is None:  # not calibrated: the half's share of the multiply-adds
        share = attn / (attn + mlp) if plan.checkpointing == "attn" else mlp / (attn + mlp)
    recompute = fwd * share
    bwd = fwd * backward
    streamed = plan.streamed_count(depth)
    gpu_masters = full and plan.optimizer == "gpu"
    block = block_weight_bytes(config, precision, "same" if full else cfg.device.base_precision)
    load = 0.0 if gpu_masters else block / cal.H2D_BYTES_PER_S
    moved_ckpt, moved_plain = offloaded_per_block(plan, cfg, config)
    n = trainable_params(cfg, config, params)
    grad_bytes = cal.GRAD_BYTES_FP32 if (plan.optimizer == "gpu" or not full) else wb
    grad_out = n / depth * grad_bytes / cal.D2H_BYTES_PER_S if plan.grad_offload else 0.0
    # outside the blocks (never streamed, checkpointed or offloaded): the same in every plan; a frozen
    # refiner runs no backward
    text_macs, image_macs = outside_macs(config, cfg)
    text_passes = 1 + backward if refiner_trains(cfg) else 1
    total = 2 * (text_macs * text_passes + image_macs * (1 + backward)) / cal.EFFECTIVE_FLOPS
    for i in range(depth):
        is_ckpt = plan.checkpointing != "none" and i % int(plan.checkpoint_every) == 0
        is_streamed = i < streamed
        kept = moved_ckpt if is_ckpt else moved_plain  # bytes sent to the host and back
        w = load if is_streamed else 0.0
        # forward: compute | weights in | activations out; backward: compute | weights + activations in | grads out
        total += max(fwd, w, kept / cal.ACT_OFFLOAD_BYTES_PER_S)
        total += max(bwd + (recompute if is_ckpt else 0.0), w + kept / cal.ACT_OFFLOAD_BYTES_PER_S, grad_out)
        total += 2 * is_streamed * cal.STREAM_LOAD_OVERHEAD_S
        if full:  # a streamed block that trains: its updated masters go back to host copies each step
            total += is_streamed * cal.FULL_STREAM_BLOCK_S
        total += (2 if plan.activation_offload == "on" else 0) * cal.ACT_OFFLOAD_OVERHEAD_S
    if plan.grad_offload:  # each micro-step's grads summed into fp32 on the host
        total += n * cal.HOST_GRAD_SUM_S_PER_PARAM
    accum = max(int(cfg.optim.grad_accum), 1)
    muon = full and cfg.optim.use_muon
    state = cal.MUON_STATE_BYTES if muon else cal.ADAMW_STATE_BYTES
    if plan.optimizer in ("gpu", "stream"):  # the update itself runs on the GPU
        total += n * cal.GPU_OPT_S_PER_PARAM["muon" if muon else "adamw"] / accum
    if plan.optimizer == "stream":
        moved = n * (state + cal.MASTER_BYTES)
        grads_in = n * cal.GRAD_BYTES_FP32 if plan.grad_offload else 0.0  # the host sums come back
        total += ((moved + grads_in) / cal.H2D_BYTES_PER_S + moved / cal.D2H_BYTES_PER_S) / accum
    elif plan.optimizer == "host":
        grads = 0.0 if plan.grad_offload else n * grad_bytes
        total += (grads / cal.D2H_BYTES_PER_S + n * wb / cal.H2D_BYTES_PER_S) / accum
        total += n * cal.HOST_OPT_S_PER_PARAM / accum
    return total


def plan_refusal(plan: MemoryPlan, cfg: Any, depth: int, shards: int = 1) -> tuple[str, str] | None:
    """(knob, why) when the engines refuse `plan` for this run (MemoryPlan.refusal; with the blocks
    sharded over `shards` FSDP2 ranks, MemoryPlan.fsdp_refusal too), else None."""
    if shards > 1 and (problem := plan.fsdp_refusal()):
        return problem
    return plan.refusal(cfg.adapter.algo == "full", depth)


def make_entry(
    entry: str,
    plan: MemoryPlan,
    cfg: Any,
    config: Any,
    params: int | None = None,
    text_encoder_bytes: int = 0,
    vae_bytes: int = 0,
    base_seconds: float | None = None,
    shards: int = 1,
) -> CatalogEntry:
    """One priced entry: `plan`'s estimate and its cost relative to the 'speed' plan."""
    est = estimate_plan(plan, cfg, config, params, text_encoder_bytes, vae_bytes, shards)
    if base_seconds is None:
        base_seconds = step_seconds(MemoryPlan(), cfg, config, params)
    cost = step_seconds(plan, cfg, config, params) / base_seconds
    return CatalogEntry(entry, plan, est.total, cost, est, profile_of(plan))


def catalog(
    model_config: Any,
    cfg: Any,
    params: int | None = None,
    text_encoder_bytes: int = 0,
    vae_bytes: int = 0,
    shards: int = 1,
) -> list[CatalogEntry]:
    """Every entry for this DiT and the run `cfg` (TOKENS_PER_STEP, PRECISION, ALGO, RANK, ...), in id
    order; the per-engine knobs `cfg.memory` sets pin their fields; `shards`: FSDP2's ranks."""
    pins = memory_pins(cfg.memory)
    base = step_seconds(MemoryPlan(), cfg, model_config, params)
    out = []
    for eid, raw in catalog_plans(model_config.depth):
        try:
            plan = plan_with_overrides(raw, pins)
        except ConfigError:  # a pin this entry cannot take (GRAD_OFFLOAD with the optimizer on the GPU)
            continue
        if plan_refusal(plan, cfg, model_config.depth, shards):
            continue
        entry = make_entry(eid, plan, cfg, model_config, params, text_encoder_bytes, vae_bytes, base, shards)
        out.append(entry)
    return out


def card_budget(card_bytes: float, margin: float = cal.CARD_MARGIN) -> float:
    """Bytes a step may allocate on a card: less the margin and what the CUDA context itself holds."""
    return card_bytes * (1.0 - margin) - cal.CUDA_CONTEXT_BYTES


def fits(entry: CatalogEntry, card_bytes: float, margin: float = cal.CARD_MARGIN) -> bool:
    """entry.peak <= card_budget(card_bytes, margin), with the context added on the left (no rounding at
    an exact fit)."""
    return entry.peak + cal.CUDA_CONTEXT_BYTES <= card_bytes * (1.0 - margin)


def fastest_fit(
    entries: list[CatalogEntry], card_bytes: float, margin: float = cal.CARD_MARGIN
) -> CatalogEntry | None:
    """The cheapest entry whose predicted peak fits `card_bytes` less `margin` (a fraction); ties: lowest
    peak, then lowest id. None when nothing fits."""
    fitting = [e for e in entries if fits(e, card_bytes, margin)]
    if not fitting:
        return None
    return min(fitting, key=lambda e: (round(e.cost, 9), e.peak, e.id))


def find_entry(entry: str, depth: int) -> MemoryPlan:
    """The raw plan of catalog entry `entry` ('c0042'), or a ConfigError naming MEMORY_PROFILE."""
    plans = dict(catalog_plans(depth))
    if entry not in plans:
        raise ConfigError(
            "MEMORY_PROFILE", f"no catalog entry {entry!r}: ids run c0000 ... {entry_id(CATALOG_SIZE - 1)}"
        )
    return plans[entry]
