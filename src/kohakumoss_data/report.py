"""What inspect_data prints: items kept and dropped, size and aspect histograms, tokens per step."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path

from kohakumoss_common.io import atomic_write_text

from .catalog import Catalog
from .plan import Plan
from .records import OK

ASPECT_BINS = (0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 1.1, 1.34, 1.67, 2.0, 2.5, 4.0)


def aspect_bin(aspect: float) -> tuple[int, str]:
    """(bin index, readable label like '0.75-0.9') for width/height."""
    edges = (0.0, *ASPECT_BINS)
    for i in range(1, len(edges)):
        if aspect < edges[i]:
            return i, f"{edges[i - 1]:g}-{edges[i]:g}" if i > 1 else f"<{edges[i]:g}"
    return len(edges), f">={ASPECT_BINS[-1]:g}"


def aspect_histogram(catalog: Catalog) -> dict[str, int]:
    """Usable items per aspect bin, narrow to wide."""
    counts = Counter(aspect_bin(it.width / it.height) for it in catalog.usable)
    return {label: n for (_, label), n in sorted(counts.items())}


def resolution_histogram(plan: Plan, epoch: int = 0) -> dict[str, int]:
    """Planned target sizes ('WxH') in one epoch, most common first."""
    counts = Counter(
        f"{it.target[0]}x{it.target[1]}" for step in plan.steps for it in step if it.epoch == epoch
    )
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def token_stats(plan: Plan) -> tuple[int, float, int]:
    tokens = plan.step_tokens()
    return min(tokens), statistics.median(tokens), max(tokens)


def _bar(count: int, top: int, width: int = 30) -> str:
    return "#" * max(1, math.ceil(width * count / top)) if count else ""


def report_lines(catalog: Catalog, plan: Plan) -> list[str]:
    r = catalog.report
    lines = [catalog.report.summary(), f"items kept {r.kept}"]
    lines += [f"items dropped {reason} {n}" for reason, n in sorted(r.dropped.items())] or [
        "items dropped none"
    ]
    lines += dropped_lines(catalog)
    lines.append("aspect (w/h) histogram:")
    hist = aspect_histogram(catalog)
    top = max(hist.values(), default=1)
    lines += [f"  {label:>10} {n:6d} {_bar(n, top)}" for label, n in hist.items()]
    lines.append("planned resolution histogram (epoch 0):")
    res = resolution_histogram(plan)
    top = max(res.values(), default=1)
    lines += [f"  {label:>10} {n:6d} {_bar(n, top)}" for label, n in res.items()]
    lo, mid, hi = token_stats(plan)
    lines.append(f"tokens per step min {lo} median {mid:g} max {hi} (budget {plan.knobs.tokens_per_step})")
    lines.append(f"steps per epoch {plan.epoch_steps} total {len(plan.steps)}")
    lines.append(f"plan sha256 {plan.sha256}")
    return lines


def dropped_rows(catalog: Catalog) -> list[dict[str, str]]:
    """One row per dropped item: its path (the item's key), status and reason."""
    return [
        {"path": it.key, "status": it.status, "reason": it.reason} for it in catalog.items if it.status != OK
    ]


def dropped_lines(catalog: Catalog) -> list[str]:
    """The report's list of dropped files, one `status path: reason` line each."""
    rows = dropped_rows(catalog)
    return ["dropped files:"] + [f"  {r['status']} {r['path']}: {r['reason']}" for r in rows] if rows else []


def write_dropped(path: Path, catalog: Catalog) -> None:
    """`dropped.jsonl`: one JSON object (path, status, reason) per dropped item."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in dropped_rows(catalog))
    atomic_write_text(path, text)
