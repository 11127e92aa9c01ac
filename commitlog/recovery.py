"""The recovery scan of the CommitLog: where the log ends, and what appends need.

``scan_log`` walks the files from a record boundary known valid (the checkpoint's),
verifying every record (``scan_records``, C when built, a run of records per call),
and stops at the first place that is not a valid record: zeros (the unwritten rest of
a file), a record that does not verify, or the end of the files; an end-of-file blank
record moves it to the next file. No Record object is built per record.

An append group cut short (record.py's FLAG_GROUP_OPEN: the last records scanned
all carry the flag, so the record that closes their group is missing) is not part of
the log: the end is moved back to where the group starts. A group never straddles the
scan's start: the checkpoint's position is a write position read under the append
lock, and a group is written in one hold of it.

It returns that end and folds what the scanned records before it say into the
queue-offset table (each queue's next offset) and the newest store timestamp: records
past the checkpoint may not be in their ConsumeQueues yet, and the first append to a
queue must already count them. ``CommitLog.open`` then truncates the log at the end.

With a ``RunHook`` (the store's re-dispatch after a crash, dispatch/scan_dispatch.py)
the scan also hands every run of verified records to it, in log order, as soon as the
run is folded: RocketMQ's ``recoverAbnormally`` with ``doDispatch``, so the log is
walked once, not once to verify and once more to dispatch: ``scan_records`` writes
the dispatcher's columns of each record it verifies too, from the header it has just
read. The runs of an append group cut short at the tail are handed over too: the
hook's caller cuts what they made back to the end (ConsumeQueue and index
``truncate_beyond``), as it cuts any unit past the recovered end.

The scan maps the log's pages ahead of itself (``_populate``): on a fresh mapping
each 64 KiB costs a page fault otherwise, about half of the scan's time here.
"""

from __future__ import annotations

import itertools
import logging
import mmap
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from mqstore.commitlog.errors import CorruptDataError, OffsetOutOfRangeError
from mqstore.commitlog.file_queue import MappedFileQueue
from mqstore.commitlog.header_scan import (
    DISPATCH_PHYSICAL,
    DISPATCH_QUEUE_ID,
    DISPATCH_QUEUE_OFFSET,
    DISPATCH_SIZE,
    DISPATCH_STORE_TS,
    DISPATCH_TOPIC_HASH,
    DISPATCH_TOPIC_LEN,
    new_columns,
)
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.prefetch import Prefetch
from mqstore.commitlog.record import (
    HEADER_SIZE,
    SCAN_FULL,
    SCAN_INVALID,
    SCAN_LIMIT,
    SCAN_ZEROS,
    decode,
    scan_records,
)
from mqstore.commitlog.run_stretches import Stretches, stretches_of

__all__ = ["SCAN_ROWS", "RunHook", "ScanColumns", "fold_columns", "scan_log"]

log = logging.getLogger(__name__)

SCAN_ROWS = 1 << 16  # records verified per scan_records call; bounds the column arrays
# The log's pages a scan maps ahead of itself (``_populate``): windows of twice this,
# each when the scan comes within this of the last one's end (a run of 100 B records
# reads ~11 MiB). Past the log's end it maps at most twice this of zeros.
POPULATE_BYTES = 16 << 20
MADV_POPULATE_READ = 22  # linux/mman.h (5.14+); Python's mmap does not name it
# Runs a file scanned ahead may hold (2.7 MB of columns each; 5.8 MB of the
# dispatcher's columns with a RunHook). 12 cost more page faults than they saved waits.
AHEAD_RUNS = 4


