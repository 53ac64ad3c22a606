import sys
sys.path.insert(0, "scripts/bench"); sys.path.insert(0, "scratch_s11")
import kernel_registers as k
import nm_exp
fn, sig, c, cf = k.kernels()["norm_modulate_bwd"]
sig = dict(list(sig.items()) + [("GATHER", "constexpr"), ("SEG", "constexpr"), ("MODE", "constexpr")])
for res in (False, True):
    for sums in (True, False):
        for rows, warps in [(1, 16), (1, 32), (2, 32)]:
            print("old", rows, warps, "fork" if res else "", "sums" if sums else "", k.usage(nm_exp._nm_bwd_exp, sig, {**c, "GATHER": True, "SEG": True, "MODE": 0, "HAS_RES": res, "NEED_SUMS": sums}, rows, warps, 90), flush=True)
t = k.kernels()
for name in ['norm_modulate_bwd','norm_modulate_bwd_fork', 'rms_norm_bwd', 'residual_norm_modulate_bwd', 'gated_residual_bwd']:
    fn,sig,c,cf=t[name]
    for r,w in [(1,32),(2,32)]:
        print("cur", name, r, w, k.usage(fn,sig,c,r,w,90), flush=True)
