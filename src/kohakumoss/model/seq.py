"""PackedSeq: where each sample's image and text tokens sit on the one flat token axis.

Per sample the layout is [image tokens, text tokens], as the released model orders them. Inputs arrive as
two packed tensors (all image tokens, all text tokens, each sample's run contiguous and in sample order);
`img_index` / `text_index` say where each lands on the joint axis. Rotary positions (r, t, h, w) per token:
image token (row, col) -> (0, text_len, row - (rows - 1) / 2, col - (cols - 1) / 2); text token j -> (0, j, 0, 0).
The text refiner attends within each sample's text alone: `text_cu_seqlens` over the packed text tokens.

Reference images (edit training, `ref_sizes`): per sample [target | text | references], as SimpleTuner's
MOSS edit flavours lay it out (../shared/spec/moss-image-edit-facts.md 1.3). Reference tokens arrive as a
third packed tensor (sample-major, references in order, each row-major; `ref_index` places them); token
(row, col) of reference m (1-based) sits at (m, text_len, row - (rows - 1) / 2, col - (cols - 1) / 2).
Their modulation is the t = 0 one: `token_sample` is each token's row of the modulation table, the
sample's, or B (the row MossBackbone appends for t = 0) for a reference token. Attention: target and text
queries see the whole sample, reference queries only its references. That is one varlen attention whose
key segments differ from its query segments (`ops.segment_attention`): queries [live_b | refs_b] per
sample on the joint axis (`cu_seqlens_q`), keys and values gathered (`kv_index`) to [sample_b | refs_b]
(`cu_seqlens_kv`). Without references every reference field is empty or None and nothing changes.

`build(..., pad_to=Q)` rounds the text tokens up to a multiple of Q with a trailing pad segment: text-only
tokens that attend among themselves, so they touch no real token, and carry no loss. With it and the
length bounds rounded too, batches whose captions differ in length have the same tensor shapes, so one
CUDA graph serves them (`train/graphs.py`); `text_lens`, `img_sizes` and the token counts stay the real ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from kohakumoss_kernels.runtime.host_values import host_values, register_host_values


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


def reference_positions(n_text: int, ref_sizes: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[sum(rows*cols), 4] float32: reference m (1-based) at (m, n_text, centred row, centred col)."""
    parts = []
    for m, (rows, cols) in enumerate(ref_sizes, start=1):
        pos, _ = sample_positions(n_text, rows, cols)
        pos[:, 0] = float(m)
        parts.append(pos)
    return torch.cat(parts) if parts else torch.zeros(0, 4)


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
    # reference images (None / empty without them): see the module docstring
    ref_sizes: tuple[tuple[tuple[int, int], ...], ...] = ()  # per sample, (rows, cols) of each reference
    ref_index: torch.Tensor | None = None  # [T_ref] long, joint positions of the reference tokens
    kv_index: torch.Tensor | None = None  # [T + T_ref] long, joint rows of the attention's keys / values
    cu_seqlens_q: torch.Tensor | None = None  # [2B + 2] int32: [live_b, refs_b] per sample, then the pad
    cu_seqlens_kv: torch.Tensor | None = None  # [2B + 2] int32: [sample_b, refs_b] per sample, then the pad

    @property
    def num_samples(self) -> int:
        return len(self.text_lens)

    @property
    def img_lens(self) -> tuple[int, ...]:
        return tuple(h * w for h, w in self.img_sizes)

    @property
    def has_references(self) -> bool:
        return self.ref_index is not None

    @property
    def ref_lens(self) -> tuple[int, ...]:
        """Reference tokens per sample (0 without references)."""
        if not self.ref_sizes:
            return (0,) * self.num_samples
        return tuple(sum(h * w for h, w in refs) for refs in self.ref_sizes)

    @property
    def ref_tokens(self) -> int:
        return sum(self.ref_lens)

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(t + i + r for t, i, r in zip(self.text_lens, self.img_lens, self.ref_lens))

    @property
    def attention_segments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(kv_index, cu_seqlens_q, cu_seqlens_kv) of the reference attention, None without references."""
        if self.ref_index is None:
            return None
        return self.kv_index, self.cu_seqlens_q, self.cu_seqlens_kv

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
        for name in ("cu_seqlens", "text_cu_seqlens", "cu_seqlens_q", "cu_seqlens_kv"):
            if moved[name] is not None:
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
        ref_sizes: Sequence[Sequence[tuple[int, int]]] | None = None,
    ) -> PackedSeq:
        """Describe a batch from per-sample text lengths and image token grids (rows, cols).
        pad_to > 0: a pad segment makes the text tokens a multiple of it (empty when they already are:
        the segment is always there, so the shapes are the same), and
        the length bounds are rounded up to multiples of it.
        ref_sizes: per sample, the token grids of its reference images (edit training); None, or no
        reference anywhere: the text-to-image layout."""
        text_lens = tuple(int(t) for t in text_lens)
        img_sizes = tuple((int(h), int(w)) for h, w in img_sizes)
        if len(text_lens) != len(img_sizes) or not text_lens:
            raise ValueError(f"need one text length per image: {len(text_lens)} vs {len(img_sizes)}")
        if any(t < 1 for t in text_lens) or any(h < 1 or w < 1 for h, w in img_sizes):
            raise ValueError(
                f"every sample needs >= 1 text token and >= 1 image token: {text_lens}, {img_sizes}"
            )
        refs = (
            tuple(tuple((int(h), int(w)) for h, w in r) for r in ref_sizes) if ref_sizes is not None else ()
        )
        if refs and len(refs) != len(text_lens):
            raise ValueError(f"need one reference list per sample: {len(refs)} vs {len(text_lens)}")
        if any(h < 1 or w < 1 for r in refs for h, w in r):
            raise ValueError(f"every reference needs >= 1 token: {refs}")
        if not any(refs):
            refs = ()
        B = len(text_lens)
        text_index, img_index, ref_index, sample, img_pos, text_pos, ref_pos = [], [], [], [], [], [], []
        q_segments, kv_segments, kv_index = [], [], []
        start = 0
        for b, (n_text, (rows, cols)) in enumerate(zip(text_lens, img_sizes)):
            n_img = rows * cols
            n_ref = sum(h * w for h, w in refs[b]) if refs else 0
            img_index.append(torch.arange(start, start + n_img))
            text_index.append(torch.arange(start + n_img, start + n_img + n_text))
            sample.append(torch.full((n_img + n_text,), b))
            pi, pt = sample_positions(n_text, rows, cols)
            img_pos.append(pi)
            text_pos.append(pt)
            if refs:  # the references' modulation is row B of the table: the t = 0 one
                live_end = start + n_img + n_text
                ref_index.append(torch.arange(live_end, live_end + n_ref))
                sample.append(torch.full((n_ref,), B))
                ref_pos.append(reference_positions(n_text, refs[b]))
                q_segments += [n_img + n_text, n_ref]
                kv_segments += [n_img + n_text + n_ref, n_ref]
                kv_index += [torch.arange(start, live_end + n_ref), torch.arange(live_end, live_end + n_ref)]
            start += n_img + n_text + n_ref
        seq_lens = [t + h * w for t, (h, w) in zip(text_lens, img_sizes)]
        if refs:
            seq_lens = [n + sum(h * w for h, w in r) for n, r in zip(seq_lens, refs)]
        segments, text_segments = list(seq_lens), list(text_lens)
        pad = _round_up(sum(text_lens), pad_to) - sum(text_lens) if pad_to > 0 else 0
        if pad_to > 0:  # its own segment at the end; sample 0's modulation (any would do: nothing reads them)
            text_index.append(torch.arange(start, start + pad))
            sample.append(torch.zeros(pad, dtype=torch.long))
            text_pos.append(torch.zeros(pad, 4))
            segments.append(pad)
            text_segments.append(pad)
        if refs:  # the pad segment attends among itself in the reference attention too
            q_segments.append(pad)
            kv_segments.append(pad)
            kv_index.append(torch.arange(start, start + pad))
        token_sample = torch.cat(sample).long()
        img_index_t = torch.cat(img_index).long()
        text_index_t = torch.cat(text_index).long()
        ref_index_t = torch.cat(ref_index).long() if refs else None
        placed = [img_index_t, text_index_t] + ([ref_index_t] if refs else [])
        joint_gather = torch.argsort(torch.cat(placed))
        pos = [torch.cat(img_pos), torch.cat(text_pos)] + ([torch.cat(ref_pos)] if refs else [])
        positions = torch.cat(pos)[joint_gather]
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
            ref_sizes=refs,
            ref_index=ref_index_t,
            kv_index=torch.cat(kv_index).long() if refs else None,
            cu_seqlens_q=_cu(q_segments) if refs else None,
            cu_seqlens_kv=_cu(kv_segments) if refs else None,
        ).to(device)