class ScanColumns:
    """The columns of a run of scanned records, SCAN_ROWS rows each: scan_records'
    output arrays (``outputs``); or with ``dispatch``, the dispatcher's columns
    (``dispatch_columns``' rows), which scan_records fills instead, and of which the
    attributes are views. Positions count from ``position_base``: 0 (in the file), or
    in the dispatcher's columns the file's start (they are physical offsets)."""

    __slots__ = ("dispatch", "outputs", "position_base", "positions", "queue_ids",
                 "queue_offsets", "sizes", "stamps", "starts", "stretches", "topic_hashes",
                 "topic_lens")  # fmt: skip

    def __init__(self, dispatch: bool = False) -> None:
        # np.empty: with dispatch these are never written, so never touched (no faults).
        self.outputs = (
            np.empty(SCAN_ROWS, dtype=np.int64),  # positions
            np.empty(SCAN_ROWS, dtype=np.int32),  # sizes
            np.empty(SCAN_ROWS, dtype=np.int64),  # queue offsets
            np.empty(SCAN_ROWS, dtype=np.int32),  # queue ids
            np.empty(SCAN_ROWS, dtype=np.int64),  # store timestamps
            np.empty(SCAN_ROWS, dtype=np.uint8),  # topic lengths
            np.empty(SCAN_ROWS, dtype=np.uint64),  # topic hashes (XXH64)
        )
        self.position_base = 0
        self.dispatch = new_columns(SCAN_ROWS) if dispatch else None
        # With dispatch: the run's stretches of one queue (run_stretches), found by the
        # thread that scanned it; ``starts`` is touched only as far as they go.
        self.starts = np.empty(SCAN_ROWS, dtype=np.int64)
        self.stretches: Stretches | None = None
        rows = self.outputs if self.dispatch is None else tuple(
            self.dispatch[row] for row in (
                DISPATCH_PHYSICAL, DISPATCH_SIZE, DISPATCH_QUEUE_OFFSET, DISPATCH_QUEUE_ID,
                DISPATCH_STORE_TS, DISPATCH_TOPIC_LEN, DISPATCH_TOPIC_HASH,
            )
        )  # fmt: skip
        (self.positions, self.sizes, self.queue_offsets, self.queue_ids, self.stamps,
         self.topic_lens, self.topic_hashes) = rows  # fmt: skip

    def end_of(self, row: int) -> int:
        """Where the record of ``row`` ends, in its file."""
        return int(self.positions[row]) - self.position_base + int(self.sizes[row])


class RunHook(Protocol):
    """Takes the runs of a recovery scan (see the module): ``mapped``'s records from
    ``start`` to ``end`` in the file, ``count`` of them verified (``columns``'
    first rows), and why the run ended (``SCAN_*``); the first ``closed`` of them end
    their append groups (the rest belong to a group still open at the run's end, which
    a later record may close, or the recovered end cut). Called in log order, in the
    thread that called ``scan_log``; ``columns`` are reused once it returns."""

    def __call__(self, mapped: Any, columns: ScanColumns, start: int, count: int, end: int,
                 status: int, closed: int) -> None: ...  # fmt: skip


