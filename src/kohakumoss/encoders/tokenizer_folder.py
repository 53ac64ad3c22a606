"""Where a tokenizer folder is: one holding tokenizer.json or tokenizer_config.json, looked for under a
folder (a ComfyUI `text_encoders/`, whose Comfy-Org text encoder file holds no tokenizer)."""

from __future__ import annotations

from pathlib import Path

TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json")


def find_tokenizer(folder: Path, depth: int = 3) -> Path | None:
    """A tokenizer folder at most `depth` levels under `folder`; names with 'tokenizer' first, then the
    shallowest, then by name."""
    if not folder.is_dir():
        return None
    found = [
        marker.parent
        for level in range(1, depth + 1)
        for name in TOKENIZER_MARKERS
        for marker in folder.glob("/".join(["*"] * level) + "/" + name)
    ]
    found = sorted(set(found), key=lambda p: ("tokenizer" not in p.name.lower(), len(p.parts), str(p)))
    return found[0] if found else None
