"""Reads of the CommitLog (a mixin of commitlog/commitlog.py's CommitLog): zero-copy
views and verified records by physical offset. A read-only log maps the files a
writer adds as reads reach them, and a file retention removed mid-read is an
OffsetOutOfRangeError, never a crash.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mqstore.commitlog.errors import CorruptDataError, OffsetOutOfRangeError
from mqstore.commitlog.file_queue import MappedFileQueue
from mqstore.commitlog.mapped_file import MappedFile
from mqstore.commitlog.record import Record, decode

__all__ = ["ReadLog"]


class ReadLog:
    """The reads (see the module)."""

    # CommitLog's, set in its __init__.
    read_only: bool
    _files: MappedFileQueue
    _appender: Any

    def read(self, position: int, size: int) -> memoryview:
        """A zero-copy view of ``size`` bytes at physical ``position``.

        Raises:
            OffsetOutOfRangeError: the range is not wholly inside one file of the log
                and before the write position.
        """
        if position < 0 or size < 0:
            raise OffsetOutOfRangeError(f"negative position {position} or size {size}")
        mapped = self._find(position)
        in_file = position - mapped.start_offset
        end = position + size
        if in_file + size > mapped.size_bytes or (
            not self.read_only and end > self._appender.write_position
        ):
            raise OffsetOutOfRangeError(
                f"[{position}, {end}) is past the end of the log or crosses a file boundary"
            )
        try:
            return memoryview(mapped.mapping)[in_file : in_file + size]
        except ValueError:
            if not mapped.mapping.closed:
                raise
            raise _file_gone(mapped, position) from None

    def record_at(self, position: int) -> Record:
        """Decode and verify the message record at ``position``.

        Raises:
            OffsetOutOfRangeError: no record can start there.
            CorruptDataError: the bytes there are not a valid message record.
        """
        mapped = self._find(position)
        in_file = position - mapped.start_offset
        limit = mapped.size_bytes
        if not self.read_only:
            limit = min(limit, self._appender.write_position - mapped.start_offset)
        try:
            record = decode(mapped.mapping, in_file, limit, mapped.path, mapped.start_offset)
        except ValueError:
            if not mapped.mapping.closed:
                raise
            raise _file_gone(mapped, position) from None
        if record is None:
            raise CorruptDataError(mapped.path, in_file, "expected a message, found a blank record")
        return record

    def iter_records(self, start: int, end: int | None = None) -> Iterator[Record]:
        """Verified records from record boundary ``start`` up to ``end`` (default: the
        write position), across files; blank records are skipped.

        Raises:
            CorruptDataError: a record before ``end`` does not verify.
        """
        stop = self._appender.write_position if end is None else end
        position = start
        while position < stop:
            mapped = self._find(position)
            in_file = position - mapped.start_offset
            limit = min(mapped.size_bytes, stop - mapped.start_offset)
            record = decode(mapped.mapping, in_file, limit, mapped.path, mapped.start_offset)
            if record is None:
                position = mapped.start_offset + mapped.size_bytes
                continue
            position += record.size
            yield record

    def refresh_files(self) -> None:
        """Read-only logs: map files a writer added, forget files retention removed."""
        if self.read_only:
            self._files.refresh()

    def file_for(self, position: int) -> MappedFile:
        """The mapped file holding physical ``position`` (O(1)).

        Raises:
            OffsetOutOfRangeError: no file of the log holds it.
        """
        return self._find(position)

    def _find(self, position: int) -> MappedFile:
        try:
            return self._files.find(position)
        except OffsetOutOfRangeError:
            if not self.read_only:
                raise
        self._files.refresh()
        return self._files.find(position)


def _file_gone(mapped: MappedFile, position: int) -> OffsetOutOfRangeError:
    """A file unmapped between finding and reading it: retention deleted it."""
    return OffsetOutOfRangeError(
        f"physical offset {position} was in {mapped.path}, deleted by retention during the read"
    )