def scan_log(
    files: MappedFileQueue, start: int, table: dict[tuple[str, int], int], newest_ts_ms: int,
    on_run: RunHook | None = None,
) -> tuple[int, int]:  # fmt: skip
    """Scan from ``start`` (see the module).

    While a file is scanned (``scan_records`` runs without the GIL), the next file is
    scanned ahead from its start in a background thread (``Prefetch``), at most
    AHEAD_RUNS runs ahead; its runs are used when the log goes on into it (the file
    before ends with its blank record), else thrown away. Every file starts at a
    record boundary, so its scan from 0 is the scan the sequential walk would make.
    The scans ahead take turns between two rings of columns (made once: fresh ones per
    file cost a page fault per 4 KiB, 16 MB a file): a scan's ring is free again once
    its thread is closed, which happens before the scan after the next one starts.
    With ``on_run`` the first file is scanned in a thread too (the calling thread then
    only folds and dispatches), and the columns hold the dispatcher's too.

    Args:
        files: the log's files.
        start: a record boundary known valid.
        table: the queue-offset table, updated in place.
        newest_ts_ms: the newest store timestamp known before the scan.
        on_run: takes every run of verified records (``RunHook``).

    Returns:
        (end, newest store timestamp): where the log ends, and the larger of
        ``newest_ts_ms`` and every scanned record's store timestamp.
    """
    position = start
    closed_end = start  # the end of the last record that closes its group
    pending: dict[tuple[str, int], int] = {}  # what the open group's records fold to
    ahead: tuple[int, Prefetch[_Run]] | None = None  # the next file's scan: its start
    reading: Prefetch[_Run] | None = None  # the scan ahead whose runs are being taken
    rings: list[list[ScanColumns]] = []  # made on the first scan ahead, then reused
    started = 0  # scans ahead started: each takes the ring the one before the last took
    try:
        while True:
            try:
                mapped = files.find(position)
            except OffsetOutOfRangeError:
                return _end(position, closed_end, pending), newest_ts_ms
            in_file = position - mapped.start_offset
            if reading is not None:
                reading.close()  # its runs are used up
                reading = None
            runs: Iterator[_Run]
            if ahead is not None and ahead[0] == mapped.start_offset and in_file == 0:
                reading, ahead = ahead[1], None
                runs = iter(reading)
            elif on_run is not None:  # the calling thread dispatches: scan in a thread
                rings = rings or [_ring(True), _ring(True)]
                scan = _scan_runs(mapped, in_file, itertools.cycle(rings[started % 2]))
                started += 1
                reading = Prefetch(scan, AHEAD_RUNS, "mqstore-scan")
                runs = iter(reading)
            else:
                runs = _scan_runs(mapped, in_file, itertools.repeat(ScanColumns()))
            next_start = mapped.start_offset + mapped.size_bytes
            for end, count, status, closed, columns in runs:
                if status == SCAN_FULL and ahead is None:  # a long file: scan the next
                    following = _file_at(files, next_start)
                    if following is not None:
                        rings = rings or [_ring(on_run is not None), _ring(on_run is not None)]
                        scan = _scan_runs(following, 0, itertools.cycle(rings[started % 2]))
                        started += 1
                        ahead = (next_start, Prefetch(scan, AHEAD_RUNS, "mqstore-scan"))
                if columns.stretches is not None:  # (found by the scanning thread)
                    newest_ts_ms = max(newest_ts_ms, columns.stretches.store_ts_max)
                elif count:
                    newest_ts_ms = max(newest_ts_ms, int(columns.stamps[:count].max()))
                if closed:  # the open group before this run (if any) is closed now
                    _merge(table, pending)
                    pending.clear()
                    fold_columns(mapped.mapping, closed, columns, table)
                    closed_end = mapped.start_offset + columns.end_of(closed - 1)
                if closed < count:
                    fold_columns(mapped.mapping, count, columns, pending, first=closed)
                if on_run is not None:
                    on_run(mapped, columns, position - mapped.start_offset, count, end, status,
                           closed)  # fmt: skip
                position = mapped.start_offset + end
                if status == SCAN_INVALID:
                    try:  # the reason, for the log
                        decode(
                            mapped.mapping, end, mapped.size_bytes, mapped.path,
                            mapped.start_offset,
                        )  # fmt: skip
                    except CorruptDataError as error:
                        log.warning("CommitLog ends at %d: %s", position, error)
                    return _end(position, closed_end, pending), newest_ts_ms
                if status in (SCAN_ZEROS, SCAN_LIMIT):
                    return _end(position, closed_end, pending), newest_ts_ms
                # SCAN_FULL: go on in this file; SCAN_BLANK: on to the next file.
    finally:
        for running in (reading, None if ahead is None else ahead[1]):
            if running is not None:
                running.close()


_Run = tuple[int, int, int, int, "ScanColumns"]  # end, count, status, closed, columns


def _ring(dispatch: bool) -> list[ScanColumns]:
    """The columns one scan ahead goes round (see ``Prefetch``): AHEAD_RUNS queued, one
    being read, one being made."""
    return [ScanColumns(dispatch) for _ in range(AHEAD_RUNS + 2)]


def _scan_runs(mapped: Any, in_file: int, buffers: Iterator[ScanColumns]) -> Iterator[_Run]:
    """The runs of one file from ``in_file``, each into the next of ``buffers``, up to
    the first run that does not fill its columns. The pages a run is about to read are
    mapped first, a window at a time (``_populate``)."""
    populated = in_file
    while True:
        columns = next(buffers)
        if POPULATE_BYTES and populated < min(in_file + POPULATE_BYTES, mapped.size_bytes):
            populated = _populate(mapped, max(populated, in_file), 2 * POPULATE_BYTES)
        end, count, status, closed = _scan(mapped, in_file, columns)
        yield end, count, status, closed, columns
        if status != SCAN_FULL:
            return
        in_file = end


def _populate(mapped: Any, start: int, length: int) -> int:
    """Map ``length`` bytes of ``mapped`` from ``start`` (page-aligned down), or up to
    its end, ahead of the scan (madvise MADV_POPULATE_READ); returns where that ends.

    Why: the scan's first touch of each page of a fresh mapping of the log is a page
    fault (mapping 64 KiB around it), ~10 us each on this VM: ~30 ns of the ~60 ns a
    100 B record costs. Populating a window in one call skips the trap per fault:
    44 ns a record, the call included (three files, four runs each way). A hint only
    (``populate_read``, without the GIL): on a kernel without it (before 5.14), or if
    it fails, the faults happen as before."""
    stop = min(start + length, mapped.size_bytes)
    populate_read(mapped.mapping, start, stop - start)
    return stop


