"""The CommitLog: one append-only log of fixed-size mapped files for every topic.

Invariants:
- Records are appended under one lock (``_lock``). Inside it the store timestamp is
  taken (and never decreases in file order), the queue offset of (topic, queue_id) is
  assigned (dense from 0), and the record is written at the write position. The
  append state lives in an Appender (commitlog/appender.py, which also argues why
  the one lock covers it): a record with nothing rare about it is appended by one
  call of it (C when built); the rest (a roll, a queue not loaded yet, anything to
  refuse) take the general path here, under the same lock.
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
log (commitlog/recovery.py).

This module holds open, close, recovery, the per-message append, flushing and
retention; three mixins hold the rest: the batch appends (commitlog/log_batch.py),
the reads (commitlog/log_read.py) and a follower's appends and cuts
(commitlog/log_replica.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from mqstore.commitlog.allocator import AllocationService
from mqstore.commitlog.appender import (
    FEED_ENTRIES_MAX,
    QUEUE_ID_MAX,
    AppendResult,
    BatchFeed,
    FeedEntry,
    new_append_lock,
    new_appender,
)
from mqstore.commitlog.batch import (
    BATCH_MESSAGES_MAX,
    BYTES_LIKE,
    check_queue_id,
    check_timestamp,
)
from mqstore.commitlog.config import CommitLogConfig
from mqstore.commitlog.durable import fsync_directory, makedirs_durable
from mqstore.commitlog.errors import (
    CorruptDataError,
    DiskFullError,
    FlushFailedError,
    InvalidTypeError,
    LimitExceededError,
    NotLeaderError,
    ReadOnlyStoreError,
    StoreClosedError,
)
from mqstore.commitlog.file_queue import MappedFileQueue
from mqstore.commitlog.flush import AsyncFlushService, GroupCommitService
from mqstore.commitlog.log_batch import BatchAppendResult, BatchLog
from mqstore.commitlog.log_read import ReadLog
from mqstore.commitlog.log_replica import ReplicaLog
from mqstore.commitlog.mapped_file import MappedFile
from mqstore.commitlog.queue_table import QueueTable
from mqstore.commitlog.record import (
    BLANK_SIZE,
    FLAG_NULL_BODY,
    HEADER_SIZE,
    encode_blank_into,
    encode_into,
    encode_keys,
    encode_properties,
    encode_tag,
    validate_topic,
)
from mqstore.commitlog.recovery import RunHook, scan_log

__all__ = [
    "BATCH_MESSAGES_MAX",
    "FEED_ENTRIES_MAX",
    "AppendResult",
    "BatchAppendResult",
    "BatchFeed",
    "CommitLog",
    "FeedEntry",
]

log = logging.getLogger(__name__)

_NOT_ARMED = 1 << 62  # a prepare-next threshold no write position reaches


_time_ns = time.time_ns


class CommitLog(ReadLog, BatchLog, ReplicaLog):
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
        self._lock = new_append_lock()  # the one append lock: see commitlog/appender.py
        self._flush_lock = threading.Lock()
        # Next queue offsets: a dict and per-topic seeds, disjoint (commitlog/queue_table.py).
        # _queue_offsets is its dict; a key Python adds goes through _queues.set.
        self._queues = QueueTable()
        self._queue_offsets = self._queues.table
        # The append state (write position, newest store timestamp, current file,
        # prepare-next threshold, feed) lives in the appender, read and set under _lock.
        self._appender = new_appender(self._lock, self._queue_offsets)
        self._appender.seeds = self._queues.seeds
        self._appender.record_size_limit = config.record_size_limit_bytes
        self._appender.clock = clock_ms
        self._appender.prepare_next_at = _NOT_ARMED
        self._append_common = self._appender.append  # bound once: the per-message path
        self._flushed_position = 0
        self._flushed_mark = (0, 0)  # (flushed_position, store ts of the record before it)
        self._failure: FlushFailedError | None = None
        self._current: MappedFile | None = None
        self._allocator: AllocationService | None = None
        self._flusher: AsyncFlushService | GroupCommitService | None = None
        self._group_commit: GroupCommitService | None = None  # the flusher in sync mode
        self._listener: Callable[[], None] | None = None  # see set_append_listener
        self._reject_reason: str | None = None
        self._feed_start = 0
        self._record_size_limit_bytes = config.record_size_limit_bytes
        self._closed = False
        self._sealed = False
        self._follower = False  # see set_follower: takes only append_replica's bytes
        self._open_group_from: int | None = None  # see open_group_start
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
        topic_offsets_loader: Callable[[str], np.ndarray] | None = None,
        syncer: Callable[[MappedFile], None] | None = None,
        clock_ms: Callable[[], int] | None = None,
        store_ts_floor_ms: int = 0,
        on_run: RunHook | None = None,
    ) -> CommitLog:
        """Open (or create) the log in ``directory`` and recover its end.

        Args:
            recover_from: a record boundary known valid (the smaller of the
                checkpoint's flushed and dispatched positions). None scans from the
                first file. Every record scanned counts in the queue-offset table.
            queue_offset_loader: gives the next queue offset of a queue the log has
                not seen since open (from the ConsumeQueue). Without it, offsets come
                from the records scanned at open (so ``recover_from`` must be None).
            topic_offsets_loader: gives the next queue offsets of many queues of a
                topic at once (an int64 array by queue id; -1, or an id past its end,
                for a queue to ask ``queue_offset_loader``). Asked once per topic, on
                the first queue of the topic the log has not seen since open. The
                array is the log's from then on: an append to a queue it holds
                advances it in place, in the one-call path (issue 15;
                commitlog/queue_table.py). The table's own counts (records scanned at
                open, appends) win.
            syncer: makes one file durable; tests inject counting or failing ones.
            clock_ms: the store clock; tests inject a fake one.
            store_ts_floor_ms: a store timestamp the log already used (the
                checkpoint's): new records never get an earlier one, even when the
                clock stepped back across a restart and the scan read no record.
            on_run: takes the recovery scan's runs of verified records (the store's
                re-dispatch during the scan: commitlog/recovery.py, ``RunHook``).

        Raises:
            CorruptDataError: files are missing, misnamed or of the wrong size, or
                the checkpoint points past the log.
        """
        if not read_only:
            makedirs_durable(directory)
        commitlog = cls(directory, config, read_only, syncer, clock_ms)
        commitlog._queues.queue_loader = queue_offset_loader
        commitlog._queues.topic_loader = topic_offsets_loader
        commitlog._appender.last_store_ts_ms = max(0, store_ts_floor_ms)
        try:
            commitlog._files.load()
            commitlog._recover(recover_from, on_run)
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
        if self._current is None or self._appender.write_position == self._current_end():
            self._set_current(self._take_file(self._appender.write_position))
        self._arm_prepare_next()
        if config.flush_mode == "sync":
            self._flusher = self._group_commit = GroupCommitService(
                self, config.sync_flush_timeout_ms
            )
        else:
            self._flusher = AsyncFlushService(
                self,
                config.flush_interval_ms,
                config.flush_least_pages,
                config.flush_thorough_interval_ms,
            )
        self._update_accepting()

    def _update_accepting(self) -> None:
        """Tell the appender whether appends may go ahead: not when closed, sealed,
        read-only, rejected or poisoned (the general path raises the error then)."""
        self._appender.accepting = (
            not self._sealed
            and not self.read_only
            and not self._follower
            and self._failure is None
            and self._reject_reason is None
        )

    def seal(self) -> None:
        """Refuse further appends and flush what was appended; reads still work."""
        with self._lock:
            self._sealed = True
            self._update_accepting()
        if not self.read_only and self._failure is None:
            self.flush_to(self._appender.write_position)

    def close(self) -> None:
        """Flush everything, stop the services and unmap the files. A poisoned log
        (``failure``) is closed without a flush: recovery at the next open decides
        what of its unflushed tail is on disk."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
            self._sealed = True
            self._update_accepting()
        try:
            if self._flusher is not None:
                self._flusher.close()
            if self._allocator is not None:
                self._allocator.close()
            if not self.read_only and self._failure is None:
                self.flush_to(self._appender.write_position)
        finally:
            self._release_files()

    def _release_files(self) -> None:
        with self._lock:
            self._set_current(None)
            self._appender.listener = self._listener = None  # no cycle via the dispatcher
        self._files.close()

    def _crash(self) -> None:
        """Stop the services without the final flush (fault tests only)."""
        with self._lock:
            self._closed = True
            self._sealed = True
            self._update_accepting()
        if self._allocator is not None:
            self._allocator.close()
        if self._flusher is not None:
            self._flusher.close()  # the async loop exits without a last flush
        self._flusher = None
        self.read_only = True  # a later close() must not flush
        self._release_files()

    # ------------------------------------------------------------------ recovery

    def _recover(self, recover_from: int | None, on_run: RunHook | None = None) -> None:
        files = self._files
        if not files.files:
            self._appender.write_position = self._flushed_position = recover_from or 0
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
        appender = self._appender
        start_ts_ms = appender.last_store_ts_ms  # a timestamp used at or before start
        end, appender.last_store_ts_ms = scan_log(
            files, start, self._queue_offsets, appender.last_store_ts_ms, on_run
        )
        self._queues.after_scan()
        assert start <= end, f"the scan went back from {start} to {end}"
        appender.write_position = end
        if self.read_only:  # a reader never syncs; what it sees is what it reads
            self._flushed_position = end
            self._flushed_mark = (end, appender.last_store_ts_ms)
            return
        # Only what precedes the scan start is known durable: a dead writer may have
        # left any file in [start, end) dirty (a SIGKILL keeps the page cache). The
        # next flush_to syncs them all: the store's at open in sync mode (records are
        # readable once flushed), else the flush service's first pass, off the open.
        self._flushed_position = start
        self._flushed_mark = (start, start_ts_ms)
        if self._truncate_after(end) and self._current is not None:
            # Zeros over a torn or corrupt tail are durable before a new record
            # follows them: else a power cut could bring old records back behind it.
            self._syncer(self._current)

    def _truncate_after(self, end: int) -> int:
        """Zero the current file past ``end`` and remove every later file; returns
        the bytes zeroed."""
        self._files.remove_after(end)
        last = self._files.last
        if last is None or end >= last.start_offset + last.size_bytes:
            self._set_current(None)
            return 0
        assert last.start_offset <= end
        zeroed = last.zero_from(end - last.start_offset)
        if zeroed:
            log.warning(
                "zeroed %d bytes of %s past the end of the log at %d", zeroed, last.path, end
            )
        self._set_current(last)
        return zeroed

    # ------------------------------------------------------------------ append

    def set_append_listener(
        self, listener: Callable[[], None] | None, *, once: bool = False
    ) -> None:
        """Called (outside the lock) after every flush, and in async flush mode after
        every append: the dispatcher's wake-up when bytes become readable. (In sync
        mode an append is readable once flushed: waking anyone before is wasted.)

        ``once``: the appender's per-message path calls it once per arming
        (``arm_append_listener``; armed now), the other paths after each append as
        before. Whoever arms it must start reading the log's end after arming, so that
        what was appended while it was not armed is read all the same."""
        appender = self._appender
        self._listener = listener
        appender.listener = listener if self._group_commit is None else None
        appender.listen_once = once
        appender.listen = True

    def arm_append_listener(self) -> None:
        """Have the next append call the listener (see ``set_append_listener``)."""
        self._appender.listen = True

    def enable_feed(self) -> None:
        """Start keeping, for the dispatcher, what each append wrote (see FeedEntry)."""
        with self._lock:
            self._appender.feed = []
            self._feed_start = self._appender.write_position
            self._appender.feed_overflow = False

    def take_feed(self) -> tuple[int, list[FeedEntry], int]:
        """Hand over the appends kept since the last call.

        Returns:
            (start, entries, stop): ``entries`` describe, in log order, records from
            physical ``start`` on; they may stop short of ``stop`` (the write position
            now) when the feed overflowed, and then the dispatcher reads the rest from
            the log itself.
        """
        with self._lock:
            start, entries, stop = (
                self._feed_start,
                self._appender.feed,
                self._appender.write_position,
            )
            assert entries is not None, "enable_feed() first"
            self._appender.feed = []
            self._feed_start = stop
            self._appender.feed_overflow = False
        return start, entries, stop

    def reject_writes(self, reason: str | None) -> None:
        """Refuse appends with DiskFullError while ``reason`` is set (disk watermark)."""
        self._reject_reason = reason
        self._update_accepting()

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
        if not keys and not properties:  # the common case: one C call when built
            result = self._append_common(topic, queue_id, body, tag, born_ts_ms, b"", b"")
            if result is None:
                return self._append_general(topic, queue_id, body, keys, tag, properties,
                                            born_ts_ms)  # fmt: skip
        else:
            return self._append_general(topic, queue_id, body, keys, tag, properties, born_ts_ms)
        group_commit = self._group_commit
        if group_commit is not None:
            self._wait_durable(group_commit, result[0] + result[3])
        return result

    def _append_general(
        self, topic: str, queue_id: int, body: bytes | bytearray | memoryview | None,
        keys: Sequence[str] | str | None, tag: str | None, properties: Any,
        born_ts_ms: int | None,
    ) -> AppendResult:  # fmt: skip
        """``append`` for what the appender leaves to Python: validate (raising the
        typed errors), encode keys and properties, then let the appender try again
        and, where it cannot, append under the lock here."""
        topic_bytes = validate_topic(topic)
        if type(queue_id) is not int or not 0 <= queue_id <= QUEUE_ID_MAX:
            check_queue_id(queue_id)
            queue_id = int.__int__(queue_id)  # an int subclass (IntEnum): the feed takes ints
        if type(topic) is not str:
            topic = topic_bytes.decode("utf-8")  # a str subclass: the same, exactly a str
        given = body
        flags = 0
        if type(body) is not bytes:
            if body is None:
                flags = FLAG_NULL_BODY
                body = b""
            elif not isinstance(body, BYTES_LIKE):
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
            check_timestamp(born_ts_ms)
        result = self._append_common(topic, queue_id, given, tag, born_ts_ms, keys_bytes,
                                     properties_bytes)  # fmt: skip
        if result is None:
            sections = (flags, topic_bytes, tag_bytes, keys_bytes, properties_bytes, body)
            result = self._append_locked(topic, queue_id, size, born_ts_ms, sections)
        group_commit = self._group_commit
        if group_commit is not None:
            self._wait_durable(group_commit, result[0] + result[3])
        return result

    def _append_locked(
        self, topic: str, queue_id: int, size: int, born_ts_ms: int | None,
        sections: tuple[int, bytes, bytes, bytes, bytes, Any],
    ) -> AppendResult:  # fmt: skip
        """One validated record, under the lock: loads the queue's offset, rolls the
        file, requests the next one, raises for a log that refuses appends."""
        flags, topic_bytes, tag_bytes, keys_bytes, properties_bytes, body = sections
        key = (topic, queue_id)
        appender = self._appender
        with self._lock:
            self._check_writable()
            queue_offset = self._queues.get(topic, queue_id)
            store_ts_ms = max(self.now_ms(), appender.last_store_ts_ms)
            position = appender.write_position
            current = self._current
            assert current is not None
            in_file = position - current.start_offset
            if in_file + size + BLANK_SIZE > current.size_bytes:
                current = self._roll(in_file)
                position = current.start_offset
                in_file = 0
            born = store_ts_ms if born_ts_ms is None else born_ts_ms
            encode_into(
                current.mapping, in_file, position, size, queue_offset, born, store_ts_ms,
                queue_id, flags, topic_bytes, tag_bytes, keys_bytes, properties_bytes, body,
            )  # fmt: skip
            self._queue_offsets[key] = queue_offset + 1
            appender.write_position = position + size
            appender.last_store_ts_ms = store_ts_ms
            if position + size >= appender.prepare_next_at:
                self._prepare_next()
            feed = appender.feed
            if feed is not None and not appender.feed_overflow:
                if len(feed) < FEED_ENTRIES_MAX:
                    feed.append((position, size, topic, queue_id, queue_offset, born,
                                 store_ts_ms, tag_bytes, keys_bytes))  # fmt: skip
                else:
                    appender.feed_overflow = True
        listener = appender.listener
        if listener is not None:
            listener()
        return AppendResult(position, queue_offset, store_ts_ms, size)

    def count_queues_from(self, position: int) -> None:
        """Fold the queue offsets of the records from record boundary ``position`` to
        the end into the queue-offset table, as recovery folds those past the
        checkpoint's flushed position: when readers are held before them
        (``MessageStore.open(replicated=True)``), their ConsumeQueues lack them, and
        an append must not take a queue's next offset from there."""
        with self._lock:
            start = max(position, self.min_position)
            scan_log(self._files, start, self._queue_offsets, self._appender.last_store_ts_ms)
            self._queues.after_scan()

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next append to (topic, queue_id) gets: the end of the
        queue in the log, which readers may not see all of yet (the dispatcher is
        behind, or held by a commit limit).

        Raises:
            InvalidTypeError, InvalidArgumentError: ``queue_id`` is not an int in
                [0, QUEUE_ID_MAX].
        """
        check_queue_id(queue_id)
        with self._lock:
            return self._queue_offset(topic, queue_id)

    def _queue_offset(self, topic: str, queue_id: int) -> int:
        """Under the lock: the next queue offset of (topic, queue_id), in the table
        from then on."""
        return self._queues.get(topic, queue_id)

    def _wait_durable(self, group_commit: GroupCommitService, end: int) -> None:
        """Sync mode: wait until ``end`` is durable."""
        group_commit.wait_durable(end)

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise FlushFailedError(str(self._failure)) from self._failure.__cause__
        if self._sealed:
            raise StoreClosedError("the CommitLog is closed")
        if self.read_only:
            raise ReadOnlyStoreError("the CommitLog is open read-only")
        if self._follower:
            raise NotLeaderError("the CommitLog is a follower's: it takes only replicated bytes")
        if self._reject_reason is not None:
            raise DiskFullError(28, f"writes rejected: {self._reject_reason}")

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
        self._set_current(following)
        self._appender.write_position = next_start
        self._arm_prepare_next()
        return following

    def _arm_prepare_next(self) -> None:
        """Set the write position past which the file after the current one is
        requested; request it now if the log is already past it (at open, or a
        threshold of 0). Called under the append lock (or before appends start)."""
        current = self._current
        assert current is not None
        if not self.config.preallocate_next:
            self._appender.prepare_next_at = _NOT_ARMED
            return
        threshold_in_file = current.size_bytes * self.config.prepare_next_percent // 100
        assert 0 <= threshold_in_file < current.size_bytes
        self._appender.prepare_next_at = current.start_offset + threshold_in_file
        if self._appender.write_position >= self._appender.prepare_next_at:
            self._prepare_next()

    def _prepare_next(self) -> None:
        """Ask the allocation service for the file after the current one, once."""
        current = self._current
        allocator = self._allocator
        assert current is not None
        assert allocator is not None
        self._appender.prepare_next_at = _NOT_ARMED
        allocator.request(current.start_offset + current.size_bytes)

    def _take_file(self, start_offset: int) -> MappedFile:
        last = self._files.last
        if last is not None and last.start_offset == start_offset:
            return last
        assert self._allocator is not None
        mapped = self._allocator.take(start_offset)
        self._files.append(mapped)
        return mapped

    def _set_current(self, mapped: MappedFile | None) -> None:
        """Make ``mapped`` the file appends go to, for the appender too (under the lock,
        or before appends start)."""
        self._current = mapped
        appender = self._appender
        if mapped is None:
            appender.mapping = None
            appender.file_start = appender.file_size = 0
            return
        appender.mapping = mapped.mapping
        appender.file_start = mapped.start_offset
        appender.file_size = mapped.size_bytes

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
        return self._appender.write_position

    @property
    def flushed_position(self) -> int:
        return self._flushed_position

    @property
    def sync_waiting(self) -> int:
        """Writers waiting for a sync flush to cover their records (0 in async mode)."""
        group_commit = self._group_commit
        return 0 if group_commit is None else group_commit.waiting

    @property
    def min_position(self) -> int:
        """The first physical offset still in the log (retention moves it)."""
        return self._files.first_start

    @property
    def last_store_ts_ms(self) -> int:
        return self._appender.last_store_ts_ms

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
                position, flushed_ts_ms = (
                    self._appender.write_position,
                    self._appender.last_store_ts_ms,
                )
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
        listener = self._listener
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
        self._update_accepting()
        log.critical("%s", failure)
        raise failure from error

    @property
    def failure(self) -> FlushFailedError | None:
        """The sync failure that poisoned the log, or None."""
        return self._failure

    # ------------------------------------------------------------------ retention

    def delete_oldest_file(self) -> MappedFile | None:
        """Remove the oldest file (never the one being written). Returns it, closed.

        Under the flush lock (taken before the append lock, as flush_to takes them): a
        flush that copied the file list before the removal finishes its syncs first.
        """
        with self._flush_lock:
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
            return self._queues.snapshot()
