"""Every op `OpSet` offers: its name, arguments, reference and the backends that are parameters of another.

An op lives in `ops/<folder>/`: `eager.py` holds the reference (a function named like the op), each
other module `<backend>.py` one backend (a function named like the op, optionally `supports(arch,
dtype)` and `WEIGHTS`, the weight kinds it takes). The registry adds two backends to every op itself:
`eager` (the reference) and `compile` (the reference under torch.compile). A variant is a backend
that is another backend's function called with fixed keyword arguments (`lora_linear`'s
`addmm_lowrank` is `addmm` with `lowrank=True, lora_first=True`): listed here, no module of its own.

Ops with a frozen weight argument (`weight_arg`: the LoRA ops and `stored_linear`) dispatch on its kind
(`stored_weight.WEIGHT_KINDS`: a tensor, or an fp8 / int8 / MXFP8 record): each kind binds its own
backend list (a backend takes the kinds in its `WEIGHTS`, default a plain tensor only; the reference
takes every kind, dequantizing) and its own tuning rows (the shape key's `W=`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .tuning import shape_keys

DENSE = ("dense",)  # the weight kinds a backend takes unless it says otherwise (stored_weight.WEIGHT_KINDS)


@dataclass(frozen=True)
class Variant:
    """A backend that calls backend `base`'s function with `kwargs` bound."""

    base: str
    kwargs: Mapping[str, object]
    summary: str
    supports_from: str | None = None  # a module under ops/ whose `supports(arch, dtype)` it needs
    weights: tuple[str, ...] = DENSE


@dataclass(frozen=True)
class OpSpec:
    name: str
    folder: str  # under ops/
    signature: str  # arguments (shapes) -> result
    summary: str  # what the reference computes
    variants: Mapping[str, Variant] = field(default_factory=dict)
    weight_arg: int | None = (
        None  # position of the frozen weight (or the group's weights) whose kind dispatches
    )
    compile: bool = True  # whether the registry offers the reference under torch.compile
    # bumped when a backend changed enough that the choices stored for this op are stale: its shape keys
    # then end in `|r<revision>`, so every table (the user's, the shipped one) times them again
    revision: int = 1
    # the dims of a call its tuning rows are keyed by (tuning/shape_keys.py): rows and width unless set
    dims: shape_keys.Dims = shape_keys.rows

    def shape_key(self, *args, **kwargs) -> str:
        """The tuning-table row of one call of this op (`shape_keys.key`)."""
        return shape_keys.key(self.name, self.dims, self.revision, *args, **kwargs)

    @property
    def reference(self) -> str:
        """Where the reference lives: `module:function`."""
        return f"kohakumoss_kernels.ops.{self.folder}.eager:{self.name}"


_LOWRANK = "lora_linear.lowrank"  # the one-launch rank-r Triton kernels: Triton must import and run here

_LORA_VARIANTS = {
    "addmm_lora_first": Variant(
        "addmm",
        {"lora_first": True},
        "the LoRA term written first, the frozen GEMM accumulating onto it (the tuner picks the order per "
        "shape); a stored weight's GEMM writes first anyway, so it takes a plain tensor only",
    ),
    "addmm_lowrank": Variant(
        "addmm",
        {"lora_first": True, "lowrank": True},
        "addmm_lora_first with the rank-r products (x down^T, gy up, the two adapter gradients) in "
        "one-launch Triton kernels (ops/lora_linear/lowrank.py); the big GEMMs stay cuBLAS",
        supports_from=_LOWRANK,
        weights=("dense", "fp8", "int8"),
    ),
}

