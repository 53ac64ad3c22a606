"""Reference images of edit training (a dataset entry's `references` option), found by the target's stem.

Folder sources: `references` is a folder mirroring the dataset's sub-folders; the references of
`<sub>/<stem>.<ext>` are `<references>/<sub>/<stem>.<any image ext>`, then `<stem>_<n>.<ext>` in the
order of n (1, 2, ...). A `<stem>_<n>` that is itself an image of the dataset's folder is that image's
reference, never another's. Record sources (jsonl, parquet, webdataset) name their references in a
field instead (`references_of`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kohakumoss_common.errors import DataError

from ..records import RawReference
from .files import read_regular, readable_name, sorted_entries

_NUMBERED = re.compile(r"^(.*)_(\d+)$")


def check_reference_folder(root: str | Path, dataset: Path) -> Path:
    """The `references` folder of a folder dataset, refused by name when it is not one."""
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise DataError(f"{dataset}: references folder {folder} does not exist (dataset option 'references')")
    return folder


class ReferenceFolder:
    """Finds each image's reference files in one folder tree; listings are read once per sub-folder."""

    def __init__(self, root: Path, extensions: tuple[str, ...]):
        self.root = root
        self.extensions = extensions
        self._listings: dict[Path, dict[str, list[Path]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_listings": {}}  # a worker lists again: files may have changed

    def _by_stem(self, folder: Path) -> dict[str, list[Path]]:
        if folder not in self._listings:
            found: dict[str, list[Path]] = {}
            try:
                entries = sorted_entries(folder) if folder.is_dir() else []
            except OSError:
                entries = []
            for entry in entries:
                if entry.suffix.lower() in self.extensions and not entry.name.startswith("."):
                    found.setdefault(entry.stem, []).append(entry)
            self._listings[folder] = found
        return self._listings[folder]

    def files_for(self, rel: str, siblings: Callable[[], set[str]]) -> tuple[list[Path], str]:
        """(reference files in order, "" or why they cannot be used) of the image at `rel` (relative to the
        dataset); `siblings()`: the stems of the dataset's images in the same folder (asked only when a
        `<stem>_<n>` file could be one of them)."""
        rel_path = Path(rel)
        folder = self.root / rel_path.parent
        stem, listing = rel_path.stem, self._by_stem(folder)
        slots: list[tuple[int, str]] = [(0, stem)] if stem in listing else []
        numbered = [(int(m.group(2)), n) for n in listing if (m := _NUMBERED.match(n)) and m.group(1) == stem]
        if numbered:
            others = siblings() - {stem}
            slots += [(n, name) for n, name in numbered if name not in others]
        files = []
        for _, name in sorted(slots):
            if len(listing[name]) > 1:
                shown = ", ".join(readable_name(p.name) for p in listing[name])
                return [], f"several reference files for one place in {readable_name(folder)}: {shown}"
            files.append(listing[name][0])
        if not files:
            where = readable_name(folder / stem)
            return [], f"no reference image {where}.<ext> or {where}_<n>.<ext>"
        return files, ""


def references_of(value: Any) -> list[Any]:
    """A record's references field (one entry or a list) as a list (empty: none given)."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def read_reference_file(path: Path, locator: Any, name: str) -> RawReference:
    """A reference file's bytes (None: it does not exist); one that cannot be read carries why."""
    try:
        return RawReference(locator, read_regular(path), name)
    except FileNotFoundError:
        return RawReference(locator, None, name)
    except (OSError, DataError) as e:  # a permission, a FIFO (never opened), a folder
        return RawReference(
            locator, None, name, f"cannot be read ({type(e).__name__}: {getattr(e, 'strerror', None) or e})"
        )
