"""PackedSeq: where each sample's image and text tokens sit on the one flat token axis.

Per sample the layout is [image tokens, text tokens], as the released model orders them. Inputs arrive as
two packed tensors (all image tokens, all text tokens, each sample's run contiguous and in sample order);
`img_index` / `text_index` say where each lands on the joint axis. Rotary positions (r, t, h, w) per token:
image token (row, col) -> (0, text_len, row - (rows - 1) / 2, col - (cols - 1) / 2); text token j -> (0, j, 0, 0).
The text refiner attends within each sample's text alone: `text_cu_seqlens` over the packed text tokens.

`build(..., pad_to=Q)` adds pad tokens: text-only tokens in segments of their own, so they touch no real
token, and carry no loss. With them and the length bounds rounded, batches whose captions differ in
length have the same tensor shapes, so one CUDA graph serves them (`train/graphs.py`); `text_lens`,
`img_sizes` and the token counts stay the real ones. Where the images are of one size (one bucket), each
sample gets a slot of the same `stride` tokens, [image, text, pad], its text rounded up to a multiple
of Q / B: every image then starts at a fixed offset, so attention can run the image keys as one dense
call (`kohakumoss_kernels/ops/varlen_attention/sdpa_slots.py`); cu_seqlens alternates each sample's
segment and its pad's. Otherwise one pad segment at the end rounds the text tokens to a multiple of Q.
The pad tokens' rows of the packed text come last, after every sample's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from kohakumoss_kernels.host_values import host_values, register_host_values, register_slots


def sample_positions(n_text: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(image positions [rows*cols, 4], text positions [n_text, 4]) float32, image tokens row-major."""
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    img = torch.stack(
        [torch.zeros(rows * cols), torch.full((rows * cols,), float(n_text)), r.flatten(), c.flatten()], 1
    ).float()
    img[:, 2] -= (rows - 1) / 2
    img[:, 3] -= (cols - 1) / 2
    text = torch.zeros(n_text, 4)
    text[:, 1] = torch.arange(n_text)
    return img, text


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple if multiple > 0 else n


def _cu(lens: Sequence[int]) -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return register_host_values(torch.tensor(cu, dtype=torch.int32), cu)


