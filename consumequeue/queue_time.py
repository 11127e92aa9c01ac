"""The time look-up of one ConsumeQueue: the first offset whose timestamp is >= T.

The queue's TimeIndex (mqstore.consumequeue.time_index) holds, in memory, the running
maximum of the head's unit timestamps (the readable units of the queue's run in the
shared unit log, at most shared_units_max: 8 bytes each, as the run's record indexes
take) and of the maxima of its own blocks, from the block that holds min_offset (whose
entry counts only its units from min_offset on). A look-up is one search over both
(``time_search``: a head unit, a block, or none) and, for a block, one scan of its
timestamps in the time file (``first_reaching``): two C calls when the module is
built. The CommitLog is never read (the store spot-checks the answer against it).
``lookup`` gives the answer and the units of that spot check (``probe``) in one pass:
in the common case the two units are unpacked (one ``struct`` read each) from the file
the block scan found, not looked up again.

Cost (bench/offset_time.py): a look-up is a few random memory reads (the block's
timestamps, the two units) and the Python around two C calls. When the CPU caches are
cold (the p99 there) what counts is how much code and how many objects a call touches,
so the index remembers the time and unit file of each block it scanned (weakly:
``TimeIndex.files``), and a look-up skips the FileCache's LRU (about 3 us a file, cold).

Reuse: the head is re-read when the run's readable range or the shared generation
moves; the blocks are rebuilt when min_offset moves, and extended from their last
block as the queue grows; every change of the units themselves drops the whole index
(``ConsumeQueue._time_index = None``), and the files it remembers with it. A read-only
queue re-reads its head on every look-up, as the scan it replaces did (its writer may
rewrite its run), and always asks the FileCache for its files (which notices a file
the writer removed).

These functions read the queue's private state; ConsumeQueue calls them under the store
lock (kept apart so that consume_queue.py stays one concern).
"""

from __future__ import annotations

import struct
from array import array
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from mqstore.commitlog.errors import CorruptDataError
from mqstore.consumequeue import queue_shared
from mqstore.consumequeue.format import (
    TIMESTAMP,
    TIMESTAMP_SIZE_BYTES,
    UNIT,
    UNIT_SIZE_BYTES,
    block_max_position_bytes,
)
from mqstore.consumequeue.time_index import TimeIndex, first_reaching, time_search

if TYPE_CHECKING:
    from mqstore.consumequeue.consume_queue import ConsumeQueue
    from mqstore.consumequeue.mapped_file import MappedTimeFile, MappedUnitFile

__all__ = ["TimeProbe", "lookup", "offset_for_time", "probe"]

PROBE_UNITS_MAX = 2  # the answer and the unit before it: where a wrong answer shows
_NO_STAMPS = np.empty(0, dtype=np.int64)
# Two adjacent units and two adjacent timestamps, as ``lookup`` reads them: one struct
# read costs a third of a numpy slice and ``tolist`` (a look-up's budget is a few
# microseconds). Declared from the formats' dtypes, and checked against them here.
_UNIT_FIELDS = "qiq"  # commitlog_offset, size, tag_hash: UNIT's fields in order
_UNIT_PAIR = struct.Struct("<" + _UNIT_FIELDS * PROBE_UNITS_MAX)
_TIMESTAMP_PAIR = struct.Struct(f"<{PROBE_UNITS_MAX}q")  # timestamps_ms
assert UNIT.fields is not None
assert struct.calcsize("<" + _UNIT_FIELDS[:1]) == UNIT.fields["size"][1]
assert struct.calcsize("<" + _UNIT_FIELDS[:2]) == UNIT.fields["tag_hash"][1]
assert _UNIT_PAIR.size == PROBE_UNITS_MAX * UNIT_SIZE_BYTES
assert np.dtype("<i8") == TIMESTAMP
assert _TIMESTAMP_PAIR.size == PROBE_UNITS_MAX * TIMESTAMP_SIZE_BYTES


class TimeProbe(NamedTuple):
    """A time look-up's answer and the units it rests on (``probe``)."""

    offset: int | None  # the answer: the first offset whose timestamp >= T, or None
    start: int  # queue offset of the first probed unit
    commitlog_offsets: array[int]  # int64, of the probed units (0 to PROBE_UNITS_MAX)
    sizes: array[int]  # int64, their record sizes
    timestamps_ms: list[int]  # their timestamps as the queue stores them


