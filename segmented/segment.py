"""LogSegment: one ``<base>.log`` with its ``.index`` and ``.timeindex``.

The ``.log`` is a sequence of record batches (``record_batch``) with dense offsets
starting at the base offset. It is written with ``pwrite`` at the end, read with
``pread``; it is never mapped. The segment tracks, in memory:

- ``size_bytes``: the valid end; nothing past it is ever read;
- the largest timestamp and the last offset of the batch that set it (the next time
  index entry), and the first batch's timestamp (``segment_ms`` rolls from it);
- the bytes appended since the last offset index entry.

Look-ups go index first, then scan batch headers from the position found, as Kafka's
``translateOffset`` and ``searchForTimestamp`` do. Scans read the ``.log`` in chunks
(``FIRST_READ_BYTES``, doubling to ``READ_MAX_BYTES``) rather than one read per batch
header.
``slice`` (a zero-copy fetch: segmented.file_records) reads batch headers only and
returns where whole batches lie; the caller sends them from ``fileno()`` while pinned.

Crash policy: ``recover`` validates every batch (size, magic, CRC-32C, record count,
and base offsets that never go back: the CRC does not cover the base offset; gaps are
legal, compaction leaves them),
rebuilds both indexes, and truncates the file at the first bad batch.

File descriptors: one for the ``.log`` for the segment's life (Kafka keeps every
segment's channel open too); each index map holds one more (Python's mmap duplicates
the fd) while mapped: always for the active segment, on demand for the others.

Deletion: ``mark_deleted`` renames the files ``*.deleted``; ``destroy`` closes and
unlinks them once no reader has the segment pinned (``pin``/``unpin``).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Iterator
from typing import Final

import attrs

from mqstore.commitlog.errors import CorruptDataError, DiskFullError
from mqstore.engine import EngineRecord
from mqstore.segmented.file_records import SliceScan
from mqstore.segmented.files import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    segment_path,
)
from mqstore.segmented.index_file import IndexSanityError, MappedIndexCache
from mqstore.segmented.offset_index import OffsetIndex
from mqstore.segmented.record_batch import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    BatchHeader,
    MalformedBatchError,
    batch_size_at,
    check_batch,
    check_crc,
    decode_batches,
    decode_records,
)
from mqstore.segmented.time_index import NO_TIMESTAMP, TimeIndex

__all__ = ["LogSegment", "RecoveryResult", "SegmentSettings"]

log = logging.getLogger(__name__)

INT32_MAX: Final = 2**31 - 1
FIRST_READ_BYTES: Final = 8 * 1024  # an index interval (4 KiB) and a few batches after it
READ_MAX_BYTES: Final = 1024 * 1024  # a recovery scan reads 1 MiB at a time
#: ``slice`` reads headers only: a 4 KiB page holds the headers of ~20 small batches,
#: and costs little beside a large batch whose body it reads in vain.
SLICE_READ_BYTES: Final = 4 * 1024


@attrs.frozen(kw_only=True)
class SegmentSettings:
    """The part of the store's config a segment needs."""

    index_interval_bytes: int
    index_max_bytes: int


@attrs.frozen(kw_only=True)
class RecoveryResult:
    truncated_bytes: int
    next_offset: int


