"""A grid of sampled images: rows with a label on the left, wrapped captions above the columns.

Every image is scaled by one factor (the widest one fills `cell` px), so a tall sample stays as wide as
a square one of its width and sizes compare as drawn; a column is as wide as its widest image (at
least `cell / 2`, room for its caption), and images narrower than their column sit at its left.
Drawn with Pillow: torchvision's `make_grid` stacks equal-sized tensors (every cell one size) and
writes no text, so it can keep neither the relative sizes nor the captions.
"""

from __future__ import annotations

import textwrap

from PIL import Image, ImageDraw, ImageFont

_PAD = 6


def _font() -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=13)  # Pillow >= 10.1: a scalable font
    except TypeError:
        return ImageFont.load_default()


def _wrap(draw: ImageDraw.ImageDraw, text: str, width: int, font) -> list[str]:
    """`text` in lines of at most `width` px (its own line breaks kept), never cut."""
    em = max(1.0, draw.textlength("abcdefghijklmnopqrstuvwxyz", font=font) / 26)
    chars = max(4, int(width / em))
    while True:
        lines = [line for para in text.split("\n") for line in (textwrap.wrap(para, chars) or [""])]
        if chars == 1 or all(draw.textlength(line, font=font) <= width for line in lines):
            return lines
        chars -= 1  # wide glyphs: wrap tighter


def grid(rows: list[tuple[str, list[Image.Image]]], captions: list[str], cell: int = 256) -> Image.Image:
    """Rows of images (label on the left), full captions above the columns, all at one scale."""
    font = _font()
    scratch = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    ncols = max(len(r[1]) for r in rows)
    widest = max(im.width for _, imgs in rows for im in imgs)
    scale = cell / widest
    col_w = [
        max([cell // 2] + [max(1, round(imgs[c].width * scale)) for _, imgs in rows if c < len(imgs)])
        for c in range(ncols)
    ]
    line_h = int(sum(font.getbbox("Ag")[1::2])) + 3
    wrapped = [_wrap(scratch, text, w - 2 * _PAD, font) for text, w in zip(captions, col_w)]
    head_h = 2 * _PAD + line_h * max([len(w) for w in wrapped] or [0])
    label_w = 2 * _PAD + max(int(scratch.textlength(label, font=font)) for label, _ in rows)
    heights = [max(max(1, round(im.height * scale)) for im in imgs) for _, imgs in rows]
    canvas = Image.new("RGB", (label_w + sum(col_w), head_h + sum(heights)), "white")
    draw = ImageDraw.Draw(canvas)
    x = label_w
    for lines, w in zip(wrapped, col_w):
        for i, line in enumerate(lines):
            draw.text((x + _PAD, _PAD + i * line_h), line, fill="black", font=font)
        x += w
    y = head_h
    for (label, imgs), h in zip(rows, heights):
        draw.text((_PAD, y + h // 2 - line_h // 2), label, fill="black", font=font)
        x = label_w
        for im, w in zip(imgs, col_w):
            size = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
            canvas.paste(im.resize(size, Image.Resampling.LANCZOS) if size != im.size else im, (x, y))
            x += w
        y += h
    return canvas
