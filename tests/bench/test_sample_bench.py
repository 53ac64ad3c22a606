"""scripts/bench/sample.py on the CPU (tiny preset): every row runs, the fast rows sample what the eager
row does, the table and JSON come out; its FLOP count and argument checks."""

from __future__ import annotations

import json

import pytest

from kohakumoss.memory.flops import block_macs, step_flops
from kohakumoss.model import get_preset

from .scripts import load_bench


def load_script():
    return load_bench("sample")


def test_cpu_smoke_rows_agree_with_the_eager_sampler(tmp_path, capsys):
    bench = load_script()
    out = tmp_path / "rows.json"
    argv = "--preset tiny --device cpu --size 32 --steps 2 --text-tokens 4 --batches 1,2"
    rows = bench.main(
        [*argv.split(), "--rows", "fast,eager", "--base-precisions", "same,fp8", "--out", str(out)]
    )
    assert [(r["base"], r["row"], r["batch"]) for r in rows] == [
        (base, row, b) for base in ("same", "fp8") for row in ("eager", "fast") for b in (1, 2)
    ]  # eager first: the reference
    for r in rows:
        assert "error" not in r and r["images_per_s"] > 0 and r["mfu"] > 0
        assert r["err_vs_eager"] < 1e-5  # fp32: batched CFG and the registry change no image
    saved = json.loads(out.read_text())["rows"]
    assert len(saved) == 4 * 2 and "latents" not in saved[0]
    table = capsys.readouterr().out
    assert "uncond skips blocks [2]" in table and "synthetic text embeddings" in table and "vs eager" in table


def test_flops_count_both_branches_less_the_skipped_block():
    bench = load_script()
    cfg = get_preset("moss-image-5b")
    fwd = step_flops(cfg, [4096], [256], full=False, backward=False)
    one_block = 2 * block_macs(cfg) * (4096 + 256) + 4 * cfg.dim * (4096 + 256) ** 2
    assert bench.sample_flops(cfg, 1, 4096, 256, 256, 50, 1) == pytest.approx(50 * (2 * fwd - one_block))
    assert bench.sample_flops(cfg, 4, 4096, 256, 256, 1, 0) == pytest.approx(8 * fwd)
    # ~ 2 x 5.08e9 parameters x 4352 tokens per forward: the count is the model's, not a made-up figure
    assert 0.9 < fwd / (2 * 5.08e9 * 4352) < 1.3


@pytest.mark.parametrize("argv", ["--rows fast,warp", "--base-precisions int3", "--size 100", "--batches ,"])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        load_script().parse_args(argv.split())
