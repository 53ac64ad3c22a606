import sys
sys.path.insert(0, "scripts/bench"); sys.path.insert(0, "scratch_s11")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kernel_registers as k
import nm_exp
fn, sig, c, cf = k.kernels()["norm_modulate_bwd"]
sig3 = dict(list(sig.items()) + [("GATHER", "constexpr"), ("SEG", "constexpr"), ("MODE", "constexpr")])
for mode, seg in [(0, True), (9, True)]:
    src = ASTSource(fn=nm_exp._nm_bwd_exp, signature=sig3, constexprs={**c, "ROWS": 1, "GATHER": True, "SEG": seg, "MODE": mode, "HAS_RES": False, "NEED_SUMS": True}, attrs=k.aligned(sig3))
    comp = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 16, "maxnreg": 64})
    print(mode, "shared bytes", comp.metadata.shared)
fn, sig, c, cf = k.kernels()["rms_norm_bwd"]
src = ASTSource(fn=fn, signature=sig, constexprs={**c, "ROWS": 1}, attrs=k.aligned(sig))
comp = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 16})
print("rms", "shared bytes", comp.metadata.shared)
