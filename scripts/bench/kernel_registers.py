"""Registers and spills of the Triton row kernels, per launch-config candidate, compiled for a target arch.

    kogine run scripts/bench/kernel_registers.py [--set ARCH=90 --set KERNELS=norm_modulate_bwd]

No GPU needed: each kernel is compiled for ARCH (Triton's bundled ptxas, `-v`), at the moss-image-5b
width (d = 3072, 24 heads x 128, MLP hidden 8192). A config that spills registers to local memory, or
needs so many that few programs fit on an SM, is why a launch config loses on the device; this says
which, before a GPU call.
Prints a table last.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kohakumoss_kernels.backends import row_chunks, triton_utils  # noqa: E402

ARCH = 90  # compute capability to compile for (sm_90a: the H200)
KERNELS = "all"  # comma-separated names from the table below, or "all"
PDL = True  # as launched on sm90+ (kohakumoss_kernels.backends.pdl): griddepcontrol.wait first
D_MODEL = 3072
HEAD_DIM = 128

BF = "*bf16"
_PER_SAMPLE = {
    "P": "*fp32",
    "D": "*fp32",
    "FIRST": "*i64",
    "LAST": "*i64",
    "T": "i32",
    "d": "i32",
    "tiles_per_prog": "i32",
}


def _sig(names: str, types: dict[str, str]) -> dict[str, str]:
    """A signature from the kernel's argument names: bf16 pointers unless `types` says otherwise."""
    return {n: types.get(n, BF) for n in names.split()}


