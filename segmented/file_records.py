"""File ranges of stored batches: what a zero-copy Fetch sends (Kafka's FileRecords
slice inside a FetchDataInfo).

A ``.log`` file is a run of record batches v2, the very bytes Kafka's FetchResponse
carries, so a fetch needs only where they are: ``FileSlice`` is (segment, position,
size) of whole batches, and ``FileSlices`` the slices of one fetch, in offset order
(one per segment touched). Nothing is read but batch headers.

Pinning: every segment of a ``FileSlices`` is pinned (``LogSegment.pin``) when the
slice is taken, so retention may rename it ``*.deleted`` but cannot close or unlink
it until ``release`` (idempotent, any thread). The holder must release, whatever
happens to the bytes: sent, dropped, or the client gone.

Bounds: only batches below the log end offset that was published when the fetch
began (never a half-written batch); at least the first batch at or after the fetch
offset, even when it alone is larger than ``bytes_max`` (KIP-74); no batch that would
take the slices past ``bytes_max`` after that; never a partial batch.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from mqstore.segmented.segment import LogSegment

__all__ = ["FileSlice", "FileSlices", "SliceScan"]


class SliceScan(NamedTuple):
    """What ``LogSegment.slice`` found in one segment."""

    position: int  # of the first batch taken (meaningless when size_bytes is 0)
    size_bytes: int  # of the whole batches taken; 0: none in this segment
    records_count: int  # records in them (fewer than offsets after compaction)
    next_offset: int  # after the last batch taken, else the offset asked for
    full: bool  # stopped because the next batch would pass bytes_max


class FileSlice(NamedTuple):
    """Whole batches at [position, position + size_bytes) of a pinned segment."""

    segment: LogSegment
    position: int
    size_bytes: int
    records_count: int

    def fileno(self) -> int:
        """The ``.log``'s descriptor (open while the segment is pinned)."""
        return self.segment.fileno()


class FileSlices:
    """The slices of one fetch; ``release`` unpins their segments."""

    __slots__ = ("_lock", "_released", "next_offset", "slices")

    def __init__(self, slices: list[FileSlice], next_offset: int) -> None:
        self.slices = tuple(slices)
        self.next_offset = next_offset  # the offset a following fetch starts from
        self._lock = threading.Lock()
        self._released = False

    @property
    def size_bytes(self) -> int:
        return sum(piece.size_bytes for piece in self.slices)

    @property
    def records_count(self) -> int:
        return sum(piece.records_count for piece in self.slices)

    @property
    def released(self) -> bool:
        return self._released

    def advise_willneed(self) -> None:
        """Ask the kernel to read the slices ahead (a worker's call, so that a
        sendfile on the event loop finds the pages in the page cache)."""
        advise = getattr(os, "posix_fadvise", None)
        if advise is None or self._released:
            return
        for piece in self.slices:
            try:
                advise(piece.fileno(), piece.position, piece.size_bytes, os.POSIX_FADV_WILLNEED)
            except OSError:
                return  # only a hint

    def release(self) -> None:
        """Unpin every segment (once; later calls do nothing)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        for piece in self.slices:
            piece.segment.unpin()

    def __enter__(self) -> FileSlices:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"FileSlices({len(self.slices)} slices, {self.size_bytes} bytes, "
            f"{self.records_count} records, released={self._released})"
        )
