"""The dispatcher's read of the CommitLog: records the feed does not describe.

After a crash the re-dispatch reads everything from the checkpoint's dispatched
position; a running store reads from the log what its feed missed. Either way a run
of records becomes ConsumeQueue units and index entries here, in bulk:

1. ``dispatch_columns`` (commitlog/header_scan.py, C when built) parses up to
   ``SCAN_ROWS`` headers of one file in one call into columns (physical offset, size,
   queue offset, queue id, born and store timestamps, topic hash, tag and keys
   lengths). No Python runs per record. A long scan (the re-dispatch after a crash)
   parses its next runs in a thread while the run before is written (``Prefetch``;
   the C parse runs without the GIL).
2. The run is grouped per queue with numpy (the rows of one put batch arrive
   together, so the grouping sorts stretches, not records). A queue with more than
   BATCH_GROUP_UNITS units in the run gets them at once: those it holds already (the
   re-dispatch after a SIGKILL, whose page cache kept them) are confirmed straight from
   the run's columns, one C call per queue file (``ConsumeQueue.units_in_place``,
   consumequeue/reput_check.py), and the rest go in one ``put_batch``. The others are
   collected over the scan as columns in log order (at most PENDING_ROWS_MAX units;
   written first when a run has a queue of the first kind) and written together, with
   no Python per queue: each queue's end comes from its topic's shared log while it
   has no object and no own files; the units past it go in one TailWriter call, in
   log order (a topic's shared unit log takes them in one write, own files through
   C); those below it (re-puts) are confirmed in one shared-log lookup per topic, and
   the rest of a queue by ``put_batch`` or ``put``.
3. Tags and keys are the only per-record Python: a tag's hash (XXH3, cached per tag),
   and the keys of a keyed record for the index.

Topics are told apart by the XXH64 of their bytes (the name is read once per run and
topic); two topics of one store colliding on 64 bits is taken as impossible.

Records are parsed, not verified (no checksum), like the rest of the dispatcher: the
recovery scan verified everything past the checkpoint before open re-dispatches it,
and readers verify each record they return. Per-queue order holds because everything
collected is written before a run's first ``put_batch`` and before ``scan`` returns,
re-puts before appends, and the caller writes what it collected before calling
``scan``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple, Protocol

import numpy as np

from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.errors import CorruptDataError
from mqstore.commitlog.header_scan import (
    DISPATCH_BORN_TS,
    DISPATCH_INVALID,
    DISPATCH_KEYS_LEN,
    DISPATCH_PHYSICAL,
    DISPATCH_QUEUE_ID,
    DISPATCH_QUEUE_OFFSET,
    DISPATCH_SIZE,
    DISPATCH_STORE_TS,
    DISPATCH_TAG_LEN,
    DISPATCH_TOPIC_HASH,
    DISPATCH_TOPIC_LEN,
    dispatch_columns,
    dispatch_columns_py,
    new_columns,
)
from mqstore.commitlog.mapped_file import MappedFile
from mqstore.commitlog.prefetch import Prefetch
from mqstore.commitlog.record import (
    BLANK_MAGIC,
    BLANK_SIZE,
    HEADER_SIZE,
    MESSAGE_MAGIC,
    PREFIX,
    decode_keys,
)
from mqstore.commitlog.run_stretches import Stretches, stretches_of
from mqstore.consumequeue.reput_check import RunColumns
from mqstore.consumequeue.tail_writer import TailWriter

__all__ = ["LogScan", "Parsed", "SCAN_ROWS", "SMALL_GROUP_UNITS", "TakenRuns"]

# Headers parsed per dispatch_columns call: the columns take 80 B a row (5 MiB), and
# each queue's put_batch (about 0.1 ms of checks) is spread over as many units as
# possible; 1 GiB of 100 B records is about 95 calls, of 1 KiB records 15.
SCAN_ROWS: Final = 1 << 16
SMALL_GROUP_UNITS: Final = 8  # up to this many units a queue goes with the small ones
# A queue with more units than this in one run gets them by put_batch, after a check of
# those it holds already (one C call per queue file); the others are collected in
# columns and written by one TailWriter call (a topic's shared unit log, own files
# through C), as the feed's are: no Python per queue, and young queues stay in the
# shared log (by put_batch each queue of 4,096 got own files, 16 units in).
BATCH_GROUP_UNITS: Final = 256
# A scan at least this long parses its next runs in a thread (Prefetch) while this one
# writes, at most PARSE_AHEAD_RUNS runs ahead (a ring of that + 2 buffers, 5 MiB each).
PARSE_AHEAD_MIN_BYTES: Final = 32 << 20
PARSE_AHEAD_RUNS: Final = 1
# Small queues' units a scan collects before it writes them (40 B each: 20 MiB); a
# 100 B message run holds ~6 units of each of 10,000 queues.
PENDING_ROWS_MAX: Final = 1 << 19
_QUEUE_ID_MASK: Final = 0xFFFF_FFFF  # a queue id in the low half of a grouping key
#: The dispatch rows a unit is made of, in the order _collect_run unpacks them.
_UNIT_ROWS: Final = (DISPATCH_QUEUE_OFFSET, DISPATCH_PHYSICAL, DISPATCH_SIZE, DISPATCH_BORN_TS,
                     DISPATCH_STORE_TS)  # fmt: skip


class Parsed(NamedTuple):
    """What one scan got through: records before ``position``, and the corruption that
    stopped it there (None when it reached its end)."""

    position: int
    store_ts_ms: int
    records: int
    corruption: CorruptDataError | None


class QueueLike(Protocol):
    @property
    def max_offset(self) -> int: ...

    def put(
        self, queue_offset: int, commitlog_offset: int, size: int, tag_hash: int, timestamp_ms: int
    ) -> None: ...

    def put_batch(
        self,
        first_queue_offset: int,
        commitlog_offsets: np.ndarray,
        sizes: np.ndarray,
        tag_hashes: np.ndarray,
        timestamps_ms: np.ndarray,
    ) -> None: ...

    def units_in_place(self, first_queue_offset: int, run: RunColumns, lo: int, count: int
                       ) -> int: ...  # fmt: skip


#: Where a run's units go: (topic, queue id) -> its ConsumeQueue, and a hook called
#: after each queue's units are written (the dispatcher detaches its TailWriter row).
QueueFinder = Callable[[str, int], QueueLike]
Keyed = list[tuple[str, list[str], int, int]]
#: One queue's units: queue offsets, physical offsets, sizes, tag hashes, timestamps.
Units = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class _Pending:
    """The units of queues with few units per run, collected over the runs of one scan
    (at most PENDING_ROWS_MAX rows) as columns in log order, one block per run, and
    written together: many queues' units in one TailWriter call, with no Python per
    queue or per unit (issue 15: at 100,000 queues a dispatch that reads the log, as
    the re-dispatch after a crash does, cost 14 us a unit when this was kept per
    queue)."""

    __slots__ = ("blocks", "rows")

    def __init__(self) -> None:
        # (topics, topic index per unit or None for topics[0], queue ids, units)
        self.blocks: list[tuple[list[str], np.ndarray | None, np.ndarray, Units]] = []
        self.rows = 0

    def add(self, topics: list[str], topic_index: np.ndarray | None, queue_ids: np.ndarray,
            units: Units) -> None:  # fmt: skip
        self.blocks.append((topics, topic_index, queue_ids, units))
        self.rows += len(queue_ids)

    def take(self) -> tuple[list[str], np.ndarray, np.ndarray, Units] | None:
        """Everything collected, as one block (topic index per unit into the returned
        topics), and empty again; None when there was nothing."""
        blocks, self.blocks, self.rows = self.blocks, [], 0
        if not blocks:
            return None
        where: dict[str, int] = {}  # topic -> its index in the block taken
        indexes = []
        for block_topics, topic_index, queue_ids, _ in blocks:
            codes = [where.setdefault(topic, len(where)) for topic in block_topics]
            if topic_index is None:
                indexes.append(np.full(len(queue_ids), codes[0], dtype=np.int32))
            else:
                indexes.append(np.asarray(codes, dtype=np.int32)[topic_index])
        units = _concatenate([block[3] for block in blocks]) if len(blocks) > 1 else blocks[0][3]
        queue_ids = np.concatenate([block[2] for block in blocks])
        return list(where), np.concatenate(indexes), queue_ids, units


def _concatenate(chunks: list[Units]) -> Units:
    offsets, physical, sizes, codes, times = zip(*chunks, strict=True)
    return (np.concatenate(offsets), np.concatenate(physical), np.concatenate(sizes),
            np.concatenate(codes), np.concatenate(times))  # fmt: skip


def _select(units: Units, rows: np.ndarray) -> Units:
    offsets, physical, sizes, codes, times = units
    return offsets[rows], physical[rows], sizes[rows], codes[rows], times[rows]


def _by_topic(
    topics: list[str], topic_index: np.ndarray, queue_ids: np.ndarray
) -> Iterator[tuple[str, np.ndarray | slice, np.ndarray, np.ndarray]]:
    """Per topic with units: (the topic, its rows, its distinct queue ids, each row's
    place among them)."""
    for index, topic in enumerate(topics):
        mine: np.ndarray | slice = (
            slice(None) if len(topics) == 1 else np.flatnonzero(topic_index == index)
        )
        ids = queue_ids[mine]
        if len(ids):
            distinct, inverse = np.unique(ids, return_inverse=True)
            yield topic, mine, distinct, inverse


class LogScan:
    """Turns runs of CommitLog records into units and index entries (see the module).

    Not thread safe: the dispatcher calls it under its round lock."""

    def __init__(
        self,
        commitlog: CommitLog | None,
        queue: QueueFinder,
        tail: TailWriter | None,
        uses_create_time: Callable[[str], bool],
        tag_hash: Callable[[bytes], int],
    ) -> None:
        """Args:
        commitlog: the log ``scan`` reads; None for a LogScan that only takes runs
            parsed elsewhere (``take_runs``: the recovery scan's).
        queue: (topic, queue id) -> its ConsumeQueue.
        tail: the dispatcher's TailWriter (the real store), which takes the small
            queues' units in one call; None: they take a ``put`` each.
        """
        self._commitlog = commitlog
        self._queue = queue
        self._tail = tail
        self._uses_create_time = uses_create_time
        self._tag_hash = tag_hash
        self._columns: np.ndarray | None = None  # made on first use: most rounds use the feed
        # The unit columns of a run laid out queue by queue (_collect_run), and the
        # row numbers 0.. that the layout adds to: made with _columns, reused by every
        # run (fresh arrays of this size cost a page fault per 4 KiB each time).
        self._laid: np.ndarray | None = None
        self._row_numbers: np.ndarray | None = None
        self._starts: np.ndarray | None = None  # run_stretches' starts, made with _laid
        self._topics: dict[bytes, str] = {}

    def scan(self, start: int, end: int, hard_end: int, keyed: Keyed) -> Parsed:
        """Dispatch the records that start in [start, end) (see the module).

        ``end`` may cut a record (a round's byte budget): the record is taken whole.
        ``hard_end`` is a record boundary the log wrote up to; no record may pass it.
        Index entries of keyed records are appended to ``keyed``, in log order.
        A record that breaks the format stops the scan at its start, with the reason;
        what precedes it is written.
        """
        assert self._commitlog is not None, "a LogScan for take_runs only"
        if self._columns is None:
            self._columns = new_columns(SCAN_ROWS)
            self._make_layout()
        ahead: Prefetch[_Run] | None = None
        runs: Iterator[_Run]
        if end - start >= PARSE_AHEAD_MIN_BYTES and dispatch_columns is not dispatch_columns_py:
            # Parsed in a thread while the run before is written; the files it reads
            # are at or past the scan's start, which nothing removes during a round.
            ring = [self._columns, *(new_columns(SCAN_ROWS) for _ in range(PARSE_AHEAD_RUNS + 1))]
            parse = _parse_runs(self._commitlog, start, end, hard_end, itertools.cycle(ring))
            ahead = Prefetch(parse, PARSE_AHEAD_RUNS, "mqstore-parse")
            runs = iter(ahead)
        else:
            single = itertools.repeat(self._columns)  # a run is used before the next is made
            runs = _parse_runs(self._commitlog, start, end, hard_end, single)
        pending = _Pending()
        position, store_ts_ms, count = start, 0, 0
        starts = self._starts
        assert starts is not None
        try:
            for mapped, at, taken, status, columns in runs:
                file_start = mapped.start_offset
                if taken:
                    store_ts_ms = int(columns[DISPATCH_STORE_TS, taken - 1])
                    found = stretches_of(columns, taken, starts)
                    self._collect_run(mapped, columns[:, :taken], found, pending, keyed)
                    count += taken
                    if pending.rows >= PENDING_ROWS_MAX:
                        self._write(pending)
                        pending = _Pending()
                if status == DISPATCH_INVALID:
                    self._write(pending)
                    reason = _why_unparsable(mapped, at, hard_end)
                    corruption = CorruptDataError(
                        mapped.path, at, f"record at physical {file_start + at}: {reason}"
                    )
                    return Parsed(file_start + at, store_ts_ms, count, corruption)
                assert file_start + at > position, f"dispatch made no progress at {position}"
                position = file_start + at
        finally:
            if ahead is not None:
                ahead.close()
        self._write(pending)
        return Parsed(position, store_ts_ms, count, None)

    def _make_layout(self, rows_max: int = SCAN_ROWS) -> None:
        if self._laid is None or self._laid.shape[1] < rows_max:
            self._laid = np.empty((len(_UNIT_ROWS) + 1, rows_max), dtype=np.int64)
            self._row_numbers = np.arange(rows_max, dtype=np.int64)
            self._starts = np.empty(rows_max, dtype=np.int64)

    def take_runs(self, rows_max: int) -> TakenRuns:
        """Dispatch runs of records parsed elsewhere (the recovery scan's, at most
        ``rows_max`` rows each, in log order): ``TakenRuns.take`` each, then
        ``finish``."""
        assert rows_max > 0
        self._make_layout(rows_max)
        return TakenRuns(self, rows_max)

    def _collect_run(self, mapped: MappedFile, rows: np.ndarray, found: Stretches,
                     pending: _Pending, keyed: Keyed) -> None:  # fmt: skip
        """Write one run's units: the rows of queues with at most BATCH_GROUP_UNITS
        units in the run into ``pending``; when the run has a queue with more, all that
        is pending is written, then that queue's units; index entries go to ``keyed``.
        ``found``: the run's stretches of one queue (``run_stretches``)."""
        starts = found.starts
        stretch_hashes = rows[DISPATCH_TOPIC_HASH][starts]
        queue_ids = rows[DISPATCH_QUEUE_ID][starts] & _QUEUE_ID_MASK
        if (stretch_hashes == stretch_hashes[0]).all():  # one topic: the common case
            topics = [self._topic_at(mapped, rows, 0)]
            stretch_keys = queue_ids
            topic_of_stretch = None
        else:
            _, firsts, topic_of_stretch = np.unique(
                stretch_hashes, return_index=True, return_inverse=True
            )
            topics = [self._topic_at(mapped, rows, int(starts[k])) for k in firsts.tolist()]
            stretch_keys = (topic_of_stretch.astype(np.int64) << 32) | queue_ids
        create_time = [self._uses_create_time(topic) for topic in topics]
        tags = self._tag_codes(mapped, rows) if found.tagged else None
        count = rows.shape[1]
        lengths = np.diff(np.append(starts, count))  # of the stretches
        if len(starts) == 1:
            big_groups = count > BATCH_GROUP_UNITS
            small_stretches = None
        else:
            _, group_of_stretch = np.unique(stretch_keys, return_inverse=True)
            group_rows = np.bincount(group_of_stretch, weights=lengths)
            small_stretches = (group_rows <= BATCH_GROUP_UNITS)[group_of_stretch]
            big_groups = not small_stretches.all()
        if big_groups:
            small_rows = (
                None if small_stretches is None
                else np.flatnonzero(np.repeat(small_stretches, lengths))
            )  # fmt: skip
            if small_rows is not None and len(small_rows):
                self._collect_small(rows, tags, small_rows, lengths, topic_of_stretch, topics,
                                    create_time, pending)  # fmt: skip
            # Everything pending first (earlier runs' units of the big queues among it:
            # a queue's units stay in order), this run's small ones included: the shared
            # logs take them in log order before a young big queue's put_batch appends
            # its first units there (else they would be refused, and each such queue
            # given own files).
            self._write(pending)
            self._write_big(rows, tags, starts, stretch_keys, topics, create_time)
        else:
            self._collect_small(rows, tags, None, lengths, topic_of_stretch, topics,
                                create_time, pending)  # fmt: skip
        if found.keyed:
            mapping, file_start = mapped.mapping, mapped.start_offset
            for row in np.flatnonzero(rows[DISPATCH_KEYS_LEN]).tolist():
                physical = int(rows[DISPATCH_PHYSICAL, row])
                store_ts = int(rows[DISPATCH_STORE_TS, row])
                at = (physical - file_start + HEADER_SIZE + int(rows[DISPATCH_TOPIC_LEN, row])
                      + int(rows[DISPATCH_TAG_LEN, row]))  # fmt: skip
                keys_raw = mapping[at : at + int(rows[DISPATCH_KEYS_LEN, row])]
                topic = topics[0]
                if topic_of_stretch is not None:
                    stretch = int(np.searchsorted(starts, row, side="right")) - 1
                    topic = topics[int(topic_of_stretch[stretch])]
                keyed.append((topic, list(decode_keys(keys_raw)), physical, store_ts))

    def _write_big(self, rows: np.ndarray, tags: np.ndarray | None, starts: np.ndarray,
                   stretch_keys: np.ndarray, topics: list[str], create_time: list[bool]
                   ) -> None:  # fmt: skip
        """Each queue with more than BATCH_GROUP_UNITS units in the run: those it holds
        already are confirmed (``_in_place``), the rest go in one ``put_batch``."""
        assert self._row_numbers is not None
        order, groups = _stretch_groups(stretch_keys, starts, rows.shape[1], self._row_numbers)
        laid: list[np.ndarray] | None = None  # laid out when a queue's units are put
        for key, lo, hi in groups:
            if hi - lo <= BATCH_GROUP_UNITS:
                continue
            name = (topics[key >> 32], key & _QUEUE_ID_MASK)
            in_place = self._in_place(name, rows, tags, order, create_time[key >> 32], lo, hi)
            if in_place == hi - lo:
                continue
            lo += in_place
            if laid is None:
                laid = self._lay_out(rows, tags, order, create_time)
            queue_offsets, physicals, sizes, born, stored, codes = laid
            times = born if create_time[key >> 32] else stored
            self._put_batch(name, (queue_offsets[lo:hi], physicals[lo:hi], sizes[lo:hi],
                                   codes[lo:hi], times[lo:hi]))  # fmt: skip

    @staticmethod
    def _collect_small(rows: np.ndarray, tags: np.ndarray | None, picked: np.ndarray | None,
                       lengths: np.ndarray, topic_of_stretch: np.ndarray | None,
                       topics: list[str], create_time: list[bool], pending: _Pending
                       ) -> None:  # fmt: skip
        """The rows ``picked`` (None: all) of queues with few units in the run, copied
        in run order into ``pending`` (the columns are reused by the next run);
        ``lengths``: the run's stretches' (of ``topic_of_stretch``)."""

        def column(row: int) -> np.ndarray:
            return rows[row].copy() if picked is None else rows[row][picked]

        queue_ids = (column(DISPATCH_QUEUE_ID) & _QUEUE_ID_MASK).astype(np.int32)
        topic_index = None
        if topic_of_stretch is not None:
            every = np.repeat(topic_of_stretch.astype(np.int32), lengths)
            topic_index = every if picked is None else every[picked]
        if not any(create_time):
            times = column(DISPATCH_STORE_TS)
        elif all(create_time):
            times = column(DISPATCH_BORN_TS)
        else:
            assert topic_index is not None  # two topics at least
            times = np.where(np.asarray(create_time)[topic_index], column(DISPATCH_BORN_TS),
                             column(DISPATCH_STORE_TS))  # fmt: skip
        if tags is None:
            codes = np.zeros(len(queue_ids), dtype=np.int64)
        else:
            codes = tags.copy() if picked is None else tags[picked]
        units = (column(DISPATCH_QUEUE_OFFSET), column(DISPATCH_PHYSICAL), column(DISPATCH_SIZE),
                 codes, times)  # fmt: skip
        pending.add(topics, topic_index, queue_ids, units)

    def _in_place(self, name: tuple[str, int], rows: np.ndarray, tags: np.ndarray | None,
                  order: np.ndarray | None, create_time: bool, lo: int, hi: int
                  ) -> int:  # fmt: skip
        """How many of a queue's units in a run (rows ``order[lo:hi]``), from its
        first, the queue holds already (``ConsumeQueue.units_in_place``): the
        re-dispatch after a SIGKILL finds them so and skips them, without laying the
        run out or building a batch."""
        first = int(rows[DISPATCH_QUEUE_OFFSET, lo if order is None else int(order[lo])])
        run = RunColumns(
            rows[DISPATCH_QUEUE_OFFSET], rows[DISPATCH_PHYSICAL], rows[DISPATCH_SIZE], tags,
            rows[DISPATCH_BORN_TS if create_time else DISPATCH_STORE_TS], order,
        )  # fmt: skip
        in_place: int = self._queue(*name).units_in_place(first, run, lo, hi - lo)
        if in_place and self._tail is not None:
            self._tail.forget(*name)  # as after put_batch
        return in_place

    def _lay_out(self, rows: np.ndarray, tags: np.ndarray | None, order: np.ndarray | None,
                 create_time: list[bool]) -> list[np.ndarray]:  # fmt: skip
        """The unit columns (``_UNIT_ROWS``, then the tag hashes) of a run in ``order``
        (one gather each into the reused ``_laid``), so that each queue's units are a
        slice; as they are when order is None. A time row no topic of the run uses is
        left in run order (``_collect_run`` never reads it)."""
        assert self._laid is not None
        count = rows.shape[1]
        laid = []
        for at, row in enumerate(_UNIT_ROWS):
            needed = (row != DISPATCH_BORN_TS or any(create_time)) and (
                row != DISPATCH_STORE_TS or not all(create_time)
            )
            if order is None or not needed:
                laid.append(rows[row])
            else:
                laid.append(np.take(rows[row], order, out=self._laid[at, :count]))
        if tags is None:
            laid.append(np.zeros(count, dtype=np.int64))
        else:
            laid.append(tags if order is None else np.take(tags, order, out=self._laid[-1, :count]))
        return laid

    def _write(self, pending: _Pending) -> None:
        """Write what ``pending`` holds (and empty it): with a TailWriter in bulk
        (``_write_small``), else a ``put`` a unit, in log order."""
        taken = pending.take()
        if taken is None:
            return
        topics, topic_index, queue_ids, units = taken
        if self._tail is not None:
            self._write_small(topics, topic_index, queue_ids, units)
            return
        queue = self._queue
        for index, queue_id, *unit in zip(
            topic_index.tolist(),
            queue_ids.tolist(),
            *(column.tolist() for column in units),
            strict=True,
        ):
            queue(topics[index], queue_id).put(*unit)

    def _put_batch(self, name: tuple[str, int], units: Units) -> None:
        """One queue's units by ``put_batch``, in stretches of consecutive queue
        offsets (a gap is the queue's to refuse), after those the queue holds already
        (``ConsumeQueue.units_in_place``)."""
        offsets, physical, sizes, codes, times = units
        queue = self._queue(*name)
        run = RunColumns(offsets, physical, sizes, codes, times, None)
        in_place = queue.units_in_place(int(offsets[0]), run, 0, len(offsets))
        if in_place:  # kept through the crash: nothing to write
            offsets, physical, sizes = offsets[in_place:], physical[in_place:], sizes[in_place:]
            codes, times = codes[in_place:], times[in_place:]
        breaks = np.flatnonzero(np.diff(offsets) != 1) + 1
        for lo, hi in zip([0, *breaks.tolist()], [*breaks.tolist(), len(offsets)], strict=True):
            if lo == hi:
                break  # every unit was in place
            queue.put_batch(
                int(offsets[lo]), physical[lo:hi], sizes[lo:hi], codes[lo:hi], times[lo:hi]
            )
        if self._tail is not None:
            self._tail.forget(*name)  # its row no longer points at the tail

    def _write_small(self, topics: list[str], topic_index: np.ndarray, queue_ids: np.ndarray,
                     units: Units) -> None:  # fmt: skip
        """Units of queues with a few each (many queues), in log order, as columns.
        Those past their queue's end (a rebuild, units a power cut took, a running
        store's) go in one TailWriter call, in log order: a topic's shared unit log
        takes them in bulk, own files through C. Those below it (the re-dispatch after
        a SIGKILL, whose page cache kept them) first: ``_reput_small``. A queue's end
        comes from its topic's shared log while it has no object and no own files
        (``TailWriter.max_offsets``): no object per queue."""
        tail = self._tail
        assert tail is not None
        ends = np.empty(len(queue_ids), dtype=np.int64)
        for topic, mine, distinct, inverse in _by_topic(topics, topic_index, queue_ids):
            topic_ends = np.asarray(tail.max_offsets(topic, distinct.tolist()), dtype=np.int64)
            ends[mine] = topic_ends[inverse]
        below = units[0] < ends
        if below.any():
            rows = np.flatnonzero(below)
            self._reput_small(topics, topic_index[rows], queue_ids[rows], _select(units, rows))
            rows = np.flatnonzero(~below)
            if not len(rows):
                return
            topic_index, queue_ids, units = topic_index[rows], queue_ids[rows], _select(units, rows)
        slots = np.empty(len(queue_ids), dtype=np.int32)
        for topic, mine, distinct, inverse in _by_topic(topics, topic_index, queue_ids):
            slots[mine] = tail.slots_for(topic, distinct)[inverse]
        offsets, physical, sizes, codes, times = units
        tail.write(slots, offsets, physical, sizes.astype(np.int32), codes, times)

    def _reput_small(self, topics: list[str], topic_index: np.ndarray, queue_ids: np.ndarray,
                     units: Units) -> None:  # fmt: skip
        """Units below their queue's end, in log order: those the topic's shared unit
        log holds already are confirmed in one lookup per topic
        (``TailWriter.confirm_shared``); the rest of a queue go by ``_put_batch`` when
        more than SMALL_GROUP_UNITS (own files: one C check per file), else a ``put``
        each (a unit past the end, or in own files, is written; one that differs
        raises)."""
        assert self._tail is not None
        for index, topic in enumerate(topics):
            mine = np.flatnonzero(topic_index == index)
            if not len(mine):
                continue
            ids, (offsets, physical, sizes, codes, times) = queue_ids[mine], _select(units, mine)
            confirmed = self._tail.confirm_shared(topic, ids, offsets, physical, sizes, codes)
            rest = np.flatnonzero(~confirmed)
            if not len(rest):
                continue
            by_queue = rest[np.argsort(ids[rest], kind="stable")]  # log order within a queue
            grouped = ids[by_queue]
            bounds = [0, *(np.flatnonzero(np.diff(grouped)) + 1).tolist(), len(by_queue)]
            for lo, hi in itertools.pairwise(bounds):
                picks = by_queue[lo:hi]
                name = (topic, int(grouped[lo]))
                if hi - lo > SMALL_GROUP_UNITS:
                    # In chunks: past a damaged unit, put_batch rewrites the rest of its
                    # chunk (unchanged units included), not the rest of the scan.
                    for at in range(0, hi - lo, BATCH_GROUP_UNITS):
                        chunk = picks[at : at + BATCH_GROUP_UNITS]
                        self._put_batch(name, (offsets[chunk], physical[chunk], sizes[chunk],
                                               codes[chunk], times[chunk]))  # fmt: skip
                    continue
                queue = self._queue(*name)
                for unit in zip(offsets[picks].tolist(), physical[picks].tolist(),
                                sizes[picks].tolist(), codes[picks].tolist(),
                                times[picks].tolist(), strict=True):  # fmt: skip
                    queue.put(*unit)

    def _tag_codes(self, mapped: MappedFile, rows: np.ndarray) -> np.ndarray | None:
        """The run's tag hashes (0: no tag), or None when no record has a tag."""
        tag_lens = rows[DISPATCH_TAG_LEN]
        if not tag_lens.any():
            return None
        codes = np.zeros(rows.shape[1], dtype=np.int64)
        mapping, file_start = mapped.mapping, mapped.start_offset
        tag_hash = self._tag_hash
        for row in np.flatnonzero(tag_lens).tolist():
            at = int(rows[DISPATCH_PHYSICAL, row]) - file_start + HEADER_SIZE
            at += int(rows[DISPATCH_TOPIC_LEN, row])
            codes[row] = tag_hash(mapping[at : at + int(tag_lens[row])])
        return codes

    def _topic_at(self, mapped: MappedFile, rows: np.ndarray, row: int) -> str:
        at = int(rows[DISPATCH_PHYSICAL, row]) - mapped.start_offset + HEADER_SIZE
        raw = mapped.mapping[at : at + int(rows[DISPATCH_TOPIC_LEN, row])]
        topic = self._topics.get(raw)
        if topic is None:
            topic = self._topics[raw] = raw.decode("ascii")  # dispatch_columns checked it
        return topic


class TakenRuns:
    """``LogScan.take_runs``: one scan's worth of runs handed in from outside, written
    as ``scan`` writes its own (per-queue order: a queue's collected units go with, and
    before, its next ``put_batch``; everything is written by ``finish``)."""

    __slots__ = ("_pending", "_rows_max", "_scan")

    def __init__(self, scan: LogScan, rows_max: int) -> None:
        self._scan = scan
        self._rows_max = rows_max
        self._pending = _Pending()

    def take(self, mapped: MappedFile, rows: np.ndarray, found: Stretches | None,
             keyed: Keyed) -> None:  # fmt: skip
        """One run: ``rows`` of dispatch columns (DISPATCH_ROWS rows, a column per
        record, at most ``rows_max``) of records in ``mapped``, with its stretches
        (``run_stretches``; None: found here); keyed records' index entries are
        appended to ``keyed``."""
        count = rows.shape[1]
        assert 0 < count <= self._rows_max
        if found is None:
            assert self._scan._starts is not None
            found = stretches_of(np.ascontiguousarray(rows), count, self._scan._starts)
        assert found.rows == count
        self._scan._collect_run(mapped, rows, found, self._pending, keyed)
        if self._pending.rows >= PENDING_ROWS_MAX:
            self._scan._write(self._pending)
            self._pending = _Pending()

    def finish(self) -> None:
        """Write what the runs left collected."""
        self._scan._write(self._pending)
        self._pending = _Pending()


_Run = tuple[MappedFile, int, int, int, np.ndarray]  # file, at, taken, status, columns


def _parse_runs(
    commitlog: CommitLog, start: int, end: int, hard_end: int, buffers: Iterator[np.ndarray]
) -> Iterator[_Run]:
    """The runs of [start, end), each parsed into the next of ``buffers``."""
    position = start
    while position < end:
        columns = next(buffers)
        mapped = commitlog.file_for(position)
        file_start = mapped.start_offset
        at, taken, status = dispatch_columns(
            mapped.mapping, position - file_start, min(mapped.size_bytes, end - file_start),
            mapped.size_bytes, hard_end - file_start, file_start, False, columns,
        )  # fmt: skip
        yield mapped, at, taken, status, columns
        if status == DISPATCH_INVALID or file_start + at <= position:
            return
        position = file_start + at


def _groups(
    keys: np.ndarray, row_numbers: np.ndarray | None = None
) -> tuple[np.ndarray | None, list[tuple[int, int, int]]]:
    """The rows grouped by key: ``(order, [(key, lo, hi), ...])``, where
    ``order[lo:hi]`` are the rows of ``key`` in run order, the keys in order of first
    appearance; order None when there is one key (every row, in place).

    The rows of one put batch are adjacent, so the work is per stretch of one key, not
    per row: the stretches are sorted by key (few), and ``order`` is laid out from
    them with one repeat (no sort of the rows). ``row_numbers`` (0, 1, ... at least as
    many as keys) saves making them."""
    count = len(keys)
    starts = np.concatenate(([0], np.flatnonzero(keys[1:] != keys[:-1]) + 1))
    return _stretch_groups(keys[starts], starts, count, row_numbers)


def _stretch_groups(
    keys: np.ndarray, starts: np.ndarray, count: int, row_numbers: np.ndarray | None = None
) -> tuple[np.ndarray | None, list[tuple[int, int, int]]]:
    """``_groups`` of ``count`` rows from their stretches: the row each starts at (the
    first at 0, in order) and its key (``keys``)."""
    assert len(starts) == len(keys) >= 1 and starts[0] == 0
    if len(starts) == 1:
        return None, [(int(keys[0]), 0, count)]
    lengths = np.diff(np.append(starts, count))
    distinct, first_stretch, group_of_stretch = np.unique(
        keys, return_index=True, return_inverse=True
    )
    by_group = np.argsort(group_of_stretch, kind="stable")  # run order within a group
    laid_lengths = lengths[by_group]
    laid_ends = np.cumsum(laid_lengths)  # where each stretch ends in the layout
    order = np.repeat(starts[by_group] - (laid_ends - laid_lengths), laid_lengths)
    order += np.arange(count) if row_numbers is None else row_numbers[:count]
    laid_groups = group_of_stretch[by_group]  # 0, 0, 1, ...: every group has a stretch
    group_ends = laid_ends[np.append(laid_groups[1:] != laid_groups[:-1], True)]
    bounds_list = [0, *group_ends.tolist()]
    keys_list = distinct.tolist()
    return order, [
        (keys_list[g], bounds_list[g], bounds_list[g + 1])
        for g in np.argsort(first_stretch, kind="stable").tolist()
    ]


def _why_unparsable(mapped: MappedFile, in_file: int, hard_end: int) -> str:
    """Why ``dispatch_columns`` stopped at ``in_file``, for the CorruptDataError."""
    left = mapped.size_bytes - in_file
    if left < BLANK_SIZE:
        return f"a record cannot start {left} bytes before the end"
    size, magic, _ = PREFIX.unpack_from(mapped.mapping, in_file)
    if magic == BLANK_MAGIC:
        if size != left:
            return f"blank record of {size} bytes does not end its file"
        return f"blank record past the written end {hard_end}"
    if magic != MESSAGE_MAGIC:
        return f"bad magic 0x{magic:08x}"
    if size < HEADER_SIZE:  # a zero size would never advance
        return f"size {size} is below the {HEADER_SIZE}-byte header"
    fit = min(mapped.size_bytes - BLANK_SIZE, hard_end - mapped.start_offset)
    if size > fit - in_file:
        return f"size {size} runs past the file or the written end {hard_end}"
    return "its header does not parse (section lengths, physical offset, flags or topic)"
