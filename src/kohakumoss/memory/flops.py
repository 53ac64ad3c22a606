"""The model's multiply-adds and a training step's FLOPs (the count MFU divides by, and the catalog's
cost model's compute), from a MossConfig of the released structure (kohakumoss/model/blocks.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def block_macs(config: Any) -> int:
    """Multiply-adds per token of one block's linears: q, k, v, o (4 d^2), ffn_up_gate (d -> 2h), ffn_down (h -> d)."""
    d, h = config.dim, config.mlp_hidden
    return 4 * d * d + 3 * d * h


def refiner_macs(config: Any) -> int:
    """Multiply-adds per text token of one text refiner block's linears: qkv (3 d^2), proj (d^2), ffn_gate and
    ffn_up (d -> h each), ffn_down (h -> d): the same count as a block's."""
    d, h = config.dim, config.mlp_hidden
    return 4 * d * d + 3 * d * h


def step_flops(
    config: Any,
    image_lens: Sequence[int],
    text_lens: Sequence[int],
    full: bool,
    outside_trains: bool = True,
    backward: bool = True,
    ref_lens: Sequence[int] | None = None,
) -> float:
    """FLOPs of one training step (forward and backward) over samples of image_lens[i] + text_lens[i] tokens
    (+ ref_lens[i] reference-image tokens: edit training, model/seq.py).

    2 FLOPs per multiply-add. Forward multiply-adds, with d = dim, h = mlp_hidden, c = in_channels:
      blocks (depth), per token of every sample:   4 d^2 + 3 d h           (q, k, v, o, ffn_up_gate, ffn_down)
      blocks, attention per sample of L tokens:     2 L^2 d per block        (scores, weighted sum); with R
                                                    reference tokens 2 (L (L + R) + R^2) d: the
                                                    references' queries see the references alone
      refiner (refiner_depth), per text token:      4 d^2 + 3 d h           (qkv, proj, ffn_gate, ffn_up, ffn_down)
      refiner, attention per sample of L_t text:    2 L_t^2 d per block
      embedders: c d per image and reference token in (video_embedder) and d c per image token out
                 (final_linear_video), text_dim d per text token (text_embedder.proj)
      per sample: time_freq_dim d + d^2 (time_embedding), 6 d^2 (shared_block_modulation), 2 d^2
                 (video_head_modulation)
    Backward: a linear's forward once more for its input gradient (not for the embedders that read the data:
    video_embedder, text_embedder.proj, time_embedding.0) and once more for its weight gradient in a full
    fine-tune; an adapter's own FLOPs are not counted. Attention's backward is 10 L^2 d (FlashAttention
    recomputes the scores: 2, then four matmuls: 8) against 4 L^2 d forward. Outside the blocks only the
    head's input gradient runs unless `outside_trains` (a full fine-tune, or an adapter on the refiner,
    embedders and modulations: TARGET_PRESET 'full'); then every linear there runs its backward too.
    backward False: the forward alone.
    """
    d, c = config.dim, config.in_channels
    outside = outside_trains or full
    n_img, n_text, samples = sum(image_lens), sum(text_lens), len(image_lens)

    def linear(macs: int, grads: bool = True, input_grad: bool = True) -> float:
        passes = 1 + (int(input_grad) + int(full) if grads and backward else 0)
        return 2.0 * macs * passes

    refs = list(ref_lens) if ref_lens is not None else [0] * samples
    n_ref = sum(refs)

    def attention(pairs: int, depth: int, grads: bool = True) -> float:
        """pairs: the (query, key) pairs attention scores."""
        return (4 + (10 if grads and backward else 0)) * depth * d * float(pairs)

    lens = [i + t for i, t in zip(image_lens, text_lens, strict=True)]
    pairs = sum(n * (n + r) + r * r for n, r in zip(lens, refs, strict=True))
    flops = linear(config.depth * block_macs(config) * (n_img + n_text + n_ref)) + attention(
        pairs, config.depth
    )
    flops += linear(d * c * n_img)  # final_linear_video
    flops += linear(c * d * (n_img + n_ref), input_grad=False)  # video_embedder
    flops += linear(config.refiner_depth * refiner_macs(config) * n_text, outside)
    flops += attention(sum(n * n for n in text_lens), config.refiner_depth, outside)
    flops += linear(config.text_dim * d * n_text, outside, input_grad=False)  # text_embedder.proj
    flops += linear(samples * config.time_freq_dim * d, outside, input_grad=False)  # time_embedding.0
    flops += linear(samples * 9 * d * d, outside)  # time_embedding.2, the two modulations
    return flops
