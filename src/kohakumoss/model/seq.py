"""PackedSeq: where each sample's text and image tokens sit on the one flat token axis.

Per sample the layout is [text tokens, image tokens]. Inputs arrive as two packed tensors (all text
tokens, all image tokens, each sample's run contiguous and in sample order); `text_index` / `img_index`
say where each lands on the joint axis. Positions are (text index, row, column) per token:
text token j -> (j, 0, 0); image token (r, c) -> (text_len, r, c).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from kohakumoss_kernels.host_values import host_values, register_host_values


@dataclass(frozen=True)
class PackedSeq:
    text_lens: tuple[int, ...]
    img_sizes: tuple[tuple[int, int], ...]  # (rows, cols) of each sample's token grid
    cu_seqlens: torch.Tensor  # [B + 1] int32, joint axis
    token_sample: torch.Tensor  # [T] long, sample id of each joint token
    img_token_sample: torch.Tensor  # [T_img] long
    text_index: torch.Tensor  # [T_text] long, joint positions of the text tokens
    img_index: torch.Tensor  # [T_img] long, joint positions of the image tokens
    positions: torch.Tensor  # [T, 3] long, (text index, row, column)
    joint_gather: torch.Tensor  # [T] long: cat(text_tokens, img_tokens)[joint_gather] is the joint axis
    max_seqlen: int

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
        moved = {
            f.name: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
            for f in fields(self)
            for v in [getattr(self, f.name)]
        }
        register_host_values(moved["cu_seqlens"], host_values(self.cu_seqlens))
        return PackedSeq(**moved)

    @classmethod
    def build(
        cls,
        text_lens: Sequence[int],
        img_sizes: Sequence[tuple[int, int]],
        device: torch.device | str = "cpu",
    ) -> PackedSeq:
        """Describe a batch from per-sample text lengths and image token grids (rows, cols)."""
        text_lens = tuple(int(t) for t in text_lens)
        img_sizes = tuple((int(h), int(w)) for h, w in img_sizes)
        if len(text_lens) != len(img_sizes) or not text_lens:
            raise ValueError(f"need one text length per image: {len(text_lens)} vs {len(img_sizes)}")
        if any(t < 1 for t in text_lens) or any(h < 1 or w < 1 for h, w in img_sizes):
            raise ValueError(
                f"every sample needs >= 1 text token and >= 1 image token: {text_lens}, {img_sizes}"
            )
        text_index, img_index, sample, pos = [], [], [], []
        cu = [0]
        for b, (n_text, (rows, cols)) in enumerate(zip(text_lens, img_sizes)):
            start = cu[-1]
            n_img = rows * cols
            text_index.append(torch.arange(start, start + n_text))
            img_index.append(torch.arange(start + n_text, start + n_text + n_img))
            sample.append(torch.full((n_text + n_img,), b))
            text_pos = torch.zeros(n_text, 3, dtype=torch.long)
            text_pos[:, 0] = torch.arange(n_text)
            r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
            img_pos = torch.stack([torch.full((n_img,), n_text), r.flatten(), c.flatten()], dim=1)
            pos += [text_pos, img_pos]
            cu.append(start + n_text + n_img)
        token_sample = torch.cat(sample).long()
        img_index_t = torch.cat(img_index).long()
        text_index_t = torch.cat(text_index).long()
        return cls(
            text_lens=text_lens,
            img_sizes=img_sizes,
            cu_seqlens=register_host_values(torch.tensor(cu, dtype=torch.int32), cu),
            token_sample=token_sample,
            img_token_sample=token_sample[img_index_t],
            text_index=text_index_t,
            img_index=img_index_t,
            positions=torch.cat(pos).long(),
            joint_gather=torch.argsort(torch.cat([text_index_t, img_index_t])),
            max_seqlen=max(b - a for a, b in zip(cu[:-1], cu[1:])),
        ).to(device)
