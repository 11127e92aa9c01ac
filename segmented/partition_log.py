"""PartitionLog: one partition's segmented log (Kafka's UnifiedLog + LocalLog).

State, all guarded by one lock per partition for writers:

- ``segments``: base offset order, the last one active; replaced, never mutated
  (copy on write), so readers take a consistent list without the lock;
- ``next_offset``: the log end offset, published after the batch is written;
- ``log_start_offset``: the first readable offset (retention and delete_records move
  it; it may lie inside the first segment);
- ``recovery_point``: every offset below it is durable in the ``.log`` AND the
  indexes of its segments (what crash recovery may skip);
- ``durable_offset``: every offset below it is durable in the ``.log``
  (what sync-mode appends wait for).

Appends: one batch per call; the base offset is filled in under the lock, the
segment rolls first if it must (``LogSegment.should_roll``). Reads pin each segment
they touch, so retention may delete it meanwhile without closing files under them.

Flushing: ``flush_to`` (the ``Flushable`` that commitlog's GroupCommitService drives
in sync mode) fdatasyncs the ``.log`` of every segment with unflushed bytes, which is
normally the active one only; ``flush`` (the periodic job) also flushes the indexes
and then advances the recovery point.

Retention (Kafka's deleteOldSegments): by log start offset, then by size, then by
time; only a prefix of segments, each predicate in turn. If every segment would go,
the active one is rolled first, so an active segment is never deleted.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Callable
from typing import Final

import attrs

from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    StoreClosedError,
)
from mqstore.engine import EngineRecord
from mqstore.segmented.file_records import FileSlice, FileSlices
from mqstore.segmented.files import CLEANED_SUFFIX, SWAP_SUFFIX, fsync_directory
from mqstore.segmented.index_file import MappedIndexCache
from mqstore.segmented.log_loader import LoadedLog
from mqstore.segmented.record_batch import set_base_offset
from mqstore.segmented.segment import LogSegment, SegmentSettings

__all__ = ["LogSettings", "PartitionLog"]

OFFSET_MAX: Final = 2**63 - 1
_Predicate = Callable[[LogSegment, LogSegment | None], bool]


@attrs.frozen(kw_only=True)
class LogSettings:
    """The part of the store's config a partition log needs."""

    segment_bytes: int
    segment_ms: int
    segment: SegmentSettings


