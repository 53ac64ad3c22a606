"""What kohakumoss-doctor says about multi-GPU training: backends (NCCL, gloo), P2P access, the topology.

`probe()` reads the machine; `checks()` is a pure function of its answer (tests fake any machine).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field


@dataclass
class DistInfo:
    gloo: bool = False
    nccl: str | None = None  # NCCL version torch was built with; None: no NCCL backend
    p2p: list[list[bool]] = field(default_factory=list)  # p2p[i][j]: GPU i can access GPU j directly
    links: dict[tuple[int, int], str] = field(default_factory=dict)  # (i, j) -> nvidia-smi topo link


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """(i, j) -> link ('NV18', 'PIX', 'SYS', ...) from `nvidia-smi topo -m`, GPU pairs only."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split()
    gpus = [h for h in header if h.startswith("GPU") and h[3:].isdigit()]
    links = {}
    for ln in lines[1:]:
        cells = ln.split("\t") if "\t" in ln else ln.split()
        cells = [c.strip() for c in cells]
        if not cells or not cells[0].startswith("GPU") or not cells[0][3:].isdigit():
            continue
        i = int(cells[0][3:])
        for col, cell in zip(gpus, cells[1:]):
            j = int(col[3:])
            if i < j:
                links[(i, j)] = cell
    return links


def probe() -> DistInfo:
    import torch
    import torch.distributed as dist

    info = DistInfo(gloo=dist.is_available() and dist.is_gloo_available())
    if dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available():
        version = torch.cuda.nccl.version()
        info.nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        info.p2p = [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(n)] for i in range(n)]
    exe = shutil.which("nvidia-smi")
    if exe and len(info.p2p) > 1:
        try:
            out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=15).stdout
            info.links = parse_topology(out)
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def checks(info: DistInfo, gpus: int) -> list[tuple[str, bool, str, str]]:
    """(name, ok, detail, fix) rows; none blocks training on one GPU."""
    rows = []
    backends = [b for b, ok in (("gloo", info.gloo), (f"nccl {info.nccl}", info.nccl)) if ok]
    if gpus > 1:
        ok = info.nccl is not None
        fix = (
            ""
            if ok
            else "DISTRIBUTED on GPUs needs NCCL: torch's CUDA build on Linux (see the install guide)"
        )
        rows.append(("distributed backends", ok, ", ".join(backends) or "none", fix))
    else:
        why = "no GPU: DISTRIBUTED runs CPU workers on gloo" if gpus == 0 else "1 GPU: nothing to spread over"
        rows.append(
            ("distributed backends", info.gloo or gpus == 1, f"{', '.join(backends) or 'none'} ({why})", "")
        )
    if gpus > 1 and info.p2p:
        missing = [
            f"{i}-{j}"
            for i in range(len(info.p2p))
            for j in range(i + 1, len(info.p2p))
            if not info.p2p[i][j]
        ]
        detail = "every GPU pair" if not missing else f"no peer access between GPUs {', '.join(missing)}"
        fix = (
            ""
            if not missing
            else "NCCL then goes through host memory: all-reduce is slower (check the BIOS/IOMMU and ACS settings)"
        )
        rows.append(("gpu p2p", not missing, detail, fix))
    if gpus > 1 and info.links:
        kinds: dict[str, int] = {}
        for link in info.links.values():
            kinds[link] = kinds.get(link, 0) + 1
        detail = (
            ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) + f" over {len(info.links)} GPU pairs"
        )
        slow = [k for k in kinds if k in ("SYS", "NODE", "PHB")]
        fix = (
            ""
            if not slow
            else f"{'/'.join(slow)} links cross the CPU: expect slower gradient all-reduce there"
        )
        rows.append(("gpu topology", not slow, detail, fix))
    return rows
