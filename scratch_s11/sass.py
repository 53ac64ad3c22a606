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
for mode, seg in [(0, True), (9, True), (0, False)]:
    src = ASTSource(fn=nm_exp._nm_bwd_exp, signature=sig3, constexprs={**c, "ROWS": 1, "GATHER": True, "SEG": seg, "MODE": mode, "HAS_RES": False, "NEED_SUMS": True}, attrs=k.aligned(sig3))
    comp = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 16})
    with tempfile.TemporaryDirectory() as t:
        p = os.path.join(t, "k.cubin"); Path(p).write_bytes(comp.asm["cubin"])
        sass = subprocess.run([str(bin_dir / "cuobjdump"), "-sass", p], capture_output=True, text=True).stdout
    ins = [l for l in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]+\*/", l)]
    cnt = lambda pat: sum(1 for l in ins if re.search(pat, l))
    print(f"mode {mode} seg {seg}: {len(ins)} instr, BAR {cnt(r'BAR')}, LDG {cnt(r'LDG')}, STG {cnt(r'STG')}, "
          f"LDS {cnt(r'LDS')}, STS {cnt(r'STS')}, RED/ATOM {cnt(r'RED|ATOM')}, LDL/STL {cnt(r'LDL|STL')}, SHFL {cnt(r'SHFL')}, BRA {cnt(r'BRA')}")
    Path(f"/tmp/sass_mode{mode}_{seg}.txt").write_text(sass)
