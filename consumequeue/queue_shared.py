"""The shared-log part of one ConsumeQueue, and the following of a read-only queue.

A queue's units live in two places (docs/QUEUES.md): offsets ``[run.first_offset, g)``
in its topic's shared unit log (mqstore.consumequeue.shared_log), and ``[g, max_offset)``
in files of its own, where ``g`` is the queue's ``_first_offset`` (its first own
unit). A queue starts shared; its run ends at ``g``. While it has no own file,
``_first_offset == _min_offset == _max_offset == g`` (the run's end): its own part is
empty. It graduates, for good, when its run would pass ``shared_units_max`` units or
when a unit cannot keep the log in commitlog order (a re-dispatch from an older
position): its first own file then begins at ``g``. No unit is ever copied.

These functions read and write the queue's private state; ConsumeQueue calls them
under the store lock (kept apart so that consume_queue.py stays one concern).

Read-only queues follow the writer: ``refresh_max`` takes in the log's new records
(``SharedUnitLog.follow``) and looks for own files once the run ends; a record that
is not what the run says (truncated or deleted by the writer) reloads the log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mqstore.commitlog.errors import CorruptDataError, OffsetOutOfRangeError
from mqstore.consumequeue.shared_log import SharedRun
from mqstore.consumequeue.unit_batch import UnitBatch

if TYPE_CHECKING:
    from mqstore.consumequeue.consume_queue import ConsumeQueue

__all__ = [
    "append_limit",
    "low_offset",
    "put_shared",
    "read_points",
    "read_records",
    "read_timestamps",
    "read_units",
    "refresh_max",
    "refresh_min",
    "shared_run",
    "sync_shared_end",
    "truncate_to_shared",
]


def shared_run(queue: ConsumeQueue) -> SharedRun | None:
    """The queue's run in the log when it holds units and ends where the own files
    begin (else None: the log holds nothing of this queue that is readable)."""
    shared = queue._shared
    if shared is None:
        return None
    run = shared.runs.get(queue.queue_id)
    if run is not None and run.end < queue._first_offset and queue._ctx.read_only:
        shared.follow()  # read before the writer appended the run's tail: catch up
        run = shared.runs.get(queue.queue_id)
    if run is None or not run.positions or run.end != queue._first_offset:
        return None
    return run


def low_offset(queue: ConsumeQueue) -> int:
    """The first readable offset: in the shared run while it has readable units."""
    run = shared_run(queue)
    if run is not None and run.min_offset < run.end:
        return run.min_offset
    return queue._min_offset


def sync_shared_end(queue: ConsumeQueue) -> None:
    """A queue without own files: its next offset is its run's end, which appends
    (the TailWriter's, straight to the log), truncation and recovery move."""
    shared = queue._shared
    assert shared is not None and queue._file_lo == queue._file_hi
    run = shared.runs.get(queue.queue_id)
    if run is None or run.end == queue._max_offset:
        return
    end = run.end
    queue._file_lo = queue._file_hi = end // queue._upf
    queue._first_offset = queue._min_offset = queue._max_offset = end
    queue._last_commitlog_offset = _last_commitlog_offset(queue, run)
    queue._time_index = None


def _last_commitlog_offset(queue: ConsumeQueue, run: SharedRun) -> int | None:
    if not run.positions:
        return None
    assert queue._shared is not None
    if not queue._ctx.read_only:  # the writer's runs are built from its log: no re-check
        return queue._shared.commitlog_offset_of(run.positions[-1])
    unit = queue._shared.units(queue.queue_id, run.end - 1, 1)
    return int(unit["commitlog_offset"][0])


# --------------------------------------------------------------------- writes


def append_limit(queue: ConsumeQueue) -> int:
    """The queue offset from which the queue's units go to its own files: -1 once it
    has own files (or sharing is off), else its run's first offset plus
    shared_units_max (the TailWriter sends the units below it to the log)."""
    shared = queue._shared
    units_max = queue._ctx.config.shared_units_max
    if shared is None or units_max == 0 or queue._file_lo != queue._file_hi:
        return -1
    run = shared.runs.get(queue.queue_id)
    first = queue._max_offset if run is None or not run.positions else run.first_offset
    return first + units_max


def put_shared(queue: ConsumeQueue, first: int, batch: UnitBatch) -> int:
    """Write what of ``batch`` (units from queue offset ``first``) belongs to the
    shared run: re-puts below the own files (checked against the log, idempotent),
    then appends while the queue has no own file and may stay shared.

    Returns:
        How many units, from the first, were handled; the caller writes the rest to
        the queue's own files (or raises for them).

    Raises:
        CorruptDataError: a re-put differs from the stored unit.
        OffsetOutOfRangeError: a re-put below the run's first unit (retention).
    """
    shared = queue._shared
    assert shared is not None
    handled = 0
    run = shared_run(queue)
    if run is not None and first < run.end:
        handled = _reput_shared(queue, run, first, batch)
        if handled == len(batch):
            return handled
    if queue._file_lo != queue._file_hi or queue._ctx.config.shared_units_max == 0:
        return handled
    offset = first + handled
    run = shared.runs.get(queue.queue_id)
    if run is not None and run.positions and offset != run.end:
        if not queue._restarts_at(offset):
            return handled  # a gap: the own-file path raises it
        shared.restart_queue(queue.queue_id, offset)
        queue._ctx.shared_generation += 1
    elif (run is None or not run.positions) and offset != queue._max_offset:
        queue._set_empty(offset)  # an empty queue may start anywhere
    run = shared.runs.get(queue.queue_id)
    run_first = offset if run is None or not run.positions else run.first_offset
    take = min(len(batch) - handled, run_first + queue._ctx.config.shared_units_max - offset)
    if take <= 0:
        return handled
    part = batch.tail(handled).head(take)
    appended = shared.append(
        np.full(take, queue.queue_id, dtype=np.int32),
        np.arange(offset, offset + take, dtype=np.int64),
        part.commitlog_offsets,
        part.sizes,
        part.tag_hashes,
        part.timestamps_ms,
    )
    if appended:
        end = offset + appended
        queue._file_lo = queue._file_hi = end // queue._upf
        queue._first_offset = queue._min_offset = queue._max_offset = end
        queue._last_commitlog_offset = int(part.commitlog_offsets[appended - 1])
        queue._time_index = None
    return handled + appended


def _reput_shared(queue: ConsumeQueue, run: SharedRun, first: int, batch: UnitBatch) -> int:
    """Check re-puts of ``[first, run.end)`` against the log; return how many."""
    assert queue._shared is not None
    if first < run.first_offset:
        raise OffsetOutOfRangeError(
            f"{queue}: queue offset {first} lies below the queue's first unit "
            f"{run.first_offset} (removed by retention)"
        )
    count = min(len(batch), run.end - first)
    stored = queue._shared.units(queue.queue_id, first, count)
    part = batch.head(count)
    differs = (
        (stored["commitlog_offset"] != part.commitlog_offsets)
        | (stored["size"] != part.sizes)
        | (stored["tag_hash"] != part.tag_hashes)
    )
    if differs.any():
        bad = int(np.argmax(differs))
        raise CorruptDataError(
            queue._shared.directory,
            0,
            f"{queue}: re-put of queue offset {first + bad} with {batch.describe(bad)} "
            f"conflicts with the shared unit {tuple(int(v) for v in stored[bad].item())}",
        )
    return count


def truncate_to_shared(queue: ConsumeQueue, offset: int) -> None:
    """Drop every own file and the run's units at or above ``offset``; the queue then
    continues at the run's end (or at ``offset`` when the run is empty)."""
    for file_index in range(queue._file_hi - 1, queue._file_lo - 1, -1):
        queue._files.delete(file_index)  # newest first: a crash leaves a prefix
    shared = queue._shared
    run = None if shared is None else shared.runs.get(queue.queue_id)
    if shared is None or run is None or not run.positions:
        queue._set_empty(offset)
        return
    shared.truncate_queue(queue.queue_id, offset)
    queue._ctx.shared_generation += 1
    queue._set_empty(run.end if run.positions else offset)
    queue._last_commitlog_offset = _last_commitlog_offset(queue, run)


# --------------------------------------------------------------------- reads


def read_units(queue: ConsumeQueue, start: int, count: int) -> np.ndarray:
    """Units ``[start, start + count)`` of the run (a copy).

    Raises:
        OffsetOutOfRangeError: read-only, and the writer removed them meanwhile.
        CorruptDataError: a record is not the unit the run says.
    """
    return _read_with_reload(queue, start, count, "units")


def read_timestamps(queue: ConsumeQueue, start: int, count: int) -> np.ndarray:
    """The timestamps of the same units (a copy); raises as ``read_units``."""
    return _read_with_reload(queue, start, count, "timestamps")


def read_records(queue: ConsumeQueue, start: int, count: int) -> np.ndarray:
    """The SHARED_RECORD records of the same units (a copy); raises as ``read_units``."""
    return _read_with_reload(queue, start, count, "records")


def read_points(queue: ConsumeQueue, start: int, count: int) -> list[tuple[int, ...]]:
    """The same records as Python tuples, for a few units (``point_records``)."""
    rows: list[tuple[int, ...]] = _read_with_reload(queue, start, count, "point_records")
    return rows


def _read_with_reload(queue: ConsumeQueue, start: int, count: int, kind: str) -> Any:
    """``SharedUnitLog.<kind>`` of the queue's units; once more after a reload when a
    read-only view finds the log changed under it."""
    shared = queue._shared
    assert shared is not None
    try:
        result = getattr(shared, kind)(queue.queue_id, start, count)
    except CorruptDataError:
        _reload_after_change(queue, start, count)
        result = getattr(queue._shared, kind)(queue.queue_id, start, count)
    return result


def _reload_after_change(queue: ConsumeQueue, start: int, count: int) -> None:
    """Read-only: the writer changed the log under us (truncation, retention, a
    record half written when we took it in): reload, then re-check the range.
    A writer re-raises: its log is authoritative, so this is damage."""
    assert queue._shared is not None
    if not queue._ctx.read_only:
        raise  # called from an except block: re-raises what it caught
    queue._shared.refresh()
    queue._load()
    run = shared_run(queue)
    if run is None or not (run.min_offset <= start and start + count <= run.end):
        raise OffsetOutOfRangeError(
            f"{queue}: [{start}, {start + count}) was removed by the writer; the queue now "
            f"holds [{low_offset(queue)}, {queue._max_offset})"
        ) from None


# --------------------------------------------------------------------- read-only


def refresh_max(queue: ConsumeQueue) -> None:
    """Read-only: follow the writer's appends from the max offset we know."""
    if queue._file_lo == queue._file_hi:
        # Own files first, then the log: the writer appends a queue's last shared
        # units before it creates the queue's first own file, so a log followed after
        # seeing that file holds the whole run (the other order can miss its tail,
        # and the load would then drop the run: the reader's min offset would jump).
        graduated = bool(queue._files.indexes())
        if queue._shared is not None:
            queue._shared.follow()
            sync_shared_end(queue)
        if graduated:
            queue._load()
        return
    upf = queue._upf
    while True:
        newest = queue._file_hi - 1
        end_in_file = queue._max_offset - newest * upf
        if end_in_file < upf:
            units = queue._files.units(newest)
            if units.sizes[end_in_file] == 0:
                return
            last = queue._last_commitlog_offset
            end = units.followed_end(end_in_file, -1 if last is None else last)
            queue._max_offset = newest * upf + end
            queue._last_commitlog_offset = int(units.commitlog_offsets[end - 1])
            if end < upf:
                return
        if not queue._files.exists(queue._file_hi):
            return
        queue._file_hi += 1


def refresh_min(queue: ConsumeQueue) -> None:
    """Read-only: reload when the writer's retention removed our oldest file."""
    if queue._file_lo == queue._file_hi:
        return
    if not queue._files.exists(queue._file_lo):
        queue._load()