def kernels() -> dict[str, tuple]:
    """name -> (jit function, signature, constexprs, launch configs: (rows, warps[, programs per SM]))."""
    from kohakumoss_kernels.ops.gated_residual import triton as gr
    from kohakumoss_kernels.ops.norm_modulate import triton as nm
    from kohakumoss_kernels.ops.qk_norm_rope import triton as qk
    from kohakumoss_kernels.ops.residual_norm_modulate import triton as rnm
    from kohakumoss_kernels.ops.rms_norm import triton as rn
    from kohakumoss_kernels.ops.situ_glu import triton as sg

    block = triton_utils.next_pow2(D_MODEL)
    bd = triton_utils.next_pow2(HEAD_DIM // 2)
    rows_fwd = triton_utils.row_configs(D_MODEL)
    rows_bwd = sorted(set(triton_utils.backward_configs(block)))  # (rows, warps, programs per SM)
    heads_bwd = sorted(set(triton_utils.backward_configs(2 * bd, min_rows=2)))
    chunks = row_chunks.width(D_MODEL)  # norm_modulate: d as chunks
    wc = {"W": "constexpr", "C": "constexpr"}
    nm_bwd = sorted(nm.backward_rows(D_MODEL))
    scalars = {"TS": "*i64", "RSTD": "*fp32", "T": "i32", "d": "i32", "eps": "fp32"}
    c = {
        "ROWS": "constexpr",
        "BLOCK": "constexpr",
        "HAS_W": "constexpr",
        "HAS_RES": "constexpr",
        "BD": "constexpr",
        "PDL": "constexpr",
        "ACC": "*fp32",
        "ACC_N": "i32",
    }
    per_sample = {**scalars, **_PER_SAMPLE, **c}
    table = {
        "rms_norm_fwd": (rn._rms_norm_fwd, _sig("X W Y RSTD T d eps HAS_W ROWS BLOCK PDL", {**scalars, **c}),
                         {"HAS_W": True, "BLOCK": block}, rows_fwd),
        "rms_norm_bwd": (rn._rms_norm_bwd, _sig("DY X W RSTD DX DW T d tiles_per_prog HAS_W NEED_DW ROWS BLOCK PDL",
                                                {**per_sample, "DW": "*fp32"}), {"HAS_W": True, "NEED_DW": True, "BLOCK": block}, rows_bwd),
        "norm_modulate_fwd": (nm._norm_modulate_fwd, _sig("X SHIFT SCALE TS Y RSTD ACC ACC_N T d eps ROWS W C PDL", {**scalars, **c, **wc}),
                              chunks, rows_fwd),
        "norm_modulate_bwd": (nm._norm_modulate_bwd,
                              _sig("DY X SCALE TS RSTD DX DRES HAS_RES P D FIRST LAST T d tiles_per_prog NEED_SUMS ROWS W C PDL",
                                   {**per_sample, **wc}), {"HAS_RES": False, "NEED_SUMS": True, **chunks}, nm_bwd),
        "norm_modulate_bwd_fork": (nm._norm_modulate_bwd,
                                   _sig("DY X SCALE TS RSTD DX DRES HAS_RES P D FIRST LAST T d tiles_per_prog NEED_SUMS ROWS W C PDL",
                                        {**per_sample, **wc}), {"HAS_RES": True, "NEED_SUMS": True, **chunks}, nm_bwd),
        "gated_residual_bwd": (gr._gated_residual_bwd,
                               _sig("DOUT Y GATE TS DY P D FIRST LAST T d tiles_per_prog NEED_SUMS ROWS BLOCK PDL", per_sample),
                               {"NEED_SUMS": True, "BLOCK": block}, rows_bwd),
        "residual_norm_modulate_bwd": (
            rnm._residual_norm_modulate_bwd,
            _sig("DR DH R Y GATE SCALE TS RSTD DX DY P D FIRST LAST T d tiles_per_prog NEED_SUMS ROWS BLOCK PDL",
                 per_sample), {"NEED_SUMS": True, "BLOCK": block}, rows_bwd),
        "qk_norm_rope_bwd": (qk._qk_norm_rope_bwd,
                             _sig("DY X W COS SIN RSTD DX DW R H half tiles_per_prog HAS_W NEED_DW ROWS BD PDL",
                                  {**c, "COS": "*fp32", "SIN": "*fp32", "RSTD": "*fp32", "DW": "*fp32", "R": "i32",
                                   "H": "i32", "half": "i32", "tiles_per_prog": "i32"}),
                             {"HAS_W": True, "NEED_DW": True, "BD": bd}, heads_bwd),
        # one launch config: BLOCK columns of one row per program, 4 warps
        "situ_glu_fwd": (sg._situ_glu_fwd, _sig("Hp OUT n_half BLOCK PDL", {**c, "n_half": "i32"}),
                         {"BLOCK": sg.BLOCK}, [(1, 4)]),
        "situ_glu_bwd": (sg._situ_glu_bwd, _sig("DOUT Hp DH n_half BLOCK PDL", {**c, "n_half": "i32"}),
                         {"BLOCK": sg.BLOCK}, [(1, 4)]),
    }  # fmt: skip
    # the same backwards where the parameters need no gradient (LoRA training: frozen norms and AdaLN)
    frozen = {"NEED_DW": False} | {"NEED_SUMS": False}
    for name in [n for n in table if n.endswith("_bwd") or n.endswith("_bwd_fork")]:
        fn, sig, consts, configs = table[name]
        if not frozen.keys() & consts.keys():  # no parameters (situ_glu)
            continue
        table[name + "_frozen"] = (
            fn,
            sig,
            {**consts, **{k: v for k, v in frozen.items() if k in consts}},
            configs,
        )
    return table


def ptxas_usage(ptx: str, arch: int) -> tuple[int, int, int]:
    """(registers, spill store bytes, spill load bytes) of the one kernel in `ptx`, from `ptxas -v`."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        Path(src).write_text(ptx)
        suffix = "a" if arch == 90 else ""
        out = subprocess.run(
            [str(ptxas), "-v", f"--gpu-name=sm_{arch}{suffix}", src, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    return parse_usage(out.stderr)


def parse_usage(text: str) -> tuple[int, int, int]:
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if regs is None:
        raise ValueError(f"no register count in ptxas output: {text[:300]}")
    stores, loads = (int(spill.group(1)), int(spill.group(2))) if spill else (0, 0)
    return int(regs.group(1)), stores, loads


ALIGNED_INTS = {
    "T": D_MODEL,
    "d": D_MODEL,
    "half": HEAD_DIM // 2,
    "R": 16,
    "n_half": 8192,
}  # at the bench shape


def aligned(sig: dict, count_constexprs: bool = True) -> dict:
    """Triton's `tt.divisibility` hints as the launch gives them at the bench shape: every pointer (torch's
    allocations are 16-byte aligned) and the integers there divisible by 16; without them the compiler
    cannot vectorise the loads, and the counts are not the device's. Triton 3.6 numbers the arguments
    with the constexprs among them, 3.8 without (count_constexprs=False)."""
    args = [(n, ty) for n, ty in sig.items() if count_constexprs or ty != "constexpr"]
    return {
        (i,): [["tt.divisibility", 16]]
        for i, (name, ty) in enumerate(args)
        if ty.startswith("*") or ALIGNED_INTS.get(name, 1) % 16 == 0
    }


def usage(fn, sig: dict, consts: dict, cfg: tuple, arch: int) -> tuple[int, int, int]:
    rows, warps, *per_sm = cfg
    cap = triton_utils.register_cap(warps, per_sm[0]) if per_sm else None  # as register_budget passes it
    options = {"num_warps": warps, "maxnreg": cap}

    def compile_with(count_constexprs: bool):
        attrs = aligned(sig, count_constexprs)
        rows_arg = {"ROWS": rows} if "ROWS" in sig else {}  # a kernel of one row per program has none
        src = ASTSource(fn=fn, signature=sig, constexprs={**consts, **rows_arg, "PDL": PDL}, attrs=attrs)
        return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)

    try:
        compiled = compile_with(True)
    except triton.CompilationError as e:  # a Triton that numbers arguments without the constexprs
        if "argument index out of range" not in str(e.error_message):
            raise
        compiled = compile_with(False)
    return ptxas_usage(compiled.asm["ptx"], arch)


def main() -> None:
    table = kernels()
    names = list(table) if KERNELS == "all" else [k.strip() for k in KERNELS.split(",")]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"KERNELS: unknown {unknown}; known: {list(table)}")
    lines = [
        f"{'kernel':<36} {'rows':>4} {'warps':>5} {'per SM':>6} {'regs':>5} {'spill st/ld B':>14} {'programs/SM':>11}"
    ]
    for name in names:
        fn, sig, consts, configs = table[name]
        for cfg in configs:
            rows, warps, *per_sm = cfg
            regs, st, ld = usage(fn, sig, consts, cfg, ARCH)
            fit = 65536 // (max(regs, 1) * 32 * warps)  # the register file's limit, before shared memory's
            launched = per_sm[0] if per_sm else "-"
            lines.append(
                f"{name:<36} {rows:>4} {warps:>5} {launched:>6} {regs:>5} {f'{st}/{ld}':>14} {fit:>11}"
            )
            print(lines[-1], flush=True)
    print(f"\nTriton {triton.__version__}, compiled for sm_{ARCH}, d = {D_MODEL}, head_dim = {HEAD_DIM}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
