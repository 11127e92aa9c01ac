"""Batch appends of the CommitLog (a mixin of commitlog/commitlog.py's CommitLog): many
records to one queue under one hold of the append lock and one flush, from Python
sequences (``append_batch``) or Arrow-style binary columns (``append_slices``), with an
optional trailer that makes the batch one append group (commitlog/batch.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from mqstore.commitlog.appender import FEED_ENTRIES_MAX, BatchFeed
from mqstore.commitlog.batch import PreparedBatch, Trailer, prepare_batch, prepare_slices
from mqstore.commitlog.errors import FlushTimeoutError, LimitExceededError
from mqstore.commitlog.flush import GroupCommitService
from mqstore.commitlog.mapped_file import MappedFile
from mqstore.commitlog.record import BLANK_SIZE

__all__ = ["BatchAppendResult", "BatchLog"]


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


class BatchLog:
    """The batch appends (see the module)."""

    # CommitLog's, set in its __init__ and open.
    _lock: Any
    _appender: Any
    _current: MappedFile | None
    _group_commit: GroupCommitService | None
    _queue_offsets: dict[tuple[str, int], int]
    _record_size_limit_bytes: int

    if TYPE_CHECKING:  # CommitLog's

        def now_ms(self) -> int: ...
        def _check_writable(self) -> None: ...
        def _queue_offset(self, topic: str, queue_id: int) -> int: ...
        def _roll(self, in_file: int) -> MappedFile: ...
        def _prepare_next(self) -> None: ...
        def _wait_durable(self, group_commit: GroupCommitService, end: int) -> None: ...

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
        trailer: Trailer | None = None,
    ) -> BatchAppendResult:
        """Append many records to one queue under one lock acquisition and one flush.

        ``keys``, ``properties`` and a sequence of ``tags`` or ``born_ts_ms`` give one
        item per body; a single ``tags`` str or ``born_ts_ms`` int applies to all. A
        None born timestamp means the store timestamp.
        A crash mid-batch keeps a prefix of the batch (never a torn record); with a
        ``trailer`` (batch.py), the batch and its trailer are one append group: a
        crash keeps both or neither (record.py's FLAG_GROUP_OPEN).

        Raises:
            The errors of ``append``; nothing is appended if any record is invalid.
        """
        batch = prepare_batch(
            topic, queue_id, bodies, keys, tags, properties, born_ts_ms,
            self._record_size_limit_bytes, group_open=trailer is not None,
        )  # fmt: skip
        return self._append_encoded(topic, queue_id, batch, trailer)

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
        trailer: Trailer | None = None,
    ) -> BatchAppendResult:
        """``append_batch`` for bodies laid out as Arrow binary columns are: body i is
        ``data[offsets[i]:offsets[i + 1]]``, None where ``nulls[i]``; no keys or
        properties; one tag; a born timestamp for all, or one per record (int64).
        Nothing is built per record in Python (C encodes when built).

        Raises:
            The errors of ``append_batch``; InvalidArgumentError for offsets that are
            not non-decreasing within ``data``, or arrays of the wrong length.
        """
        batch = prepare_slices(
            topic, queue_id, offsets, data, nulls, tag, born_ts_ms,
            self._record_size_limit_bytes, group_open=trailer is not None,
        )  # fmt: skip
        return self._append_encoded(topic, queue_id, batch, trailer)

    def _append_encoded(
        self, topic: str, queue_id: int, batch: PreparedBatch, trailer: Trailer | None = None
    ) -> BatchAppendResult:
        """Write a validated batch (and its trailer) under one hold of the lock.

        A group (batch + trailer) that does not fit the rest of the current file but
        fits an empty one starts in the next file, so a group rarely spans files.
        A crash keeps a prefix of the batch; with a trailer, recovery drops a group
        cut short."""
        appender = self._appender
        with self._lock:
            self._check_writable()
            first_queue_offset = self._queue_offset(topic, queue_id)
            store_ts_ms = max(self.now_ms(), appender.last_store_ts_ms)
            closing = None
            if trailer is not None:  # before any byte is written: it may raise
                closing = trailer.prepare(first_queue_offset, self._record_size_limit_bytes)
                self._start_group(int(batch.sizes.sum()) + int(closing.sizes.sum()))
            positions = self._write_locked(topic, queue_id, batch, first_queue_offset, store_ts_ms)
            if closing is not None:
                assert trailer is not None
                closing_first = self._queue_offset(trailer.topic, trailer.queue_id)
                closing_positions = self._write_locked(
                    trailer.topic, trailer.queue_id, closing, closing_first, store_ts_ms
                )
            appender.last_store_ts_ms = store_ts_ms
            position = appender.write_position
            feed = appender.feed
            if feed is not None and not appender.feed_overflow:
                if len(feed) + 2 <= FEED_ENTRIES_MAX:
                    feed.append(
                        BatchFeed(positions, batch.sizes, topic, queue_id, first_queue_offset,
                                  store_ts_ms, batch.encoded, batch.tag, batch.born_ts_ms)
                    )  # fmt: skip
                    if closing is not None:
                        assert trailer is not None
                        feed.append(
                            BatchFeed(closing_positions, closing.sizes, trailer.topic,
                                      trailer.queue_id, closing_first, store_ts_ms,
                                      closing.encoded, closing.tag, closing.born_ts_ms)
                        )  # fmt: skip
                else:
                    appender.feed_overflow = True
        listener = appender.listener
        if listener is not None:
            listener()
        group_commit = self._group_commit
        if group_commit is not None:
            try:
                self._wait_durable(group_commit, position)
            except FlushTimeoutError as error:
                error.first_queue_offset = first_queue_offset  # appended all the same
                raise
        return BatchAppendResult(positions, batch.sizes, first_queue_offset, store_ts_ms)

    def _start_group(self, size: int) -> None:
        """Under the lock: roll to the next file when a group of ``size`` bytes does not
        fit the rest of this one but fits an empty file."""
        current = self._current
        assert current is not None
        in_file = self._appender.write_position - current.start_offset
        if in_file and in_file + size + BLANK_SIZE > current.size_bytes >= size + BLANK_SIZE:
            self._roll(in_file)

    def _write_locked(
        self, topic: str, queue_id: int, batch: PreparedBatch, first_queue_offset: int,
        store_ts_ms: int,
    ) -> np.ndarray:  # fmt: skip
        """Under the lock: ``batch.encode`` writes what fits the current file from record
        ``done`` on and returns where it stopped; files roll between calls. Moves the
        write position and the queue's offset; returns the records' positions."""
        sizes, encode = batch.sizes, batch.encode
        count = len(sizes)
        key = (topic, queue_id)
        positions = np.empty(count, dtype=np.int64)
        position = self._appender.write_position
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
            if position >= self._appender.prepare_next_at:
                self._prepare_next()
            if done == count:
                break
            if stop == done and in_file == 0:  # config keeps records below a file
                raise LimitExceededError(f"record {done} does not fit an empty file")
            self._appender.write_position = position  # the records before the roll are in
            self._queue_offsets[key] = first_queue_offset + done
            current = self._roll(in_file)
            mapping = current.mapping
            file_size = current.size_bytes
            position = current.start_offset
            in_file = 0
        self._queue_offsets[key] = first_queue_offset + count
        self._appender.write_position = position
        return positions