def offset_for_time(queue: ConsumeQueue, timestamp_ms: int) -> int | None:
    """The first readable offset (in offset order) whose timestamp >= ``timestamp_ms``.

    Raises:
        CorruptDataError: a block maximum promises a timestamp its block lacks.
    """
    return _find(queue, timestamp_ms)[0]


def lookup(queue: ConsumeQueue, timestamp_ms: int) -> TimeProbe:
    """``probe(queue, offset_for_time(queue, timestamp_ms))`` in one pass: when the
    answer and the unit before it lie in one own file above min_offset (the common
    case), the two units and their timestamps are unpacked from the files the block
    scan found (one ``struct`` read each), with no second look-up of the run, the
    files or the bounds.

    Raises:
        CorruptDataError: as ``offset_for_time`` and ``probe``.
    """
    offset, files, position = _find(queue, timestamp_ms)
    if files is None or position < 1 or offset is None or offset <= queue._min_offset:
        return probe(queue, offset)
    times, units = files
    unit_buffer: Any = units.units  # buffers (numpy's stubs say otherwise)
    stamp_buffer: Any = times.times
    before, before_size, _, at, at_size, _ = _UNIT_PAIR.unpack_from(
        unit_buffer, (position - 1) * UNIT_SIZE_BYTES
    )
    if before_size <= 0 or at_size <= 0:  # a unit below max_offset is never unwritten
        bad = 0 if before_size <= 0 else 1
        queue._raise_unwritten(offset // queue._upf, position - 1 + bad, offset - 1 + bad)
    stamps = list(_TIMESTAMP_PAIR.unpack_from(stamp_buffer, (position - 1) * TIMESTAMP_SIZE_BYTES))
    physicals, sizes = array("q", (before, at)), array("q", (before_size, at_size))
    return TimeProbe(offset, offset - 1, physicals, sizes, stamps)


def _find(
    queue: ConsumeQueue, timestamp_ms: int
) -> tuple[int | None, tuple[MappedTimeFile, MappedUnitFile] | None, int]:
    """(answer, the time and unit file whose block scan found it, its index there):
    the files are None when the answer is a head unit or there is none."""
    index = _index(queue)
    if index is None:
        return None, None, -1
    low, high = queue._min_offset, queue._max_offset
    head_count = len(index.head_max)
    block_count = index.count if low < high else 0
    found = time_search(index.head_max, head_count, index.running_max, block_count, timestamp_ms)
    if found < 0:
        return None, None, -1
    if found < head_count:
        return index.head_start + found, None, -1
    block = index.block_start + found - head_count
    geometry, upf = queue._ctx.geometry, queue._upf
    file_index, block_in_file = divmod(block, geometry.blocks_per_file)  # block_bounds, inline
    block_start = file_index * upf + block_in_file * geometry.interval_units
    block_end = min(block_start + geometry.interval_units, (file_index + 1) * upf)
    scan_start = max(block_start, low)  # the first block holds units below low
    unit_in_file = scan_start - file_index * upf  # a block never crosses a file
    end_in_file = unit_in_file + min(block_end, high) - scan_start
    files = _files(queue, index, file_index)
    position = first_reaching(files[0].times, unit_in_file, end_in_file, timestamp_ms)
    if position >= 0:
        return file_index * queue._upf + position, files, position
    if block_end < high:
        _raise_bad_block_max(queue, block)
    return None, None, -1  # the last block's maximum counts a unit not visible yet


def _files(
    queue: ConsumeQueue, index: TimeIndex, file_index: int
) -> tuple[MappedTimeFile, MappedUnitFile]:
    """The time and unit file ``file_index``: remembered by the index, else from the
    FileCache. A read-only queue always asks the cache, which notices a file its
    writer removed (the queue then reloads)."""
    files = index.files(file_index)
    if files is None or queue._ctx.read_only:
        files = queue._files.times(file_index), queue._files.units(file_index)
        if not queue._ctx.read_only:
            index.remember_files(file_index, *files)
    return files


def _index(queue: ConsumeQueue) -> TimeIndex | None:
    """The queue's time index with its head (the shared run's readable units) and its
    blocks (from the block of min_offset) brought up to date; None when the queue has
    no readable unit. An index is kept while min_offset stays (its first block is
    min_offset's), so a look-up on an unchanged queue only compares its keys."""
    run = None if queue._shared is None else queue_shared.shared_run(queue)
    shared_start = shared_end = 0
    if run is not None:
        run_end = run.end  # (a property)
        if run.min_offset < run_end:
            shared_start, shared_end = run.min_offset, run_end
    low, high = queue._min_offset, queue._max_offset
    if shared_start == shared_end and low >= high:
        return None
    context = queue._ctx
    index = queue._time_index
    if index is None or index.low_offset != low:
        index = queue._time_index = TimeIndex(context.geometry.block_of(low), low)
    key = (shared_start, shared_end, context.shared_generation)
    if index.head_key != key or context.read_only:
        stamps = _NO_STAMPS
        if shared_start < shared_end:
            stamps = queue_shared.read_timestamps(queue, shared_start, shared_end - shared_start)
        index.set_head(shared_start, stamps, key)
    if low < high and (index.covered_max_offset != high or index.count == 0):
        _extend_blocks(queue, index)
    return index


def _extend_blocks(queue: ConsumeQueue, index: TimeIndex) -> None:
    """Extend the block index to cover max_offset (re-reading its last block, which
    may have grown since). The first block's entry is the maximum of its units from
    min_offset on: its stored maximum also counts the units below."""
    geometry = queue._ctx.geometry
    low, high = queue._min_offset, queue._max_offset
    last_block = geometry.block_of(high - 1)
    redo_from = max(index.block_start, min(index.end_block - 1, last_block))
    maxima = []
    block = redo_from
    while block <= last_block:
        file_index, block_in_file = divmod(block, geometry.blocks_per_file)
        stop = min(geometry.blocks_per_file, block_in_file + last_block - block + 1)
        maxima.append(queue._files.times(file_index).block_max[block_in_file:stop])
        block += stop - block_in_file
    values = np.concatenate(maxima)
    if redo_from == index.block_start:
        head_end = min(geometry.block_bounds(index.block_start)[1], high)
        file_index, unit_in_file = divmod(low, queue._upf)
        times = queue._files.times(file_index).times
        values[0] = times[unit_in_file : unit_in_file + head_end - low].max()
    index.replace_from(redo_from, values, high)


def _raise_bad_block_max(queue: ConsumeQueue, block: int) -> None:
    file_index, block_in_file = divmod(block, queue._ctx.geometry.blocks_per_file)
    times = queue._files.times(file_index)
    raise CorruptDataError(
        times.path,
        block_max_position_bytes(queue._upf) + block_in_file * TIMESTAMP_SIZE_BYTES,
        f"block {block_in_file} maximum {int(times.block_max[block_in_file])} is not "
        "reached by any timestamp of its block",
    )


def probe(queue: ConsumeQueue, offset: int | None) -> TimeProbe:
    """The answer ``offset`` with the units of ``[offset - 1, offset]`` (of the last two
    units when ``offset`` is None), clipped to the readable units; none when there are
    none. Copies: they stay valid whatever happens to the files.

    Raises:
        CorruptDataError: a probed unit below max_offset is unwritten.
    """
    low, high = queue_shared.low_offset(queue), queue._max_offset
    if low >= high:
        return TimeProbe(offset, high, array("q"), array("q"), [])
    last = high - 1 if offset is None else offset
    start = max(low, last - PROBE_UNITS_MAX + 1)
    upf = queue._upf
    file_index, unit_in_file = divmod(start, upf)
    if last < queue._first_offset:  # in the shared run: one point read
        rows = queue_shared.read_points(queue, start, last - start + 1)
        stamps = [timestamp_ms for *_, timestamp_ms in rows]  # SHARED_RECORD's last field
    elif start < queue._first_offset or last // upf != file_index:  # across a boundary
        units = np.concatenate([queue.get_range(at, 1) for at in range(start, last + 1)])
        rows = units[["commitlog_offset", "size"]].tolist()
        stamps = queue.timestamps(start, last - start + 1).tolist()
    else:  # the common case, kept to a few Python-level reads (ints, not arrays)
        end_in_file = unit_in_file + last - start + 1
        rows = queue._files.units(file_index).units[unit_in_file:end_in_file].tolist()
        for index, row in enumerate(rows):
            if row[1] <= 0:  # size: unwritten
                queue._raise_unwritten(file_index, unit_in_file + index, start + index)
        stamps = queue._files.times(file_index).times[unit_in_file:end_in_file].tolist()
    # rows are (commitlog_offset, size[, tag_hash]); int64 arrays (array: no numpy call)
    physicals, sizes = array("q", [row[0] for row in rows]), array("q", [row[1] for row in rows])
    return TimeProbe(offset, start, physicals, sizes, stamps)
