"""Plain folders: images found recursively, each with an optional sidecar caption file."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from kohakumoss_common.errors import DataError

from ..probe import MISSING_REFERENCE
from ..records import RawItem, RawReference, Unit
from .base import Source
from .files import (
    CAPTION_LIKE,
    DEFAULT_CAPTION_EXTENSIONS,
    DEFAULT_EXTENSIONS,
    UNREADABLE,
    fault_reason,
    find_sidecar,
    normalize_extensions,
    path_fault,
    read_caption_file,
    read_regular,
    readable_name,
    sorted_entries,
    stat_signature,
    walk_images,
)
from .references import ReferenceFolder, check_reference_folder, read_reference_file


class FolderSource(Source):
    kind = "folder"

    def __init__(
        self,
        path: str | Path,
        caption_extension: str | Iterable[str] = DEFAULT_CAPTION_EXTENSIONS,
        extensions: Iterable[str] = DEFAULT_EXTENSIONS,
        recursive: bool = True,
        repeats: int = 1,
        references: str | Path | None = None,
    ):
        super().__init__(path)
        if not self.path.is_dir():
            raise DataError(f"{self.path}: dataset folder does not exist")
        try:
            sorted_entries(self.path)
        except OSError as e:
            raise DataError(f"{self.path}: dataset folder cannot be listed ({type(e).__name__}: {e})") from e
        self.caption_extensions = normalize_extensions(caption_extension)
        self.extensions = normalize_extensions(extensions)
        self.recursive = recursive
        self.repeats = int(repeats)
        # edit training: a folder of reference images mirroring this one (sources/references.py)
        self.references = (
            ReferenceFolder(check_reference_folder(references, self.path).resolve(), self.extensions)
            if references
            else None
        )
        self._stems: dict[Path, set[str]] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_stems": {}}

    def _sibling_stems(self, folder: Path) -> set[str]:
        """Stems of this dataset's images in `folder` (a `<stem>_<n>` among them is no one's reference)."""
        if folder not in self._stems:
            try:
                entries = sorted_entries(folder)
            except OSError:
                entries = []
            self._stems[folder] = {e.stem for e in entries if e.suffix.lower() in self.extensions}
        return self._stems[folder]

    def _reference_files(self, rel: str) -> tuple[list[Path], str]:
        assert self.references is not None
        folder = (self.path / rel).parent
        return self.references.files_for(rel, lambda: self._sibling_stems(folder))

    def _images(self) -> Iterator[tuple[Path, str]]:
        """(image, fault) pairs; a fault is a recorded drop (see `files.walk_images`)."""
        yield from walk_images(self.path, self.extensions, self.recursive)

    def units(self) -> Iterator[Unit]:
        """One unit per image; a tree in which no image has a sidecar of `caption_extension` but captions
        sit beside them under another extension is refused once listed (as a jsonl's missing caption key)."""
        captioned, stems = False, set()
        for image, fault in self._images():
            rel = image.relative_to(self.path).as_posix()
            if fault:
                yield Unit(rel, f"fault:{fault}")
                continue
            sidecar = find_sidecar(image, self.caption_extensions)
            captioned = captioned or sidecar is not None
            stems.add((image.parent, image.stem))
            signature = f"{stat_signature(image, sidecar)}|{sidecar.suffix if sidecar else ''}"
            if self.references is not None:  # a reference added, edited or removed re-reads the image
                refs, problem = self._reference_files(rel)
                signature += f"|refs:{problem or [p.name for p in refs]}|{stat_signature(*refs)}"
            yield Unit(rel, signature)
        if stems and not captioned:
            self._check_caption_extension(stems)

    def _check_caption_extension(self, stems: set[tuple[Path, str]]) -> None:
        others = set(CAPTION_LIKE) - set(self.caption_extensions)
        found = sorted(
            {
                entry.suffix.lower()
                for folder in {parent for parent, _ in stems}
                for entry in sorted_entries(folder)
                if entry.suffix.lower() in others and (folder, entry.stem) in stems
            }
        )
        if found:
            raise DataError(
                f"{self.path}: no image has a caption file ending in {list(self.caption_extensions)} (setting "
                f"caption_extension), but caption files beside them end in {found}: set caption_extension to it"
            )

    def repeats_for(self, rel: str) -> int:
        return self.repeats

    def expand(self, unit_id: str) -> Iterator[RawItem]:
        image = self.path / unit_id
        fault = path_fault(image)
        key = readable_name(unit_id)  # a name that is not UTF-8 is a drop, named readably in the report
        item = RawItem(
            key=key, unit=unit_id, locator=key, data=None, captions=None, name=readable_name(image.stem)
        )
        if fault:
            yield replace(item, fault=(fault, fault_reason(image, fault)))
            return
        try:
            sidecar = find_sidecar(image, self.caption_extensions)
            captions = [read_caption_file(sidecar)] if sidecar is not None else None
            data = read_regular(image)
        except OSError as e:  # vanished or unreadable since listing
            yield replace(item, fault=(UNREADABLE, f"{type(e).__name__}: {e}"))
            return
        item = replace(item, data=data, captions=captions, repeats=self.repeats_for(unit_id))
        if self.references is not None:
            refs, problem = self._reference_files(unit_id)
            if problem:
                item = replace(item, fault=(MISSING_REFERENCE, problem))
            else:
                item.references = [self._read_reference(p) for p in refs]
        yield item

    @staticmethod
    def _read_reference(path: Path) -> RawReference:
        """A reference file's bytes (None: it vanished); one that cannot be read is the probe's `bad_reference`."""
        return read_reference_file(path, str(path), readable_name(path))

    def read_reference(self, locator: str) -> bytes:
        return read_regular(Path(locator))

    def read(self, locator: str) -> bytes:
        return read_regular(self.path / locator)

    def spec(self) -> dict:
        return {
            **super().spec(),
            "captions": self.caption_extensions,
            "extensions": self.extensions,
            "recursive": self.recursive,
            "repeats": self.repeats,
            **({"references": str(self.references.root)} if self.references is not None else {}),
        }
