"""Every constant of the memory estimate and the catalog's cost model, with where it comes from.

MEASURED: a value taken from a run of this project (the run is named next to it).
DERIVED:  computed from a measured value and the block's structure (the arithmetic is in the comment).
PLACEHOLDER: a reasonable guess, to be calibrated on the H200 (`scripts/bench/*`); replace it with the
measured value and change its tag.
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
# ("none", "bf16") is MEASURED: docs/performance/training.md, moss-image-5b, LoRA r32 attn-mlp, 8704
# tokens per step, bf16, no checkpointing, everything resident: 59.0 GiB peak allocated, less 9.3 GiB
# of DiT weights and 1.1 GiB of LoRA state = 48.6 GiB / (8704 tokens x 42 blocks x 3072) = ~46 bytes.
# That whole-model figure folds the working set in, so its "working" is 0 until measured apart.
# The others are DERIVED, to be calibrated on the H200:
#   full: keeps the block input only (one bf16 value per dim: 2); its backward recomputes the whole
#         block (46) plus the gradient of its activations (two bf16 tensors: 4) = 50;
#   attn: the attention half is recomputed. Of the ~19 values per dim a SwiGLU block keeps, the MLP
#         half keeps ~2 + 3 x mlp_hidden/dim = 10 (46 x 10/19 = ~24) and the attention half ~9 (norm /
#         modulate 2, qkv 3, q/k after norm + rope 2, attention out 1, gate 1: 46 x 9/19 = ~22).
#         kept: block input 2 + the MLP half's 24 = 26; working: the attention half 22 + 4 = 26;
#   mlp:  kept: the attention half's 22 + the MLP half's inputs (x, h: 4) = 26; working: 24 + 4 = 28.
# fp16 keeps the same shapes as bf16; fp32 doubles every value.
_BF16 = {  # mode: (kept, working)
    "none": (46.0, 0.0),  # MEASURED kept (working folded in, see above)
    "full": (2.0, 50.0),  # DERIVED, to be calibrated on the H200
    "attn": (26.0, 26.0),  # DERIVED, to be calibrated on the H200
    "mlp": (26.0, 28.0),  # DERIVED, to be calibrated on the H200
}
ACTIVATIONS: dict[tuple[str, str], dict[str, float]] = {
    (mode, precision): {"kept": kept * scale, "working": working * scale}
    for mode, (kept, working) in _BF16.items()
    for precision, scale in (("bf16", 1.0), ("fp16", 1.0), ("fp32", 2.0))
}

# Activation offload keeps this many blocks' kept activations on the GPU (one being copied out or
# prefetched, one in use). PLACEHOLDER.
ACT_OFFLOAD_WINDOW = 2

# --- weights and trainable state -------------------------------------------------------------------
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}  # frozen/compute weights per parameter
MASTER_BYTES = 4  # fp32 master weight per trained parameter
GRAD_BYTES_FP32 = 4  # fp32 gradient (trained fp32 weights: adapters, full FT with GPU masters)
ADAMW_STATE_BYTES = 8  # exp_avg + exp_avg_sq in fp32
MUON_STATE_BYTES = 4  # one fp32 momentum buffer
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

# --- cost model (the catalog's relative step cost) -------------------------------------------------
# Achieved dense bf16 throughput of the card and pinned-copy bandwidth each way. Only their ratio
# matters for the ranking. PLACEHOLDERS (a consumer card: ~100 TFLOP/s achieved, PCIe 4.0 x16).
EFFECTIVE_FLOPS = 100e12
H2D_BYTES_PER_S = 25e9
D2H_BYTES_PER_S = 25e9
# Backward time / forward time of a block: a frozen base computes input grads only (~1x the forward),
# a full fine-tune also weight grads (~2x). DERIVED (textbook FLOP counts), to be calibrated on the H200.
BACKWARD_FACTOR = {"adapter": 1.0, "full": 2.0}
# Recompute time / forward time of a checkpointed block, per mode. None: the mode's share of the
# block's multiply-adds (catalog.block_macs). DERIVED, to be calibrated on the H200.
RECOMPUTE_SHARE: dict[str, float | None] = {"none": 0.0, "full": 1.0, "attn": None, "mlp": None}
# Fixed cost of each engine action that cannot overlap (a stream sync, a hook): per streamed block
# load, per offloaded block of activations. PLACEHOLDER; also breaks ties towards fewer engines.
ENGINE_OVERHEAD_S = 0.5e-3
# Host (CPU) optimizer update time per trained parameter (fused AdamW on a desktop CPU). PLACEHOLDER.
HOST_OPT_S_PER_PARAM = 1.0e-9
