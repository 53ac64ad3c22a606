"""Run a Python module under a CUDA memory cap, as a card of that size would hold it (for a peer trainer
that has no cap of its own).

    python scripts/bench/peer_path/capped_run.py CAP_GIB -m kohakuengine.cli run scripts/train/moss.py ...

CAP_GIB 0: no cap. The cap is torch's per-process fraction of device 0 (what this project's CARD_GB sets).
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    cap, flag, module, *rest = sys.argv[1:]
    if flag != "-m":
        raise SystemExit("usage: capped_run.py CAP_GIB -m MODULE [ARGS...]")
    if float(cap) > 0:
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, float(cap) * 2**30 / total), 0)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
