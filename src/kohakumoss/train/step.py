"""One micro-step: a HostBatch onto the device as a packed batch, sigmas and noise, the loss.

Sigmas and noise come from generators seeded by (SEED, micro-step), so a resumed run draws exactly
what an uninterrupted one would, with no generator state to carry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kohakumoss.diffusion import TimestepConfig, draw_sigmas, flow_matching_loss, make_flow_target
from kohakumoss.diffusion.objective import LossConfig
from kohakumoss.encoders.latents import patchify
from kohakumoss.model import PackedSeq
from kohakumoss_common.errors import DataError


@dataclass
class DeviceBatch:
    x0: torch.Tensor  # [T_img, 128] clean latent tokens
    text: torch.Tensor  # [T_text, text_dim]
    seq: PackedSeq
    weight: torch.Tensor | None = None  # [T_img] float32 loss weight per image token (masks, reg weights)
    refs: torch.Tensor | None = None  # [T_ref, 128] clean reference latent tokens (edit training)

    @property
    def num_samples(self) -> int:
        return self.seq.num_samples

    @property
    def tokens(self) -> int:
        """Every token of the batch's sequences: image, text and reference tokens (not the text pad)."""
        return self.seq.total_tokens

    @property
    def reference_tokens(self) -> int:
        return self.seq.ref_tokens


@dataclass
class HostReady:
    """A host batch packed for the model: the host half of a step's input, page-locked when `pin`."""

    x0: torch.Tensor  # [T_img, 128] in the compute dtype
    text: torch.Tensor  # [T_text, text_dim] in the compute dtype
    seq: PackedSeq  # on the host
    weight: torch.Tensor | None = None  # [T_img] float32 (HostBatch.token_weights), None: all 1
    refs: torch.Tensor | None = None  # [T_ref, 128] reference latent tokens in the compute dtype


def reference_tokens(
    batch, dtype: torch.dtype
) -> tuple[torch.Tensor | None, list[list[tuple[int, int]]] | None]:
    """The batch's reference latents (`references`: per sample a list of [32, h, w]) patchified and
    packed (sample-major, references in order) with their token grids; (None, None) without any."""
    per_sample = getattr(batch, "references", None)
    if per_sample is None or not any(len(refs) for refs in per_sample):
        return None, None
    if len(per_sample) != len(batch.latents):
        raise DataError(
            f"step {batch.step}: {len(per_sample)} reference lists for {len(batch.latents)} images"
        )
    tokens = [patchify(r.float()) for refs in per_sample for r in refs]
    grids = [[(r.shape[-2] // 2, r.shape[-1] // 2) for r in refs] for refs in per_sample]
    return torch.cat(tokens).to(dtype), grids


def host_ready(batch, dtype: torch.dtype, pin: bool = False, pad_to: int = 0) -> HostReady:
    """HostBatch (latents [32, h, w] per image, packed text) -> packed host tensors (patchify, cast, pin).
    pad_to > 0: the text tokens padded to a multiple of it (`PackedSeq.build`), so shapes repeat."""
    if batch.latents is None or batch.text_hidden is None:
        raise DataError(
            f"step {batch.step}: the batch has no latents or no text embeddings (no encoder and no cache)"
        )
    x0 = torch.cat([patchify(lat.float()) for lat in batch.latents]).to(dtype)
    text = batch.text_hidden.to(dtype)
    grids = [(lat.shape[-2] // 2, lat.shape[-1] // 2) for lat in batch.latents]
    refs, ref_grids = reference_tokens(batch, dtype)
    seq = PackedSeq.build(batch.text_lengths.tolist(), grids, pad_to=pad_to, ref_sizes=ref_grids)
    if seq.text_pad:
        text = torch.cat([text, text.new_zeros(seq.text_pad, text.shape[1])])
    weight = batch.token_weights() if hasattr(batch, "token_weights") else None
    if pin:
        x0, text, seq = x0.pin_memory(), text.pin_memory(), seq.pin_memory()
        weight = weight.pin_memory() if weight is not None else None
        refs = refs.pin_memory() if refs is not None else None
    return HostReady(x0, text, seq, weight, refs)


def ready_to_device(ready: HostReady, device: torch.device) -> DeviceBatch:
    """Queue the copies (asynchronous from page-locked memory)."""
    return DeviceBatch(
        ready.x0.to(device, non_blocking=True),
        ready.text.to(device, non_blocking=True),
        ready.seq.to(device),
        ready.weight.to(device, non_blocking=True) if ready.weight is not None else None,
        ready.refs.to(device, non_blocking=True) if ready.refs is not None else None,
    )


def to_device_batch(batch, device: torch.device, dtype: torch.dtype) -> DeviceBatch:
    """HostBatch -> packed device tensors, in the calling thread (the training loop uses `Prefetcher`)."""
    return ready_to_device(host_ready(batch, dtype), device)


_DEVICE_GENERATORS: dict[torch.device, torch.Generator] = {}


def step_generator(
    seed: int, micro_step: int, stream: int, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A generator for one micro-step and stream (0: sigma, 1: noise), seeded from (seed, micro-step) alone.
    An accelerator's generator is made once per device and re-seeded (making one took ~3 ms of host time
    per micro-step on the H200, with the GPU idle); use it before asking for the next."""
    device = torch.device(device)
    if device.type == "cpu":
        gen = torch.Generator()
    else:
        gen = _DEVICE_GENERATORS.get(device)
        if gen is None:
            gen = _DEVICE_GENERATORS[device] = torch.Generator(device=device)
    return gen.manual_seed((int(seed) * 1_000_003 + micro_step * 2 + stream) % (2**63))


def draw_step_noise(seed: int, micro_step: int, x0: torch.Tensor, seq: PackedSeq, tcfg: TimestepConfig):
    """Sigmas (drawn on the host: B numbers) and noise (drawn where x0 lives: a 1 MP step's noise took
    ~6 ms on the host plus a copy, time the GPU sat idle between steps). Same (seed, micro-step), same
    draws on the same kind of device."""
    image_tokens = torch.tensor(seq.img_lens)
    sigma = draw_sigmas(tcfg, image_tokens, step_generator(seed, micro_step, 0))
    gen = step_generator(seed, micro_step, 1, x0.device)
    noise = torch.randn(x0.shape, generator=gen, dtype=torch.float32, device=x0.device)
    return sigma.to(x0.device, non_blocking=True), noise.to(x0.dtype)


def flow_loss(
    model,
    batch: DeviceBatch,
    sigma: torch.Tensor,
    noise: torch.Tensor,
    dtype: torch.dtype,
    weighting: str = LossConfig.weighting,
    reduction: str = LossConfig.reduction,
    **loss_options,
) -> torch.Tensor:
    """Forward the backbone on the noised batch (autocast to `dtype`) and return the flow-matching loss
    (`loss_options`: flow_matching_loss's loss_type, huber_c, min_snr_gamma). Reference tokens (edit
    training) go in clean and give no output, so the loss covers the target tokens alone."""
    target = make_flow_target(batch.x0, sigma, batch.seq.img_token_sample, noise)
    device_type = batch.x0.device.type
    refs = {} if batch.refs is None else {"refs": batch.refs}  # text-to-image calls the model as before
    with torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32):
        pred = model(target.x_t, batch.text, sigma, batch.seq, **refs)
    return flow_matching_loss(
        pred,
        target.target,
        sigma,
        batch.seq.img_token_sample,
        weighting,
        reduction,
        weight=batch.weight,
        **loss_options,
    )
