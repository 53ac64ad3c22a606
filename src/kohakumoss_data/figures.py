"""PNG figures for inspect_data, drawn with Pillow: a bar histogram and a contact sheet of planned crops."""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image, ImageDraw

_BG, _FG, _BAR = (255, 255, 255), (20, 20, 20), (70, 110, 200)


def histogram_png(title: str, counts: dict[str, int], width: int = 800, bar_h: int = 22) -> Image.Image:
    """Horizontal bars, one per label, with counts."""
    rows = list(counts.items()) or [("(none)", 0)]
    height = 40 + bar_h * len(rows)
    image = Image.new("RGB", (width, height), _BG)
    draw = ImageDraw.Draw(image)
    draw.text((10, 10), title, fill=_FG)
    top = max(n for _, n in rows) or 1
    for i, (label, n) in enumerate(rows):
        y = 34 + i * bar_h
        draw.text((10, y + 4), label, fill=_FG)
        length = int((width - 220) * n / top)
        draw.rectangle((140, y + 2, 140 + length, y + bar_h - 4), fill=_BAR)
        draw.text((150 + length, y + 4), str(n), fill=_FG)
    return image


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
