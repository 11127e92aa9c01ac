"""One ConsumeQueue: the 20-byte units of one (topic, queue id), and their timestamps.

Format: see mqstore.consumequeue.format. Queue offset n is unit n % units_per_file of unit file
n // units_per_file; its timestamp sits at the same index of the file's time file.

Invariants (of the files on disk and of this object's state):
- The queue's files are contiguous: file indexes ``[file_lo, file_hi)``.
- The written units form one run ``[first_offset, max_offset)``. Units before
  ``first_offset`` (only in the first file, after a queue began at offset N) and from
  ``max_offset`` on are all-zero. ``max_offset`` is the next offset to write.
- ``first_offset <= min_offset <= max_offset``. ``min_offset`` rises when retention
  deletes the CommitLog below the queue's units (``correct_min_offset``).
- Commitlog offsets strictly increase with queue offset (binary searches rely on it).
- A unit's size field is written last: a non-zero size means the whole unit, its
  timestamp and its block maximum are in place.

Load: lazy, on the first use of a queue. The directory is listed; ``max_offset`` is
found by a binary search over the newest file (O(log units_per_file)), ``first_offset``
from the header of the oldest time file.

Crash policy: units are rebuilt from the CommitLog by re-dispatch, so writes are
idempotent: re-putting a stored unit is a no-op (it also repairs the unit's timestamp
and block maximum), re-putting into an unwritten slot below max_offset fills it, and a
different unit at a stored offset is a conflict (CorruptDataError). After CommitLog
recovery, ``truncate_beyond_commitlog`` drops units that point past the log's end.

Read-only queues (another process writes) see new units through the shared page cache;
they re-check max_offset whenever asked at or past the max they know, and reload when
retention removed a file under them.

Threading: every method holds the store lock (an RLock shared with the file cache).
"""

from __future__ import annotations

import logging
from typing import Final

import numpy as np

from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
    StoreClosedError,
)
from mqstore.consumequeue import queue_recovery, queue_shared, queue_time, reput_check
from mqstore.consumequeue.format import TIMESTAMP, UNIT, UNIT_SIZE_BYTES
from mqstore.consumequeue.queue_files import QueueContext, QueueFiles
from mqstore.consumequeue.queue_recovery import UnitVerifier
from mqstore.consumequeue.queue_writes import QueueWrites
from mqstore.consumequeue.reput_check import RunColumns
from mqstore.consumequeue.shared_log import SharedUnitLog
from mqstore.consumequeue.time_index import TimeIndex
from mqstore.consumequeue.unit_batch import (
    INT64_MAX,
    INT64_MIN,
    QUEUE_OFFSET_MAX,
    SIZE_MAX_BYTES,
    UnitBatch,
    check_int,
)

__all__ = ["ConsumeQueue"]

log = logging.getLogger(__name__)

#: Up to this many units, the shared log is read unit by unit (read_points: ~0.8 us a
#: unit) rather than gathered (read_units: ~10 us of numpy calls, whatever the count).
_POINT_READ_UNITS_MAX: Final = 12
#: Up to this many units, the written check takes the minimum of a list (~30 ns a
#: unit) rather than calling numpy (~1.2 us a call).
_LIST_CHECK_UNITS_MAX: Final = 32


