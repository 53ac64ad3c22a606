"""A grid of sampled images: rows with a label on the left, captions above the columns."""

from __future__ import annotations

from PIL import Image, ImageDraw


def grid(rows: list[tuple[str, list[Image.Image]]], captions: list[str], cell: int = 256) -> Image.Image:
    """Rows of images (label on the left), prompts above the columns; cells scaled to `cell` px wide."""
    label_w, head_h = 110, 28
    ncols = max(len(r[1]) for r in rows)
    heights = [max(int(im.height * cell / im.width) for im in imgs) for _, imgs in rows]
    canvas = Image.new("RGB", (label_w + ncols * cell, head_h + sum(heights)), "white")
    draw = ImageDraw.Draw(canvas)
    for c, text in enumerate(captions):
        draw.text((label_w + c * cell + 4, 6), text[: cell // 7], fill="black")
    y = head_h
    for (label, imgs), h in zip(rows, heights):
        draw.text((6, y + h // 2 - 6), label, fill="black")
        for c, im in enumerate(imgs):
            canvas.paste(im.resize((cell, int(im.height * cell / im.width))), (label_w + c * cell, y))
        y += h
    return canvas
