"""The offset index (``<base>.index``): where in the ``.log`` to start a scan.

Layout: 8-byte big-endian entries, sorted by both fields::

    position size field
           0    4 relative_offset  int32: a batch's LAST offset - the segment's base offset
           4    4 position         int32: that batch's START position in the .log

An entry is added when more than ``index_interval_bytes`` of log were appended since
the last one, so the first batch of a segment is never indexed (every position is
> 0). ``lookup(t)`` gives the last entry whose offset is <= t (or the base offset at
position 0); the batch holding t starts at or after that position.
"""

from __future__ import annotations

import struct
from typing import ClassVar, Final

from mqstore.segmented.index_file import IndexFile, IndexSanityError

__all__ = ["OffsetIndex"]

ENTRY: Final = struct.Struct(
    ">i"  # relative_offset: batch last offset - base offset
    "i"  # position: batch start position in the .log
)
assert ENTRY.size == 8


class OffsetIndex(IndexFile):
    """Sparse map from offsets to .log positions."""

    ENTRY: ClassVar[struct.Struct] = ENTRY

    def append(self, offset: int, position: int) -> None:
        """Add (offset, position); both must exceed the last entry's."""
        relative = offset - self.base_offset
        with self._lock:
            if self._entries:
                assert self._map is not None
                last_relative, last_position = self._entry(self._map, self._entries - 1)
                assert relative > last_relative and position > last_position
            assert 0 < relative <= 2**31 - 1 and 0 < position <= 2**31 - 1
            self._append(relative, position)

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry with offset <= target, else (base, 0)."""
        with self._lock:
            buffer, newly_mapped = self._mapped()
            if buffer is None:
                entry: tuple[int, ...] = (0, 0)
            else:
                found = self._largest_lower_bound(buffer, target_offset - self.base_offset, 0)
                entry = (0, 0) if found < 0 else self._entry(buffer, found)
        self._note_use(newly_mapped)
        return self.base_offset + entry[0], entry[1]

    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry, or (base offset, 0)."""
        with self._lock:
            if not self._entries:
                return self.base_offset, 0
            if self._map is not None:
                relative, position = self._entry(self._map, self._entries - 1)
            else:
                relative, position = self._read_entry(self._entries - 1)
        return self.base_offset + relative, position

    @property
    def is_full(self) -> bool:
        return self._entries >= self.max_entries

    def sanity_check(self, next_offset_max: int, log_size_bytes: int) -> None:
        """Kafka's checks (whole entries, last offset >= base) plus: the first and last
        entries lie inside the segment, in order, and past position 0.

        Raises:
            IndexSanityError: any check fails.
        """
        if not self._entries:
            return
        first = self._read_entry(0)
        last = self._read_entry(self._entries - 1)
        for relative, position in (first, last):
            if not 0 < relative < next_offset_max - self.base_offset:
                raise IndexSanityError(f"{self.path}: relative offset {relative} is outside")
            if not 0 < position < log_size_bytes:
                raise IndexSanityError(f"{self.path}: position {position} out of the .log")
        if self._entries > 1 and not (last[0] > first[0] and last[1] > first[1]):
            raise IndexSanityError(f"{self.path}: entries are not increasing")
