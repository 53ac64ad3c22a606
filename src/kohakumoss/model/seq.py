"""PackedSeq: where each sample's image and text tokens sit on the one flat token axis.

Per sample the layout is [image tokens, text tokens], as the released model orders them. Inputs arrive as
two packed tensors (all image tokens, all text tokens, each sample's run contiguous and in sample order);
`img_index` / `text_index` say where each lands on the joint axis. Rotary positions (r, t, h, w) per token:
image token (row, col) -> (0, text_len, row - (rows - 1) / 2, col - (cols - 1) / 2); text token j -> (0, j, 0, 0).
The text refiner attends within each sample's text alone: `text_cu_seqlens` over the packed text tokens.

`build(..., pad_to=Q)` rounds the text tokens up to a multiple of Q with a trailing pad segment: text-only
tokens that attend among themselves, so they touch no real token, and carry no loss. With it and the
length bounds rounded too, batches whose captions differ in length have the same tensor shapes, so one
CUDA graph serves them (`train/graphs.py`); `text_lens`, `img_sizes` and the token counts stay the real ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from kohakumoss_kernels.host_values import host_values, register_host_values


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
    text_pad: int = 0  # pad tokens after the last sample's (a segment of their own on both axes)

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
        pad_to > 0: a pad segment makes the text tokens a multiple of it (empty when they already are:
        the segment is always there, so the shapes are the same), and
        the length bounds are rounded up to multiples of it."""
        text_lens = tuple(int(t) for t in text_lens)
        img_sizes = tuple((int(h), int(w)) for h, w in img_sizes)
        if len(text_lens) != len(img_sizes) or not text_lens:
            raise ValueError(f"need one text length per image: {len(text_lens)} vs {len(img_sizes)}")
        if any(t < 1 for t in text_lens) or any(h < 1 or w < 1 for h, w in img_sizes):
            raise ValueError(
                f"every sample needs >= 1 text token and >= 1 image token: {text_lens}, {img_sizes}"
            )
        text_index, img_index, sample, img_pos, text_pos = [], [], [], [], []
        start = 0
        for b, (n_text, (rows, cols)) in enumerate(zip(text_lens, img_sizes)):
            n_img = rows * cols
            img_index.append(torch.arange(start, start + n_img))
            text_index.append(torch.arange(start + n_img, start + n_img + n_text))
            sample.append(torch.full((n_img + n_text,), b))
            pi, pt = sample_positions(n_text, rows, cols)
            img_pos.append(pi)
            text_pos.append(pt)
            start += n_img + n_text
        seq_lens = [t + h * w for t, (h, w) in zip(text_lens, img_sizes)]
        segments, text_segments = list(seq_lens), list(text_lens)
        pad = _round_up(sum(text_lens), pad_to) - sum(text_lens) if pad_to > 0 else 0
        if pad_to > 0:  # its own segment at the end; sample 0's modulation (any would do: nothing reads them)
            text_index.append(torch.arange(start, start + pad))
            sample.append(torch.zeros(pad, dtype=torch.long))
            text_pos.append(torch.zeros(pad, 4))
            segments.append(pad)
            text_segments.append(pad)
        token_sample = torch.cat(sample).long()
        img_index_t = torch.cat(img_index).long()
        text_index_t = torch.cat(text_index).long()
        joint_gather = torch.argsort(torch.cat([img_index_t, text_index_t]))
        positions = torch.cat([torch.cat(img_pos), torch.cat(text_pos)])[joint_gather]
        return cls(
            text_lens=text_lens,
            img_sizes=img_sizes,
            cu_seqlens=_cu(segments),
            text_cu_seqlens=_cu(text_segments),
            token_sample=token_sample,
            img_token_sample=token_sample[img_index_t],
            text_index=text_index_t,
            img_index=img_index_t,
            positions=positions,
            joint_gather=joint_gather,
            max_seqlen=_round_up(max(segments), pad_to),
            text_max_seqlen=_round_up(max(text_segments), pad_to),
            text_pad=pad,
        ).to(device)
