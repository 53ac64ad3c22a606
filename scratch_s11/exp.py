"""Session 11 scratch experiment (not committed): where norm_modulate's backward loses time vs rms_norm's,
and the finish passes' old vs new block shapes."""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "src")
from kohakumoss_kernels import sample_sums as ss  # noqa: E402
from kohakumoss_kernels.ops.norm_modulate.triton import _load_tile  # noqa: E402
from kohakumoss_kernels.ops.rms_norm.triton import _rms_norm_bwd  # noqa: E402
from kohakumoss_kernels.triton_utils import device_ms, persistent_programs, register_budget  # noqa: E402


sys.path.insert(0, "scratch_s11")
from nm_exp import _nm_bwd_exp  # noqa: E402


T, d, B = 8704, 3072, 2
dev = "cuda"
if os.environ.get("TRITON_INTERPRET") == "1":  # a CPU smoke run of the script itself
    T, d, dev = 64, 40, "cpu"

    def device_ms(fn, reps=1):  # noqa: F811
        fn()
        return 0.0
g = torch.Generator(device=dev).manual_seed(0)
x = torch.randn(T, d, device=dev, dtype=torch.bfloat16, generator=g)
dy = torch.randn(T, d, device=dev, dtype=torch.bfloat16, generator=g)
dres = torch.randn(T, d, device=dev, dtype=torch.bfloat16, generator=g)
scale = torch.randn(B, d, device=dev, dtype=torch.bfloat16, generator=g) * 0.1
ts = torch.repeat_interleave(torch.arange(B, device=dev), T // B)
rstd = torch.rand(T, device=dev) + 0.5
dx = torch.empty_like(x)
w = torch.randn(d, device=dev, dtype=torch.bfloat16, generator=g)


def nm(cfg, gather=True, sums=True, seg=True, res=False, mode=0, cap=False):
    rows, warps, per_sm = cfg
    tiles = triton.cdiv(T, rows)
    grid = persistent_programs(x, tiles, per_sm)
    p, first, last, acc = ss.buffers(grid, B, 2, d, dev)
    extra = register_budget(x, warps, per_sm) if cap else {}

    def run():
        _nm_bwd_exp[(grid,)](
            dy, x, scale, ts, rstd, dx, dres if res else dx, res, p, acc, first, last, T, d, triton.cdiv(tiles, grid),
            NEED_SUMS=sums, ROWS=rows, BLOCK=triton.next_power_of_2(d), GATHER=gather, SEG=seg, MODE=mode,
            num_warps=warps, **extra,
        )  # fmt: skip

    return run


def rms(cfg, need_dw=True, cap=False):
    rows, warps, per_sm = cfg
    tiles = triton.cdiv(T, rows)
    grid = persistent_programs(x, tiles, per_sm)
    part = torch.empty(grid, d, device=dev)

    def run():
        _rms_norm_bwd[(grid,)](
            dy, x, w, rstd, dx, part, T, d, triton.cdiv(tiles, grid),
            HAS_W=True, NEED_DW=need_dw, ROWS=rows, BLOCK=triton.next_power_of_2(d), num_warps=warps,
            **(register_budget(x, warps, per_sm) if cap else {}),
        )  # fmt: skip

    return run


def copy_run():
    src = torch.empty(3 * T * d // 2, device=dev, dtype=torch.bfloat16)  # 160 MB moved: 80 read + 80 written
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


CFGS = [(1, 4, 2), (1, 8, 2), (1, 16, 2), (1, 16, 1), (1, 32, 1)]
print(f"copy 160 MB: {device_ms(copy_run(), reps=20) * 1e3:.1f} us", flush=True)
names = ["m0", "m0cap", "m9", "m11", "m11cap", "m11fork", "m11forkcap", "noseg", "nosums", "rms", "rmscap"]
print("cfg            " + "  ".join(f"{n:>10}" for n in names))
for cfg in CFGS:
    fs = [nm(cfg), nm(cfg, cap=True), nm(cfg, mode=9), nm(cfg, mode=11), nm(cfg, mode=11, cap=True),
          nm(cfg, mode=11, res=True), nm(cfg, mode=11, res=True, cap=True), nm(cfg, seg=False), nm(cfg, sums=False),
          rms(cfg), rms(cfg, cap=True)]
    print(f"{str(cfg):14} " + "  ".join(f"{device_ms(f, reps=20) * 1e3:10.1f}" for f in fs), flush=True)
# correctness of mode 11 against mode 0 (dx and the per-sample sums after finish)
outs = []
for mode in (0, 11):
    f = nm((1, 16, 2), mode=mode)
    f()
    outs.append(dx.clone())
print("mode 11 dx == mode 0 dx:", torch.equal(outs[0], outs[1]), flush=True)
