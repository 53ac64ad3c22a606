import sys
sys.path.insert(0, "scripts/bench"); sys.path.insert(0, "scratch_s11")
import kernel_registers as k
import nm_exp
fn, sig, c, cf = k.kernels()["norm_modulate_bwd"]
sig = dict(list(sig.items()) + [("GATHER", "constexpr"), ("SEG", "constexpr"), ("MODE", "constexpr")])
for mode in map(int, sys.argv[1:]):
    for res in (False, True):
        for rows, warps in [(1, 16)]:
            print("mode", mode, rows, warps, "fork" if res else "", k.usage(nm_exp._nm_bwd_exp, sig, {**c, "GATHER": True, "SEG": True, "MODE": mode, "HAS_RES": res, "NEED_SUMS": True}, rows, warps, 90), flush=True)
