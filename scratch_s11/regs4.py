import sys
sys.path.insert(0, "scripts/bench"); sys.path.insert(0, "scratch_s11")
import kernel_registers as k
import nm_exp
fn, sig, c, cf = k.kernels()["norm_modulate_bwd"]
sig = dict(list(sig.items()) + [("HOLD", "constexpr"), ("EMIT", "constexpr")])
for hold in (True, False):
    for emit in (True, False):
        for sums in (True, False):
            for res in (False, True):
                print("seg hold", hold, "emit", emit, "sums", sums, "fork" if res else "", k.usage(nm_exp._nm_bwd_seg, sig, {**c, "HOLD": hold, "EMIT": emit, "HAS_RES": res, "NEED_SUMS": sums}, 1, 16, 90), flush=True)
