"""Print fwd / f+b us and % of copy per op for each kernels-bench run dir under a root."""
import json
import sys
from pathlib import Path

root = Path(sys.argv[1])
runs = sorted(p for p in root.iterdir() if (p / "kernels_bench.json").exists())
data = {p.name: json.loads((p / "kernels_bench.json").read_text()) for p in runs}
ops = []
for d in data.values():
    for r in d["rows"]:
        if "fwd_GBps" in r and r["op"] not in ops:
            ops.append(r["op"])
print("run copy GB/s: " + ", ".join(f"{k} {v['ceilings']['copy_GBps']:.0f}" for k, v in data.items()))
print(f"{'op':<28}" + "".join(f"{k:>22}" for k in data))
for op in ops:
    line = f"{op:<28}"
    for d in data.values():
        r = next((r for r in d["rows"] if r["op"] == op and "fwd_GBps" in r), None)
        line += f"{'-':>22}" if r is None else f"{r['fwd_ms']*1e3:6.1f}/{r['fwd_bwd_ms']*1e3:6.1f} {r['fwd_pct_ceiling']:3.0f}/{r['fwd_bwd_pct_ceiling']:3.0f}".rjust(22)
    print(line)
