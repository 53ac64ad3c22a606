"""The Triton backends' launch arithmetic, on the CPU: register budgets, backward candidates, finish tiles."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")

from kohakumoss_kernels.backends import sample_sums, triton_utils  # noqa: E402


def test_register_cap_fits_the_programs_per_sm_in_the_register_file():
    assert triton_utils.register_cap(16, 2) == 64  # 2 x 512 threads x 64 = 65536
    assert triton_utils.register_cap(32, 1) == 64
    assert triton_utils.register_cap(16, 4) == 32
    assert triton_utils.register_cap(8, 3) == 80  # 85 rounded down to a multiple of 8
    assert triton_utils.register_cap(4, 2) is None  # 256: above what a thread can have anyway
    assert triton_utils.register_cap(16, 1) == 128


def test_register_budget_is_a_cuda_launch_option_only():
    assert triton_utils.register_budget(torch.zeros(1), 16, 2) == {}  # CPU (the interpreter)


@pytest.mark.skipif(triton_utils.interpreting(), reason="the interpreter's candidate list is one config")
def test_backward_candidates_add_32_warps_where_two_programs_can_fit():
    cands = triton_utils.backward_configs(4096)
    wide = [c for c in cands if c[1] == 32]
    assert wide and all(c[2] in (1, 2) for c in wide)  # 4 x 1024 threads never fit an SM
    assert all(c[0] * 4096 // (32 * 32) >= triton_utils.MIN_PER_THREAD_WIDE for c in wide)
    assert len(set(cands)) == len(cands)


@pytest.mark.parametrize(
    ("programs", "d", "expected"),
    [(264, 3072, (512, 16)), (528, 128, (1024, 8)), (1, 40, (1, 64)), (5000, 3072, (1024, 8))],
)
def test_sum_rows_takes_every_partial_row_in_one_tile(programs, d, expected):
    block_g, block_c = sample_sums.sum_rows_blocks(programs, d)
    assert (block_g, block_c) == expected
    assert block_g * block_c <= max(sample_sums.SUM_TILE, block_g * sample_sums.SUM_MIN_COLS)


@pytest.mark.parametrize(
    "d, expected",
    [(3072, (1024, 3)), (128, (128, 1)), (4096, (4096, 1)), (40, (16, 3)), (1536, (512, 3)), (1, (1, 1))],
)
def test_row_chunks_cover_the_width_with_the_least_padding(d, expected):
    from kohakumoss_kernels.backends.row_chunks import row_chunks

    assert row_chunks(d) == expected


def test_row_chunks_always_cover_the_row_in_at_most_three_power_of_two_chunks():
    from kohakumoss_kernels.backends.row_chunks import MAX_CHUNKS, row_chunks

    for d in range(1, 5000):
        w, c = row_chunks(d)
        assert c <= MAX_CHUNKS and w & (w - 1) == 0 and c * w >= d and (c - 1) * w < d
        assert c * w <= triton_utils.next_pow2(d)  # never more padding than one power-of-two tile


def test_norm_modulate_backward_candidates_are_one_row_with_two_columns_per_thread_or_more():
    from kohakumoss_kernels.ops.norm_modulate.triton import backward_rows

    cfgs = backward_rows(3072)
    assert cfgs and all(rows == 1 and 1024 // (32 * warps) >= 2 for rows, warps, _ in cfgs)
    assert (1, 4, 4) in cfgs and len(set(cfgs)) == len(cfgs)


def test_a_launch_pick_is_kept_in_the_cards_table_and_reused(tmp_path, monkeypatch):
    """The first run times the configs and keeps the winner in the card's table; a later process (its
    in-memory picks gone) reuses it without timing; other candidates or TUNE=always time again."""
    from kohakumoss_kernels import tuning
    from kohakumoss_kernels.backends import triton_utils

    monkeypatch.setenv("KOHAKUMOSS_CACHE", str(tmp_path))
    monkeypatch.setenv(triton_utils.ENV_PICK, "1")
    monkeypatch.delenv("KOHAKUMOSS_TUNE", raising=False)
    monkeypatch.setattr(tuning, "_tables", {})
    monkeypatch.setattr(triton_utils, "_PICKED", {})
    timed = []

    def device_ms(fn, reps=10, rounds=3):
        fn()
        return {(1, 4): 0.3, (2, 8): 0.1, (4, 8): 0.2}[timed[-1]]

    def launch(cfg):
        timed.append(cfg)

    monkeypatch.setattr(triton_utils, "device_ms", device_ms)
    key = (3072, torch.bfloat16, 16384, torch.device("cpu"))
    configs = [(1, 4), (2, 8)]
    before = len(tuning._stored_launches)
    assert triton_utils.pick("demo.fwd", key, configs, launch) == (2, 8)
    assert len(tuning._stored_launches) == before + 1  # counted in the tuning window's log line
    stored = json.loads((tmp_path / "tuning" / "cpu.json").read_text())["launches"]
    assert stored["demo.fwd|3072|torch.bfloat16|16384"]["config"] == [2, 8]

    monkeypatch.setattr(triton_utils, "_PICKED", {})  # a new process
    monkeypatch.setattr(tuning, "_tables", {})
    timed.clear()
    assert triton_utils.pick("demo.fwd", key, configs, launch) == (2, 8) and timed == []
    monkeypatch.setattr(triton_utils, "_PICKED", {})
    assert triton_utils.pick("demo.fwd", key, [*configs, (4, 8)], launch) == (2, 8) and timed  # new candidate
    monkeypatch.setattr(triton_utils, "_PICKED", {})
    monkeypatch.setenv("KOHAKUMOSS_TUNE", "always")
    timed.clear()
    triton_utils.pick("demo.fwd", key, configs, launch)
    assert timed


def test_counting_compiles_chains_the_hooks_and_restores_them():
    """Triton calls jit_cache_hook before a compile (a truthy answer skips it) and jit_post_compile_hook
    after; the counter chains hooks already set, passes their answers on, and puts them back."""
    from triton import knobs

    runtime = knobs.runtime
    seen = []
    runtime.jit_cache_hook = lambda **kw: seen.append(("pre", kw["key"])) or False
    runtime.jit_post_compile_hook = lambda **kw: seen.append(("post", kw["key"]))
    try:
        outer_pre, outer_post = runtime.jit_cache_hook, runtime.jit_post_compile_hook
        with triton_utils.counting_compiles() as stats:
            assert stats.available
            for key in ("a", "b"):
                assert not runtime.jit_cache_hook(key=key)  # a compile, not skipped
                runtime.jit_post_compile_hook(key=key)
        assert stats.kernels == 2 and stats.seconds >= 0
        assert seen == [("pre", "a"), ("post", "a"), ("pre", "b"), ("post", "b")]
        assert (runtime.jit_cache_hook, runtime.jit_post_compile_hook) == (outer_pre, outer_post)
    finally:
        runtime.jit_cache_hook = runtime.jit_post_compile_hook = None


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
)
def test_counting_compiles_counts_a_real_compile():
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, SEED: tl.constexpr):  # SEED: a specialization no cache holds yet
        i = tl.arange(0, 128)
        tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)

    x = torch.zeros(128, device="cuda")
    with triton_utils.counting_compiles() as stats:
        add_one[(1,)](x, 128, SEED=int(torch.randint(1 << 30, ()).item()))
    assert stats.kernels == 1 and stats.seconds > 0 and x[0].item() == 1


def test_attention_launch_configs_are_picked_per_sample_length_bucket():
    from kohakumoss_kernels.ops.varlen_attention.triton import _key

    q = torch.empty(10, 2, 128, dtype=torch.bfloat16)
    assert _key(q, 128) != _key(q, 4352)  # the refiner's text and a 1 MP sample: their own configs
    assert _key(q, 4352) == _key(q, 5000) and _key(q, 4352)[:2] == (128, torch.bfloat16)
    assert _key(q.half(), 4352) != _key(q, 4352)