class ConsumeQueue(QueueWrites):
    """The units of one (topic, queue id). Obtain it from ``ConsumeQueueStore.queue``.

    Attributes:
        topic: the topic name.
        queue_id: the queue number within the topic.
        directory: ``<consumequeue dir>/<topic>/<queue_id>``.
    """

    __slots__ = (
        "_ctx",
        "_file_lo",
        "_files",
        "_first_offset",
        "_loaded",
        "_min_offset",
        "_shared",
        "_upf",
        "directory",
        "queue_id",
        "topic",
    )
    _file_lo: int  # oldest file index
    _file_hi: int  # newest file index + 1
    _first_offset: int  # first unit written on disk
    _min_offset: int
    _max_offset: int
    _last_commitlog_offset: int | None  # of the unit at max_offset - 1
    _time_index: TimeIndex | None  # built on the first offset_for_time
    _shared: SharedUnitLog | None  # the topic's shared unit log (see queue_shared)

    def __init__(
        self,
        context: QueueContext,
        topic: str,
        queue_id: int,
        directory: str,
        serial: int,
        *,
        known_empty: bool = False,
        shared: SharedUnitLog | None = None,
    ) -> None:
        """Built by the store. ``known_empty``: the writer knows the directory is absent,
        so the queue starts loaded without own files, without listing it. ``shared``:
        the topic's shared unit log, which holds the queue's units below its own files."""
        self._ctx = context
        self._shared = shared
        self.topic = topic
        self.queue_id = queue_id
        self.directory = directory
        self._files = QueueFiles(context, directory, serial)
        self._upf = context.config.units_per_file
        self._loaded = known_empty
        self._set_empty(0)

    def __repr__(self) -> str:
        return f"ConsumeQueue({self.topic!r}, {self.queue_id})"

    # ----------------------------------------------------------------- offsets

    @property
    def min_offset(self) -> int:
        """The first readable queue offset."""
        with self._ctx.lock:
            self._enter()
            if self._ctx.read_only:
                queue_shared.refresh_min(self)
            return queue_shared.low_offset(self)

    @property
    def max_offset(self) -> int:
        """The next queue offset to write (Kafka's "latest"); re-checked when read-only."""
        with self._ctx.lock:
            self._enter()
            if self._ctx.read_only:
                queue_shared.refresh_max(self)
            return self._max_offset

    @property
    def known_max_offset(self) -> int:
        """The max offset as this queue last learned it, without re-reading the
        writer's files (``max_offset`` does, read-only): what the last ``get_range``
        stopped at. A writer's is its own, authoritative."""
        return self._max_offset

    def refresh(self) -> None:
        """Re-read the queue's files (read-only queues: see the writer's latest state).

        A writable queue's state is authoritative; this is a no-op for it.
        """
        with self._ctx.lock:
            self._check_open()
            if self._ctx.read_only:
                if self._shared is not None:
                    self._shared.refresh()
                self._load()

    # ----------------------------------------------------------------- writes

    def put(
        self, queue_offset: int, commitlog_offset: int, size: int, tag_hash: int, timestamp_ms: int
    ) -> None:
        """Write one unit at ``queue_offset`` (idempotent; see the module docstring).

        Raises:
            InvalidArgumentError: a gap (``queue_offset > max_offset`` in a queue that has
                units), a commitlog offset not above the previous unit's, a value out of
                range (size 1..2**31-1, offsets and timestamp >= 0).
            CorruptDataError: a different unit is stored at ``queue_offset``.
            OffsetOutOfRangeError: ``queue_offset`` lies in a file retention deleted.
            ReadOnlyStoreError, StoreClosedError, DiskFullError.
        """
        queue_offset = check_int("queue_offset", queue_offset, 0, QUEUE_OFFSET_MAX)
        commitlog_offset = check_int("commitlog_offset", commitlog_offset, 0, INT64_MAX)
        size = check_int("size", size, 1, SIZE_MAX_BYTES)
        tag_hash = check_int("tag_hash", tag_hash, INT64_MIN, INT64_MAX)
        timestamp_ms = check_int("timestamp_ms", timestamp_ms, 0, INT64_MAX)
        with self._ctx.lock:
            self._enter_for_write()
            if self._shared is not None and (
                queue_offset < self._first_offset or self._file_lo == self._file_hi
            ):
                batch = UnitBatch.of(
                    np.array([commitlog_offset]), np.array([size]),
                    np.array([tag_hash]), np.array([timestamp_ms]),
                )  # fmt: skip
                if queue_shared.put_shared(self, queue_offset, batch):
                    return
            if self._is_empty() or self._restarts_at(queue_offset):
                self._start_at(queue_offset)
            elif queue_offset < self._max_offset:
                self._reput_one(queue_offset, commitlog_offset, size, tag_hash, timestamp_ms)
                return
            elif queue_offset > self._max_offset:
                raise InvalidArgumentError(
                    f"{self}: put at queue offset {queue_offset} would leave a gap after "
                    f"max offset {self._max_offset}"
                )
            self._check_commitlog_order(commitlog_offset)
            self._append_one(queue_offset, commitlog_offset, size, tag_hash, timestamp_ms)

    def put_batch(
        self,
        first_queue_offset: int,
        commitlog_offsets: np.ndarray,
        sizes: np.ndarray,
        tag_hashes: np.ndarray,
        timestamps_ms: np.ndarray,
    ) -> None:
        """Write units at ``first_queue_offset, first_queue_offset + 1, ...``.

        The part below max_offset is checked like ``put`` (stored units must match,
        unwritten slots are filled); the rest is appended, file by file. Everything is
        validated before the first byte is written.

        Raises:
            As ``put``; also InvalidArgumentError for arrays that are not 1-D integer
            arrays of one length, or commitlog offsets that do not strictly increase.
        """
        first = check_int("first_queue_offset", first_queue_offset, 0, QUEUE_OFFSET_MAX)
        batch = UnitBatch.of(commitlog_offsets, sizes, tag_hashes, timestamps_ms)
        if first + len(batch) > QUEUE_OFFSET_MAX:
            raise InvalidArgumentError(f"batch ends past queue offset {QUEUE_OFFSET_MAX}")
        if not len(batch):
            return
        with self._ctx.lock:
            self._enter_for_write()
            if self._shared is not None and (
                first < self._first_offset or self._file_lo == self._file_hi
            ):
                handled = queue_shared.put_shared(self, first, batch)
                if handled == len(batch):
                    return
                first, batch = first + handled, batch.tail(handled)
            if self._is_empty() or self._restarts_at(first):
                self._start_at(first)
            elif first > self._max_offset:
                raise InvalidArgumentError(
                    f"{self}: batch at queue offset {first} would leave a gap after max "
                    f"offset {self._max_offset}"
                )
            overlap = min(len(batch), self._max_offset - first)
            assert overlap >= 0
            if overlap > 0:
                self._check_reput_range(first, batch.head(overlap))
            if overlap < len(batch):
                self._check_commitlog_order(int(batch.commitlog_offsets[overlap]))
            if overlap > 0:
                self._reput_range(first, batch.head(overlap))
            if overlap < len(batch):
                self._write_units(self._max_offset, batch.tail(overlap))

    def units_in_place(self, first_queue_offset: int, run: RunColumns, lo: int, count: int
                       ) -> int:  # fmt: skip
        """How many of the units at ``first_queue_offset, ...``, rows ``lo .. lo + count``
        of ``run`` in its order, the queue's own files hold already, timestamps and block
        maxima included: ``put_batch`` would write none of them (see reput_check). The
        re-dispatch after a SIGKILL skips them. Writer only."""
        with self._ctx.lock:
            self._enter_for_write()
            return reput_check.queue_units_in_place(self, first_queue_offset, run, lo, count)

    def append_limit(self) -> int:
        """The queue offset from which units go to the queue's own files; -1 when every
        unit does (see queue_shared.append_limit). Writer only."""
        with self._ctx.lock:
            self._enter_for_write()
            return queue_shared.append_limit(self)

    def truncate(self, offset: int) -> None:
        """Drop every unit at or above ``offset``: zero them in their file, delete files
        that hold no unit below ``offset``. A truncation below every unit empties the
        queue; its next put may then start anywhere.

        Raises:
            ReadOnlyStoreError, StoreClosedError.
        """
        offset = check_int("offset", offset, 0, QUEUE_OFFSET_MAX)
        with self._ctx.lock:
            self._enter_for_write()
            self._truncate(offset)

    def flush(self) -> None:
        """Make this queue's writes durable (fdatasync of its dirty files, fsync of the
        directories on its path). No-op when read-only."""
        with self._ctx.lock:
            self._check_open()
        if not self._ctx.read_only:
            self._ctx.cache.flush(self.directory)

    # ----------------------------------------------------------------- reads

    def get(self, offset: int) -> np.void:
        """The unit at ``offset`` (a copy; fields commitlog_offset, size, tag_hash).

        Raises:
            OffsetOutOfRangeError: ``offset`` outside ``[min_offset, max_offset)``.
            CorruptDataError: the unit is not written although it is below max_offset.
        """
        offset = check_int("offset", offset, 0, QUEUE_OFFSET_MAX)
        with self._ctx.lock:
            self._enter()
            self._check_range(offset, offset + 1)
            if offset < self._first_offset:
                shared_unit: np.void = queue_shared.read_units(self, offset, 1)[0]
                return shared_unit
            file_index, unit_in_file = divmod(offset, self._upf)
            unit: np.void = self._files.units(file_index).units[unit_in_file].copy()
            if unit["size"] <= 0:
                self._raise_unwritten(file_index, unit_in_file, offset)
            return unit

    def get_range(self, start: int, max_units: int) -> np.ndarray:
        """Up to ``max_units`` units from ``start``: a read-only view on the mapping.

        The result stops at the end of the file that holds ``start`` (at most
        units_per_file - start % units_per_file units) and at max_offset, so it is a
        zero-copy view. It has at least one unit when ``start < max_offset`` and
        ``max_units >= 1``, and none when ``start == max_offset``. The view stays valid
        after its file is evicted from the cache or the store is closed (it keeps the
        mapping, and one descriptor, alive until dropped). It is live: units below
        max_offset never change, but a later truncate zeroes what it shows.

        Raises:
            OffsetOutOfRangeError: ``start < min_offset`` or ``start > max_offset``.
            CorruptDataError: an unwritten unit below max_offset.
        """
        start = check_int("start", start, 0, QUEUE_OFFSET_MAX)
        max_units = check_int("max_units", max_units, 0, QUEUE_OFFSET_MAX)
        with self._ctx.lock:
            self._enter()
            if self._ctx.read_only:
                if start + max(max_units, 1) > self._max_offset:
                    queue_shared.refresh_max(self)  # asked at or past our max: follow, once
                self._check_bounds(start, start)
            elif not self._min_offset <= start <= self._max_offset:
                # The shared run's units lie below min_offset: only then is the run
                # looked up (the lowest readable offset is never above min_offset).
                self._check_range(start, start)
            if start < self._first_offset:
                count = min(max_units, self._first_offset - start)
                return _read_only(self._shared_units(start, count))
            file_index, unit_in_file = divmod(start, self._upf)
            count = min(max_units, self._max_offset - start, self._upf - unit_in_file)
            if count <= 0:
                return _read_only(_NO_UNITS)  # a view: its base stays read-only
            units = self._files.units(file_index)
            end = unit_in_file + count
            self._check_written(units.sizes[unit_in_file:end], file_index, unit_in_file, start)
            view = units.units[unit_in_file:end]
            view.setflags(write=False)  # a new view: _read_only's second one is not needed
            return view

    def timestamps(self, start: int, count: int) -> np.ndarray:
        """The timestamps (int64 ms) of units ``[start, start + count)``.

        A read-only view when the range lies in one file, else a copy.

        Raises:
            OffsetOutOfRangeError: the range is not inside ``[min_offset, max_offset)``.
        """
        start = check_int("start", start, 0, QUEUE_OFFSET_MAX)
        count = check_int("count", count, 0, QUEUE_OFFSET_MAX)
        with self._ctx.lock:
            self._enter()
            self._check_range(start, start + count)
            parts = []
            offset = start
            if offset < self._first_offset:
                take = min(count, self._first_offset - offset)
                parts.append(queue_shared.read_timestamps(self, offset, take))
                offset += take
            while offset < start + count:
                file_index, unit_in_file = divmod(offset, self._upf)
                take = min(start + count - offset, self._upf - unit_in_file)
                times = self._files.times(file_index).times
                parts.append(times[unit_in_file : unit_in_file + take])
                offset += take
            if len(parts) == 1:
                return _read_only(parts[0])
            return np.concatenate(parts) if parts else np.empty(0, dtype=TIMESTAMP)

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """The first queue offset (in offset order, >= min_offset) whose timestamp is
        >= ``timestamp_ms``; None if there is none.

        Timestamps may be out of order (CreateTime). One search over the in-memory
        running maxima (the units of the head, then the blocks), then at most one block
        (time_index_interval_units timestamps) is scanned: see
        mqstore.consumequeue.queue_time. The CommitLog is never read.

        Raises:
            CorruptDataError: a block maximum promises a timestamp its block lacks.
        """
        timestamp_ms = check_int("timestamp_ms", timestamp_ms, INT64_MIN, INT64_MAX)
        with self._ctx.lock:
            self._enter()
            if self._ctx.read_only:
                queue_shared.refresh_max(self)
            return queue_time.offset_for_time(self, timestamp_ms)

    def time_probe(self, timestamp_ms: int) -> queue_time.TimeProbe:
        """``offset_for_time``, with what a caller spot-checks the answer against (the
        units and stored timestamps of the answer and of the unit before it, or of the
        last two units when there is no answer), in one locked call.

        Raises:
            CorruptDataError: as ``offset_for_time``; or a probed unit is unwritten.
        """
        timestamp_ms = check_int("timestamp_ms", timestamp_ms, INT64_MIN, INT64_MAX)
        with self._ctx.lock:
            self._enter()
            if self._ctx.read_only:
                queue_shared.refresh_max(self)
            return queue_time.lookup(self, timestamp_ms)

    # ------------------------------------------------ store-wide maintenance

    def truncate_beyond_commitlog(self, commitlog_end: int) -> None:
        """Drop every unit whose commitlog_offset >= ``commitlog_end`` (after recovery)."""
        with self._ctx.lock:
            self._enter_for_write()
            if self._first_offset == self._max_offset:
                return
            assert self._last_commitlog_offset is not None
            if self._last_commitlog_offset < commitlog_end:
                return
            cut = self._search_commitlog(commitlog_end, self._first_offset, self._max_offset)
            self._truncate(cut)

    def recover_tail(
        self, commitlog_claim: int, commitlog_min: int, verify: UnitVerifier
    ) -> tuple[int, int | None]:
        """After a power cut: keep the own units the checkpoint vouches for, drop the
        rest (see mqstore.consumequeue.queue_recovery.recover_tail).

        Returns:
            (units dropped, rebuild_from): re-dispatch must start at or before
            ``rebuild_from`` when it is not None (whole files were dropped).
        """
        return queue_recovery.recover_tail(self, commitlog_claim, commitlog_min, verify)

    def correct_min_offset(self, commitlog_min: int) -> None:
        """Raise min_offset to the first unit whose commitlog_offset >= ``commitlog_min``
        (after retention) and delete the files wholly below it, never the newest file
        (it carries max_offset). Read-only queues only move min_offset."""
        with self._ctx.lock:
            self._enter()
            if self._shared is not None and self._ctx.read_only:
                try:
                    self._shared.correct_min_offset(self.queue_id, commitlog_min)
                except CorruptDataError:  # the writer deleted a file under us: reload
                    self._shared.refresh()
                    self._shared.correct_min_offset(self.queue_id, commitlog_min)
            low, high = self._min_offset, self._max_offset
            if low < high and self._commitlog_offset_at(low) < commitlog_min:
                self._min_offset = self._search_commitlog(commitlog_min, low, high)
                self._time_index = None
            if not self._ctx.read_only:
                # Also files left by an earlier call, when they were still the newest.
                self._delete_files_below(self._min_offset)

    # ----------------------------------------------------------------- state

    def _set_empty(self, offset: int) -> None:
        """No files, no units: every offset is ``offset``."""
        self._file_lo = self._file_hi = offset // self._upf
        self._first_offset = self._min_offset = self._max_offset = offset
        self._last_commitlog_offset = None
        self._time_index = None

    def _check_open(self) -> None:
        if self._ctx.closed:
            raise StoreClosedError(f"{self}: the ConsumeQueue store is closed")

    def _enter(self) -> None:
        self._check_open()
        if not self._loaded or self._files.stale:
            self._load()
        elif self._shared is not None and self._file_lo == self._file_hi:
            queue_shared.sync_shared_end(self)

    def _enter_for_write(self, lenient: bool = False) -> None:
        if self._ctx.read_only:
            raise ReadOnlyStoreError(f"{self}: the ConsumeQueue store is open read-only")
        if lenient:
            self._check_open()
            self._load(lenient=True)
            return
        self._enter()

    def _load(self, lenient: bool = False) -> None:
        """List the files, read the oldest header, binary search the newest file
        (``lenient``: sizes only, see ``recover_tail``)."""
        previous_min = self._min_offset if self._loaded else 0
        indexes = self._files.indexes()
        self._loaded = True
        if not indexes:
            self._set_empty(0)
            if self._shared is not None:
                queue_shared.sync_shared_end(self)
            return
        self._file_lo, self._file_hi = indexes[0], indexes[-1] + 1
        self._time_index = None
        first_unit = self._files.times(self._file_lo).first_unit_in_file
        self._first_offset = self._file_lo * self._upf + first_unit
        newest = self._file_hi - 1
        start = first_unit if newest == self._file_lo else 0
        end = self._files.units(newest).written_end(start, -1, check_order=not lenient)
        self._max_offset = max(newest * self._upf + end, self._first_offset)
        self._min_offset = self._first_offset
        if self._first_offset <= previous_min <= self._max_offset:
            self._min_offset = previous_min  # keep a corrected min_offset across reloads
        self._last_commitlog_offset = self._commitlog_offset_before(self._max_offset)

    # ----------------------------------------------------------------- files

    def _delete_files_below(self, offset: int) -> None:
        """Delete the oldest files whose units all lie below ``offset``, never the newest."""
        deleted = False
        while self._file_lo < self._file_hi - 1 and (self._file_lo + 1) * self._upf <= offset:
            self._files.delete(self._file_lo)
            self._file_lo += 1
            deleted = True
        if deleted:  # a later file holds units from its first on
            self._first_offset = max(self._first_offset, self._file_lo * self._upf)
            self._time_index = None
        assert self._first_offset <= self._min_offset

    # ----------------------------------------------------------------- truncation

    def _truncate(self, offset: int) -> None:
        if offset >= self._max_offset:
            return
        self._ctx.cache.generation += 1  # a TailWriter's row for this queue is stale
        self._time_index = None
        if offset <= self._first_offset:
            queue_shared.truncate_to_shared(self, offset)
            return
        file_index, unit_in_file = divmod(offset, self._upf)
        for newer in range(self._file_hi - 1, file_index, -1):
            self._files.delete(newer)  # newest first: a crash leaves a contiguous prefix
        self._file_hi = file_index + 1
        if unit_in_file == 0:
            assert file_index > self._file_lo
            self._files.delete(file_index)
            self._file_hi = file_index
        else:
            self._zero_units(file_index, unit_in_file)
        self._max_offset = offset
        self._min_offset = min(self._min_offset, offset)
        self._last_commitlog_offset = self._commitlog_offset_before(offset)

    def _zero_units(self, file_index: int, unit_in_file: int) -> None:
        """Zero units (sizes first) and timestamps from ``unit_in_file`` to the written end
        of the file, then recompute the maxima of the blocks left."""
        end = min(self._max_offset - file_index * self._upf, self._upf)
        units = self._files.units(file_index, for_write=True)
        units.sizes[unit_in_file:end] = 0
        units.commitlog_offsets[unit_in_file:end] = 0
        units.tag_hashes[unit_in_file:end] = 0
        times = self._files.times(file_index, for_write=True)
        times.times[unit_in_file:end] = 0
        interval = self._ctx.config.time_index_interval_units
        first_block = unit_in_file // interval
        times.block_max[first_block + 1 :] = 0
        self._max_offset = file_index * self._upf + unit_in_file
        self._recompute_block_maxima(file_index, unit_in_file, unit_in_file + 1)

    # ----------------------------------------------------------------- searching

    def _commitlog_offset_at(self, offset: int) -> int:
        file_index, unit_in_file = divmod(offset, self._upf)
        return int(self._files.units(file_index).commitlog_offsets[unit_in_file])

    def _commitlog_offset_before(self, offset: int) -> int | None:
        if offset <= self._first_offset:
            return None
        return self._commitlog_offset_at(offset - 1)

    def _search_commitlog(self, target: int, low: int, high: int) -> int:
        """The first queue offset in ``[low, high)`` whose commitlog_offset >= ``target``
        (``high`` if none). O(log n) probes; each is checked to be written and in order.

        Raises:
            CorruptDataError: an unwritten unit, or commitlog offsets out of order.
        """
        below, above = INT64_MIN, INT64_MAX + 1  # values seen on either side, tightening
        while low < high:
            middle = (low + high) // 2
            file_index, unit_in_file = divmod(middle, self._upf)
            units = self._files.units(file_index)
            if units.sizes[unit_in_file] <= 0:
                self._raise_unwritten(file_index, unit_in_file, middle)
            value = int(units.commitlog_offsets[unit_in_file])
            if not below < value < above:
                raise CorruptDataError(
                    units.path,
                    unit_in_file * UNIT_SIZE_BYTES,
                    f"commitlog offset {value} at queue offset {middle} is out of order",
                )
            if value < target:
                below, low = value, middle + 1
            else:
                above, high = value, middle
        return low

    # ----------------------------------------------------------------- errors

    def _check_range(self, start: int, end: int) -> None:
        """``[start, end)`` must lie in ``[min_offset, max_offset]`` (read-only: re-checked)."""
        if self._ctx.read_only and (
            end > self._max_offset or (start == end and start >= self._max_offset)
        ):
            queue_shared.refresh_max(self)
        self._check_bounds(start, end)

    def _check_bounds(self, start: int, end: int) -> None:
        """``_check_range`` with the max offset as known (read-only: the min re-checked)."""
        low = queue_shared.low_offset(self)
        if self._ctx.read_only and start < low:
            queue_shared.refresh_min(self)
            low = queue_shared.low_offset(self)
        if start < low or end > self._max_offset:
            raise OffsetOutOfRangeError(
                f"{self}: [{start}, {max(end, start)}) is outside [{low}, {self._max_offset})"
            )

    def _shared_units(self, start: int, count: int) -> np.ndarray:
        """Units ``[start, start + count)`` of the shared run (a copy)."""
        if count > _POINT_READ_UNITS_MAX:
            return queue_shared.read_units(self, start, count)
        points = queue_shared.read_points(self, start, count)  # checked as read_units checks
        units = [(commitlog_offset, size, tag_hash)
                 for commitlog_offset, size, tag_hash, _, _, _ in points]  # fmt: skip
        return np.array(units, dtype=UNIT)

    def _check_written(
        self, sizes: np.ndarray, file_index: int, unit_in_file: int, offset: int
    ) -> None:
        """Every unit whose ``sizes`` (from ``unit_in_file``, queue ``offset``) shows is
        written: CorruptDataError (or a reload when read-only) at the first that is not."""
        if len(sizes) <= _LIST_CHECK_UNITS_MAX:
            written = min(sizes.tolist()) > 0
        else:
            written = sizes.min() > 0
        if not written:
            bad = int(np.argmax(sizes <= 0))
            self._raise_unwritten(file_index, unit_in_file + bad, offset + bad)

    def _raise_unwritten(self, file_index: int, unit_in_file: int, offset: int) -> None:
        if self._ctx.read_only:
            self._load()  # the writer may have truncated (recovery) under us
            if not queue_shared.low_offset(self) <= offset < self._max_offset:
                raise OffsetOutOfRangeError(
                    f"{self}: queue offset {offset} was truncated by the writer; the queue "
                    f"now holds [{queue_shared.low_offset(self)}, {self._max_offset})"
                )
        raise CorruptDataError(
            self._files.unit_path(file_index),
            unit_in_file * UNIT_SIZE_BYTES,
            f"queue offset {offset} is below max offset {self._max_offset} but not written",
        )


_NO_UNITS: Final = np.empty(0, dtype=UNIT)
_NO_UNITS.setflags(write=False)


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view
