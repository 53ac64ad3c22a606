"""Every constant of the memory estimate and the catalog's cost model, with where it comes from.

MEASURED: a value taken from a run of this project (the run is named next to it).
DERIVED:  computed from a measured value and the block's structure (the arithmetic is in the comment).
FITTED:   solved from measured rows by scripts/bench/fit_step_cost.py.
PLACEHOLDER: a reasonable guess, to be calibrated on the H200 (`scripts/bench/*`); replace it with the
measured value and change its tag.

"Pre-release block": the block measured before 2026-12-01, before the model took the released MOSS-Image
structure.
Its linears had the shapes of today's (q, k, v, o d x d, a fused [2h, d] MLP input, [d, h] output), its
ops saved the same tensors (a SwiGLU op saved its [T, 2h] input as situ_glu does), and it ran a 256 -> 6d
modulation per block (per sample, not per token); it had no text refiner. A value measured or fitted on it
says so; re-measure it on the released block with the command named there.
"""

from __future__ import annotations

GIB = 1 << 30

# --- activations ------------------------------------------------------------------------------------
# ONE table, keyed by (checkpoint mode of a block, compute precision), in bytes per token and per
# model dim of one block (scripts/bench/memory_calibrate.py measures both on the H200):
#   kept:    what the block keeps for its backward (a checkpointed block: what its mode keeps);
#   working: the extra peak while that block runs its backward (recompute included), above what it
#            keeps; only one block is in its backward at a time, so it counts once per step.
#
# MEASURED (all of them, 2026-12-01, the released block): `AREAS="" BENCH=calibrate bash .ci/gpu` on the
# H200 (scripts/bench/memory_calibrate.py): one moss-image-5b block at 8704 tokens (2 x 1 MP), bf16, LoRA
# r32 on every linear (TARGET_PRESET 'full') through the registry's lora_linear; per-block figures are the
# difference between a 3-block and a 1-block stack. With activation offload, "kept" is what stays on the
# GPU per block and "working" includes the prefetched activations of the block below. The pre-release
# block measured within 0.05 of every "kept" (none 40.69, full 2.02, attn 22.21, mlp 22.26). What a plain
# block keeps matches its ops' saved tensors: x (norm_modulate), y (q/k/v's input), q and k before and after
# qk_norm_rope, v, the attention output, o's output (its gate's gradient), x and y again
# (residual_norm_modulate), ffn_up_gate's output [2h], SiTU-GLU's output [h], ffn_down's output: 12 d + 3 h
# values, (12 + 3 x 8192 / 3072) x 2 = 40.00 bytes per token and dim in bf16 (+ LoRA's rank-32 states).
_BF16 = {  # mode: (kept, working)
    "none": (40.72, 6.77),
    "full": (2.04, 45.29),
    "attn": (22.24, 6.70),
    "mlp": (22.41, 24.85),
}
_BF16_OFFLOAD = {
    "none": (10.92, 70.59),
    "full": (0.0, 53.89),
    "attn": (10.75, 29.68),
    "mlp": (0.16, 76.09),
}
# Edit runs (reference images): the attention gathers keys and values to the key segments (target and text
# queries read all of a sample's keys, reference queries its references' again), so the k and v it keeps for
# the backward have one more row each per reference token: 2 d-wide values per reference token and block,
# where the attention half keeps its activations. DERIVED from model/blocks.attention; the tiny model's saved
# tensors agree (tests/memory/test_estimate.py). train_step.py's lora/auto/latent_text/cap78 --references 1
# (catalog c0050, 'ckpt mlp/1') measured 64.4 GiB at step 1 and 65.1 later on an H100 against 60.4 predicted
# without it; with it, 64.5 (3.9 GiB of gathered k and v, x ALLOCATOR_SLACK).
REFERENCE_KV_ROWS = 2
# Reference images per target priced for an edit dataset no scan has counted yet (`kohakumoss-config check`
# before the first scan; the trainer scans first and prices the most any item has: estimate.references_per_target).
# PLACEHOLDER: the common edit layout (SimpleTuner's and ComfyUI's edit workflows give one).
ASSUMED_REFERENCES = 1
# Outside the blocks (embedders, head, loss, rotary tables, and the text refiner when it trains): MEASURED
# (same run) 246.1 MiB at 8704 tokens x 3072 with the refiner under LoRA. Of it REFINER_SAVED's count (below)
# is 108.0 MiB; the rest, 5.42 bytes per token and model dim, is this constant: DERIVED (the split between
# the two is the count's, not measured; memory_calibrate.py prints both).
FIXED_PER_TOKEN_DIM = 5.42
# The text refiner (refiner_depth blocks over the text tokens only) keeps, per text token and block, this
# many (d-wide, mlp_hidden-wide) values in the compute precision when it runs a backward (a full
# fine-tune, or an adapter on it): DERIVED from TextRefinerBlock's ops: x and its rms_norm, q, k before and
# after qk_norm_rope, v, the attention output, x and its rms_norm again (10 d); the [up | gate]
# concatenation SiTU-GLU reads (2 h) and its output (h). A frozen refiner keeps nothing.
REFINER_SAVED = (10, 3)
# What an adapter run by lycoris's modules keeps for its own backward is a fact of its algorithm:
# `Algo.saved_per_fan_in` in adapters/algos.py, tagged there like the constants here.
# The tables by PRECISION: fp16 as bf16 (the same bytes; its float32 residuals are FP16_RESIDUAL_EXTRA),
# fp32 twice: DERIVED (the dtypes' sizes).
ACTIVATIONS: dict[tuple[str, str], dict[str, float]] = {
    (mode, precision): {"kept": kept * scale, "working": working * scale}
    for mode, (kept, working) in _BF16.items()
    for precision, scale in (("bf16", 1.0), ("fp16", 1.0), ("fp32", 2.0))
}
ACTIVATIONS_OFFLOADED: dict[tuple[str, str], dict[str, float]] = {
    (mode, precision): {"kept": kept * scale, "working": working * scale}
    for mode, (kept, working) in _BF16_OFFLOAD.items()
    for precision, scale in (("bf16", 1.0), ("fp16", 1.0), ("fp32", 2.0))
}