def populate_read_py(buffer: Any, start: int, length: int) -> bool:
    """The twin of the C ``populate_read`` (commitlog/_dispatch.c): map [start, start +
    length) of ``buffer`` (from its page) when it is an mmap; False when nothing was
    done. Python's ``mmap.madvise`` holds the GIL: the C version is the one to use."""
    if not (start >= 0 and 0 <= length <= memoryview(buffer).nbytes - start):
        raise ValueError("populate_read: range outside the buffer")
    if not isinstance(buffer, mmap.mmap) or not length:
        return False
    try:
        buffer.madvise(MADV_POPULATE_READ, start - start % mmap.PAGESIZE,
                       length + start % mmap.PAGESIZE)  # fmt: skip
    except (OSError, ValueError):
        return False
    return True


populate_read = populate_read_py if NATIVE is None else NATIVE.populate_read


def _scan(mapped: Any, in_file: int, columns: ScanColumns) -> tuple[int, int, int, int]:
    result: tuple[int, int, int, int] = scan_records(
        mapped.mapping, in_file, mapped.size_bytes, mapped.start_offset, *columns.outputs,
        columns.dispatch,
    )  # fmt: skip
    if columns.dispatch is not None:
        columns.position_base = mapped.start_offset
        count = result[1]
        columns.stretches = stretches_of(columns.dispatch, count, columns.starts) if count else None
    return result


def _file_at(files: MappedFileQueue, start_offset: int) -> Any:
    try:
        return files.find(start_offset)
    except OffsetOutOfRangeError:
        return None


def _end(end: int, closed_end: int, pending: dict[tuple[str, int], int]) -> int:
    """Where the log ends: ``end``, or where an open group at the tail starts (the
    end of the last closed one; the group's records, folded into ``pending`` only,
    are forgotten)."""
    if not pending:
        return end
    log.warning(
        "CommitLog ends at %d: an append group cut short (%d bytes to %d) is dropped",
        closed_end, end - closed_end, end,
    )  # fmt: skip
    return closed_end


def _merge(table: dict[tuple[str, int], int], folded: dict[tuple[str, int], int]) -> None:
    for key, next_offset in folded.items():
        if next_offset > table.get(key, 0):
            table[key] = next_offset


def fold_columns(
    buffer: Any, count: int, columns: ScanColumns, table: dict[tuple[str, int], int],
    first: int = 0,
) -> int:  # fmt: skip
    """Fold the rows ``first`` to ``count`` of a run of records scanned in ``buffer``
    (a file's mapping, or a replicated chunk) into the queue-offset table (one Python
    step per queue, not per record); returns the rows' newest store timestamp.

    The rows of one put batch are adjacent, so the run is cut into stretches of one
    (topic, queue) first (the scanning thread's ``stretches`` when they cover exactly
    these rows), and only the stretches' maxima are sorted."""
    assert 0 <= first < count
    hashes = columns.topic_hashes[first:count]
    ids, offsets = columns.queue_ids[first:count], columns.queue_offsets[first:count]
    found = columns.stretches
    if found is not None and first == 0 and count == found.rows:
        starts = found.starts
    else:
        starts = np.flatnonzero(
            np.append(True, (hashes[1:] != hashes[:-1]) | (ids[1:] != ids[:-1]))
        )
    highest = np.maximum.reduceat(offsets, starts)  # each stretch's highest queue offset
    hashes, ids = hashes[starts], ids[starts]
    order = np.lexsort((highest, ids, hashes))
    hashes, ids = hashes[order], ids[order]
    last = np.flatnonzero(
        np.append((hashes[1:] != hashes[:-1]) | (ids[1:] != ids[:-1]), True)
    )  # the last stretch of each (topic, queue) group holds its highest offset
    for stretch in order[last].tolist():
        row = first + int(starts[stretch])
        at = int(columns.positions[row]) - columns.position_base + HEADER_SIZE
        topic = str(buffer[at : at + int(columns.topic_lens[row])], "ascii")
        key = (topic, int(columns.queue_ids[row]))
        offset = int(highest[stretch])
        if offset >= table.get(key, 0):
            table[key] = offset + 1
    return int(columns.stamps[first:count].max())
