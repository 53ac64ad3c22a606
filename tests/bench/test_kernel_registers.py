"""scripts/bench/kernel_registers.py: ptxas's register and spill report, parsed; one kernel compiled for
sm_90 on this machine (no GPU needed) where Triton's bundled ptxas is present."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "kernel_registers.py"


def load():
    return runpy.run_path(str(SCRIPT), run_name="kernel_registers")


def test_parse_usage_reads_registers_and_spills():
    parse = load()["parse_usage"]
    text = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
        "ptxas info    : Function properties for k\n"
        "    208 bytes stack frame, 204 bytes spill stores, 196 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 208 bytes cumulative stack size"
    )
    assert parse(text) == (255, 204, 196)
    assert parse("ptxas info    : Used 62 registers") == (62, 0, 0)
    with pytest.raises(ValueError, match="register"):
        parse("nothing here")


def test_one_kernel_compiles_for_sm90_without_a_gpu():
    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("Triton without its bundled ptxas")
    g = load()
    fn, sig, consts, configs = g["kernels"]()["rms_norm_fwd"]
    regs, stores, loads = g["usage"](fn, sig, consts, (1, 16), 90)
    assert 0 < regs <= 255 and stores >= 0 and loads >= 0
    assert (1, 16) in configs  # the candidates the picker times at this width
    # a backward candidate compiles under its register budget: 2 programs x 16 warps share 64K registers
    fn, sig, consts, configs = g["kernels"]()["norm_modulate_bwd"]
    assert (1, 16, 2) in configs
    assert g["usage"](fn, sig, consts, (1, 16, 2), 90)[0] <= 64


def test_situ_glu_kernels_compile_for_sm90():
    """The interpreter runs no code generation: both kernels must also compile for the H200."""
    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("Triton without its bundled ptxas")
    g = load()
    table = g["kernels"]()
    for name in ("situ_glu_fwd", "situ_glu_bwd"):
        fn, sig, consts, configs = table[name]
        assert configs == [(1, 4)]
        assert 0 < g["usage"](fn, sig, consts, configs[0], 90)[0] <= 255
    assert "situ_glu_bwd_frozen" not in table  # no parameters, no frozen variant
