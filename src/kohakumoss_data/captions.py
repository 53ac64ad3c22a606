"""Caption bytes -> text, and what to do when an image has none (the scan's missing_caption setting)."""

from __future__ import annotations

from kohakumoss_common.errors import ConfigError

from .records import OK

MISSING_POLICIES = ("error", "empty", "filename")
# A caption longer than this is not a caption (a log or a dump named .txt): it is dropped before it is
# decoded or tokenised, which for a 50 MB file took over 4 GiB. Far above any real caption's few KiB.
MAX_CAPTION_BYTES = 64 * 1024
TOO_LARGE = "too_large"


def check_policy(policy: str) -> str:
    if policy not in MISSING_POLICIES:
        raise ConfigError("missing_caption", f"must be one of {MISSING_POLICIES}, got {policy!r}")
    return policy


def decode_captions(raw: list[bytes] | None) -> tuple[list[str], str]:
    """(captions, status): status is ok, missing, not_utf8 or too_large (a caption over MAX_CAPTION_BYTES,
    never decoded); blank lines are dropped."""
    if raw is None:
        return [], "missing"
    if any(len(blob) > MAX_CAPTION_BYTES for blob in raw):
        return [], TOO_LARGE
    out = []
    for blob in raw:
        try:
            text = blob.decode("utf-8-sig").strip()
        except UnicodeDecodeError:
            return [], "not_utf8"
        if text:
            out.append(text)
    return out, OK if out else "missing"


def filename_caption(name: str) -> str:
    """kohya's fallback: the file stem with underscores as spaces."""
    return name.replace("_", " ").strip()


def apply_missing_policy(captions: list[str], status: str, name: str, policy: str) -> list[str]:
    """The captions an item trains with once the missing_caption policy is applied."""
    if status != "missing":
        return captions
    if policy == "filename":
        return [filename_caption(name)]
    return [""]
