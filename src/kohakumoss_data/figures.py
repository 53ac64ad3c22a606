"""PNG figures for inspect_data: a bar histogram (matplotlib) and a contact sheet of planned crops (Pillow)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

_BG, _FG, _BAR = (255, 255, 255), (20, 20, 20), (70, 110, 200)


def histogram_png(title: str, counts: dict[str, int], width: int = 800, bar_h: int = 22) -> Image.Image:
    """Horizontal bars, one per label, with counts: matplotlib's (Agg canvas: no display, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    rows = list(counts.items()) or [("(none)", 0)]
    dpi = 100
    fig = Figure(figsize=(width / dpi, (90 + bar_h * len(rows)) / dpi), dpi=dpi, layout="constrained")
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels, values = [label for label, _ in rows][::-1], [n for _, n in rows][::-1]  # first row on top
    bars = ax.barh(labels, values, color=[c / 255 for c in _BAR])
    ax.bar_label(bars, padding=3, fontsize="small")
    ax.set_title(title, fontsize="medium", loc="left")
    ax.set_xlabel("items")
    ax.set_xlim(0, max(values + [1]) * 1.12)  # room for the count beside the longest bar
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # counts
    ax.tick_params(axis="y", labelsize="small")
    canvas.draw()
    return Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3].copy())


def contact_sheet(tiles: Sequence[tuple[Image.Image, str]], tile: int = 192, columns: int = 4) -> Image.Image:
    """Thumbnails (fit inside `tile` px) with a label under each."""
    rows = max(1, (len(tiles) + columns - 1) // columns)
    sheet = Image.new("RGB", (columns * tile, rows * (tile + 18)), _BG)
    draw = ImageDraw.Draw(sheet)
    for i, (image, label) in enumerate(tiles):
        thumb = image.copy()
        thumb.thumbnail((tile - 8, tile - 8))
        x, y = (i % columns) * tile, (i // columns) * (tile + 18)
        sheet.paste(thumb, (x + (tile - thumb.width) // 2, y + (tile - thumb.height) // 2))
        draw.text((x + 4, y + tile), label[:30], fill=_FG)
    return sheet