class LogSegment:
    """One segment. Appends come under the partition's lock; reads pin it."""

    def __init__(
        self,
        directory: str,
        base_offset: int,
        settings: SegmentSettings,
        cache: MappedIndexCache,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        suffix: str = "",
    ) -> None:
        self.base_offset = base_offset
        self.log_path = segment_path(directory, base_offset, LOG_SUFFIX) + suffix
        self.settings = settings
        self.offset_index = offset_index
        self.time_index = time_index
        offset_index.attach_cache(cache)
        time_index.attach_cache(cache)
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.size_bytes = os.fstat(self._fd).st_size
        self.flushed_size_bytes = self.size_bytes
        self.max_timestamp_ms = NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset
        self.rolling_timestamp_ms = NO_TIMESTAMP  # the first batch's max timestamp
        self._bytes_since_index_entry = 0
        self._pin_lock = threading.Lock()
        self._pins = 0
        self.deleted = False
        self.closed = False

    # ------------------------------------------------------------------ open

    @classmethod
    def create(
        cls,
        directory: str,
        base_offset: int,
        settings: SegmentSettings,
        cache: MappedIndexCache,
        suffix: str = "",
    ) -> LogSegment:
        """A new empty active segment (indexes preallocated and mapped). ``suffix``
        follows every file name (the cleaner writes ``.cleaned`` segments)."""
        log_path = segment_path(directory, base_offset, LOG_SUFFIX) + suffix
        fd = os.open(log_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        os.close(fd)
        max_bytes = settings.index_max_bytes
        offset_index = OffsetIndex.create(
            segment_path(directory, base_offset, INDEX_SUFFIX) + suffix, base_offset, max_bytes
        )
        time_index = TimeIndex.create(
            segment_path(directory, base_offset, TIME_INDEX_SUFFIX) + suffix,
            base_offset,
            max_bytes,
        )
        return cls(directory, base_offset, settings, cache, offset_index, time_index, suffix)

    @classmethod
    def load(
        cls,
        directory: str,
        base_offset: int,
        settings: SegmentSettings,
        cache: MappedIndexCache,
        next_offset_max: int,
        will_recover: bool = False,
    ) -> LogSegment:
        """An existing segment, its indexes sanity-checked (not mapped). A missing or
        insane index is rebuilt from the ``.log`` (``recover``), with a warning.

        ``next_offset_max`` bounds its offsets: the next segment's base offset, or
        the largest int64 for the last segment. ``will_recover``: the caller recovers
        the segment next (after a crash), so its indexes are neither checked nor
        rebuilt here.
        """
        max_bytes = settings.index_max_bytes
        index_path = segment_path(directory, base_offset, INDEX_SUFFIX)
        time_index_path = segment_path(directory, base_offset, TIME_INDEX_SUFFIX)
        rebuild = ""
        try:
            offset_index = OffsetIndex.load(index_path, base_offset, max_bytes)
            time_index = TimeIndex.load(time_index_path, base_offset, max_bytes)
        except IndexSanityError as error:
            rebuild = str(error)
            offset_index = OffsetIndex.create(index_path, base_offset, max_bytes)
            time_index = TimeIndex.create(time_index_path, base_offset, max_bytes)
        segment = cls(directory, base_offset, settings, cache, offset_index, time_index)
        if will_recover:
            return segment
        if not rebuild:
            try:
                offset_index.sanity_check(next_offset_max, segment.size_bytes)
                time_index.sanity_check(next_offset_max)
            except IndexSanityError as error:
                rebuild = str(error)
        if rebuild:
            log.warning("rebuilding the indexes of %s: %s", segment.log_path, rebuild)
            segment.recover()
            segment.become_inactive()
        else:
            segment._load_state()
        return segment

    def _load_state(self) -> None:
        """In-memory state of a segment whose indexes passed the sanity check."""
        self.max_timestamp_ms, self.offset_of_max_timestamp = self.time_index.last_entry()
        _, last_indexed_position = self.offset_index.last_entry()
        self._bytes_since_index_entry = self.size_bytes - last_indexed_position

    # ------------------------------------------------------------------ append

    def should_roll(
        self,
        batch_size_bytes: int,
        max_timestamp_ms: int,
        last_offset: int,
        segment_bytes: int,
        segment_ms: int,
    ) -> bool:
        """Kafka's LogSegment.shouldRoll: full by size, old by segment_ms, a full
        index, or a relative offset past int32. An empty segment never rolls.

        ``segment_ms`` counts from the first batch's timestamp to the incoming one's,
        as Kafka's timeWaitedForRoll does (no jitter)."""
        if self.size_bytes == 0:
            return False
        assert self.rolling_timestamp_ms != NO_TIMESTAMP  # set by the first batch
        waited_ms = max_timestamp_ms - self.rolling_timestamp_ms
        return (
            self.size_bytes > segment_bytes - batch_size_bytes
            or waited_ms > segment_ms
            or self.offset_index.is_full
            or self.time_index.is_full
            or last_offset - self.base_offset > INT32_MAX
        )

    def append(self, batch: bytearray, last_offset: int, max_timestamp_ms: int) -> int:
        """Write one batch at the end; return its position. Caller holds the
        partition lock and has checked ``should_roll``.

        Raises:
            DiskFullError: no room (the partial write is cut off again).
            OSError: any other write failure (likewise cut off).
        """
        position = self.size_bytes
        _write_fully(self._fd, batch, position, self.log_path)
        if max_timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = max_timestamp_ms
            self.offset_of_max_timestamp = last_offset
        if position == 0:
            self.rolling_timestamp_ms = max_timestamp_ms
        if self._bytes_since_index_entry > self.settings.index_interval_bytes and not (
            self.offset_index.is_full or self.time_index.is_full  # a cleaned segment's
        ):  # merged input may need more entries than fit: its scans then go longer
            self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(self.max_timestamp_ms, self.offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += len(batch)
        self.size_bytes = position + len(batch)
        return position

    def become_inactive(self) -> None:
        """Roll (Kafka's onBecomeInactiveSegment): record the final largest timestamp
        in the slot the time index kept free, trim both indexes and unmap them."""
        if self.max_timestamp_ms != NO_TIMESTAMP:
            self.time_index.maybe_append(
                self.max_timestamp_ms, self.offset_of_max_timestamp, skip_full_check=True
            )
        self.offset_index.trim()
        self.time_index.trim()

    def become_active(self) -> None:
        """After a clean open: re-expand the indexes to their preallocated size and
        load the first batch's timestamp (``segment_ms`` counts from it).

        Raises:
            CorruptDataError: the first batch does not validate.
        """
        self.offset_index.make_writable()
        self.time_index.make_writable()
        if self.size_bytes and self.rolling_timestamp_ms == NO_TIMESTAMP:
            try:
                for _, header, _, _ in self._batches(0, self.size_bytes):
                    self.rolling_timestamp_ms = header.max_timestamp
                    break
            except MalformedBatchError as error:
                raise self._corrupt(error) from None

    # ------------------------------------------------------------------ read

    def _batches(
        self, position: int, end: int, verify_crc: bool = False
    ) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
        """(file position, header, buffer, position in buffer) of each batch in
        [position, end). Raises MalformedBatchError with a FILE position."""
        buffer, buffer_start, chunk = b"", position, FIRST_READ_BYTES
        while position < end:
            start = position - buffer_start
            try:
                if len(buffer) - start < HEADER_SIZE:
                    buffer = os.pread(self._fd, min(chunk, end - position), position)
                    buffer_start, start, chunk = position, 0, min(chunk * 2, READ_MAX_BYTES)
                size = batch_size_at(buffer, start)
                if len(buffer) - start < size and position + size <= end:
                    buffer = os.pread(self._fd, max(size, min(chunk, end - position)), position)
                    buffer_start, start, chunk = position, 0, min(chunk * 2, READ_MAX_BYTES)
                header = check_batch(buffer, start, verify_crc)
            except MalformedBatchError as error:
                error.position = position
                raise
            yield position, header, buffer, start
            position += header.size

    def _corrupt(self, error: MalformedBatchError) -> CorruptDataError:
        return CorruptDataError(self.log_path, error.position, error.reason)

    def read(
        self, offset: int, count_max: int, bytes_max: int, end: int
    ) -> tuple[list[EngineRecord], int]:
        """Records from ``offset`` (possibly mid-batch), at most ``count_max``, within
        [.., end). Stops after the batch that crosses ``bytes_max`` (at least one
        batch is read). Returns the records and the bytes of batches decoded.

        Raises:
            CorruptDataError: a batch there does not validate (CRC included).
        """
        _, position = self.offset_index.lookup(offset)
        records: list[EngineRecord] = []
        decoded_bytes = 0
        chunk = FIRST_READ_BYTES
        while position < end:
            buffer = os.pread(self._fd, min(chunk, end - position), position)
            try:
                got, advance, decoded, needed = decode_batches(
                    buffer, 0, offset, count_max - len(records), bytes_max - decoded_bytes
                )
            except MalformedBatchError as error:
                raise CorruptDataError(
                    self.log_path, position + error.position, error.reason
                ) from None
            records += got
            if got:  # the next chunk continues after what this one returned
                offset = got[-1].offset + 1
            decoded_bytes += decoded
            position += advance
            if not needed:
                break
            if position < end and needed > end - position:
                raise CorruptDataError(
                    self.log_path, position, f"a batch of {needed} bytes runs past the end"
                )
            chunk = max(needed, min(chunk * 2, READ_MAX_BYTES))
        return records, decoded_bytes

    def slice(self, offset: int, bytes_max: int, end_offset: int, must_take_one: bool) -> SliceScan:
        """Where the whole batches from the one holding (or, after a compaction gap,
        following) ``offset`` lie, up to ``bytes_max`` bytes; only batches that start
        below ``end_offset``. ``must_take_one``: the first such batch is taken even
        when it alone is larger than ``bytes_max`` (KIP-74). Reads batch headers only
        (no CRC: the consumer checks it, as with Kafka's sendfile).

        Raises:
            CorruptDataError: a batch header there is not a batch v2 header, or a
                batch runs past the segment's end.
        """
        assert bytes_max >= 0
        _, position = self.offset_index.lookup(offset)
        end = self.size_bytes
        start = taken_bytes = count = 0
        next_offset = offset
        buffer, buffer_start = b"", position
        while position < end:
            at = position - buffer_start
            if len(buffer) - at < HEADER_SIZE:
                buffer = os.pread(self._fd, min(SLICE_READ_BYTES, end - position), position)
                buffer_start, at = position, 0
                if len(buffer) < HEADER_SIZE:
                    raise CorruptDataError(self.log_path, position, "batch header cut short")
            header = BatchHeader._make(HEADER.unpack_from(buffer, at))
            size = header.size
            if size < HEADER_SIZE or header.magic != MAGIC or header.last_offset_delta < 0:
                raise CorruptDataError(
                    self.log_path, position, f"not a batch v2 header (size {size}, "
                    f"magic {header.magic}, last delta {header.last_offset_delta})",
                )  # fmt: skip
            if size > end - position:
                raise CorruptDataError(self.log_path, position, f"a {size}-byte batch runs past")
            if header.base_offset >= end_offset:
                break  # appended after the fetch began: not published to it
            if header.last_offset >= offset:
                if taken_bytes and taken_bytes + size > bytes_max:
                    return SliceScan(start, taken_bytes, count, next_offset, full=True)
                if not taken_bytes:
                    if size > bytes_max and not must_take_one:
                        return SliceScan(position, 0, 0, next_offset, full=True)
                    start = position
                taken_bytes += size
                count += header.records_count
                next_offset = header.last_offset + 1
            position += size
        return SliceScan(start, taken_bytes, count, next_offset, full=False)

    def fileno(self) -> int:
        """The ``.log``'s descriptor: for a pinned segment's sendfile only."""
        return self._fd

    def find_offset_by_timestamp(
        self, timestamp_ms: int, starting_offset: int, end: int
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``starting_offset``
        whose timestamp is >= ``timestamp_ms``, or None (Kafka's findOffsetByTimestamp:
        time index, then offset index, then a scan of batches and records)."""
        _, indexed_offset = self.time_index.lookup(timestamp_ms)
        _, position = self.offset_index.lookup(max(indexed_offset, starting_offset))
        try:
            for _, header, buffer, start in self._batches(position, end):
                if header.max_timestamp < timestamp_ms or header.last_offset < starting_offset:
                    continue
                check_crc(buffer, start, header)
                for record in decode_records(
                    buffer, start, header, starting_offset, header.records_count
                ):
                    if record.timestamp_ms >= timestamp_ms:
                        return record.offset, record.timestamp_ms
        except MalformedBatchError as error:
            raise self._corrupt(error) from None
        return None

    def read_next_offset(self) -> int:
        """The offset after the last batch: scan from the last index entry (clean open
        of the active segment; Kafka's readNextOffset). Also catches up the largest
        timestamp over the scanned batches.

        Raises:
            CorruptDataError: a batch after the last index entry does not validate.
        """
        _, position = self.offset_index.last_entry()
        next_offset = self.base_offset
        try:
            for _, header, _, _ in self._batches(position, self.size_bytes):
                next_offset = header.last_offset + 1
                if header.max_timestamp > self.max_timestamp_ms:
                    self.max_timestamp_ms = header.max_timestamp
                    self.offset_of_max_timestamp = header.last_offset
        except MalformedBatchError as error:
            raise self._corrupt(error) from None
        return next_offset

    # ------------------------------------------------------------------ recovery

    def recover(self) -> RecoveryResult:
        """Rebuild both indexes from the ``.log`` and cut it at the first bad batch.

        The indexes are left mapped writable (the caller trims them unless this is
        the active segment).
        """
        self.offset_index.reset()
        self.time_index.reset()
        self.max_timestamp_ms = NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset
        self.rolling_timestamp_ms = NO_TIMESTAMP
        file_size = os.fstat(self._fd).st_size
        valid_bytes = last_indexed_position = 0
        expected_offset = self.base_offset
        try:
            for position, header, _, _ in self._batches(0, file_size, verify_crc=True):
                if header.base_offset < expected_offset:  # gaps: compaction removed batches
                    raise MalformedBatchError(
                        position, f"base offset {header.base_offset}, expected {expected_offset}+"
                    )
                if header.last_offset - self.base_offset > INT32_MAX:
                    raise MalformedBatchError(position, "offset beyond the segment's int32 range")
                if self._recover_batch(header, position, last_indexed_position):
                    last_indexed_position = position
                valid_bytes += header.size
                expected_offset = header.last_offset + 1
        except MalformedBatchError as error:
            log.warning(
                "%s: invalid batch at position %d (%s); truncating %d bytes",
                self.log_path, error.position, error.reason, file_size - error.position,
            )  # fmt: skip
        if valid_bytes < file_size:
            os.ftruncate(self._fd, valid_bytes)
        self.size_bytes = valid_bytes
        self.flushed_size_bytes = 0  # what survived may sit in the page cache only
        self._bytes_since_index_entry = valid_bytes - last_indexed_position
        if self.max_timestamp_ms != NO_TIMESTAMP:  # Kafka writes the final entry here too
            self.time_index.maybe_append(
                self.max_timestamp_ms, self.offset_of_max_timestamp, skip_full_check=True
            )
        return RecoveryResult(truncated_bytes=file_size - valid_bytes, next_offset=expected_offset)

    def _recover_batch(self, header: BatchHeader, position: int, last_indexed: int) -> bool:
        """Account one valid batch as ``append`` did; True if it was indexed."""
        if header.max_timestamp > self.max_timestamp_ms:
            self.max_timestamp_ms = header.max_timestamp
            self.offset_of_max_timestamp = header.last_offset
        if position == 0:
            self.rolling_timestamp_ms = header.max_timestamp
        if position - last_indexed <= self.settings.index_interval_bytes:
            return False
        if self.offset_index.is_full or self.time_index.is_full:
            return False  # an index_max_bytes smaller than when written: scans go longer
        self.offset_index.append(header.last_offset, position)
        self.time_index.maybe_append(self.max_timestamp_ms, self.offset_of_max_timestamp)
        return True

    # ------------------------------------------------------------------ durability

    def flush_log(self) -> None:
        """fdatasync the ``.log`` if bytes were appended since the last flush."""
        size = self.size_bytes
        if size > self.flushed_size_bytes:
            os.fdatasync(self._fd)
            self.flushed_size_bytes = max(self.flushed_size_bytes, size)

    def flush(self) -> None:
        """The ``.log`` and both indexes (Kafka's LogSegment.flush)."""
        self.flush_log()
        self.offset_index.flush()
        self.time_index.flush()

    @property
    def needs_flush(self) -> bool:
        return (
            self.size_bytes > self.flushed_size_bytes
            or self.offset_index.dirty
            or self.time_index.dirty
        )

    @property
    def largest_timestamp_ms(self) -> int:
        """The largest record timestamp; the file's mtime if it holds none (Kafka)."""
        if self.max_timestamp_ms != NO_TIMESTAMP:
            return self.max_timestamp_ms
        return os.fstat(self._fd).st_mtime_ns // 1_000_000

    # ------------------------------------------------------------------ lifecycle

    def pin(self) -> bool:
        """Keep the files open for a reader; False if the segment was deleted."""
        with self._pin_lock:
            if self.deleted:
                return False
            self._pins += 1
            return True

    def unpin(self) -> None:
        with self._pin_lock:
            assert self._pins > 0
            self._pins -= 1

    def change_suffix(self, old_suffix: str, new_suffix: str) -> None:
        """Rename the three files from ``<name><old_suffix>`` to ``<name><new_suffix>``
        (the cleaner's ``.cleaned`` -> ``.swap`` -> final steps); the ``.log`` last,
        as the loader keys its recovery on it."""
        assert self.log_path.endswith(old_suffix)
        for index in (self.offset_index, self.time_index):
            assert index.path.endswith(old_suffix)
            index.rename(index.path[: len(index.path) - len(old_suffix)] + new_suffix)
        new_path = self.log_path[: len(self.log_path) - len(old_suffix)] + new_suffix
        os.rename(self.log_path, new_path)
        self.log_path = new_path

    def mark_deleted(self) -> None:
        """Rename the files ``*.deleted``; readers already pinned keep reading."""
        with self._pin_lock:
            self.deleted = True
        os.rename(self.log_path, self.log_path + DELETED_SUFFIX)
        self.log_path += DELETED_SUFFIX
        for index in (self.offset_index, self.time_index):
            index.rename(index.path + DELETED_SUFFIX)

    def destroy(self) -> bool:
        """Close and unlink the files unless a reader still pins the segment."""
        with self._pin_lock:
            assert self.deleted
            if self._pins:
                return False
            self._pins = -1  # never pinned again
        self.close_files()
        for path in (self.log_path, self.offset_index.path, self.time_index.path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        return True

    def close_files(self) -> None:
        if not self.closed:
            self.closed = True
            self.offset_index.close()
            self.time_index.close()
            os.close(self._fd)


def _write_fully(fd: int, batch: bytearray, position: int, path: str) -> None:
    """pwrite all of ``batch`` at ``position``; on failure cut the partial write off."""
    written = 0
    try:
        written = os.pwrite(fd, batch, position)
        while written < len(batch):  # a short write: rare, but allowed by POSIX
            with memoryview(batch) as view:
                written += os.pwrite(fd, view[written:], position + written)
    except OSError as error:
        if written:
            os.ftruncate(fd, position)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(errno.ENOSPC, f"no room to append to {path}") from error
        raise
