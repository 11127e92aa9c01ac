"""The follower's side of the CommitLog (a mixin of commitlog/commitlog.py's CommitLog):
appending bytes copied from a leader, cutting the log at a divergence point, and
starting it again past a gap. commitlog/replica.py verifies a chunk before any of it
lands; mqstore/replication drives these calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mqstore.commitlog.batch import BYTES_LIKE
from mqstore.commitlog.config import CommitLogConfig
from mqstore.commitlog.errors import (
    DiskFullError,
    FlushFailedError,
    IllegalStateError,
    InvalidTypeError,
    OffsetOutOfRangeError,
    ReplicaPositionError,
)
from mqstore.commitlog.file_queue import MappedFileQueue
from mqstore.commitlog.flush import GroupCommitService
from mqstore.commitlog.mapped_file import MappedFile
from mqstore.commitlog.recovery import scan_log
from mqstore.commitlog.replica import plan_replica_chunk

if TYPE_CHECKING:
    from mqstore.commitlog.allocator import AllocationService
    from mqstore.commitlog.queue_table import QueueTable

__all__ = ["ReplicaLog"]


class ReplicaLog:
    """A follower's appends and cuts (see the module)."""

    # CommitLog's, set in its __init__ and open.
    config: CommitLogConfig
    read_only: bool
    _files: MappedFileQueue
    _lock: Any
    _flush_lock: threading.Lock
    _appender: Any
    _allocator: AllocationService | None
    _current: MappedFile | None
    _group_commit: GroupCommitService | None
    _syncer: Callable[[MappedFile], None]
    _queue_offsets: dict[tuple[str, int], int]
    _queues: QueueTable
    _flushed_position: int
    _flushed_mark: tuple[int, int]
    _failure: FlushFailedError | None
    _reject_reason: str | None
    _feed_start: int
    _sealed: bool
    _follower: bool
    _open_group_from: int | None

    if TYPE_CHECKING:  # CommitLog's

        @property
        def min_position(self) -> int: ...
        def _update_accepting(self) -> None: ...
        def _check_writable(self) -> None: ...
        def _take_file(self, start_offset: int) -> MappedFile: ...
        def _set_current(self, mapped: MappedFile | None) -> None: ...
        def _arm_prepare_next(self) -> None: ...
        def _prepare_next(self) -> None: ...
        def _truncate_after(self, end: int) -> int: ...
        def _wait_durable(self, group_commit: GroupCommitService, end: int) -> None: ...

    def set_follower(self, follower: bool) -> None:
        """Make the log a follower's (local appends raise NotLeaderError and only
        ``append_replica`` writes) or, with False, a leader's again."""
        with self._lock:
            self._follower = follower
            self._update_accepting()

    @property
    def is_follower(self) -> bool:
        return self._follower

    def append_replica(self, position: int, data: bytes | bytearray | memoryview) -> int:
        """Append bytes copied from the leader's log at physical ``position``.

        ``data`` must be whole records (blank records included) that start at this
        log's write position; commitlog/replica.py verifies every one before a byte
        is written. The new end is published as a local append publishes it: the
        dispatcher is woken (async mode) or the bytes are made durable first (sync
        mode), so ConsumeQueues, the index and the checkpoint follow as for puts.

        Returns:
            The new write position.

        Raises:
            ReplicaPositionError: ``position`` is not the write position.
            CorruptDataError: ``data`` is not whole, valid records (nothing written).
            StoreClosedError, ReadOnlyStoreError, FlushFailedError, DiskFullError:
                as for a local append.
            FlushTimeoutError: sync mode, and the bytes were not durable in time.
        """
        if type(position) is not int or position < 0:
            raise InvalidTypeError(f"position must be an int >= 0, not {position!r}")
        if not isinstance(data, BYTES_LIKE):
            raise InvalidTypeError(f"data must be bytes-like, not {type(data).__name__}")
        if position != self._appender.write_position:  # before any work; again under the lock
            raise ReplicaPositionError(position, self._appender.write_position)
        plan = plan_replica_chunk(data, position, self.config.file_size_bytes)
        view = memoryview(data).cast("B")
        end = position + view.nbytes
        appender = self._appender
        with self._lock:
            self._check_replica_writable()
            if position != appender.write_position:
                raise ReplicaPositionError(position, appender.write_position)
            for physical, start, stop in plan.pieces:
                current = self._current
                assert current is not None
                if physical == current.start_offset + current.size_bytes:
                    current = self._take_file(physical)  # the leader rolled here
                    self._set_current(current)
                    self._arm_prepare_next()
                in_file = physical - current.start_offset
                assert 0 <= in_file <= current.size_bytes - (stop - start)
                current.mapping[in_file : in_file + stop - start] = view[start:stop]
            self._queues.raise_to(plan.queue_offsets)
            appender.write_position = end
            if plan.ends_open:
                if plan.group_end is not None:
                    self._open_group_from = plan.group_end
                elif self._open_group_from is None:
                    self._open_group_from = position
            elif plan.group_end is not None:
                self._open_group_from = None
            appender.last_store_ts_ms = max(appender.last_store_ts_ms, plan.newest_store_ts_ms)
            if end >= appender.prepare_next_at:
                self._prepare_next()
            if appender.feed is not None:
                appender.feed_overflow = True  # the dispatcher reads these from the log
        listener = appender.listener
        if listener is not None:
            listener()
        group_commit = self._group_commit
        if group_commit is not None:
            self._wait_durable(group_commit, end)
        return end

    @property
    def open_group_start(self) -> int | None:
        """Where the append group left open at this log's end starts (None: the log
        ends where a group ends). Only a follower's log can end so, and only until
        the leader's next chunk: its leader cuts chunks at group ends, but a group
        that spans two files comes in two chunks. A follower promoted then truncates
        the open group (``MessageStore.truncate_replica``), as recovery would."""
        return self._open_group_from

    def truncate_replica(self, position: int, derived_end: int) -> int:
        """Cut a follower's log at ``position`` (a record boundary: the divergence
        point its leader named), durably: later files (the allocation service's spare
        included) are deleted, newest first, and the directory synced; then the rest
        of the file that holds ``position`` is zeroed and synced. A crash in between
        leaves a prefix of the old log, which the next divergence check cuts again.

        The queue-offset table is rebuilt as at open: the records from
        ``derived_end`` (below it, every record is in the ConsumeQueues, which the
        caller truncates at ``position`` next) to ``position`` are scanned, and the
        other queues reload from their ConsumeQueues on their next append
        (apache/rocketmq#7689: offsets reused after a truncation lost messages).

        Returns:
            The bytes cut off.

        Raises:
            IllegalStateError: the log is not a follower's.
            OffsetOutOfRangeError: ``position`` is past the end or before the first file.
        """
        with self._flush_lock, self._lock:
            self._check_replica_writable()
            appender = self._appender
            end = appender.write_position
            if not self.min_position <= position <= end:
                raise OffsetOutOfRangeError(
                    f"cannot truncate to {position}: the log holds [{self.min_position}, {end})"
                )
            if position == end:
                return 0
            if self._open_group_from is not None and self._open_group_from >= position:
                self._open_group_from = None
            self._discard_parked(position + 1)  # the newest files first
            self._truncate_after(position)
            if self._current is not None:
                self._syncer(self._current)
            else:  # cut at a file boundary past the last file: take it on the next append
                self._set_current(self._take_file(position))
            appender.write_position = position
            if self._flushed_position > position:
                self._flushed_position = position
                self._flushed_mark = (position, self._flushed_mark[1])
            self._queues.clear()
            rescan_from = max(min(derived_end, position), self.min_position)
            scan_log(self._files, rescan_from, self._queue_offsets, appender.last_store_ts_ms)
            self._queues.after_scan()
            if appender.feed is not None:
                appender.feed = []
                self._feed_start = position
            self._arm_prepare_next()
        return end - position

    def restart_replica_at(self, position: int) -> None:
        """Empty a follower's log and start it again at ``position`` (a file start:
        its leader's first file, when retention removed what this log would copy
        next; Kafka's truncateFullyAndStartAt). Every file is deleted, newest first,
        the directory synced, then an empty file is taken at ``position``. A crash in
        between leaves a prefix of the old log, or none (the caller lowered the
        checkpoint to 0 first), and the next fetch restarts it again.

        Raises:
            IllegalStateError: the log is not a follower's, or ``position`` is not
                past its end or not a file start.
        """
        size = self.config.file_size_bytes
        with self._flush_lock, self._lock:
            self._check_replica_writable()
            appender = self._appender
            if position <= appender.write_position or position % size:
                raise IllegalStateError(
                    f"cannot restart a log ending at {appender.write_position} at {position}"
                )
            self._discard_parked(0)
            self._files.remove_after(-1)
            self._open_group_from = None
            self._set_current(self._take_file(position))
            appender.write_position = position
            self._flushed_position = position
            self._flushed_mark = (position, self._flushed_mark[1])
            self._queues.clear()
            if appender.feed is not None:
                appender.feed = []
                self._feed_start = position
            self._arm_prepare_next()

    def _discard_parked(self, start_offset: int) -> None:
        """Remove the files the allocation service parked (or builds) at or past
        ``start_offset`` before a cut: a spare left past the cut would follow a gap."""
        if self._allocator is not None:
            self._allocator.discard_from(start_offset)

    def _check_replica_writable(self) -> None:
        """append_replica's _check_writable: the same errors, and a leader refuses."""
        if self._failure is not None or self._sealed or self.read_only:
            self._check_writable()
        if not self._follower:
            raise IllegalStateError("append_replica on a leader's log (set_follower first)")
        if self._reject_reason is not None:
            raise DiskFullError(28, f"writes rejected: {self._reject_reason}")
