"""slot_merge's Triton kernel against sdpa_slots.merge_torch under TRITON_INTERPRET=1 (run by
test_triton_interpret.py): the kernels' own layouts (strided views, padded lse rows), pad rows."""

from __future__ import annotations

import torch

from kohakumoss_kernels.ops.varlen_attention import sdpa_slots, slot_merge

if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    B, H, S, D = 2, 3, 45, 16  # S: one full 32-row block and a partial one
    o_a = torch.randn(B, S, H, D, generator=g).transpose(1, 2)  # the kernels' [B, S, H, D] memory
    o_b = torch.randn(B, H, S, D, generator=g)
    lse_a = torch.randn(B, H, S, generator=g) * 3
    lse_b = torch.randn(B, H, S + 19, generator=g)[..., :S] * 3  # the memory-efficient kernel's padded rows
    real = torch.arange(S)[None] < torch.tensor([[40], [S]])  # sample 0 has 5 pad rows, sample 1 none
    want, got = torch.empty(B, S, H, D).transpose(1, 2), torch.empty(B, S, H, D).transpose(1, 2)
    lse_want = sdpa_slots.merge_torch(o_a, o_b, lse_a, lse_b, real, want)
    assert slot_merge.fits(o_a, o_b, lse_a, lse_b, got)
    lse_got = slot_merge.merge(o_a, o_b, lse_a, lse_b, real, got)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse_got, lse_want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[0, :, 40:], o_b[0, :, 40:])  # pad rows: the text and pad part alone
    print("ok slot_merge")
