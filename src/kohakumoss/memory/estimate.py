"""A simple, documented peak-memory estimate of one training step with today's trainer.

Today's trainer has no memory engines: the frozen DiT is resident in PRECISION, nothing is
offloaded, no activation checkpointing. The estimate is the sum of

- DiT weights: parameters x bytes of PRECISION (fp32 for a full fine-tune: the trained weights);
- trainable state: adapters: trainable parameters x 16 bytes (fp32 weight, grad and AdamW's two
  moments); a full fine-tune: 12 bytes per parameter (the fp32 weight is counted above). Adapter
  parameters: RANK x (in + out) summed over the targeted linears, an upper bound for LoKr / IA3 /
  OFT, which train fewer (Muon's one moment makes a full fine-tune's figure an upper bound too);
- activations: TOKENS_PER_STEP x depth x dim x ACT_BYTES_PER_DIM saved values per block. The
  constant comes from the one measured run (docs/performance/training.md: moss-image-5b, LoRA r32,
  8704 tokens, bf16, no checkpointing: 59.0 GiB peak allocated; less 9.3 GiB of weights and 1.1 GiB
  of LoRA state, ~48.6 GiB / (8704 x 42 x 3072) = ~46 bytes per token, block and model dim);
- the text encoder and VAE weights when they run in the step (TEXT_ENCODE / VAE_ENCODE not "cache"),
  from their files' sizes.

It is an estimate of today's code, not of the planned memory profiles: the GPU layers' profiles
(offload, streaming, checkpointing) will lower it once they exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 1 << 30
ACT_BYTES_PER_DIM = {"bf16": 46.0, "fp16": 46.0, "fp32": 92.0}  # per token, block and model dim
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
STATE_BYTES = 16  # fp32 weight + fp32 grad + AdamW exp_avg + exp_avg_sq
ALLOCATOR_SLACK = 1.05  # fragmentation and workspace on top of the sum


@dataclass
class MemoryEstimate:
    parts: dict[str, float] = field(default_factory=dict)  # name -> bytes

    @property
    def total(self) -> float:
        return sum(self.parts.values()) * ALLOCATOR_SLACK

    def lines(self) -> list[str]:
        rows = [f"  {name:<18} {b / GIB:7.1f} GiB" for name, b in self.parts.items()]
        return [*rows, f"  {'total (+5%)':<18} {self.total / GIB:7.1f} GiB"]


def _linear_sizes(config: Any, target_preset: str) -> list[tuple[int, int]]:
    """(in, out) of the linears of one block an adapter wraps (attention; attention + MLP)."""
    d, h = config.dim, config.mlp_hidden
    attn = [(d, d)] * 4  # q, k, v, o
    mlp = [(d, 2 * h), (h, d)] if config.mlp_act == "swiglu" else [(d, h), (h, d)]
    if target_preset == "attn":
        return attn
    if target_preset == "full":
        return [*attn, *mlp, (config.mod_dim, 6 * d)]
    return attn + mlp


def file_bytes(path: str | Path) -> int:
    """Bytes of the safetensors weights at `path` (a file or a folder of them); 0 when absent."""
    p = Path(path) if path else None
    if p is None or not p.exists():
        return 0
    files = [p] if p.is_file() else list(p.rglob("*.safetensors"))
    return sum(f.stat().st_size for f in files)


def estimate_peak(
    knobs: dict[str, Any],
    config: Any,
    params: int | None = None,
    text_encoder_bytes: int = 0,
    vae_bytes: int = 0,
) -> MemoryEstimate:
    """Peak bytes of one training step for these knobs on a DiT of `config` (a MossConfig)."""
    precision = knobs.get("PRECISION", "bf16")
    full = knobs.get("ALGO", "lora") == "full"
    if params is None:
        per_block = sum(i * o for i, o in _linear_sizes(config, "full"))
        params = per_block * config.depth
    est = MemoryEstimate()
    est.parts["DiT weights"] = params * (4 if full else WEIGHT_BYTES.get(precision, 2))
    if full:  # the weights above are the trained fp32 ones: add their grad and AdamW's two moments
        est.parts["trainable state"] = params * (STATE_BYTES - 4)
    else:
        rank = int(knobs.get("RANK", 16))
        sizes = _linear_sizes(config, knobs.get("TARGET_PRESET", "attn-mlp"))
        est.parts["trainable state"] = rank * sum(i + o for i, o in sizes) * config.depth * STATE_BYTES
    tokens = int(knobs.get("TOKENS_PER_STEP", 8192))
    per = ACT_BYTES_PER_DIM.get(precision, 46.0)
    est.parts["activations"] = tokens * config.depth * config.dim * per
    if knobs.get("TEXT_ENCODE", "auto") != "cache" and text_encoder_bytes:
        est.parts["text encoder"] = text_encoder_bytes
    if knobs.get("VAE_ENCODE", "auto") != "cache" and vae_bytes:
        est.parts["VAE"] = vae_bytes
    return est
