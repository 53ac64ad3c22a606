"""The released sigma schedule against an independent float32 transcription of the released algorithm."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kohakumoss.diffusion import released_sigmas
from kohakumoss_common.errors import ConfigError

F32 = np.float32


def linspace_f32(start: float, end: float, steps: int) -> np.ndarray:
    """torch.linspace in float32 on the CPU: step = (end - start) / (steps - 1) in float32; the first
    half counts up from start, the second down from end, each value one rounding of start + step * i."""
    if steps == 1:
        return np.array([start], dtype=F32)
    start, end = F32(start), F32(end)
    step = (end - start) / F32(steps - 1)
    i = np.arange(steps, dtype=np.float64)
    up = np.float64(start) + np.float64(step) * i
    down = np.float64(end) - np.float64(step) * (steps - 1 - i)
    return np.where(i < steps // 2, up, down).astype(F32)


def shifted(count: int, shift: float, total: int = 1000) -> np.ndarray:
    v = linspace_f32(1.0, shift / (total + shift - 1), count)
    return (F32(shift) * v / (F32(1) + F32(shift - 1) * v)).astype(F32)


def reference(steps: int, shift: float = 5.0) -> np.ndarray:
    """Nearest training-grid point by brute force (ties to the smaller sigma), duplicates dropped, 0 added."""
    grid = shifted(1000, 1.0)[::-1]  # ascending
    snapped = [grid[np.argmin(np.abs(grid - s))] for s in shifted(steps, shift)]
    kept = [s for j, s in enumerate(snapped) if j == 0 or s != snapped[j - 1]]
    return np.array([*kept, 0.0], dtype=F32)


@pytest.mark.parametrize("steps", [1, 2, 8, 28, 50, 100, 250, 1000])
def test_sigmas_equal_the_released_algorithm_bit_for_bit(steps):
    got = released_sigmas(steps)
    want = reference(steps)
    assert got.dtype == torch.float32
    assert np.array_equal(got.numpy(), want), (steps, got.numpy()[:8], want[:8])
    assert got[0] == 1.0 and got[-1] == 0.0 and bool((got[1:] < got[:-1]).all())
    grid = torch.from_numpy(shifted(1000, 1.0).copy())
    assert bool(torch.isin(got[:-1], grid).all())  # every sigma but the last is a training-grid point


def test_duplicates_dropped_only_where_steps_outnumber_the_grid():
    assert [len(released_sigmas(n)) for n in (1, 2, 8, 28, 50, 100)] == [2, 3, 9, 29, 51, 101]
    assert len(released_sigmas(250)) == 247 and len(released_sigmas(1000)) == 616
    assert released_sigmas(1).tolist() == [1.0, 0.0]


def test_snapping_and_shift_matter():
    unsnapped = torch.from_numpy(np.append(shifted(8, 5.0), F32(0)))
    assert not torch.equal(released_sigmas(8), unsnapped)
    assert torch.allclose(released_sigmas(8), unsnapped, atol=6e-4)  # within half a grid step
    assert not torch.equal(released_sigmas(8, shift=3.0), released_sigmas(8))
    assert np.array_equal(released_sigmas(8, shift=3.0).numpy(), reference(8, 3.0))


@pytest.mark.parametrize("kw, knob", [({"steps": 0}, "STEPS"), ({"steps": 4, "shift": 0.0}, "SHIFT")])
def test_bad_settings_named(kw, knob):
    with pytest.raises(ConfigError, match=knob):
        released_sigmas(**kw)