OPS: tuple[OpSpec, ...] = (
    OpSpec(
        "rms_norm",
        "rms_norm",
        "x [..., d], weight [d] | None, eps -> [..., d]",
        "x / sqrt(mean(x^2) + eps) * weight, in float32, returned in x's dtype",
    ),
    OpSpec(
        "norm_modulate",
        "norm_modulate",
        "x [T, d], shift [B, d], scale [B, d], token_sample [T], eps, fork=False -> [T, d] (, x)",
        "rms_norm(x) * (1 + scale) + shift, the per-sample scale and shift gathered per token; fork also "
        "returns x for its residual use",
    ),
    OpSpec(
        "gated_residual",
        "gated_residual",
        "x [T, d], y [T, d], gate [B, d], token_sample [T] -> [T, d]",
        "x + gate * y, the per-sample gate gathered per token",
    ),
    OpSpec(
        "residual_norm_modulate",
        "residual_norm_modulate",
        "x, y [T, d], gate, shift, scale [B, d], token_sample [T], eps -> (r, h) [T, d]",
        "r = gated_residual(x, y, gate); h = norm_modulate(r, shift, scale) in one pass",
    ),
    OpSpec(
        "apply_rope",
        "rope",
        "x [T, H, D], cos [T, D/2], sin [T, D/2] -> [T, H, D]",
        "rotary embedding, half-split pairs (i, i + D/2)",
        dims=shape_keys.heads,
    ),
    OpSpec(
        "qk_norm_rope",
        "qk_norm_rope",
        "x [T, H, D], weight [D] | None, cos, sin [T, D/2], eps -> [T, H, D]",
        "apply_rope(rms_norm(x, weight)) per head, one pass over q or k",
        dims=shape_keys.heads,
    ),
    OpSpec(
        "situ_glu",
        "situ_glu",
        "h [..., 2H] -> [..., H]",
        "4 tanh(g/4) sigmoid(g) * 25 tanh(u/25), u = h[..., :H] (hidden), g = h[..., H:] (gate)",
    ),
    OpSpec(
        "varlen_attention",
        "varlen_attention",
        "q, k, v [T, H, D], cu_seqlens [B+1] int32, max_seqlen, scale=None -> [T, H, D]",
        "softmax attention within each packed sample",
        revision=2,  # Triton's launch configs picked per sample-length bucket (were autotuned per head_dim)
        dims=shape_keys.attention,
    ),
    OpSpec(
        "segment_attention",
        "segment_attention",
        "q [Tq, H, D], k, v [Tk, H, D], cu_seqlens_q, cu_seqlens_kv [S+1] int32, max_seqlen_q, "
        "max_seqlen_kv, scale=None -> [Tq, H, D]",
        "softmax attention of query segment i over key segment i (the reference images' block mask)",
        dims=shape_keys.segment_attention,
    ),
    OpSpec(
        "lora_linear",
        "lora_linear",
        "x [..., I], weight [O, I] | stored, bias [O] | None, down [r, I], up [O, r], scale -> [..., O]",
        "x W^T + b + scale * (x down^T) up^T, a frozen linear with its LoRA bypass",
        variants=_LORA_VARIANTS,
        weight_arg=1,
        dims=shape_keys.weighted,
    ),
    OpSpec(
        "lora_group",
        "lora_group",
        "x [..., I], weights, biases, downs, ups, scales (one per member) -> tuple of [..., O_i]",
        "lora_linear per member, the members reading one x (q, k, v)",
        variants=_LORA_VARIANTS,
        weight_arg=1,
        dims=shape_keys.lora_group,
    ),
    OpSpec(
        "stored_linear",
        "stored_linear",
        "x [..., I], weight Fp8Weight | Int8Weight | Mxfp8Weight [O, I], bias [O] | None -> [..., O]",
        "x W^T + b over the stored weight dequantized (un-rotated where ConvRot), no LoRA",
        weight_arg=1,
        compile=False,
        dims=shape_keys.weighted,
    ),
)

SPECS: Mapping[str, OpSpec] = MappingProxyType({spec.name: spec for spec in OPS})


def shape_key(op: str, *args, **kwargs) -> str:
    """The tuning-table row of one call of `op`: its spec's (`OpSpec.shape_key`); an op outside the list
    (one a test registers) keys by rows and width."""
    spec = SPECS.get(op)
    if spec is None:
        return shape_keys.key(op, shape_keys.rows, 1, *args, **kwargs)
    return spec.shape_key(*args, **kwargs)
