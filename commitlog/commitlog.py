"""The CommitLog: one append-only log of fixed-size mapped files for every topic.

Invariants:
- Records are appended under one lock. Inside it the store timestamp is taken (and
  never decreases in file order), the queue offset of (topic, queue_id) is assigned
  (dense from 0), and the record is written at the write position.
- A record never spans two files. When it does not fit with room for a blank
  record, the rest of the file becomes an end-of-file blank record and writing rolls
  to the next file, which the allocation service has already prepared: it is
  requested once the write position passes ``prepare_next_percent`` of the current
  file (0: as soon as the file is started), so an idle log holds one file, not two.
- ``write_position`` is the end of the last appended record; ``flushed_position`` is a
  record boundary before which every byte is durable.

Crash policy (``open``): scan forward from ``recover_from`` (the checkpoint's flushed
position, a record boundary), verifying every checksum, and stop at the first
record that does not verify. That is the end of the log: the rest of its file is
zeroed and every later file removed, so a torn or stale record can never be read
back. The scan is bounded by the checkpoint, so restart time does not grow with the
log.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, NoReturn, cast

import attrs
import numpy as np

from mqstore.commitlog.allocator import AllocationService
from mqstore.commitlog.config import CommitLogConfig
from mqstore.commitlog.durable import fsync_directory, makedirs_durable
from mqstore.commitlog.errors import (
    CorruptDataError,
    DiskFullError,
    FlushFailedError,
    InvalidArgumentError,
    InvalidTypeError,
    LimitExceededError,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
    StoreClosedError,
)
from mqstore.commitlog.file_queue import MappedFileQueue
from mqstore.commitlog.flush import AsyncFlushService, GroupCommitService
from mqstore.commitlog.mapped_file import MappedFile
from mqstore.commitlog.record import (
    BLANK_SIZE,
    FLAG_NULL_BODY,
    HEADER_SIZE,
    SCAN_INVALID,
    SCAN_LIMIT,
    SCAN_ZEROS,
    Record,
    check_bodies,
    decode,
    encode_blank_into,
    encode_bodies,
    encode_into,
    encode_keys,
    encode_properties,
    encode_run,
    encode_slices,
    encode_tag,
    scan_records,
    validate_topic,
)

__all__ = ["AppendResult", "BatchAppendResult", "BatchFeed", "CommitLog", "FeedEntry"]

log = logging.getLogger(__name__)

QUEUE_ID_MAX = 2**31 - 1
BATCH_MESSAGES_MAX = 1 << 20  # one batch holds the append lock; bound how long
_NOT_ARMED = 1 << 62  # a prepare-next threshold no write position reaches
_BYTES_LIKE = (bytes, bytearray, memoryview)


class AppendResult(NamedTuple):
    """Where one appended record landed. A NamedTuple: immutable, named, and cheap to
    build on the per-message path (an attrs frozen class costs 2x here)."""

    physical_offset: int
    queue_offset: int
    store_timestamp_ms: int
    size: int


_new_result = tuple.__new__  # builds a NamedTuple without its Python-level __new__

SCAN_ROWS = 1 << 16  # records verified per scan_records call in recovery
FEED_ENTRIES_MAX = 1 << 16  # appends kept for the dispatcher; past it, it reads the log


class BatchFeed(NamedTuple):
    """One append_batch as the dispatcher sees it (``encoded`` from _encode_batch)."""

    positions: np.ndarray
    sizes: np.ndarray
    topic: str
    queue_id: int
    first_queue_offset: int
    store_ts_ms: int
    #: Per-record (size, flags, tag, keys, properties, body, born) from _encode_batch;
    #: None for a plain batch (bodies only), whose records share ``tag`` and
    #: ``born_ts_ms`` (None: the store timestamp) and carry no keys.
    encoded: list[tuple[int, int, bytes, bytes, bytes, Any, int | None]] | None
    tag: bytes = b""
    born_ts_ms: np.ndarray | int | None = None  # an array: one per record (append_slices)


#: What the dispatcher gets per append: a BatchFeed, or for one record the tuple
#: (position, size, topic, queue_id, queue_offset, born_ts_ms, store_ts_ms, tag, keys)
#: with tag and keys as their encoded bytes. It saves re-parsing what was just written.
FeedEntry = Any


@attrs.frozen
class BatchAppendResult:
    """Where a batch landed: record i is at ``physical_offsets[i]`` with queue offset
    ``first_queue_offset + i``."""

    physical_offsets: np.ndarray
    sizes: np.ndarray
    first_queue_offset: int
    store_timestamp_ms: int

    def __len__(self) -> int:
        return len(self.physical_offsets)


_time_ns = time.time_ns


class CommitLog:
    """Append, read, flush and recover the log in ``directory``. Build with ``open``."""

    def __init__(
        self,
        directory: str,
        config: CommitLogConfig,
        read_only: bool,
        syncer: Callable[[MappedFile], None] | None,
        clock_ms: Callable[[], int] | None,
    ) -> None:
        self.directory = directory
        self.config = config
        self.read_only = read_only
        self._syncer = syncer or MappedFile.flush
        self._clock_ms = clock_ms  # None: the wall clock, read inline on the hot path
        self._files = MappedFileQueue(directory, config.file_size_bytes, read_only)
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._queue_offsets: dict[tuple[str, int], int] = {}
        self._queue_offset_loader: Callable[[str, int], int] | None = None
        self._write_position = 0
        self._flushed_position = 0
        self._last_store_ts_ms = 0
        self._flushed_mark = (0, 0)  # (flushed_position, store ts of the record before it)
        self._failure: FlushFailedError | None = None
        self._current: MappedFile | None = None
        self._allocator: AllocationService | None = None
        self._flusher: AsyncFlushService | GroupCommitService | None = None
        self._append_listener: Callable[[], None] | None = None
        self._reject_reason: str | None = None
        self._feed: list[FeedEntry] | None = None
        self._feed_start = 0
        self._feed_overflow = False
        self._record_size_limit_bytes = config.record_size_limit_bytes
        # Write position past which the next file is requested (_arm_prepare_next).
        self._prepare_next_at = _NOT_ARMED
        self._closed = False
        self._sealed = False
        self.roll_wait_ns: list[int] = []  # how long each roll waited for its file

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(
        cls,
        directory: str,
        config: CommitLogConfig,
        *,
        read_only: bool = False,
        recover_from: int | None = None,
        queue_offset_loader: Callable[[str, int], int] | None = None,
        syncer: Callable[[MappedFile], None] | None = None,
        clock_ms: Callable[[], int] | None = None,
        store_ts_floor_ms: int = 0,
    ) -> CommitLog:
        """Open (or create) the log in ``directory`` and recover its end.

        Args:
            recover_from: a record boundary known valid (the smaller of the
                checkpoint's flushed and dispatched positions). None scans from the
                first file. Every record scanned counts in the queue-offset table.
            queue_offset_loader: gives the next queue offset of a queue the log has
                not seen since open (from the ConsumeQueue). Without it, offsets come
                from the records scanned at open (so ``recover_from`` must be None).
            syncer: makes one file durable; tests inject counting or failing ones.
            clock_ms: the store clock; tests inject a fake one.
            store_ts_floor_ms: a store timestamp the log already used (the
                checkpoint's): new records never get an earlier one, even when the
                clock stepped back across a restart and the scan read no record.

        Raises:
            CorruptDataError: files are missing, misnamed or of the wrong size, or
                the checkpoint points past the log.
        """
        if not read_only:
            makedirs_durable(directory)
        commitlog = cls(directory, config, read_only, syncer, clock_ms)
        commitlog._queue_offset_loader = queue_offset_loader
        commitlog._last_store_ts_ms = max(0, store_ts_floor_ms)
        try:
            commitlog._files.load()
            commitlog._recover(recover_from)
            if not read_only:
                commitlog._start_services()
        except BaseException:
            commitlog._files.close()
            raise
        return commitlog

    def _start_services(self) -> None:
        config = self.config
        self._allocator = AllocationService(
            self.directory,
            config.file_size_bytes,
            config.prewarm,
            config.mlock,
            write_back=config.flush_mode == "sync",
        )
        if self._current is None or self._write_position == self._current_end():
            self._current = self._take_file(self._write_position)
        self._arm_prepare_next()
        if config.flush_mode == "sync":
            self._flusher = GroupCommitService(self, config.sync_flush_timeout_ms)
        else:
            self._flusher = AsyncFlushService(
                self,
                config.flush_interval_ms,
                config.flush_least_pages,
                config.flush_thorough_interval_ms,
            )

    def seal(self) -> None:
        """Refuse further appends and flush what was appended; reads still work."""
        with self._lock:
            self._sealed = True
        if not self.read_only and self._failure is None:
            self.flush_to(self._write_position)

    def close(self) -> None:
        """Flush everything, stop the services and unmap the files. A poisoned log
        (``failure``) is closed without a flush: recovery at the next open decides
        what of its unflushed tail is on disk."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
            self._sealed = True
        try:
            if self._flusher is not None:
                self._flusher.close()
            if self._allocator is not None:
                self._allocator.close()
            if not self.read_only and self._failure is None:
                self.flush_to(self._write_position)
        finally:
            self._files.close()

    def _crash(self) -> None:
        """Stop the services without the final flush (fault tests only)."""
        with self._lock:
            self._closed = True
            self._sealed = True
        if self._allocator is not None:
            self._allocator.close()
        if self._flusher is not None:
            self._flusher.close()  # the async loop exits without a last flush
        self._flusher = None
        self.read_only = True  # a later close() must not flush
        self._files.close()

    # ------------------------------------------------------------------ recovery

    def _recover(self, recover_from: int | None) -> None:
        files = self._files
        if not files.files:
            self._write_position = self._flushed_position = recover_from or 0
            if recover_from:
                raise CorruptDataError(
                    self.directory, recover_from, "checkpoint points into an empty CommitLog"
                )
            return
        start = files.first_start if recover_from is None else max(recover_from, files.first_start)
        last = files.files[-1]
        if start > last.start_offset + last.size_bytes:
            raise CorruptDataError(
                last.path, start - last.start_offset, "checkpoint points past the CommitLog"
            )
        # Records past the start may not be in the ConsumeQueue yet: the queue-offset
        # table must already count them when the first append asks for an offset.
        self._scan_columns(start)
        end = self._scan_end
        self._write_position = end
        self._flushed_position = end
        self._flushed_mark = (end, self._last_store_ts_ms)
        if self.read_only:
            return
        self._truncate_after(end)
        if self._current is not None:
            self._syncer(self._current)

    def _scan_columns(self, start: int) -> None:
        """Verify records from ``start``, a run per call (C when built;
        ``scan_records``), and take from their columns what recovery needs: every
        queue's next offset and the newest store timestamp. The scan stops at zeros
        (the unwritten rest of a file), at a record that does not verify, or at the
        end of the files; a blank record moves it to the next file. Leaves the end in
        ``_scan_end``, with no Record built per record."""
        files = self._files
        capacity = SCAN_ROWS
        positions = np.empty(capacity, dtype=np.int64)
        sizes = np.empty(capacity, dtype=np.int32)
        queue_offsets = np.empty(capacity, dtype=np.int64)
        queue_ids = np.empty(capacity, dtype=np.int32)
        stamps = np.empty(capacity, dtype=np.int64)
        topic_lens = np.empty(capacity, dtype=np.uint8)
        topic_hashes = np.empty(capacity, dtype=np.uint64)
        position = start
        self._scan_end = start
        while True:
            try:
                mapped = files.find(position)
            except OffsetOutOfRangeError:
                return
            in_file = position - mapped.start_offset
            end, count, status = scan_records(
                mapped.mapping, in_file, mapped.size_bytes, mapped.start_offset, positions,
                sizes, queue_offsets, queue_ids, stamps, topic_lens, topic_hashes,
            )  # fmt: skip
            if count:
                self._absorb(mapped, count, positions, queue_offsets, queue_ids, stamps,
                             topic_lens, topic_hashes)  # fmt: skip
            position = mapped.start_offset + end
            self._scan_end = position
            if status == SCAN_INVALID:
                try:  # the reason, for the log
                    decode(mapped.mapping, end, mapped.size_bytes, mapped.path, mapped.start_offset)
                except CorruptDataError as error:
                    log.warning("CommitLog ends at %d: %s", position, error)
                return
            if status in (SCAN_ZEROS, SCAN_LIMIT):
                return
            # SCAN_FULL: go on in this file; SCAN_BLANK: on to the next file.

    def _absorb(
        self, mapped: MappedFile, count: int, positions: np.ndarray, queue_offsets: np.ndarray,
        queue_ids: np.ndarray, stamps: np.ndarray, topic_lens: np.ndarray,
        topic_hashes: np.ndarray,
    ) -> None:  # fmt: skip
        """Fold a run of scanned records into the queue-offset table (one Python step
        per queue, not per record) and the newest store timestamp."""
        hashes, ids, offsets = topic_hashes[:count], queue_ids[:count], queue_offsets[:count]
        order = np.lexsort((offsets, ids, hashes))
        hashes, ids = hashes[order], ids[order]
        last = np.flatnonzero(
            np.append((hashes[1:] != hashes[:-1]) | (ids[1:] != ids[:-1]), True)
        )  # the last row of each (topic, queue) group holds its highest offset
        table = self._queue_offsets
        for row in order[last].tolist():
            at = int(positions[row]) + HEADER_SIZE
            topic = str(mapped.mapping[at : at + int(topic_lens[row])], "ascii")
            key = (topic, int(queue_ids[row]))
            offset = int(queue_offsets[row])
            if offset >= table.get(key, 0):
                table[key] = offset + 1
        newest = int(stamps[:count].max())
        if newest > self._last_store_ts_ms:
            self._last_store_ts_ms = newest

    def _truncate_after(self, end: int) -> None:
        """Zero the current file past ``end`` and remove every later file."""
        self._files.remove_after(end)
        last = self._files.last
        if last is None or end >= last.start_offset + last.size_bytes:
            self._current = None
            return
        assert last.start_offset <= end
        zeroed = last.zero_from(end - last.start_offset)
        if zeroed:
            log.warning(
                "zeroed %d bytes of %s past the end of the log at %d", zeroed, last.path, end
            )
        self._current = last

    # ------------------------------------------------------------------ append

    def set_append_listener(self, listener: Callable[[], None] | None) -> None:
        """Called (outside the lock) after every append and every flush: the
        dispatcher's wake-up."""
        self._append_listener = listener

    def enable_feed(self) -> None:
        """Start keeping, for the dispatcher, what each append wrote (see FeedEntry)."""
        with self._lock:
            self._feed = []
            self._feed_start = self._write_position
            self._feed_overflow = False

    def take_feed(self) -> tuple[int, list[FeedEntry], int]:
        """Hand over the appends kept since the last call.

        Returns:
            (start, entries, stop): ``entries`` describe, in log order, records from
            physical ``start`` on; they may stop short of ``stop`` (the write position
            now) when the feed overflowed, and then the dispatcher reads the rest from
            the log itself.
        """
        with self._lock:
            start, entries, stop = self._feed_start, self._feed, self._write_position
            assert entries is not None, "enable_feed() first"
            self._feed = []
            self._feed_start = stop
            self._feed_overflow = False
        return start, entries, stop

    def reject_writes(self, reason: str | None) -> None:
        """Refuse appends with DiskFullError while ``reason`` is set (disk watermark)."""
        self._reject_reason = reason

    def append(
        self,
        topic: str,
        queue_id: int,
        body: bytes | bytearray | memoryview | None,
        *,
        keys: Sequence[str] | str | None = (),
        tag: str | None = None,
        properties: Any = None,
        born_ts_ms: int | None = None,
    ) -> AppendResult:
        """Append one record.

        Returns:
            The record's physical offset, queue offset, store timestamp and size.

        Raises:
            InvalidTypeError, InvalidArgumentError: bad topic, queue id, body, keys...
            LimitExceededError: the record is larger than the size limit.
            DiskFullError: no room for the next file, or writes are rejected.
            FlushTimeoutError: sync flush mode, and the bytes did not become durable.
        """
        topic_bytes = validate_topic(topic)
        if type(queue_id) is not int or not 0 <= queue_id <= QUEUE_ID_MAX:
            _check_queue_id(queue_id)
        flags = 0
        if type(body) is not bytes:
            if body is None:
                flags = FLAG_NULL_BODY
                body = b""
            elif not isinstance(body, _BYTES_LIKE):
                raise InvalidTypeError(f"body must be bytes-like, not {type(body).__name__}")
        tag_bytes = encode_tag(tag) if tag else b""
        keys_bytes = encode_keys(keys) if keys else b""
        properties_bytes = encode_properties(properties) if properties else b""
        size = (
            HEADER_SIZE
            + len(topic_bytes)
            + len(tag_bytes)
            + len(keys_bytes)
            + len(properties_bytes)
            + len(body)
        )
        if size > self._record_size_limit_bytes:
            raise LimitExceededError(
                f"record of {size} bytes exceeds the limit of {self._record_size_limit_bytes}"
            )
        if born_ts_ms is not None:
            _check_timestamp(born_ts_ms)
        key = (topic, queue_id)
        with self._lock:
            self._check_writable()
            queue_offset = self._queue_offsets.get(key)
            if queue_offset is None:
                queue_offset = self._load_queue_offset(topic, queue_id)
            clock = self._clock_ms
            store_ts_ms = _time_ns() // 1_000_000 if clock is None else clock()
            if store_ts_ms < self._last_store_ts_ms:
                store_ts_ms = self._last_store_ts_ms
            position = self._write_position
            current = self._current
            assert current is not None
            in_file = position - current.start_offset
            if in_file + size + BLANK_SIZE > current.size_bytes:
                current = self._roll(in_file)
                position = current.start_offset
                in_file = 0
            encode_into(
                current.mapping, in_file, position, size, queue_offset,
                store_ts_ms if born_ts_ms is None else born_ts_ms, store_ts_ms,
                queue_id, flags, topic_bytes, tag_bytes, keys_bytes, properties_bytes, body,
            )  # fmt: skip
            self._queue_offsets[key] = queue_offset + 1
            self._write_position = position + size
            self._last_store_ts_ms = store_ts_ms
            if position + size >= self._prepare_next_at:
                self._prepare_next()
            feed = self._feed
            if feed is not None and not self._feed_overflow:
                if len(feed) < FEED_ENTRIES_MAX:
                    feed.append(
                        (position, size, topic, queue_id, queue_offset,
                         store_ts_ms if born_ts_ms is None else born_ts_ms, store_ts_ms,
                         tag_bytes, keys_bytes)
                    )  # fmt: skip
                else:
                    self._feed_overflow = True
        listener = self._append_listener
        if listener is not None:
            listener()
        flusher = self._flusher
        if type(flusher) is GroupCommitService:
            flusher.wait_durable(position + size)
        return _new_result(AppendResult, (position, queue_offset, store_ts_ms, size))

    def append_batch(
        self,
        topic: str,
        queue_id: int,
        bodies: Sequence[bytes | bytearray | memoryview | None],
        *,
        keys: Sequence[Sequence[str] | str | None] | None = None,
        tags: Sequence[str | None] | str | None = None,
        properties: Sequence[Any] | None = None,
        born_ts_ms: Sequence[int | None] | int | None = None,
    ) -> BatchAppendResult:
        """Append many records to one queue under one lock acquisition and one flush.

        ``keys``, ``properties`` and a sequence of ``tags`` or ``born_ts_ms`` give one
        item per body; a single ``tags`` str or ``born_ts_ms`` int applies to all. A
        None born timestamp means the store timestamp.
        A crash mid-batch keeps a prefix of the batch (never a torn record).

        Raises:
            The errors of ``append``; nothing is appended if any record is invalid.
        """
        topic_bytes = validate_topic(topic)
        _check_queue_id(queue_id)
        count = len(bodies)
        if count > BATCH_MESSAGES_MAX:
            raise LimitExceededError(f"a batch holds at most {BATCH_MESSAGES_MAX} messages")
        plain = (
            keys is None
            and properties is None
            and (tags is None or isinstance(tags, str))
            and (born_ts_ms is None or isinstance(born_ts_ms, int))
            and type(bodies) is list
        )
        encoded: list[tuple[int, int, bytes, bytes, bytes, Any, int | None]] | None = None
        shared_tag = b""
        plain_bodies: list[Any] = []
        plain_born = cast("int | None", born_ts_ms)
        if plain:
            # Bodies only (the common batch): validated and encoded in C, no tuple each.
            plain_bodies = cast("list[Any]", bodies)
            shared_tag = encode_tag(cast("str | None", tags))
            if plain_born is not None:
                _check_timestamp(plain_born)
            sizes = np.empty(count, dtype=np.int32)
            fixed = HEADER_SIZE + len(topic_bytes) + len(shared_tag)
            bad = check_bodies(plain_bodies, fixed, self.config.record_size_limit_bytes, sizes)
            if bad >= 0:
                body = plain_bodies[bad]
                if body is not None and not isinstance(body, _BYTES_LIKE):
                    raise InvalidTypeError(f"body must be bytes-like, not {type(body).__name__}")
                raise LimitExceededError(
                    f"record {bad} of {fixed + len(body or b'')} bytes exceeds the limit of "
                    f"{self.config.record_size_limit_bytes}"
                )
        else:
            encoded = self._encode_batch(topic_bytes, bodies, keys, tags, properties, born_ts_ms)
            sizes = np.fromiter((item[0] for item in encoded), dtype=np.int32, count=count)

        def encode(
            mapping: Any, in_file: int, file_size: int, position: int, queue_offset: int,
            store_ts_ms: int, done: int, positions: Any,
        ) -> int:  # fmt: skip
            if encoded is None:
                return int(encode_bodies(
                    mapping, in_file, file_size, position, queue_offset, store_ts_ms,
                    store_ts_ms if plain_born is None else plain_born, queue_id, topic_bytes,
                    shared_tag, plain_bodies, done, positions,
                ))  # fmt: skip
            return int(encode_run(
                mapping, in_file, file_size, position, queue_offset, store_ts_ms, queue_id,
                topic_bytes, encoded, done, positions,
            ))  # fmt: skip

        return self._append_encoded(
            topic, queue_id, sizes, encode, encoded, shared_tag,
            plain_born if encoded is None else None,
        )  # fmt: skip

    def append_slices(
        self,
        topic: str,
        queue_id: int,
        offsets: np.ndarray,
        data: Any,
        *,
        nulls: np.ndarray | None = None,
        tag: str | None = None,
        born_ts_ms: np.ndarray | int | None = None,
    ) -> BatchAppendResult:
        """``append_batch`` for bodies laid out as Arrow binary columns are: body i is
        ``data[offsets[i]:offsets[i + 1]]``, None where ``nulls[i]``; no keys or
        properties; one tag; a born timestamp for all, or one per record (int64).
        Nothing is built per record in Python (C encodes when built).

        Raises:
            The errors of ``append_batch``; InvalidArgumentError for offsets that are
            not non-decreasing within ``data``, or arrays of the wrong length.
        """
        topic_bytes = validate_topic(topic)
        _check_queue_id(queue_id)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or len(offsets) < 1:
            raise InvalidArgumentError("offsets must be a 1-D array of count + 1 positions")
        count = len(offsets) - 1
        if count > BATCH_MESSAGES_MAX:
            raise LimitExceededError(f"a batch holds at most {BATCH_MESSAGES_MAX} messages")
        data_len = memoryview(data).nbytes
        lengths = np.diff(offsets)
        if count and (offsets[0] < 0 or offsets[-1] > data_len or lengths.min() < 0):
            raise InvalidArgumentError("offsets must increase within the data buffer")
        null_flags: np.ndarray | None = None
        if nulls is not None:
            null_flags = np.ascontiguousarray(nulls, dtype=np.uint8)
            if null_flags.shape != (count,):
                raise InvalidArgumentError(f"nulls has {len(null_flags)} items for {count} bodies")
            lengths = np.where(null_flags != 0, 0, lengths)
        borns: np.ndarray | None = None
        born_all: int | None = None
        if isinstance(born_ts_ms, np.ndarray):
            borns = np.ascontiguousarray(born_ts_ms, dtype=np.int64)
            if borns.shape != (count,):
                raise InvalidArgumentError(f"born_ts_ms has {len(borns)} items for {count} bodies")
            if count and borns.min() < 0:
                raise InvalidArgumentError("born timestamps must be >= 0")
        elif born_ts_ms is not None:
            _check_timestamp(born_ts_ms)
            born_all = born_ts_ms
        tag_bytes = encode_tag(tag)
        sizes64 = HEADER_SIZE + len(topic_bytes) + len(tag_bytes) + lengths
        limit = self.config.record_size_limit_bytes
        if count and sizes64.max() > limit:
            bad = int(np.argmax(sizes64 > limit))
            raise LimitExceededError(
                f"record {bad} of {int(sizes64[bad])} bytes exceeds the limit of {limit}"
            )
        sizes = sizes64.astype(np.int32)

        def encode(
            mapping: Any, in_file: int, file_size: int, position: int, queue_offset: int,
            store_ts_ms: int, done: int, positions: Any,
        ) -> int:  # fmt: skip
            return int(encode_slices(
                mapping, in_file, file_size, position, queue_offset, store_ts_ms,
                store_ts_ms if born_all is None else born_all, queue_id, topic_bytes,
                tag_bytes, offsets, data, null_flags, borns, done, positions,
            ))  # fmt: skip

        return self._append_encoded(
            topic,
            queue_id,
            sizes,
            encode,
            None,
            tag_bytes,
            borns if borns is not None else born_all,
        )

    def _append_encoded(
        self,
        topic: str,
        queue_id: int,
        sizes: np.ndarray,
        encode: Callable[..., int],
        encoded: list[tuple[int, int, bytes, bytes, bytes, Any, int | None]] | None,
        shared_tag: bytes,
        shared_born: np.ndarray | int | None,
    ) -> BatchAppendResult:
        """Write a validated batch under the lock: ``encode`` writes what fits the
        current file from record ``done`` on and returns where it stopped; files roll
        between calls. A crash keeps a prefix of the batch."""
        count = len(sizes)
        key = (topic, queue_id)
        positions = np.empty(count, dtype=np.int64)
        with self._lock:
            self._check_writable()
            first_queue_offset = self._queue_offsets.get(key)
            if first_queue_offset is None:
                first_queue_offset = self._load_queue_offset(topic, queue_id)
            store_ts_ms = max(self.now_ms(), self._last_store_ts_ms)
            position = self._write_position
            current = self._current
            assert current is not None
            mapping = current.mapping
            in_file = position - current.start_offset
            file_size = current.size_bytes
            done = 0
            while True:
                # Encode what fits this file in one call (C when built), then roll.
                stop = encode(mapping, in_file, file_size, position,
                              first_queue_offset + done, store_ts_ms, done, positions)  # fmt: skip
                if stop > done:
                    written = int(positions[stop - 1]) + int(sizes[stop - 1]) - position
                    position += written
                    in_file += written
                    done = stop
                if position >= self._prepare_next_at:
                    self._prepare_next()
                if done == count:
                    break
                if stop == done and in_file == 0:  # config keeps records below a file
                    raise LimitExceededError(f"record {done} does not fit an empty file")
                self._write_position = position  # the records before the roll are in
                self._queue_offsets[key] = first_queue_offset + done
                current = self._roll(in_file)
                mapping = current.mapping
                file_size = current.size_bytes
                position = current.start_offset
                in_file = 0
            self._queue_offsets[key] = first_queue_offset + count
            self._write_position = position
            self._last_store_ts_ms = store_ts_ms
            feed = self._feed
            if feed is not None and not self._feed_overflow:
                if len(feed) < FEED_ENTRIES_MAX:
                    feed.append(
                        BatchFeed(positions, sizes, topic, queue_id, first_queue_offset,
                                  store_ts_ms, encoded, shared_tag, shared_born)
                    )  # fmt: skip
                else:
                    self._feed_overflow = True
        listener = self._append_listener
        if listener is not None:
            listener()
        flusher = self._flusher
        if type(flusher) is GroupCommitService:
            flusher.wait_durable(position)
        return BatchAppendResult(positions, sizes, first_queue_offset, store_ts_ms)

    def _encode_batch(
        self,
        topic_bytes: bytes,
        bodies: Sequence[Any],
        keys: Sequence[Any] | None,
        tags: Sequence[str | None] | str | None,
        properties: Sequence[Any] | None,
        born_ts_ms: Sequence[int | None] | int | None,
    ) -> list[tuple[int, int, bytes, bytes, bytes, Any, int | None]]:
        """Validate and encode every per-record section outside the lock."""
        count = len(bodies)
        for name, items in (("keys", keys), ("properties", properties)):
            if items is not None and len(items) != count:
                raise InvalidArgumentError(f"{name} has {len(items)} items for {count} bodies")
        shared_tag = encode_tag(tags) if tags is None or isinstance(tags, str) else None
        if shared_tag is None and len(tags) != count:  # type: ignore[arg-type]
            raise InvalidArgumentError(f"tags has {len(tags)} items for {count} bodies")  # type: ignore[arg-type]
        shared_born = born_ts_ms if born_ts_ms is None or isinstance(born_ts_ms, int) else None
        if isinstance(born_ts_ms, int):
            _check_timestamp(born_ts_ms)
        elif born_ts_ms is not None and len(born_ts_ms) != count:
            raise InvalidArgumentError(f"born_ts_ms has {len(born_ts_ms)} items for {count} bodies")
        limit = self.config.record_size_limit_bytes
        fixed = HEADER_SIZE + len(topic_bytes)
        encoded = []
        for index, body in enumerate(bodies):
            flags = 0
            if type(body) is not bytes:
                if body is None:
                    flags, body = FLAG_NULL_BODY, b""
                elif not isinstance(body, _BYTES_LIKE):
                    raise InvalidTypeError(f"body must be bytes-like, not {type(body).__name__}")
            tag_b = shared_tag if shared_tag is not None else encode_tag(tags[index])  # type: ignore[index]
            keys_b = encode_keys(keys[index]) if keys is not None else b""
            props_b = encode_properties(properties[index]) if properties is not None else b""
            born = shared_born
            if born_ts_ms is not None and shared_born is None:
                born = born_ts_ms[index]  # type: ignore[index]
                if born is not None:  # None: the store timestamp, as for one append
                    _check_timestamp(born)
            size = fixed + len(tag_b) + len(keys_b) + len(props_b) + len(body)
            if size > limit:
                raise LimitExceededError(
                    f"record {index} of {size} bytes exceeds the limit of {limit}"
                )
            encoded.append((size, flags, tag_b, keys_b, props_b, body, born))
        return encoded

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise FlushFailedError(str(self._failure)) from self._failure.__cause__
        if self._sealed:
            raise StoreClosedError("the CommitLog is closed")
        if self.read_only:
            raise ReadOnlyStoreError("the CommitLog is open read-only")
        if self._reject_reason is not None:
            raise DiskFullError(28, f"writes rejected: {self._reject_reason}")

    def _load_queue_offset(self, topic: str, queue_id: int) -> int:
        loader = self._queue_offset_loader
        offset = loader(topic, queue_id) if loader is not None else 0
        assert offset >= 0
        self._queue_offsets[(topic, queue_id)] = offset
        return offset

    def _roll(self, in_file: int) -> MappedFile:
        """Fill the current file with a blank record and switch to the next one.

        The next file is taken first: if that fails (disk full), nothing changed.
        """
        current = self._current
        assert current is not None
        next_start = current.start_offset + current.size_bytes
        started_ns = time.perf_counter_ns()
        following = self._take_file(next_start)
        self.roll_wait_ns.append(time.perf_counter_ns() - started_ns)
        encode_blank_into(current.mapping, in_file, current.size_bytes - in_file)
        self._current = following
        self._write_position = next_start
        self._arm_prepare_next()
        return following

    def _arm_prepare_next(self) -> None:
        """Set the write position past which the file after the current one is
        requested; request it now if the log is already past it (at open, or a
        threshold of 0). Called under the append lock (or before appends start)."""
        current = self._current
        assert current is not None
        if not self.config.preallocate_next:
            self._prepare_next_at = _NOT_ARMED
            return
        threshold_in_file = current.size_bytes * self.config.prepare_next_percent // 100
        assert 0 <= threshold_in_file < current.size_bytes
        self._prepare_next_at = current.start_offset + threshold_in_file
        if self._write_position >= self._prepare_next_at:
            self._prepare_next()

    def _prepare_next(self) -> None:
        """Ask the allocation service for the file after the current one, once."""
        current = self._current
        allocator = self._allocator
        assert current is not None
        assert allocator is not None
        self._prepare_next_at = _NOT_ARMED
        allocator.request(current.start_offset + current.size_bytes)

    def _take_file(self, start_offset: int) -> MappedFile:
        last = self._files.last
        if last is not None and last.start_offset == start_offset:
            return last
        assert self._allocator is not None
        mapped = self._allocator.take(start_offset)
        self._files.append(mapped)
        return mapped

    def _current_end(self) -> int:
        assert self._current is not None
        return self._current.start_offset + self._current.size_bytes

    def now_ms(self) -> int:
        """The store clock, in ms."""
        clock = self._clock_ms
        return _time_ns() // 1_000_000 if clock is None else clock()

    # ------------------------------------------------------------------ read

    @property
    def write_position(self) -> int:
        return self._write_position

    @property
    def flushed_position(self) -> int:
        return self._flushed_position

    @property
    def min_position(self) -> int:
        """The first physical offset still in the log (retention moves it)."""
        return self._files.first_start

    @property
    def last_store_ts_ms(self) -> int:
        return self._last_store_ts_ms

    @property
    def flushed_mark(self) -> tuple[int, int]:
        """(flushed position, store timestamp of the last record before it; 0: none),
        read as one consistent pair."""
        return self._flushed_mark

    @property
    def file_count(self) -> int:
        return len(self._files.files)

    def files(self) -> list[MappedFile]:
        return list(self._files.files)

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
            not self.read_only and end > self._write_position
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
            limit = min(limit, self._write_position - mapped.start_offset)
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
        stop = self._write_position if end is None else end
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

    # ------------------------------------------------------------------ flush

    def flush_to(self, position: int) -> None:
        """Make every byte before ``position`` durable (one fdatasync per file touched).

        The flush covers the whole log as appended when it starts (at least up to
        ``position``), so ``flushed_ts_ms`` is the store timestamp of the last record
        it covers.

        Raises:
            FlushFailedError: this sync failed, or an earlier one did. The store is
                then poisoned: ``flushed_position`` never moves again and every write
                is refused until the log is reopened and recovered.
        """
        with self._flush_lock:
            if self._failure is not None:
                raise FlushFailedError(str(self._failure)) from self._failure.__cause__
            start = self._flushed_position
            if position <= start:
                return
            with self._lock:  # a record boundary and the timestamp of the record before it
                position, flushed_ts_ms = self._write_position, self._last_store_ts_ms
            files = self._files.files
            for mapped in list(files):
                file_end = mapped.start_offset + mapped.size_bytes
                if file_end > start and mapped.start_offset < position:
                    try:
                        self._syncer(mapped)
                    except Exception as error:
                        self._poison(mapped, start, position, error)
            self._flushed_mark = (position, flushed_ts_ms)  # one assignment: a consistent pair
            self._flushed_position = position
        listener = self._append_listener
        if listener is not None:  # sync mode: newly durable bytes may now be dispatched
            listener()

    def _poison(self, mapped: MappedFile, start: int, end: int, error: Exception) -> NoReturn:
        """Record a failed sync: from now on nothing is flushed or appended."""
        failure = FlushFailedError(
            f"sync of {mapped.path} failed ({error}); bytes in [{start}, {end}) may be "
            "lost. The store refuses writes until it is reopened and recovered"
        )
        failure.__cause__ = error
        self._failure = failure
        log.critical("%s", failure)
        raise failure from error

    @property
    def failure(self) -> FlushFailedError | None:
        """The sync failure that poisoned the log, or None."""
        return self._failure

    # ------------------------------------------------------------------ retention

    def delete_oldest_file(self) -> MappedFile | None:
        """Remove the oldest file (never the one being written). Returns it, closed."""
        with self._lock:
            if len(self._files.files) < 2 or self._files.files[0] is self._current:
                return None
            oldest = self._files.remove_oldest()
        oldest.close()
        os.unlink(oldest.path)
        fsync_directory(self.directory)  # else a power cut brings the file back
        return oldest

    def queue_offsets(self) -> dict[tuple[str, int], int]:
        """The next queue offset of every queue seen since open (a copy)."""
        with self._lock:
            return dict(self._queue_offsets)


def _file_gone(mapped: MappedFile, position: int) -> OffsetOutOfRangeError:
    """A file unmapped between finding and reading it: retention deleted it."""
    return OffsetOutOfRangeError(
        f"physical offset {position} was in {mapped.path}, deleted by retention during the read"
    )


def _check_queue_id(queue_id: object) -> None:
    if isinstance(queue_id, bool) or not isinstance(queue_id, int):
        raise InvalidTypeError(f"queue_id must be an int, not {type(queue_id).__name__}")
    if not 0 <= queue_id <= QUEUE_ID_MAX:
        raise InvalidArgumentError(f"queue_id {queue_id} is outside [0, {QUEUE_ID_MAX}]")


def _check_timestamp(timestamp_ms: object) -> None:
    if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int):
        raise InvalidTypeError(f"timestamps must be int ms, not {type(timestamp_ms).__name__}")
    if not 0 <= timestamp_ms < 2**63:
        raise InvalidArgumentError(f"timestamp {timestamp_ms} ms is outside [0, 2**63)")
