"""Decoding unusual images correctly, and probing bad ones into a reason instead of a crash."""

from __future__ import annotations

import numpy as np
from PIL import Image

from kohakumoss_data.decode import decode_rgb
from kohakumoss_data.probe import probe_bytes

from .helpers import encoded, make_broken


def _mean_abs(a: Image.Image, b: Image.Image) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float32) - np.asarray(b, dtype=np.float32)).mean())


def test_unusual_modes_decode_to_upright_rgb(photos, tmp_path):
    photo = photos[0]  # 320x240
    make_broken(tmp_path, photo)
    cmyk = decode_rgb((tmp_path / "cmyk.jpg").read_bytes())
    assert cmyk.mode == "RGB" and _mean_abs(cmyk, photo) < 12
    gray16 = decode_rgb((tmp_path / "gray16.png").read_bytes())
    assert (
        gray16.mode == "RGB" and _mean_abs(gray16, photo.convert("L").convert("RGB")) < 1.5
    )  # scaled, not clipped
    rotated = decode_rgb((tmp_path / "rotated.jpg").read_bytes())
    assert rotated.size == (240, 320)
    expect = photo.transpose(Image.Transpose.ROTATE_270)  # orientation 6 = 90 degrees clockwise
    assert _mean_abs(rotated, expect) < 6 < _mean_abs(rotated, photo.transpose(Image.Transpose.ROTATE_90))
    alpha = decode_rgb((tmp_path / "alpha.png").read_bytes())  # half transparent over white: brighter
    assert alpha.mode == "RGB" and np.asarray(alpha).mean() > np.asarray(photo).mean() + 20
    palette = decode_rgb((tmp_path / "palette.png").read_bytes())
    assert palette.mode == "RGB" and palette.size == photo.size


def test_probe_reasons(photos, tmp_path):
    expected = make_broken(tmp_path, photos[1])
    for name in ("truncated.jpg", "empty.jpg", "text.png"):
        assert probe_bytes((tmp_path / name).read_bytes(), 10**8).status == expected[name], name
    rotated = probe_bytes((tmp_path / "rotated.jpg").read_bytes(), 10**8)
    assert (rotated.status, rotated.width, rotated.height) == ("ok", 320, 240)  # photos[1] is 240x320
    bomb = probe_bytes(encoded(photos[1], "PNG"), max_pixels=100 * 100)
    assert bomb.status == "decompression_bomb"
    good = probe_bytes(encoded(photos[1], "WEBP"), 10**8)
    assert good.status == "ok" and len(good.hash) == 64
