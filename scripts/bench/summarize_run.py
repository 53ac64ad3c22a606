"""Print a run's median throughput and peak memory from its metrics.jsonl (steps after warm-up).

python scripts/bench/summarize_run.py RUN_DIR [WARMUP_STEPS]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main() -> None:
    run, warmup = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    late = [r for r in rows if r["step"] > warmup] or rows
    print(
        f"run {run}: {len(rows)} steps logged, first loss {rows[0]['loss']:.4f}, last loss {rows[-1]['loss']:.4f}"
    )
    for key in ("samples_per_s", "tokens_per_s", "step_s"):
        print(f"  median {key} (steps > {warmup}): {statistics.median(r[key] for r in late):.3f}")
    print(f"  peak memory (max over steps): {max(r['peak_mem_gib'] for r in rows):.2f} GiB")
    print(f"  checkpoints: {sorted(p.name for p in (run / 'checkpoints').iterdir())}")
    print(f"  exports: {sorted(p.name for p in (run / 'export').iterdir())}")


if __name__ == "__main__":
    main()
