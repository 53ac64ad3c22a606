"""Parquet files: an image column (bytes, {bytes, path} structs, or paths) and a caption column, both knobs."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kohakumoss_common.errors import DataError

from ..probe import MISSING_REFERENCE
from ..records import RawItem, RawReference, Unit
from .base import Source
from .files import read_regular, stat_signature
from .jsonl import caption_blobs
from .references import references_of


def parquet_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(path.rglob("*.parquet"))
        if files:
            return files
    raise DataError(f"{path}: no parquet file here")


BROKEN_PARQUET = "broken_parquet"
PARQUET_ERRORS = (pa.ArrowException, OSError)  # ArrowInvalid: not parquet, cut short, a bad page


def check_columns(file: Path, schema: pa.Schema, columns: dict[str, str]) -> None:
    """Raise naming the knob and the column when a configured column is absent."""
    for knob, column in columns.items():
        if column and column not in schema.names:
            raise DataError(f"{file}: no column '{column}' (knob {knob}); columns are {schema.names}")


class ParquetSource(Source):
    kind = "parquet"

    def __init__(
        self,
        path: str | Path,
        image_column: str = "image",
        caption_column: str = "caption",
        image_root: str | Path | None = None,
        references: str | None = None,
    ):
        super().__init__(path)
        self.image_column = image_column
        self.caption_column = caption_column
        self.references = references or None  # edit training: the column of each row's reference image(s)
        self.image_root = (
            Path(image_root) if image_root else (self.path if self.path.is_dir() else self.path.parent)
        )
        self._files = parquet_files(self.path)
        for file in self._files:
            try:
                schema = pq.read_schema(file)
            except PARQUET_ERRORS:
                continue  # a broken file is the scan's named drop (expand), not a refusal of the rest
            check_columns(file, schema, self._columns())
        self._handle: dict[str, tuple[pq.ParquetFile, list[int]]] = {}
        self._group: tuple[str, int, str, pa.Table] | None = None

    def _columns(self) -> dict[str, str]:
        columns = {"image_column": self.image_column, "caption_column": self.caption_column}
        return columns | ({"references": self.references} if self.references else {})

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handle"], state["_group"] = {}, None  # open files do not pickle into workers
        return state

    def _rel(self, file: Path) -> str:
        return file.relative_to(self.path).as_posix() if self.path.is_dir() else file.name

    def units(self) -> Iterator[Unit]:
        for file in self._files:
            yield Unit(self._rel(file), stat_signature(file))

    def _file(self, rel: str) -> Path:
        return self.path / rel if self.path.is_dir() else self.path

    def _image_value(self, value: Any) -> bytes | None:
        if isinstance(value, dict):
            if value.get("bytes"):
                return value["bytes"]
            value = value.get("path")
        if isinstance(value, str):
            file = self.image_root / value
            return read_regular(file) if file.is_file() else None
        return value

    def expand(self, unit_id: str) -> Iterator[RawItem]:
        file = self._file(unit_id)
        try:
            check_columns(file, pq.read_schema(file), self._columns())
            table = pq.read_table(file, columns=[c for c in self._columns().values() if c])
        except PARQUET_ERRORS as e:
            reason = f"parquet file cannot be read ({type(e).__name__}: {e})"
            yield RawItem(
                unit_id, unit_id, [unit_id, -1], None, None, name=file.stem, fault=(BROKEN_PARQUET, reason)
            )
            return
        images = table.column(self.image_column).to_pylist()
        captions = (
            table.column(self.caption_column).to_pylist() if self.caption_column else [None] * len(images)
        )
        refs = table.column(self.references).to_pylist() if self.references else [None] * len(images)
        for row, (image, caption, ref) in enumerate(zip(images, captions, refs)):
            name = image if isinstance(image, str) else f"{file.stem}_{row}"
            item = RawItem(
                key=f"{unit_id}:{row}",
                unit=unit_id,
                locator=[unit_id, row],
                data=self._image_value(image),
                captions=caption_blobs(caption),
                name=Path(str(name)).stem,
            )
            if self.references:
                item.references = [
                    self._reference(
                        v, [unit_id, row, k], f"{file}: row {row} column '{self.references}'[{k}]"
                    )
                    for k, v in enumerate(references_of(ref))
                ]
                if not item.references:
                    why = f"{file}: row {row} has no reference in column '{self.references}' (option references)"
                    item.fault = (MISSING_REFERENCE, why)
            yield item

    def _reference(self, value: Any, locator: list, where: str) -> RawReference:
        """One reference cell entry (bytes, a path under image_root, or a {bytes, path} struct)."""
        path = value.get("path") if isinstance(value, dict) and not value.get("bytes") else value
        name = f"{where} ({self.image_root / path})" if isinstance(path, str) else where
        try:
            return RawReference(locator, self._image_value(value), name)
        except (OSError, DataError) as e:
            return RawReference(locator, None, name, f"cannot be read ({type(e).__name__}: {e})")

    def _row_table(self, rel: str, row: int, column: str | None = None) -> tuple[pa.Table, int]:
        if rel not in self._handle:
            pf = pq.ParquetFile(self._file(rel))
            starts = [0]
            for i in range(pf.num_row_groups):
                starts.append(starts[-1] + pf.metadata.row_group(i).num_rows)
            self._handle[rel] = (pf, starts)
        pf, starts = self._handle[rel]
        group = bisect.bisect_right(starts, row) - 1
        column = column or self.image_column
        if self._group is None or self._group[:3] != (rel, group, column):
            self._group = (rel, group, column, pf.read_row_group(group, columns=[column]))
        return self._group[3], row - starts[group]

    def read(self, locator: list) -> bytes:
        rel, row = locator
        table, offset = self._row_table(rel, int(row))
        data = self._image_value(table.column(self.image_column)[offset].as_py())
        if data is None:
            raise DataError(f"{self._file(rel)}: row {row} has no image")
        return data

    def read_reference(self, locator: list) -> bytes:
        rel, row, k = locator
        assert self.references is not None
        table, offset = self._row_table(rel, int(row), self.references)
        values = references_of(table.column(self.references)[offset].as_py())
        data = self._image_value(values[int(k)]) if int(k) < len(values) else None
        if data is None:
            raise DataError(f"{self._file(rel)}: row {row} has no reference {int(k) + 1} since the scan")
        return data

    def spec(self) -> dict:
        return {**super().spec(), **self._columns(), "image_root": str(self.image_root.resolve())}
