import sys
sys.path.insert(0, "scripts/bench"); sys.path.insert(0, "scratch_s11")
import kernel_registers as k
import nm_exp
fn, sig, c, cf = k.kernels()["norm_modulate_bwd"]
sig = {**sig}
keys = list(sig)
sig = dict(list(sig.items()) + [("GATHER", "constexpr"), ("SEG", "constexpr"), ("MODE", "constexpr")])
for name, extra in [(f"mode{m}", dict(GATHER=True, SEG=True, MODE=m)) for m in map(int, sys.argv[1:])]:
    for rows, warps in [(1, 16)]:
        for res in (False, True):
            print(name, rows, warps, "fork" if res else "", k.usage(nm_exp._nm_bwd_exp, sig, {**c, **extra, "HAS_RES": res}, rows, warps, 90), flush=True)
