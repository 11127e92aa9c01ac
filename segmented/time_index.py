"""The time index (``<base>.timeindex``): where to start a search by timestamp.

Layout: 12-byte big-endian entries::

    position size field
           0    8 timestamp_ms     int64: the largest timestamp in the segment so far
           8    4 relative_offset  int32: last offset of the batch that set it - base

An entry is written next to each offset index entry, but only when the timestamp
grows, so both fields are non-decreasing and timestamps strictly increasing. Every
batch before the one at ``relative_offset`` holds only timestamps below
``timestamp_ms``: the first record with a timestamp >= T is at or after the offset
of the last entry whose timestamp is <= T. When the segment rolls or closes, the
final (largest timestamp, offset) is appended into the slot that ``is_full`` keeps
free, so an inactive segment's largest timestamp is its last entry.
"""

from __future__ import annotations

import struct
from typing import ClassVar, Final

from mqstore.segmented.index_file import IndexFile, IndexSanityError

__all__ = ["NO_TIMESTAMP", "TimeIndex"]

ENTRY: Final = struct.Struct(
    ">q"  # timestamp_ms: largest timestamp so far
    "i"  # relative_offset: last offset of the batch that set it - base offset
)
assert ENTRY.size == 12
NO_TIMESTAMP: Final = -1  # Kafka's RecordBatch.NO_TIMESTAMP


class TimeIndex(IndexFile):
    """Sparse map from timestamps to offsets."""

    ENTRY: ClassVar[struct.Struct] = ENTRY

    def maybe_append(self, timestamp_ms: int, offset: int, skip_full_check: bool = False) -> None:
        """Append (timestamp, offset) if the timestamp is larger than the last entry's.

        ``skip_full_check`` is for the final entry at a roll or close, which may take
        the slot ``is_full`` keeps free.
        """
        relative = offset - self.base_offset
        with self._lock:
            assert skip_full_check or self._entries < self.max_entries - 1
            if self._entries:
                assert self._map is not None
                last_timestamp, last_relative = self._entry(self._map, self._entries - 1)
                if timestamp_ms <= last_timestamp:
                    return
                assert relative >= last_relative
            assert 0 <= relative <= 2**31 - 1
            self._append(timestamp_ms, relative)

    def lookup(self, target_timestamp_ms: int) -> tuple[int, int]:
        """(timestamp, offset) of the last entry with timestamp <= target, else
        (NO_TIMESTAMP, base offset)."""
        with self._lock:
            buffer, newly_mapped = self._mapped()
            if buffer is None:
                entry: tuple[int, ...] = (NO_TIMESTAMP, 0)
            else:
                found = self._largest_lower_bound(buffer, target_timestamp_ms, 0)
                entry = (NO_TIMESTAMP, 0) if found < 0 else self._entry(buffer, found)
        self._note_use(newly_mapped)
        return entry[0], self.base_offset + entry[1]

    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (NO_TIMESTAMP, base offset)."""
        with self._lock:
            if not self._entries:
                return NO_TIMESTAMP, self.base_offset
            if self._map is not None:
                timestamp, relative = self._entry(self._map, self._entries - 1)
            else:
                timestamp, relative = self._read_entry(self._entries - 1)
        return timestamp, self.base_offset + relative

    @property
    def is_full(self) -> bool:
        return self._entries >= self.max_entries - 1

    def sanity_check(self, next_offset_max: int) -> None:
        """Kafka's checks (whole entries, last timestamp >= first, last offset >= base)
        plus: offsets inside the segment and in order.

        Raises:
            IndexSanityError: any check fails.
        """
        if not self._entries:
            return
        first = self._read_entry(0)
        last = self._read_entry(self._entries - 1)
        for _, relative in (first, last):
            if not 0 <= relative < next_offset_max - self.base_offset:
                raise IndexSanityError(f"{self.path}: relative offset {relative} is outside")
        if last[0] < first[0] or last[1] < first[1]:
            raise IndexSanityError(f"{self.path}: entries are not increasing")
