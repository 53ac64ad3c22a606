import sys
sys.path.insert(0, "scripts/bench")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kernel_registers as k
t = k.kernels()
for name in ["rms_norm_bwd", "norm_modulate_bwd", "norm_modulate_bwd_fork", "gated_residual_bwd", "residual_norm_modulate_bwd", "qk_norm_rope_bwd"]:
    fn, sig, c, cf = t[name]
    rows = 16 if "qk" in name else 1
    for warps, cap in [(16, 64), (16, 80), (8, 128), (4, 255), (32, 32), (8, 64)]:
        src = ASTSource(fn=fn, signature=sig, constexprs={**c, "ROWS": rows}, attrs=k.aligned(sig))
        comp = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "maxnreg": cap})
        print(name, rows, warps, "maxnreg", cap, k.ptxas_usage(comp.asm["ptx"], 90), flush=True)
