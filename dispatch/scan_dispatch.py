"""The re-dispatch after a crash, done during the recovery scan (RocketMQ's
``recoverAbnormally`` with ``doDispatch``).

Why: the recovery scan verifies every record past the checkpoint, and the re-dispatch
used to read the same bytes again to build their ConsumeQueue units and index entries:
two walks of up to a GiB of log, the second one memory-bound. Here the scan hands
each run of verified records (commitlog/recovery.py, ``RunHook``: ``scan_records``
wrote the dispatcher's columns of each record it verified, and the scanning thread
found the run's stretches of one queue) to ``ScanDispatch``, which writes them as the
dispatcher's own re-dispatch would (``LogScan.take_runs``): units the page cache kept
are confirmed in place, the rest written, and keyed records indexed.

What it takes: the records from ``from_position`` (the checkpoint's dispatched
position, a record boundary the scan passes) on, every run after the one that holds
that boundary, for as long as the runs are contiguous and every verified record
parsed. It stops taking (and ``position`` stays where it stopped) at anything else:
the scan never reaching ``from_position`` as a boundary, a record the dispatcher's
parse refuses (the re-dispatch from ``position`` then meets it and reports it), or a
write that failed (logged; ``position`` goes back to ``from_position`` and the index
is cut back there, so that the re-dispatch redoes the lot: it is idempotent).

Crash policy: nothing here is claimed durable. The caller (``MessageStore._open``):

- cuts the index back to ``from_position`` before the scan (entries past it are
  re-made), and afterwards cuts ConsumeQueues and index at the recovered end, which
  removes what the runs of an append group cut short at the tail made;
- starts the dispatcher at ``position`` (at most the recovered end), so the
  re-dispatch covers whatever this did not;
- keeps the checkpoint's claim logic as it was: the re-dispatch started at the
  claim, whether here or in the dispatcher.

Only for a writer whose re-dispatch would start at the checkpoint's dispatched
position with nothing held back (no rebuild of lost derived files, no power-loss tail
repair, no replication hold) and async flush: in sync mode a record may be readable
only once durable, and units made during the scan would precede the log's sync.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final, Protocol

import numpy as np

from mqstore.commitlog.header_scan import DISPATCH_PHYSICAL, DISPATCH_SIZE, DISPATCH_STORE_TS
from mqstore.commitlog.record import BLANK_SIZE, SCAN_BLANK, SCAN_FULL
from mqstore.commitlog.recovery import SCAN_ROWS, ScanColumns
from mqstore.consumequeue.tail_writer import TailWriter
from mqstore.dispatch.log_scan import Keyed, LogScan, QueueFinder, TakenRuns

__all__ = ["ScanDispatch"]

log = logging.getLogger(__name__)

#: Keyed records' index entries collected before one IndexService.put_batch: a run's
#: worth at most (64 Ki records), so the list stays small.
KEYED_MAX: Final = SCAN_ROWS


class IndexLike(Protocol):
    def put_batch(self, topics: Any, keys: Any, physical_offsets: Any, store_ts_ms: Any
                  ) -> None: ...  # fmt: skip

    def truncate_beyond(self, physical_end: int) -> None: ...


def _parsable(mapped: Any, columns: ScanColumns, count: int) -> int:
    """How many of a run's ``count`` verified records, from the first, the dispatcher's
    parse takes too: it asks more than the recovery scan (commitlog/header_scan.py), a
    topic of at least one byte and room for a blank record after a record in its file
    (which only the last record of a file can lack: another record needs more)."""
    if not count:
        return 0
    assert columns.stretches is not None and columns.stretches.rows == count
    parsable = columns.stretches.first_empty_topic
    if parsable and columns.end_of(parsable - 1) > mapped.size_bytes - BLANK_SIZE:
        parsable -= 1
    return parsable


class ScanDispatch:
    """The ``RunHook`` the store hands ``CommitLog.open`` (see the module).

    Attributes (read after the scan):
        position: every record in [from_position, position) is dispatched.
        store_ts_ms: the store timestamp of the last record dispatched (0: none).
        records: how many records were dispatched.
    """

    def __init__(
        self,
        from_position: int,
        queue: QueueFinder,
        tail: TailWriter | None,
        index: IndexLike,
        uses_create_time: Callable[[str], bool],
        tag_hash: Callable[[bytes], int],
    ) -> None:
        assert from_position >= 0
        self.from_position = from_position
        self.position = from_position
        self.store_ts_ms = 0
        self.records = 0
        self._tail = tail
        self._index = index
        self._runs: TakenRuns | None = LogScan(
            None, queue, tail, uses_create_time, tag_hash
        ).take_runs(SCAN_ROWS)
        self._started = False  # the scan has passed from_position
        # Where the last run handed in ended: the scan's progress, which the next run
        # must start at (``_first_row``). Not ``position``, the dispatch's progress:
        # while an append group is held open across runs, ``position`` stays at the
        # group's first record and this moves on to each run's end; they meet again
        # when the group closes. (Read only once the scan passed from_position.)
        self._scanned_to = from_position
        # The rows of an append group still open at the last run's end (copied), and
        # their file: taken with the run that closes the group.
        self._held: np.ndarray | None = None
        self._held_mapped: Any = None
        self._keyed: Keyed = []

    @property
    def taking(self) -> bool:
        """Whether runs are still taken (no reason to stop met yet)."""
        return self._runs is not None

    def __call__(self, mapped: Any, columns: ScanColumns, start: int, count: int, end: int,
                 status: int, closed: int) -> None:  # fmt: skip
        """One run of the recovery scan (``RunHook``).

        Only records whose append group is closed are taken. The rows of a group still
        open at a run's end are held (copied: the columns are reused) and taken with
        the run that closes it (groups never span files); a group the scan leaves open
        (the recovered end cuts it) is never taken. So no unit ever points into a
        group the recovered end may cut, not even for the moment a read-only follower
        could see it (review of the merge)."""
        if self._runs is None:
            return
        file_start = mapped.start_offset
        assert columns.dispatch is not None and columns.position_base == file_start
        run_start = file_start + start
        physical = columns.positions[:count]  # (the dispatcher's columns: physical)
        records_end = run_start if not count else file_start + columns.end_of(count - 1)
        first = self._first_row(run_start, records_end, physical, count)
        if first is None:
            return
        self._scanned_to = file_start + end
        parsed = _parsable(mapped, columns, count)
        if parsed < first:  # (before from_position: never the dispatcher's to see)
            self._stop_taking("the dispatcher's parse refuses a record before it")
            return
        taken = min(parsed, closed)  # rows [first, taken) close their groups
        held = self._held
        if held is not None and mapped is not self._held_mapped:
            self._stop_taking("an append group held open crosses a file")
            return
        rows = columns.dispatch[:, first:taken]
        if held is not None and taken > first:  # the held group closes in this run
            rows = np.concatenate((held, rows), axis=1)
            self._held = held = None
        if rows.shape[1] and held is None:
            assert int(rows[DISPATCH_PHYSICAL, 0]) == self.position, (rows[:, 0], self.position)
            try:
                whole = first == 0 and taken == count and rows.shape[1] == count
                self._runs.take(mapped, rows, columns.stretches if whole else None, self._keyed)
                if len(self._keyed) >= KEYED_MAX:
                    self._put_keyed()
            except AssertionError:
                raise  # our own invariant: never left to a fallback
            except Exception as error:
                self._abandon(error)
                return
            self.store_ts_ms = int(rows[DISPATCH_STORE_TS, -1])
            self.records += rows.shape[1]
            self.position = int(rows[DISPATCH_PHYSICAL, -1]) + int(rows[DISPATCH_SIZE, -1])
        if parsed < count:  # the dispatcher's parse refuses a verified record: stop there
            self._stop_taking("the dispatcher's parse refuses a verified record")
            return
        if taken < parsed:  # a group still open at the run's end: hold it
            if status != SCAN_FULL:  # the log (or the file) ends with it open: cut
                self._stop_taking("an append group is open where the scan ends")
                return
            more = columns.dispatch[:, max(taken, first) : parsed].copy()
            self._held = more if held is None else np.concatenate((held, more), axis=1)
            self._held_mapped = mapped
            return
        if held is not None:  # (no row of this run: the held group is still open)
            return
        self.position = records_end
        if status == SCAN_BLANK:  # the next run starts the next file
            if end != mapped.size_bytes:
                self._stop_taking("the dispatcher's parse refuses a blank record short of the end")
                return
            self.position = file_start + end

    def _first_row(self, run_start: int, records_end: int, physical: np.ndarray, count: int
                   ) -> int | None:  # fmt: skip
        """The run's first row to take, or None to take none of it (it ends before
        ``from_position``, or taking stopped)."""
        if self._started:
            if run_start != self._scanned_to:  # runs are contiguous: never, but never guess
                self._stop_taking(f"a run starts at {run_start}, not at {self._scanned_to}")
                return None
            return 0
        target = self.from_position
        if target < run_start:
            self._stop_taking(f"the scan started past the dispatched position {target}")
            return None
        if target > records_end:
            return None  # ahead of this run
        first = int(np.searchsorted(physical, target))
        if first < count and int(physical[first]) != target:
            self._stop_taking(f"the dispatched position {target} is no record boundary")
            return None
        self._started = True
        return first

    def _put_keyed(self) -> None:
        if self._keyed:
            topics, keys, offsets, stamps = zip(*self._keyed, strict=True)
            self._keyed = []
            self._index.put_batch(topics, keys, offsets, stamps)

    def _stop_taking(self, reason: str) -> None:
        """Stop taking runs; what was taken is kept (``finish`` writes it)."""
        if self._runs is not None:
            log.info("re-dispatch during the recovery scan stops at %d: %s", self.position, reason)
            self._stop_runs()

    def _stop_runs(self) -> None:
        self._held = self._held_mapped = None  # an open group: the dispatcher's to take
        runs, self._runs = self._runs, None
        if runs is not None:
            self._finish_runs(runs)

    def _finish_runs(self, runs: TakenRuns) -> None:
        try:
            runs.finish()
            self._put_keyed()
        except AssertionError:
            raise
        except Exception as error:
            self._abandon(error)

    def _abandon(self, error: Exception) -> None:
        """A write failed: leave everything to the dispatcher's re-dispatch from
        ``from_position`` (idempotent), with the index cut back there."""
        log.warning("re-dispatch during the recovery scan failed at %d, the re-dispatch "
                    "starts over at %d: %r", self.position, self.from_position, error)  # fmt: skip
        self._runs = None
        self._keyed = []
        self._held = self._held_mapped = None
        self.position, self.store_ts_ms, self.records = self.from_position, 0, 0
        self._index.truncate_beyond(self.from_position)

    def finish(self) -> None:
        """After the scan: write what the runs left collected; detach the TailWriter
        (the dispatcher has its own)."""
        try:
            self._stop_runs()
        finally:
            if self._tail is not None:
                self._tail.detach_all()