class PartitionLog:
    """The segments of one (topic, partition)."""

    def __init__(
        self,
        topic: str,
        partition: int,
        directory: str,
        settings: LogSettings,
        cache: MappedIndexCache,
        loaded: LoadedLog,
        log_append_time: bool,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.directory = directory
        self.settings = settings
        self.log_append_time = log_append_time
        self._cache = cache
        self._lock = threading.Lock()
        self._durable_lock = threading.Lock()
        # (segments, their base offsets): one tuple, so a reader never pairs a new
        # list with old bases. Replaced whole under the lock (copy on write).
        self._table: tuple[list[LogSegment], list[int]] = ([], [])
        self._publish(list(loaded.segments))
        self.next_offset = loaded.next_offset
        self.log_start_offset = loaded.log_start_offset
        self.recovery_point = loaded.recovery_point
        self.durable_offset = loaded.recovery_point
        self.closed = False
        assert self.segments and self.log_start_offset <= self.next_offset

    # ------------------------------------------------------------------ append

    def append(
        self, batch: bytearray, count: int, max_timestamp_ms: int, base_offset: int | None = None
    ) -> int:
        """Write one batch of ``count`` records; return its base offset.

        ``base_offset`` (a copy of another log's records: the CommitLog engine's
        compaction logs) places the batch there, leaving a gap from the log end, as
        compaction leaves gaps; by default the batch goes at the log end. An empty log
        that receives a gap starts at ``base_offset``.

        Raises:
            StoreClosedError: the log was closed.
            InvalidArgumentError: ``base_offset`` is below the log end.
            DiskFullError, OSError: the write failed; nothing was appended.
        """
        with self._lock:
            if self.closed:
                raise StoreClosedError(f"partition {self.topic}-{self.partition} is closed")
            if base_offset is None:
                base_offset = self.next_offset
            elif base_offset < self.next_offset:
                raise InvalidArgumentError(
                    f"{self.topic}-{self.partition}: a batch at {base_offset} would go below "
                    f"the log end {self.next_offset}"
                )
            elif self.next_offset == self.log_start_offset:
                self.log_start_offset = base_offset  # nothing below it was ever here
            last_offset = base_offset + count - 1
            set_base_offset(batch, base_offset)
            segment = self.segments[-1]
            settings = self.settings
            if segment.should_roll(
                len(batch), max_timestamp_ms, last_offset, settings.segment_bytes,
                settings.segment_ms,
            ):  # fmt: skip
                segment = self._roll_locked()
            segment.append(batch, last_offset, max_timestamp_ms)
            self.next_offset = last_offset + 1
        return base_offset

    def roll(self) -> None:
        """Start a new segment now, unless the active one is empty."""
        with self._lock:
            if self.segments[-1].size_bytes:
                self._roll_locked()

    def _roll_locked(self) -> LogSegment:
        old = self.segments[-1]
        assert old.size_bytes > 0 and self.next_offset > old.base_offset
        old.become_inactive()
        new = LogSegment.create(
            self.directory, self.next_offset, self.settings.segment, self._cache
        )
        # The new files' names must be durable before an append into them is: a sync of
        # the .log covers its data, not its directory entry (a power cut would undo it).
        fsync_directory(self.directory)
        self._publish([*self.segments, new])
        return new

    def _publish(self, segments: list[LogSegment]) -> None:
        """Replace the segment list (copy on write: readers hold the old one)."""
        self._table = (segments, [s.base_offset for s in segments])

    # ------------------------------------------------------------------ read

    def _view(self, offset: int) -> tuple[int, list[LogSegment], list[int]]:
        """(log end offset, segments, bases), after checking ``offset`` is in range.
        The log end is read first: every byte below it is in the segments read next."""
        end_offset = self.next_offset
        segments, bases = self._table
        if offset < self.log_start_offset or offset > end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{self.log_start_offset}, {end_offset}] "
                f"of {self.topic}-{self.partition}"
            )
        return end_offset, segments, bases

    def read(self, offset: int, count_max: int, bytes_max: int) -> list[EngineRecord]:
        """Records from ``offset``: at most ``count_max``, and no further batch once
        ``bytes_max`` bytes of batches were read. ``[]`` at the log end.

        Raises:
            OffsetOutOfRangeError: below the log start or above the log end.
            CorruptDataError: a batch does not validate.
        """
        end_offset, segments, bases = self._view(offset)
        records: list[EngineRecord] = []
        read_bytes = 0
        i = bisect_right(bases, offset) - 1
        while offset < end_offset and i < len(segments):
            segment = segments[i]
            if not segment.pin():  # deleted by retention since the view was taken
                end_offset, segments, bases = self._view(offset)
                i = bisect_right(bases, offset) - 1
                continue
            try:
                got, got_bytes = segment.read(
                    offset, count_max - len(records), bytes_max - read_bytes, segment.size_bytes
                )
            finally:
                segment.unpin()
            if got and got[-1].offset >= end_offset:  # appended after the view: not yet
                got = [record for record in got if record.offset < end_offset]
            records += got
            read_bytes += got_bytes
            if len(records) >= count_max or read_bytes >= bytes_max:
                break
            i += 1
            if i == len(segments):
                if offset < end_offset and not got:
                    raise CorruptDataError(
                        segment.log_path, segment.size_bytes, f"offset {offset} is missing"
                    )
                break
            # The segment was read to its end: compaction may have left a gap after
            # its last record, so the next offset is the next segment's base.
            offset = bases[i]
        return records

    def read_slices(self, offset: int, bytes_max: int) -> FileSlices:
        """The file ranges of the whole batches from the one holding (or following)
        ``offset``, up to ``bytes_max`` bytes but at least one batch, below the log
        end published now; each segment pinned until the result's ``release``
        (Kafka's LogSegment.read -> FetchDataInfo). No slices at the log end.

        Raises:
            OffsetOutOfRangeError: below the log start or above the log end.
            CorruptDataError: a batch header does not validate, or the offset is
                missing from the last segment.
        """
        end_offset, segments, bases = self._view(offset)
        slices: list[FileSlice] = []
        taken_bytes = 0
        i = bisect_right(bases, offset) - 1
        try:
            while offset < end_offset and i < len(segments):
                segment = segments[i]
                if not segment.pin():  # deleted by retention since the view was taken
                    end_offset, segments, bases = self._view(offset)
                    i = bisect_right(bases, offset) - 1
                    continue
                try:
                    scan = segment.slice(
                        offset, max(bytes_max - taken_bytes, 0), end_offset, not slices
                    )
                except BaseException:
                    segment.unpin()
                    raise
                if scan.size_bytes:
                    slices.append(
                        FileSlice(segment, scan.position, scan.size_bytes, scan.records_count)
                    )
                    taken_bytes += scan.size_bytes
                else:
                    segment.unpin()
                offset = scan.next_offset
                if scan.full:
                    break
                i += 1
                if i == len(segments):
                    if offset < end_offset and not slices:
                        raise CorruptDataError(
                            segment.log_path, segment.size_bytes, f"offset {offset} is missing"
                        )
                    break
                offset = max(offset, bases[i])  # a compaction gap ends at the next base
        except BaseException:
            FileSlices(slices, offset).release()
            raise
        return FileSlices(slices, offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after the log start whose
        timestamp is >= ``timestamp_ms``, or None.

        Segments whose largest timestamp is below the target are skipped without
        reading them (Kafka's first segment with largestTimestamp >= T). Unlike
        Kafka, a miss in that segment (its matches lie below the log start) moves on
        to the next segment instead of answering None.
        """
        start_offset = self.log_start_offset
        end_offset, segments, bases = self._view(start_offset)
        for segment in segments[max(0, bisect_right(bases, start_offset) - 1) :]:
            if segment.max_timestamp_ms < timestamp_ms or not segment.pin():
                continue
            try:
                found = segment.find_offset_by_timestamp(
                    timestamp_ms, start_offset, segment.size_bytes
                )
            finally:
                segment.unpin()
            if found is not None:
                return found if found[0] < end_offset else None
        return None

    # ------------------------------------------------------------------ durability

    @property
    def write_position(self) -> int:
        """Flushable (mqstore.commitlog.flush): positions are offsets here."""
        return self.next_offset

    @property
    def flushed_position(self) -> int:
        return self.durable_offset

    def _unflushed(self) -> tuple[int, list[LogSegment]]:
        """(log end offset, segments needing a flush): a suffix of the non-empty
        segments, so the scan stops at the first clean one from the end."""
        with self._lock:
            end_offset = self.next_offset
            dirty = []
            for segment in reversed(self.segments):
                if segment.needs_flush:
                    dirty.append(segment)
                elif segment.size_bytes:
                    break
        return end_offset, dirty

    def flush_to(self, position: int) -> None:
        """Make the ``.log`` durable up to at least ``position`` (an offset): one
        fdatasync per segment with unflushed bytes. Used by group commit."""
        end_offset, dirty = self._unflushed()
        assert end_offset >= position
        for segment in dirty:
            if segment.pin():
                try:
                    segment.flush_log()
                finally:
                    segment.unpin()
        with self._durable_lock:
            self.durable_offset = max(self.durable_offset, end_offset)

    def flush(self) -> None:
        """Flush the ``.log`` and the indexes of every dirty segment, then advance
        the recovery point (Kafka's UnifiedLog.flush)."""
        end_offset, dirty = self._unflushed()
        for segment in dirty:
            if segment.pin():
                try:
                    segment.flush()
                finally:
                    segment.unpin()
        with self._durable_lock:
            self.durable_offset = max(self.durable_offset, end_offset)
            self.recovery_point = max(self.recovery_point, end_offset)

    # ------------------------------------------------------------------ retention

    def increment_log_start_offset(self, offset: int) -> bool:
        """Raise the log start to ``offset`` (delete_records); True if it moved.

        Raises:
            OffsetOutOfRangeError: ``offset`` is above the log end.
        """
        with self._lock:
            if offset > self.next_offset:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is past the log end {self.next_offset}"
                )
            if offset <= self.log_start_offset:
                return False
            self.log_start_offset = offset
            return True

    def delete_old_segments(
        self, now_ms: int, retention_ms: int, retention_bytes: int
    ) -> list[LogSegment]:
        """Apply retention; return the segments removed from the log (renamed
        ``*.deleted``; the caller destroys them after the delete delay)."""
        deleted = self._delete_prefix(
            lambda segment, following: (
                following is not None and following.base_offset <= self.log_start_offset
            )
        )
        if retention_bytes >= 0:
            excess_bytes = self.size_bytes - retention_bytes

            def over_size(segment: LogSegment, following: LogSegment | None) -> bool:
                nonlocal excess_bytes
                if excess_bytes - segment.size_bytes < 0:
                    return False
                excess_bytes -= segment.size_bytes
                return True

            if excess_bytes >= 0:
                deleted += self._delete_prefix(over_size)
        if retention_ms >= 0:
            deleted += self._delete_prefix(
                lambda segment, following: now_ms - segment.largest_timestamp_ms > retention_ms
            )
        return deleted

    def _delete_prefix(self, predicate: _Predicate) -> list[LogSegment]:
        """Remove the longest prefix of segments that satisfy ``predicate`` (never an
        empty last segment); roll first if that would take every segment."""
        with self._lock:
            segments = self.segments
            count = 0
            for i, segment in enumerate(segments):
                following = segments[i + 1] if i + 1 < len(segments) else None
                if following is None and segment.size_bytes == 0:
                    break
                if not predicate(segment, following):
                    break
                count += 1
            if not count:
                return []
            if count == len(segments):
                self._roll_locked()
            deleted, kept = self.segments[:count], self.segments[count:]
            self._publish(kept)
            self.log_start_offset = max(self.log_start_offset, kept[0].base_offset)
            for segment in deleted:
                segment.mark_deleted()
        return deleted

    # ------------------------------------------------------------------ compaction

    def replace_segments(
        self,
        old: list[LogSegment],
        new: LogSegment,
        stage_hook: Callable[[str], None] | None = None,
    ) -> bool:
        """Swap the cleaned segment ``new`` (files ``*.cleaned``, flushed) in for the
        consecutive segments ``old`` (Kafka's replaceSegments): rename ``new``
        ``*.swap`` (the commit point), rename ``old`` ``*.deleted`` (the caller
        destroys them later), then drop ``new``'s suffix. False, changing nothing,
        if retention removed one of ``old`` meanwhile (the caller deletes ``new``).
        ``stage_hook`` is called after each step (crash tests).
        """
        with self._lock:
            segments = self.segments
            try:
                first = segments.index(old[0])
            except ValueError:
                return False
            if segments[first : first + len(old)] != old or first + len(old) >= len(segments):
                return False
            assert new.base_offset == old[0].base_offset
            new.change_suffix(CLEANED_SUFFIX, SWAP_SUFFIX)
            fsync_directory(self.directory)
            _hook(stage_hook, "swap")
            for segment in old:
                segment.mark_deleted()
            _hook(stage_hook, "deleted")
            new.change_suffix(SWAP_SUFFIX, "")
            fsync_directory(self.directory)
            self._publish([*segments[:first], new, *segments[first + len(old) :]])
            _hook(stage_hook, "swapped")
        return True

    # ------------------------------------------------------------------ lifecycle

    @property
    def segments(self) -> list[LogSegment]:
        return self._table[0]

    @property
    def index_cache(self) -> MappedIndexCache:
        """The store's cache of mapped inactive indexes (the cleaner's new segments)."""
        return self._cache

    @property
    def size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self.segments)

    def close(self) -> None:
        """Flush everything, record the final time index entry, trim the active
        segment's indexes and close every file (a clean shutdown)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self.flush()
        active = self.segments[-1]
        active.become_inactive()
        active.offset_index.flush()
        active.time_index.flush()
        for segment in self.segments:
            segment.close_files()

    def abandon(self) -> None:
        """Close the files without flushing or trimming (a failed open, or tests
        simulating a crash)."""
        with self._lock:
            self.closed = True
        for segment in self.segments:
            segment.close_files()


def _hook(stage_hook: Callable[[str], None] | None, stage: str) -> None:
    if stage_hook is not None:
        stage_hook(stage)
