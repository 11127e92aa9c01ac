"""The ordered list of CommitLog files, and O(1) look-up of the file for an offset.

Files are contiguous: file k starts at ``first_start + k * file_size_bytes``. Retention
removes files only from the oldest end, recovery only from the newest end, so the
list stays contiguous and the file for any offset is found by one division.
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import Final

from mqstore.commitlog.durable import fsync_directory
from mqstore.commitlog.errors import CorruptDataError, OffsetOutOfRangeError, StoreError
from mqstore.commitlog.mapped_file import MappedFile, parse_file_name

__all__ = ["MappedFileQueue"]

BLANK_PREFIX_BYTES = 16  # a written file starts with a record prefix; a spare with zeros
LOAD_ATTEMPTS: Final = 10  # read-only listings retried while a writer removes files

log = logging.getLogger(__name__)


class MappedFileQueue:
    """The CommitLog's files, oldest first."""

    def __init__(self, directory: str, file_size_bytes: int, read_only: bool) -> None:
        self.directory = directory
        self.file_size_bytes = file_size_bytes
        self.read_only = read_only
        self.files: list[MappedFile] = []

    def load(self) -> None:
        """Map every file in the directory, checking names, sizes and contiguity.

        Leftovers of an interrupted allocation (``*.allocating``) are removed.

        Raises:
            CorruptDataError: a gap between files, or a file of the wrong size.
        """
        assert not self.files
        for attempt in range(LOAD_ATTEMPTS):
            starts = self._list_starts()
            for previous, start in itertools.pairwise(starts):
                if start != previous + self.file_size_bytes:
                    path = os.path.join(self.directory, f"{start:020d}")
                    raise CorruptDataError(path, 0, f"gap in the CommitLog after offset {previous}")
            for start in starts:
                if start % self.file_size_bytes:
                    path = os.path.join(self.directory, f"{start:020d}")
                    raise CorruptDataError(path, 0, "file start is not a multiple of the file size")
            try:
                for start in starts:
                    path = os.path.join(self.directory, f"{start:020d}")
                    self.files.append(MappedFile(path, start, self.file_size_bytes, self.read_only))
                return
            except FileNotFoundError:
                # Read-only beside a live writer: a file listed a moment ago was removed
                # (recovery cuts files past the log end, retention drops the oldest).
                # List again; a writer never loses a file it listed itself.
                for mapped in self.files:
                    mapped.close()
                self.files.clear()
                if not self.read_only or attempt == LOAD_ATTEMPTS - 1:
                    raise

    def _list_starts(self) -> list[int]:
        """Start offsets of the files in the directory, sorted; leftovers of an
        interrupted allocation are removed (writer) or skipped (reader)."""
        starts = []
        for name in os.listdir(self.directory):
            if name.endswith(".allocating"):
                if not self.read_only:
                    os.unlink(os.path.join(self.directory, name))
                continue
            start = parse_file_name(name)
            if start is not None:
                starts.append(start)
        starts.sort()
        return starts

    def refresh(self) -> None:
        """Read-only mode: map files that a writer in another process has added,
        and forget files that retention removed."""
        assert self.read_only
        on_disk = {}
        for name in os.listdir(self.directory):
            start = parse_file_name(name)
            if start is not None:
                on_disk[start] = name
        while self.files and self.files[0].start_offset not in on_disk:
            self.files.pop(0).close()
        next_start = (
            self.files[-1].start_offset + self.file_size_bytes
            if self.files
            else min(on_disk, default=0)
        )
        while next_start in on_disk:
            path = os.path.join(self.directory, on_disk[next_start])
            try:
                self.files.append(MappedFile(path, next_start, self.file_size_bytes, True))
            except (FileNotFoundError, CorruptDataError):
                break  # still being allocated, or removed meanwhile
            next_start += self.file_size_bytes

    @property
    def first_start(self) -> int:
        return self.files[0].start_offset if self.files else 0

    @property
    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find(self, physical_offset: int) -> MappedFile:
        """The file holding ``physical_offset``, in O(1).

        Raises:
            OffsetOutOfRangeError: no file holds that offset.
        """
        files = self.files
        if files:
            index = (physical_offset - files[0].start_offset) // self.file_size_bytes
            if 0 <= index < len(files):
                return files[index]
        raise OffsetOutOfRangeError(
            f"physical offset {physical_offset} is not in the CommitLog "
            f"[{self.first_start}, {self.first_start + len(files) * self.file_size_bytes})"
        )

    def append(self, mapped: MappedFile) -> None:
        expected = self.files[-1].start_offset + self.file_size_bytes if self.files else None
        if expected is not None and mapped.start_offset != expected:
            raise AssertionError(f"file {mapped.path} does not follow {self.files[-1].path}")
        self.files.append(mapped)

    def remove_after(self, physical_end: int) -> int:
        """Delete every file that starts after ``physical_end`` (recovery's truncation).

        The file that starts exactly at ``physical_end`` is kept: writing resumes there.

        Raises:
            StoreError: a file could not be removed (it stays on disk past the end,
                where the next open removes it again); DiskFullError, StoreError: the
                directory sync failed.
        """
        assert not self.read_only
        removed = 0
        while self.files and self.files[-1].start_offset > physical_end:
            doomed = self.files.pop()
            never_written = not any(doomed.mapping[:BLANK_PREFIX_BYTES])
            doomed.close()
            try:
                os.unlink(doomed.path)
            except OSError as error:
                reason = f"removing {doomed.path} past the end of the log failed: {error}"
                raise StoreError(reason) from error
            level = logging.INFO if never_written else logging.WARNING
            log.log(level, "removed CommitLog file %s past the end of the log", doomed.path)
            removed += 1
        if removed:
            fsync_directory(self.directory)  # a file past the end must not come back
        return removed

    def remove_oldest(self) -> MappedFile:
        """Drop the oldest file from the queue (retention) and return it, unclosed."""
        assert len(self.files) > 1, "the newest file is never removed"
        return self.files.pop(0)

    def close(self) -> None:
        for mapped in self.files:
            mapped.close()
        self.files.clear()
