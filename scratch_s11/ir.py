import sys
sys.path.insert(0, "scripts/bench"); sys.path.insert(0, "scratch_s11")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kernel_registers as k
import nm_exp
fn, sig, c, cf = k.kernels()["norm_modulate_bwd"]
sig3 = dict(list(sig.items()) + [("GATHER", "constexpr"), ("SEG", "constexpr"), ("MODE", "constexpr")])
for mode in (6, 9):
    src = ASTSource(fn=nm_exp._nm_bwd_exp, signature=sig3, constexprs={**c, "ROWS": 1, "GATHER": True, "SEG": True, "MODE": mode, "HAS_RES": False, "NEED_SUMS": True}, attrs=k.aligned(sig3))
    comp = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 16})
    open(f"/tmp/ttgir{mode}.txt", "w").write(comp.asm["ttgir"])
    open(f"/tmp/ptx{mode}.txt", "w").write(comp.asm["ptx"])
