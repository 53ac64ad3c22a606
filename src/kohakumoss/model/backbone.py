"""MossBackbone(img, text, sigma, seq) -> v: the MOSS-Image DiT over one packed token axis.

img [T_img, in_channels] patchified latent tokens, text [T_text, text_dim] text encoder hidden states,
sigma [B] noise levels, seq the PackedSeq layout. Returns the predicted velocity per image token.
Module and parameter names are the released checkpoint's (HF `transformer/`), so the native layout is
the HF one. No data loading, loss or sampler in here; attention stays within each sample; no padding.

    time  = time_embedding(sinusoid(sigma * 1000))                  Linear, SiLU, Linear (no SiLU after)
    mod   = shared_block_modulation(time)                           one [B, 6d] for all blocks
    text  = text_embedder(text)                                     projection + 2 unmodulated refiner blocks
    x     = [video_embedder(img), text] per sample                  image tokens first
    x     = layers[i](x, mod) for every block (skip_layers left out: skip-layer guidance; with keep_lead
            the leading samples still run them)
    shift, scale = video_head_modulation(time)
    v     = final_linear_video(final_norm_video(x_img) * (1 + scale) + shift)

With reference images (`refs`, edit training; ../shared/spec/moss-image-edit-facts.md 1.3) the joint axis is
[target | text | references] per sample: the references through video_embedder too, modulated at t = 0
(row B of `mod`, appended here), their queries attending to references alone (PackedSeq), no output.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import torch
from torch import nn

from kohakumoss_kernels import OpSet

from .blocks import MossBlock, TextEmbedder, fold_norm_weight
from .config import MossConfig
from .embed import TimestepEmbedding
from .rope import RotaryBands, rope_cos_sin
from .seq import PackedSeq


def linear_rows(name: str, image_tokens: int, text_tokens: int, samples: int, ref_tokens: int = 0) -> int:
    """Rows the linear `name` multiplies in one forward (the diagram above): the blocks see every token,
    the refiner the text, the embedder the image and reference tokens, the head the image tokens, the
    time path one row per sample."""
    if name.startswith("layers."):
        return image_tokens + text_tokens + ref_tokens
    if name.startswith("text_embedder."):
        return text_tokens
    if name == "video_embedder":
        return image_tokens + ref_tokens
    if name == "final_linear_video":
        return image_tokens
    if name.startswith("time_embedding.") or name.endswith("_modulation"):
        return samples
    raise ValueError(f"'{name}' is no linear of MossBackbone")


class MossBackbone(nn.Module):
    def __init__(self, config: MossConfig, ops: OpSet | None = None):
        super().__init__()
        self.config = config
        self.ops = ops if ops is not None else OpSet("auto")
        d = config.dim
        self.video_embedder = nn.Linear(config.in_channels, d)
        self.text_embedder = TextEmbedder(config)
        self.time_embedding = TimestepEmbedding(config.time_freq_dim, d, config.time_scale)
        self.shared_block_modulation = nn.Linear(d, 6 * d)
        self.layers = nn.ModuleList(MossBlock(config) for _ in range(config.depth))
        self.final_norm_video = nn.RMSNorm(d, eps=config.norm_eps)
        self.video_head_modulation = nn.Linear(d, 2 * d)  # [shift, scale]
        self.final_linear_video = nn.Linear(d, config.in_channels, bias=False)
        self.rope = RotaryBands(config.head_dim, config.rope_theta)
        # how each block is called; memory engines (checkpointing, streaming) replace this wrapper
        self.block_runner: Callable[..., torch.Tensor] | None = None
        # the residual streams' dtype (None: the embedders' output dtype); float32 keeps fp16 runs finite
        # where the stream outgrows fp16's range (kohakumoss.precision.fp16): the ops add in float32 and
        # store in the stream's dtype, the linears read their normed inputs in the autocast dtype
        self.residual_dtype: torch.dtype | None = None

    def modulations(self, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(block modulation [6, B, d], head modulation [2, B, d]) from sigma [B]; contiguous per chunk."""
        time = self.time_embedding(sigma)
        mod = self.shared_block_modulation(time.to(self.shared_block_modulation.weight.dtype))
        head = self.video_head_modulation(time.to(self.video_head_modulation.weight.dtype))
        B = sigma.shape[0]
        return mod.view(B, 6, -1).transpose(0, 1).contiguous(), head.view(B, 2, -1).transpose(
            0, 1
        ).contiguous()

    def embed(
        self,
        img: torch.Tensor,
        text: torch.Tensor,
        seq: PackedSeq,
        rope: tuple[torch.Tensor, torch.Tensor],
        refs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The streams embedded (the text through its refiner, the references through the image
        embedder) and laid out on the joint axis."""
        text_rope = (rope[0][seq.text_index], rope[1][seq.text_index])
        txt = self.text_embedder(text, seq, text_rope, self.ops, self.residual_dtype)
        if refs is None:
            vid = self.video_embedder(img.to(self.video_embedder.weight.dtype))
            dtype = self.residual_dtype or vid.dtype
            return torch.cat([vid.to(dtype), txt.to(dtype)], dim=0)[seq.joint_gather]
        both = self.video_embedder(torch.cat([img, refs.to(img.dtype)]).to(self.video_embedder.weight.dtype))
        dtype = self.residual_dtype or both.dtype
        vid, ref = both.split([img.shape[0], refs.shape[0]])
        return torch.cat([vid.to(dtype), txt.to(dtype), ref.to(dtype)], dim=0)[seq.joint_gather]

    def forward(
        self,
        img: torch.Tensor,
        text: torch.Tensor,
        sigma: torch.Tensor,
        seq: PackedSeq,
        skip_layers: Collection[int] = (),
        keep_lead: PackedSeq | None = None,
        refs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """keep_lead: the layout of the batch's leading samples, which then run every block (skip_layers
        leave the blocks out of the other samples only): the sampler's conditional branch packed before
        its skip-layer-guided unconditional one, one forward for both.
        refs: [T_ref, in_channels] the reference images' clean latent tokens, packed as `seq.ref_sizes`
        says (`pack_references`); required exactly when seq has references."""
        cfg, ops = self.config, self.ops
        check_references(seq, refs)
        if seq.has_references:  # row B of the modulation table: t = 0, the references'
            mod, head = self.modulations(torch.cat([sigma, sigma.new_zeros(1)]))
            head = head[:, : sigma.shape[0]]
        else:
            mod, head = self.modulations(sigma)
        rope = rope_cos_sin(seq.positions, cfg.head_dim, cfg.rope_theta)
        x = self.embed(img, text, seq, rope, refs)
        run = self.block_runner
        lead = _lead_inputs(keep_lead, seq, mod, rope) if keep_lead is not None and skip_layers else None

        def call(block, x, mod, seq, rope):
            return run(block, x, mod, seq, rope) if run is not None else block(x, mod, seq, rope, ops)

        for i, block in enumerate(self.layers):
            if i not in skip_layers:
                x = call(block, x, mod, seq, rope)
            elif lead is not None:  # the block on the leading samples' tokens alone
                n, lead_mod, lead_rope = lead
                x = torch.cat([call(block, x[:n], lead_mod, keep_lead, lead_rope), x[n:]])
        shift, scale = head.unbind(0)
        scale = fold_norm_weight(self.final_norm_video.weight, scale)
        y = ops.norm_modulate(x[seq.img_index], shift, scale, seq.img_token_sample, cfg.norm_eps)
        return self.final_linear_video(y)

    def init_weights(
        self, std: float = 0.02, generator: torch.Generator | None = None, via: torch.device | None = None
    ) -> MossBackbone:
        """Random weights (normal linears, norm weights 1 + normal): for tests and the random-weight benchmarks.
        Each parameter is drawn whole in float32 and stored in its own dtype (as distributed builds
        replay it: `distributed.materialize.fill_random`).

        via: draw the values on this device and copy them in (a GPU fills a host-built 5B model in
        seconds instead of minutes); `generator` must then live on `via`.
        """
        for name, p in self.named_parameters():
            if p.device.type == "meta":
                continue
            with torch.no_grad():
                drawn = torch.empty(p.shape, dtype=torch.float32, device=via or p.device)
                drawn.normal_(0.0, std, generator=generator)
                if p.ndim == 1 and not name.endswith("bias"):  # norm weights around 1
                    drawn.add_(1.0)
                p.copy_(drawn)
        return self


def check_references(seq: PackedSeq, refs: torch.Tensor | None) -> None:
    """refs must be given exactly when the layout has references, with one row per reference token."""
    if refs is None and seq.has_references:
        raise ValueError(f"the layout has {seq.ref_tokens} reference tokens but no refs were given")
    if refs is not None and refs.shape[0] != seq.ref_tokens:
        raise ValueError(f"refs has {refs.shape[0]} tokens, the layout {seq.ref_tokens} (ref_sizes)")


def pack_references(
    reference_latents: Sequence[Sequence[torch.Tensor]],
) -> tuple[torch.Tensor | None, list[list[tuple[int, int]]]]:
    """Per sample a list of [in_channels, rows, cols] token grids (patchified latents) -> the packed
    reference tokens [T_ref, in_channels] (sample-major, references in order, each row-major) and
    their grids, the `ref_sizes` of `PackedSeq.build`. None when no sample has a reference."""
    sizes = [[(int(r.shape[-2]), int(r.shape[-1])) for r in refs] for refs in reference_latents]
    tokens = [r.flatten(1).t() for refs in reference_latents for r in refs]
    return (torch.cat(tokens) if tokens else None), sizes


def _lead_inputs(lead: PackedSeq, seq: PackedSeq, mod: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
    """(tokens, modulation [6, b (+1), d], rope) of the first `lead.num_samples` samples of `seq`
    (with references, the t = 0 row after theirs, where the lead's reference tokens read it)."""
    b, n = lead.num_samples, lead.total_tokens
    lead_refs = lead.ref_sizes or ((),) * b
    seq_refs = seq.ref_sizes[:b] if seq.ref_sizes else ((),) * b
    if (
        lead.text_lens != seq.text_lens[:b]
        or lead.img_sizes != seq.img_sizes[:b]
        or lead_refs != seq_refs
        or b >= seq.num_samples
    ):
        raise ValueError(
            f"keep_lead {lead.text_lens}/{lead.img_sizes}/{lead.ref_sizes} is not a proper prefix of the batch "
            f"{seq.text_lens}/{seq.img_sizes}/{seq.ref_sizes}"
        )
    lead_mod = torch.cat([mod[:, :b], mod[:, -1:]], 1) if lead.has_references else mod[:, :b].contiguous()
    return n, lead_mod, (rope[0][:n], rope[1][:n])
