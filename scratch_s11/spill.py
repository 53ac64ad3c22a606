import re, subprocess, sys, tempfile, os
sys.path.insert(0, "scripts/bench"); sys.path.insert(0, "scratch_s11")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kernel_registers as k
import nm_exp
from pathlib import Path
fn, sig, c, cf = k.kernels()["norm_modulate_bwd"]
sig3 = dict(list(sig.items()) + [("GATHER", "constexpr"), ("SEG", "constexpr"), ("MODE", "constexpr")])
bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
src = ASTSource(fn=nm_exp._nm_bwd_exp, signature=sig3, constexprs={**c, "ROWS": 1, "GATHER": True, "SEG": True, "MODE": 0, "HAS_RES": False, "NEED_SUMS": True}, attrs=k.aligned(sig3))
comp = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 16, "maxnreg": 64})
with tempfile.TemporaryDirectory() as t:
    p = os.path.join(t, "k.cubin"); Path(p).write_bytes(comp.asm["cubin"])
    sass = subprocess.run([str(bin_dir / "cuobjdump"), "-sass", p], capture_output=True, text=True).stdout
Path("/tmp/sass_m0cap.txt").write_text(sass)
for l in sass.splitlines():
    if re.search(r"BRA|LDL|STL|BAR\.SYNC|LDG|STG|RED|ATOM", l):
        print(l.strip()[:90])
