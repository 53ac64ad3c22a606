"""Reference K/V caching for sampling with reference images (edit models).

Reference queries attend to reference keys alone (seq.py), and reference tokens are modulated at t = 0:
their hidden states, so their keys and values in every block, depend only on the references, on
their RoPE coordinates (r, f = the sample's text length, h, w) and on the blocks run (a skip-layer
branch skips them too). They are the same at every denoising step. So one forward on the full
layout records, per block, the reference tokens' keys and values after QK-norm and RoPE
(`recording`); the steps after it run the target and text tokens alone, their attention reading
[sample's live keys | its cached reference keys] (`replaying`): the same values as the full forward,
at the cost of the live tokens only (SimpleTuner's `cache_reference_kv`, exact, not an approximation).

A layout's cache holds its own samples' references: the sampler keeps one per CFG branch layout and
per skip-layer set. The cached tensors keep their addresses, so a CUDA graph of the replaying step
reads them like any other fixed buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import nn

from kohakumoss_kernels.runtime.host_values import register_host_values

from .seq import PackedSeq


class ReferenceKV:
    """Per block, the reference tokens' post-RoPE keys and values [T_ref, H, D] of one layout."""

    def __init__(self, ref_index: torch.Tensor):
        self.ref_index = ref_index  # joint positions of the reference tokens in the recording layout
        self.kv: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}
        self.recording = True

    def __call__(
        self, block: nn.Module, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """While recording: keep the block's reference rows of k, v and pass them on; after: the live
        tokens' k, v followed by the block's cached reference rows."""
        if self.recording:
            self.kv[block] = (k.index_select(0, self.ref_index), v.index_select(0, self.ref_index))
            return k, v
        if block not in self.kv:
            raise RuntimeError("reference K/V replayed for a block the recording forward did not run")
        ref_k, ref_v = self.kv[block]
        return torch.cat([k, ref_k.to(k.dtype)]), torch.cat([v, ref_v.to(v.dtype)])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for kv in self.kv.values() for t in kv)


@dataclass(frozen=True)
class ReferenceKVSeq(PackedSeq):
    """A layout whose attention calls `reference_kv` on each block's keys and values after RoPE.
    `live_segments` (replaying): (kv_index, cu_seqlens_q, cu_seqlens_kv) of the live queries over
    [live keys | cached reference keys]; None (recording): the full layout's own segments."""

    reference_kv: ReferenceKV | None = None
    live_segments: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def attention_segments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        return self.live_segments if self.live_segments is not None else super().attention_segments


def _base_fields(seq: PackedSeq) -> dict:
    return {f.name: getattr(seq, f.name) for f in fields(PackedSeq)}


def recording(full: PackedSeq) -> ReferenceKVSeq:
    """`full` (a layout with references, on its device), recording its references' K/V as it runs."""
    if not full.has_references:
        raise ValueError("a reference K/V cache needs a layout with references")
    return ReferenceKVSeq(**_base_fields(full), reference_kv=ReferenceKV(full.ref_index))


def replaying(full: ReferenceKVSeq) -> ReferenceKVSeq:
    """The live tokens of `full` (target and text, the same RoPE and modulation rows) attending to the
    reference K/V `full` recorded. Call after the recording forward."""
    kv = full.reference_kv
    if kv is None or not kv.kv:
        raise ValueError("replaying needs a recording layout whose forward ran")
    if full.text_pad:
        raise ValueError("reference K/V replaying takes an unpadded layout (the sampler's)")
    device = full.cu_seqlens.device
    live = PackedSeq.build(full.text_lens, full.img_sizes, device)
    live_lens = [t + h * w for t, (h, w) in zip(full.text_lens, full.img_sizes)]
    total, start, ref_start, index = sum(live_lens), 0, 0, []
    for n_live, n_ref in zip(live_lens, full.ref_lens):
        index += [
            torch.arange(start, start + n_live),
            torch.arange(total + ref_start, total + ref_start + n_ref),
        ]
        start, ref_start = start + n_live, ref_start + n_ref
    kv_lens = [n + r for n, r in zip(live_lens, full.ref_lens)]
    segments = (torch.cat(index).long().to(device), _cu(live_lens, device), _cu(kv_lens, device))
    # max_seqlen bounds the key segments too (the attention sizes its grid from it)
    base = replace(live, max_seqlen=max(full.max_seqlen, live.max_seqlen))
    kv.recording = False
    return ReferenceKVSeq(**_base_fields(base), reference_kv=kv, live_segments=segments)


def _cu(lens: list[int], device: torch.device) -> torch.Tensor:
    host = torch.tensor([0, *lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    out = host.to(device)
    register_host_values(out, host.tolist())
    return out
