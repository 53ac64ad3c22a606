"""Check one image while scanning: size, content hash, and the reason it cannot be used, if any."""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from kohakumoss_common.hashing import sha256_bytes

from .decode import open_image, swaps_sides
from .records import OK

ZERO_BYTE = "zero_byte"
CORRUPT = "corrupt"
TRUNCATED = "truncated"
UNSUPPORTED = "unsupported_format"
BOMB = "decompression_bomb"
TOO_SMALL = "too_small"
CAPTION_NOT_UTF8 = "caption_not_utf8"
CAPTION_TOO_LARGE = "caption_too_large"
MISSING_CAPTION = "missing_caption"
MISSING_REFERENCE = "missing_reference"  # the dataset's `references` names no file (or field) for it
BAD_REFERENCE = "bad_reference"  # a reference file exists but cannot be read or decoded
DROP_REASONS = (
    ZERO_BYTE,
    CORRUPT,
    TRUNCATED,
    UNSUPPORTED,
    BOMB,
    TOO_SMALL,
    CAPTION_NOT_UTF8,
    CAPTION_TOO_LARGE,
    MISSING_CAPTION,
    MISSING_REFERENCE,
    BAD_REFERENCE,
)

# JPEG draft mode decodes at 1/8 scale: every byte is still read, so truncation is still caught.
_DRAFT_SIZE = (64, 64)


@dataclass(frozen=True)
class Probe:
    width: int
    height: int
    hash: str
    status: str = OK
    reason: str = ""


def probe_bytes(data: bytes, max_pixels: int) -> Probe:
    """Fully decode `data` once (cheaply) to prove it is usable; never raises for bad images."""
    if len(data) == 0:
        return Probe(0, 0, "", ZERO_BYTE, "file is empty")
    digest = sha256_bytes(data)
    try:
        image = open_image(data, max_pixels)
    except Image.DecompressionBombError as e:
        return Probe(0, 0, digest, BOMB, str(e))
    except UnidentifiedImageError as e:
        return Probe(0, 0, digest, UNSUPPORTED, str(e))
    except Exception as e:  # Pillow raises many types for malformed headers
        return Probe(0, 0, digest, CORRUPT, f"{type(e).__name__}: {e}")
    # Pixels load before the EXIF is read: Pillow's PNG EXIF lookup loads them and a failure
    # there would be swallowed, leaving a broken IDAT to pass as ok.
    width, height = image.size
    try:
        if image.format == "JPEG":
            image.draft("RGB", _DRAFT_SIZE)
        image.load()
    except Exception as e:
        reason = TRUNCATED if "truncated" in str(e).lower() else CORRUPT
        return Probe(width, height, digest, reason, f"{type(e).__name__}: {e}")
    if swaps_sides(image):
        width, height = height, width
    return Probe(width, height, digest)
