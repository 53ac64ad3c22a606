import sys
sys.path.insert(0, "scripts/bench"); sys.path.insert(0, "scratch_s11")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kernel_registers as k
import nm_exp
fn, sig, c, cf = k.kernels()["norm_modulate_bwd"]
sig2 = dict(list(sig.items()) + [("HOLD", "constexpr"), ("EMIT", "constexpr")])
sig3 = dict(list(sig.items()) + [("GATHER", "constexpr"), ("SEG", "constexpr"), ("MODE", "constexpr")])
def use(f, s, consts, rows, warps, cap):
    src = ASTSource(fn=f, signature=s, constexprs={**consts, "ROWS": rows}, attrs=k.aligned(s))
    comp = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "maxnreg": cap})
    return k.ptxas_usage(comp.asm["ptx"], 90)
for hold in (True, False):
    for res in (False, True):
        for warps, cap in [(16, 64), (8, 128), (4, None)]:
            print("seg hold", hold, "fork" if res else "", warps, cap, use(nm_exp._nm_bwd_seg, sig2, {**c, "HOLD": hold, "EMIT": True, "HAS_RES": res, "NEED_SUMS": True}, 1, warps, cap), flush=True)
for res in (False, True):
    for warps, cap in [(16, 64), (8, 128)]:
        print("m9", "fork" if res else "", warps, cap, use(nm_exp._nm_bwd_exp, sig3, {**c, "GATHER": True, "SEG": True, "MODE": 9, "HAS_RES": res, "NEED_SUMS": True}, 1, warps, cap), flush=True)