# PRECISION fp16 keeps the DiT's residual streams in float32 (precision/fp16.py): per token and dim of a
# block, 2 more bytes for each copy of the residual x the block keeps. DERIVED from the kept list above:
# a plain block keeps x twice (norm_modulate, residual_norm_modulate): +4; 'attn' and 'mlp' keep the
# block's input for the recompute and x at the other half's norm: +4; 'full' keeps only its input: +2.
# The branch activations stay fp16 (autocast), so nothing else changes.
FP16_RESIDUAL_EXTRA = {"none": 4.0, "attn": 4.0, "mlp": 4.0, "full": 2.0}


# --- weights and trainable state -------------------------------------------------------------------
# DERIVED (the dtypes' sizes): frozen / compute weights per parameter by PRECISION.
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
MASTER_BYTES = 4  # DERIVED: fp32 master weight per trained parameter (and EMA's copy of it)
GRAD_BYTES_FP32 = 4  # DERIVED: fp32 gradient (trained fp32 weights: adapters, full FT with GPU masters)
# PLACEHOLDER (not measured: no machine with several GPUs yet): blocks FSDP2 holds gathered at once, the
# one running and the one its forward / backward prefetches (distributed/wrap.py: reshard after forward)
FSDP_GATHERED_BLOCKS = 2
ADAMW_STATE_BYTES = 8  # DERIVED: exp_avg + exp_avg_sq in fp32
MUON_STATE_BYTES = 4  # DERIVED: one fp32 momentum buffer
# BASE_PRECISION's 8-bit linears (fp8, fp8_weight, int8, int8_weight): one byte per weight plus this
# float32 scale per output row; mxfp8: one e8m0 byte per MXFP8_BLOCK inputs of a row, stored twice (as
# is and in the GEMM's tile layout). DERIVED (precision/*_base.py's buffers; tests/memory/test_estimate.py
# compares them with quantized blocks).
ROW_SCALE_BYTES = 4
MXFP8_BLOCK = 32
# TEXT_ENCODER_QUANT (any mode): the text encoder's resident bytes as a fraction of its bf16 bytes. DERIVED
# from Qwen3.5-9B's text model (encoders/text_config.QWEN35_9B on the meta device): 7,936,684,544
# parameters, 6,918,504,448 of them in the 248 decoder-block linears (1,426,944 rows) that
# encoders/text_quant.py quantizes; (2 x 7.937e9 - 6.919e9 + 4 x 1.427e6) / (2 x 7.937e9) = 0.5645.
TEXT_ENCODER_QUANT_FRACTION = 0.5645
# Optimizer "stream": states and masters live in pinned host memory and pass through the GPU this
# many blocks at a time for the update. PLACEHOLDER.
OPT_STREAM_CHUNKS = 2
# Gradient offload: a GPU staging ring of this many blocks' gradients. PLACEHOLDER.
GRAD_STAGING_BLOCKS = 2
# Encoders streamed from host memory keep this fraction of their weights on the GPU at once
# (a couple of layers of a ~32-layer text encoder). PLACEHOLDER.
ENCODER_STREAM_FRACTION = 1 / 16

