"""cast_cache: inside a window each listed master is cast once (a group's members side by side, so their
concatenation is a view); outside it, or for a tensor it does not hold, `cast` casts as `.to` does."""

from __future__ import annotations

import torch

from kohakumoss_kernels.runtime import cast_cache


def _masters():
    g = torch.Generator().manual_seed(0)
    downs = [torch.randn(r, 6, generator=g) for r in (3, 2, 4)]
    up = torch.randn(7, 3, generator=g)
    return downs, up


def test_window_casts_once_and_cat_is_a_view():
    downs, up = _masters()
    with cast_cache.cast_once([downs, [up]], torch.bfloat16):
        a, b = cast_cache.cast(up, torch.bfloat16), cast_cache.cast(up, torch.bfloat16)
        assert a is b and a.dtype == torch.bfloat16
        torch.testing.assert_close(a, up.to(torch.bfloat16), atol=0, rtol=0)
        cat = cast_cache.cast_cat(downs, torch.bfloat16)
        assert cat.data_ptr() == cast_cache.cast(downs[0], torch.bfloat16).data_ptr()  # no new buffer
        torch.testing.assert_close(cat, torch.cat(downs).to(torch.bfloat16), atol=0, rtol=0)
        # another dtype, a tensor outside the window, a group in another order: cast on the spot
        assert cast_cache.cast(up, torch.float16).dtype == torch.float16
        other = up.clone()
        assert cast_cache.cast(other, torch.bfloat16) is not a
        rev = cast_cache.cast_cat(downs[::-1], torch.bfloat16)
        torch.testing.assert_close(rev, torch.cat(downs[::-1]).to(torch.bfloat16), atol=0, rtol=0)
    outside = cast_cache.cast(up, torch.bfloat16)
    assert outside is not a and not cast_cache._copies and not cast_cache._groups


def test_a_new_window_sees_updated_masters():
    downs, up = _masters()
    with cast_cache.cast_once([[up]], torch.bfloat16):
        before = cast_cache.cast(up, torch.bfloat16).clone()
    with torch.no_grad():
        up.add_(1.0)  # the optimizer's step between two forwards
    with cast_cache.cast_once([[up]], torch.bfloat16):
        after = cast_cache.cast(up, torch.bfloat16)
    torch.testing.assert_close(after, up.to(torch.bfloat16), atol=0, rtol=0)
    assert not torch.equal(before, after)
