import sys
sys.path.insert(0, "scripts/bench"); sys.path.insert(0, "scratch_s11")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kernel_registers as k
import nm_exp
fn, sig, c, cf = k.kernels()["norm_modulate_bwd"]
sig3 = dict(list(sig.items()) + [("GATHER", "constexpr"), ("SEG", "constexpr"), ("MODE", "constexpr")])
def use(mode, res, warps, cap, sums=True):
    src = ASTSource(fn=nm_exp._nm_bwd_exp, signature=sig3, constexprs={**c, "ROWS": 1, "GATHER": True, "SEG": True, "MODE": mode, "HAS_RES": res, "NEED_SUMS": sums}, attrs=k.aligned(sig3))
    comp = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "maxnreg": cap})
    return k.ptxas_usage(comp.asm["ptx"], 90)
for mode in map(int, sys.argv[1:]):
    for res in (False, True):
        for warps, cap in [(16, None)]:
            print("mode", mode, "fork" if res else "    ", warps, cap, use(mode, res, warps, cap), flush=True)