@dataclass(frozen=True)
class PackedSeq:
    text_lens: tuple[int, ...]
    img_sizes: tuple[tuple[int, int], ...]  # (rows, cols) of each sample's token grid
    cu_seqlens: torch.Tensor  # [B + 1] int32, joint axis
    text_cu_seqlens: torch.Tensor  # [B + 1] int32, over the packed text tokens (the refiner's attention)
    token_sample: torch.Tensor  # [T] long, sample id of each joint token
    img_token_sample: torch.Tensor  # [T_img] long
    text_index: torch.Tensor  # [T_text] long, joint positions of the text tokens
    img_index: torch.Tensor  # [T_img] long, joint positions of the image tokens
    positions: torch.Tensor  # [T, 4] float32, (r, t, h, w)
    joint_gather: torch.Tensor  # [T] long: cat(img_tokens, text_tokens)[joint_gather] is the joint axis
    max_seqlen: int
    text_max_seqlen: int
    text_pad: int = 0  # pad tokens in all (segments of their own on both axes; their text rows come last)
    slots: tuple[int, int] | None = None  # (stride, prefix): samples in equal slots, image first

    @property
    def num_samples(self) -> int:
        return len(self.text_lens)

    @property
    def img_lens(self) -> tuple[int, ...]:
        return tuple(h * w for h, w in self.img_sizes)

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(t + i for t, i in zip(self.text_lens, self.img_lens))

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def device(self) -> torch.device:
        return self.cu_seqlens.device

    def to(self, device: torch.device | str) -> PackedSeq:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> PackedSeq:
        """A host copy in page-locked memory, so `.to(cuda)` is an asynchronous copy."""
        return self._map(torch.Tensor.pin_memory)

    def _map(self, fn) -> PackedSeq:
        moved = {
            f.name: (fn(v) if isinstance(v, torch.Tensor) else v)
            for f in fields(self)
            for v in [getattr(self, f.name)]
        }
        for name in ("cu_seqlens", "text_cu_seqlens"):
            register_host_values(moved[name], host_values(getattr(self, name)))
        if self.slots is not None:
            register_slots(moved["cu_seqlens"], *self.slots)
        return PackedSeq(**moved)

    def tensors(self) -> list[torch.Tensor]:
        return [v for f in fields(self) for v in [getattr(self, f.name)] if isinstance(v, torch.Tensor)]

    @classmethod
    def build(
        cls,
        text_lens: Sequence[int],
        img_sizes: Sequence[tuple[int, int]],
        device: torch.device | str = "cpu",
        pad_to: int = 0,
    ) -> PackedSeq:
        """Describe a batch from per-sample text lengths and image token grids (rows, cols).
        pad_to > 0: pad tokens make the shapes repeat (filling each slot, or one segment of at least one
        making the text tokens a multiple of pad_to), and the length bounds are rounded to multiples of it."""
        text_lens = tuple(int(t) for t in text_lens)
        img_sizes = tuple((int(h), int(w)) for h, w in img_sizes)
        if len(text_lens) != len(img_sizes) or not text_lens:
            raise ValueError(f"need one text length per image: {len(text_lens)} vs {len(img_sizes)}")
        if any(t < 1 for t in text_lens) or any(h < 1 or w < 1 for h, w in img_sizes):
            raise ValueError(
                f"every sample needs >= 1 text token and >= 1 image token: {text_lens}, {img_sizes}"
            )
        img_lens = [h * w for h, w in img_sizes]
        B = len(text_lens)
        slotted = pad_to > 0 and len(set(img_lens)) == 1
        # slotted: each sample's pad fills its slot; else one pad segment rounds the text tokens up
        slot_text = _round_up(max(text_lens), max(1, pad_to // B))  # a pad segment may be empty
        pads = [slot_text - t for t in text_lens] if slotted else [0] * B
        tail = _round_up(sum(text_lens) + 1, pad_to) - sum(text_lens) if pad_to > 0 and not slotted else 0
        text_index, img_index, sample, img_pos, text_pos = [], [], [], [], []
        pad_index = []
        segments: list[int] = []
        start = 0
        for b, (n_text, (rows, cols), pad) in enumerate(zip(text_lens, img_sizes, pads)):
            n_img = rows * cols
            img_index.append(torch.arange(start, start + n_img))
            text_index.append(torch.arange(start + n_img, start + n_img + n_text))
            sample.append(torch.full((n_img + n_text + pad,), b))  # joint order: the slot's pad too
            pi, pt = sample_positions(n_text, rows, cols)
            img_pos.append(pi)
            text_pos.append(pt)
            start += n_img + n_text
            segments.append(n_img + n_text)
            if slotted:
                pad_index.append(torch.arange(start, start + pad))
                start += pad
                segments.append(pad)
        if tail:  # its own segment at the end; sample 0's modulation (any would do: nothing reads them)
            pad_index.append(torch.arange(start, start + tail))
            sample.append(torch.zeros(tail, dtype=torch.long))
            segments.append(tail)
        text_pad = sum(pads) + tail
        text_segments = [*text_lens, *(pads if slotted else [tail] if tail else [])]
        text_index.extend(pad_index)
        text_pos.append(torch.zeros(text_pad, 4))
        img_index_t = torch.cat(img_index).long()
        text_index_t = torch.cat(text_index).long()
        joint_gather = torch.argsort(torch.cat([img_index_t, text_index_t]))
        token_sample = torch.cat(sample).long()
        positions = torch.cat([torch.cat(img_pos), torch.cat(text_pos)])[joint_gather]
        stride = img_lens[0] + slot_text
        cu_seqlens = _cu(segments)
        if slotted:
            register_slots(cu_seqlens, stride, img_lens[0])
        return cls(
            text_lens=text_lens,
            img_sizes=img_sizes,
            cu_seqlens=cu_seqlens,
            text_cu_seqlens=_cu(text_segments),
            token_sample=token_sample,
            img_token_sample=token_sample[img_index_t],
            text_index=text_index_t,
            img_index=img_index_t,
            positions=positions,
            joint_gather=joint_gather,
            max_seqlen=stride if slotted else _round_up(max(segments), pad_to),
            text_max_seqlen=_round_up(max(text_segments), pad_to),
            text_pad=text_pad,
            slots=(stride, img_lens[0]) if slotted else None,
        ).to(device)
