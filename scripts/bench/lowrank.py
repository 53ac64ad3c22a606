"""The LoRA linear's rank-r products (`kohakumoss_kernels/ops/lora_linear/lowrank.py`) per launch config, at
the speed row's shapes, against cuBLAS and the copy bandwidth. Prints a table last.

    kogine run scripts/bench/lowrank.py [--set ROWS_SHARES=64,-1 --set COLS_BN=128]

rows: h = x @ down^T (b a transposed view) and sq = gy @ up (b contiguous); cols: the weight gradients
added into a float32 `.grad` (gy^T @ h into [N, r], and x^T @ sq into a transposed [r, N] view). Each
config is timed on the device with the stream held (triton_utils.device_ms: calls back to back); cuBLAS
as the addmm backends call it (split-K GEMM + reduce + memset). What the picker's candidate lists
(ROWS_CONFIGS, COLS_CONFIGS) should hold, from a sweep wider than the picker times in a run.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402

from kohakumoss_common.timing import copy_gbs  # noqa: E402
from kohakumoss_kernels.backends.triton_utils import device_ms  # noqa: E402
from kohakumoss_kernels.ops.lora_linear import lowrank  # noqa: E402
from kohakumoss_kernels.runtime import grad_sink  # noqa: E402

TOKENS = 8704  # 2 x (4096 image + 256 text)
RANK = 32
ROWS_K = "3072,16384"  # x's width (h = x down^T) or gy's (sq = gy up)
COLS_N = "3072,16384"
ROWS_SHARES = "64,-1,-2,-4"  # rows per program, or -k: shared evenly by k programs per SM
ROWS_BK = "64,128,256"
ROWS_STAGES = "3,4,6"
ROWS_WARPS = "4,8"
COLS_BN = "64,128,256"
COLS_BM = "64,128"
COLS_WARPS = "4,8"
COLS_STAGES = "3,4"
COLS_PER_SM = "1,2,4"
TOP = 3  # configs shown per shape, fastest first


def ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v]


def sweep(candidates: list[tuple], patch: str, call) -> list[tuple[float, tuple]]:
    """(ms, config) for every config that compiles and runs, fastest first."""
    kept, out = getattr(lowrank, patch), []
    for cfg in candidates:
        setattr(lowrank, patch, [cfg])  # the picker's only candidate: launched as is, nothing timed
        try:
            out.append((device_ms(call), cfg))
        except Exception as e:  # out of shared memory or registers: not a candidate
            print(f"  {cfg}: {type(e).__name__}", flush=True)
    setattr(lowrank, patch, kept)
    return sorted(out)


def rows_of(name: str, ranked: list, ref_ms: float, gb: float, copy: float) -> list[str]:
    """The table's lines of one product: its TOP configs, then cuBLAS; printed as they come."""
    lines = [f"| {name} | {cfg} | {ms * 1e3:.1f} | {gb * 1e3 / ms:.0f} | {gb * 1e3 / ms / copy:.0%} |"
             for ms, cfg in ranked[:TOP]]  # fmt: skip
    lines.append(
        f"| {name} | cuBLAS | {ref_ms * 1e3:.1f} | {gb * 1e3 / ref_ms:.0f} | {gb * 1e3 / ref_ms / copy:.0%} |"
    )
    print("\n".join(lines), flush=True)
    return lines


def main() -> None:
    dev = torch.device("cuda")
    copy = copy_gbs(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    rows_grid = list(itertools.product(ints(ROWS_SHARES), ints(ROWS_BK), ints(ROWS_STAGES), ints(ROWS_WARPS)))
    cols_grid = list(
        itertools.product(
            ints(COLS_BN), ints(COLS_BM), ints(COLS_WARPS), ints(COLS_STAGES), ints(COLS_PER_SM)
        )
    )
    lines = []
    for K in ints(ROWS_K):
        x = torch.randn(TOKENS, K, device=dev, generator=g).bfloat16()
        for layout, b in (("down^T", torch.randn(RANK, K, device=dev, generator=g).bfloat16().t()),
                          ("up", torch.randn(K, RANK, device=dev, generator=g).bfloat16())):  # fmt: skip
            gb = (x.numel() + b.numel() + TOKENS * RANK) * 2 / 1e9
            ref = device_ms(
                lambda x=x, b=b: torch.empty(TOKENS, RANK, device=dev, dtype=x.dtype).addmm_(x, b, beta=0)
            )
            ranked = sweep(rows_grid, "ROWS_CONFIGS", lambda x=x, b=b: lowrank.rows_mm(x, b))
            lines += rows_of(f"rows K={K} b={layout}", ranked, ref, gb, copy)
    for N in ints(COLS_N):
        a = torch.randn(TOKENS, N, device=dev, generator=g).bfloat16()
        h = torch.randn(TOKENS, RANK, device=dev, generator=g).bfloat16()
        for layout, out in (
            ("[N, r]", torch.zeros(N, RANK, device=dev)),
            ("[r, N]^T", torch.zeros(RANK, N, device=dev).t()),
        ):
            gb = (a.numel() + h.numel()) * 2 / 1e9
            if layout == "[N, r]":
                ref = device_ms(lambda a=a, h=h, out=out: grad_sink.mm_into(out, a.t(), h))
            else:
                ref = device_ms(lambda a=a, h=h, out=out: grad_sink.mm_into(out.t(), h.t(), a))
            ranked = sweep(cols_grid, "COLS_CONFIGS", lambda a=a, h=h, out=out: lowrank.cols_into(out, a, h))
            lines += rows_of(f"cols N={N} out={layout}", ranked, ref, gb, copy)
    print(f"\ncopy {copy:.0f} GB/s; {TOKENS} tokens, rank {RANK}; rows config (share, BK, stages, warps), "
          "cols config (BN, BM, warps, stages, programs per SM)")  # fmt: skip
    print("| product | config | us | GB/s | of copy |\n| --- | --- | ---: | ---: | ---: |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