# Allocator fragmentation and workspace on top of the sum (peak reserved vs allocated). PLACEHOLDER.
ALLOCATOR_SLACK = 1.05
# Memory the card cannot give to the step (CUDA context, other processes): `fastest_fit`'s default
# margin, a fraction of the card. PLACEHOLDER.
CARD_MARGIN = 0.05
# What the process holds on the card beyond torch's allocated peak: the CUDA context, cuBLAS / Triton
# workspaces and the caching allocator's reserve. MEASURED (docs/performance/memory.md): nvidia-smi
# minus the step's max_memory_allocated was 1.6 GiB for `minimal` under a 6 GiB cap and 2.5 GiB for
# `speed` (pre-release block); the smaller, capped figure is what a small card pays (its allocator has no
# room to cache). The released block (2026-12-01, `TRAIN_ROWS=lora/speed/latent_text,lora/minimal/latent_text/
# cap6 BENCH=train_step bash .ci/gpu`): 1.65 GiB for `speed`, 2.62 for `minimal` under 6 GiB, of which
# 1.49 GiB was the allocator's cache (reserved 4.45 against 2.96 allocated: room the cap still left it).
CUDA_CONTEXT_BYTES = 1.6 * GIB

# --- cost model (the catalog's relative step cost) -------------------------------------------------
# FITTED: each constant below solves one measured H200 row of scripts/bench/train_step.py (moss-image-5b,
# 2 x 4352 tokens, latent + text cache; LoRA r32 on every linear, or full fine-tune with Muon), as a ratio
# to the LoRA `speed` row of the same device call, scaled to the released block's speed row (0.472 s, the released
# block; the other rows ran the pre-release block, the module docstring says what that means: the same
# block linears and ops, so the same multiply-adds per token; re-measure them and refit):
#   lora/speed 0.472 s (released block)                 -> EFFECTIVE_FLOPS
#   lora/balanced 0.743 / speed 0.526 s (pre-release)     -> RECOMPUTE_SHARE["full"]
#   lora/low_vram/cap8 1.020 / 0.526 s (pre-release)      -> STREAM_LOAD_OVERHEAD_S
#   full/speed 1.307 / 0.526 s (pre-release)              -> GPU_OPT_S_PER_PARAM["muon"]
#   full/c0252/cap24 4.92 / 0.479 s (pre-release)         -> HOST_GRAD_SUM_S_PER_PARAM
#   full/c0261/cap24 ~140 s / speed 0.463 s (pre-release)  -> FULL_STREAM_BLOCK_S
# solved in that order, repeated until they settle (the later rows depend on the earlier constants):
# scripts/bench/fit_step_cost.py does it and prints them; tests/memory/test_cost_fit.py checks they agree.
# The text refiner's compute over the text tokens is counted apart at the same rate (catalog.outside_macs).
# Achieved throughput by the model's multiply-adds (graphed, tuned kernels: MFU by memory/flops.py was
# 62.9% in that row), and pinned-copy bandwidth each way: MEASURED (memory_calibrate.py, H200) 55.3 GB/s
# host->device, 55.1 GB/s back (the released block's calibration: 55.1 and 55.2).
EFFECTIVE_FLOPS = 564.0e12
H2D_BYTES_PER_S = 55.3e9
D2H_BYTES_PER_S = 55.1e9
# Activation offload moves many tensors of a few MiB to tens of MiB, not one block: MEASURED effective
# rate each way (memory_calibrate.py, pre-release block): 'none' + offload moves 29.8 bytes per token and
# dim (0.80 GB) per block and took 39.19 ms forward + backward, i.e. ~19.6 ms per direction = ~41 GB/s
# (released block, 2026-12-01: the same 29.8 bytes in 36.80 ms).
ACT_OFFLOAD_BYTES_PER_S = 41e9
# Backward time / forward time of a block. adapter: MEASURED on the pre-release block (memory_calibrate.py,
# eager block: (15.05 - 5.80) / 5.80 ms); full: DERIVED (weight grads double the backward's matmuls).
BACKWARD_FACTOR = {"adapter": 1.59, "full": 2.6}
# Extra time of a checkpointed block / its forward, per mode. full: FITTED (above). attn, mlp: the eager
# pre-release block's MEASURED shares (memory_calibrate.py: attn 1.42, mlp 0.63, full 1.57) scaled by the
# fitted full / measured full (1.073 / 1.57): DERIVED.
_RECOMPUTE_FULL = 1.073
RECOMPUTE_SHARE: dict[str, float | None] = {
    "none": 0.0,
    "full": _RECOMPUTE_FULL,
    "attn": 1.42 / 1.57 * _RECOMPUTE_FULL,
    "mlp": 0.63 / 1.57 * _RECOMPUTE_FULL,
}
# What the engines cost beyond their copies (stream syncs, hooks, copies competing with compute for
# memory bandwidth), per streamed block load and per parameter of the host's fp32 grad sums: FITTED
# (above). Per offloaded block each way: PLACEHOLDER (the uncapped block's offload cost is the copies,
# ACT_OFFLOAD_BYTES_PER_S). lora/minimal/cap4, every engine at once under a 4 GiB cap, measured ~1.6x the
# model's step; not fitted to any one engine (fit_step_cost.py prints it against the prediction): that
# run's host AdamW was still the foreach kernel (~9x the fused one on the CI box), a likely part of it.
STREAM_LOAD_OVERHEAD_S = 2.52e-3
ACT_OFFLOAD_OVERHEAD_S = 0.5e-3
HOST_GRAD_SUM_S_PER_PARAM = 0.3226e-9
# A full fine-tune's streamed (trainable) block, per step. FITTED to the one row that ran it: catalog c0261
# (11 blocks streamed, optimizer streamed, no grad offload) took 147 and 139 s for its first two steps under
# a 24 GiB cap (pre-release block: KOHAKUMOSS_TUNE=off TRAIN_ROWS=full/auto/latent_text/cap24 .ci/gpu; the row
# timed out), ~60x its prediction. Not yet profiled: which part of streaming trainable weights costs this
# is open; the term keeps `auto` off such plans until it is known.
FULL_STREAM_BLOCK_S = 12.99
# The optimizer update on the GPU per trained parameter. adamw: MEASURED (a profile of the pre-release speed
# row: torch's fused AdamW 0.953 ms per step for 99.4M LoRA parameters); muon: FITTED (above; Muon's
# Newton-Schulz iterations on every weight matrix dominate a full fine-tune's update).
GPU_OPT_S_PER_PARAM = {"adamw": 9.58e-12, "muon": 1.019e-10}
# Host (CPU) optimizer update time per trained parameter (fused AdamW on a desktop CPU). PLACEHOLDER:
# the CI box (2 cores) MEASURED 0.62 ns (fused, 111M params in 0.070 s; foreach 5.6 ns), a desktop has more cores.
HOST_OPT_S_PER_PARAM = 1.0e-9
