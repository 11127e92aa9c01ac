"""Appending ConsumeQueue units for many queues in one call: the dispatcher's fast path.

Why: with thousands of queues each dispatch round holds about one unit per queue, and
``ConsumeQueue.put`` (validation, lock, file look-up, two struct writes) costs about
15 us per unit in Python; a store of 4,096 partitions then dispatches 12x slower than
one of a single partition. Here a round's units go to C (``write_units`` in
consumequeue/_units.c) in one call.

How: every queue the dispatcher writes gets a slot, a row of a table holding the raw
addresses of its last unit and time files, its max offset, the end of the disk space
reserved ahead of it and its last commitlog offset (columns ``TAIL_*``). ``write``
hands the table and the round's columns to C, which appends each unit that is the next
of an attached row and fits its reserved space, and stops at the first that is not.
That unit goes through ``ConsumeQueue.put`` (new file, reservation, a re-put after
recovery, an error to raise), then its row is attached again, and C goes on.

Invariants:

- Every row's files are held by reference (``_refs``) while attached, so its mapping
  cannot be unmapped under C; and the table is dropped whenever the shared FileCache's
  ``generation`` moves (a mapping left the cache, a queue dropped units), so a row
  never addresses a mapping the cache no longer accounts for (descriptor bound, dirty
  tracking). With more queues than half the cache holds, no row is attached at all:
  the fast path would only thrash, and every unit takes ``ConsumeQueue.put``.
- After each C call, the queues it wrote are told their new max offset and last
  commitlog offset, and their files are marked dirty (for the next flush), under the
  store lock, before anything else can look at them.
- Units are appended in the order given; the caller passes each queue's units in
  queue-offset order (as the CommitLog wrote them).
- Without the C module, ``write`` is a loop of ``ConsumeQueue.put``.

Shared queues (docs/QUEUES.md): a queue without own files keeps its units in its
topic's shared unit log. Each slot caches the queue offset from which its units go
to own files (``ConsumeQueue.append_limit``; -1 once it has them); a round's units
below their slot's limit go first, per topic, to ``SharedUnitLog.append`` (one
pwrite), in log order; a unit the log does not take (a re-put, a gap, commitlog
order) goes through ``ConsumeQueue.put``, and the slot's limit is read again. The
rest go to own files as above. The cached limits are re-read whenever a queue's run
is cut or restarted (``QueueContext.shared_generation``).

No object per queue (issue 15): a slot of a queue that has no ConsumeQueue object and
no own files holds None, and its limit comes from the shared log alone
(``ConsumeQueueStore.shared_append_limits``, one call per topic for the new queues of
a round: ``new_slots``); the object is built on the first unit that needs it (one
that graduates the queue, a re-put, an error to raise). 100,000 young queues then cost
a slot each (4 bytes in their topic's slot array, found by queue id, and a row of the
per-slot arrays), not an object, nor a key tuple and dict entry.
"""

from __future__ import annotations

import itertools
from typing import Any, Final, cast

import numpy as np

from mqstore.commitlog.native import NATIVE, check_layout
from mqstore.consumequeue.consume_queue import ConsumeQueue
from mqstore.consumequeue.format import UNIT, times_position_bytes
from mqstore.consumequeue.mapped_file import MappedTimeFile, MappedUnitFile
from mqstore.consumequeue.queue_store import ConsumeQueueStore

__all__ = ["TailWriter"]

# Columns of the slot table (commitlog/_native.h, enum TAIL_*).
_UNITS_ADDR: Final = 0
_TIMES_ADDR: Final = 1
_BLOCKS_ADDR: Final = 2
_INTERVAL: Final = 3
_FILE_FIRST: Final = 4
_NEXT: Final = 5
_LIMIT: Final = 6
_LAST_CLOG: Final = 7
_COLUMNS: Final = 8
# A write of at most this many units takes Python's scalar paths: a round of one
# record (a waiting reader's, at a low rate) costs microseconds, not numpy calls.
SMALL_WRITE_UNITS: Final = 8
# Up to this many units, _publish finds the touched slots with a dict over a list, not
# a sort (_distinct) and a fancy index of the table: both release the GIL for any
# length (numpy 2.x), and a released GIL goes to the writer thread, which keeps it
# until it sleeps (docs/VISIBILITY.md, stop 29). The bound is write_units' own: it
# keeps the GIL below 256 units too, and the list path costs ~0.15 us a unit, 40 us at
# the bound.
PUBLISH_LIST_UNITS_MAX: Final = 256
# Queue ids below this have their slot in their topic's int32 array (512 KiB at most a
# topic; the seed of CommitLog's offsets stops at the same id, SEED_QUEUES_MAX); higher
# ones, as rare as partitions past 131,072, in the slot map under (topic, queue id).
SLOT_ARRAY_IDS_MAX: Final = 1 << 17
assert UNIT.fields is not None
assert [UNIT.fields[name][1] for name in ("commitlog_offset", "size", "tag_hash")] == [0, 8, 12]
assert UNIT.itemsize == 20
if NATIVE is not None:  # the C copy of the table and the unit: an ImportError if stale
    check_layout(
        NATIVE,
        {
            "TAIL_UNITS_ADDR": _UNITS_ADDR, "TAIL_TIMES_ADDR": _TIMES_ADDR,
            "TAIL_BLOCKS_ADDR": _BLOCKS_ADDR, "TAIL_INTERVAL": _INTERVAL,
            "TAIL_FILE_FIRST": _FILE_FIRST, "TAIL_NEXT": _NEXT, "TAIL_LIMIT": _LIMIT,
            "TAIL_LAST_CLOG": _LAST_CLOG, "TAIL_COLUMNS": _COLUMNS,
            "UNIT_SIZE": UNIT.itemsize,
            "UNIT_AT_COMMITLOG_OFFSET": UNIT.fields["commitlog_offset"][1],
            "UNIT_AT_SIZE": UNIT.fields["size"][1],
            "UNIT_AT_TAG_HASH": UNIT.fields["tag_hash"][1],
        },
        "consumequeue/tail_writer.py",
    )  # fmt: skip


class TailWriter:
    """Appends units to the tails of a store's ConsumeQueues (writer side only).

    Thread safety: ``write`` holds the store's ConsumeQueue lock; one caller at a time
    (the dispatcher)."""

    def __init__(self, queues: ConsumeQueueStore) -> None:
        self._store = queues
        self._ctx = queues._ctx
        # feed_columns' slot map: per topic an int32 array of slots by queue id (ids below
        # SLOT_ARRAY_IDS_MAX; -1: none), and (topic, queue id) -> slot for higher ids.
        # Issue 15: 100,000 new queues then cost no key tuple and no dict entry each.
        self._slots: dict[str | tuple[str, int], Any] = {}
        # Per slot its queue's object; None (sharing on) while the queue has none and
        # no own files: its units go to the shared log, and the object is built on the
        # first unit that needs it (issue 15: no object per queue on the dispatch path).
        self._queues: list[ConsumeQueue | None] = []
        self._refs: list[tuple[MappedUnitFile, MappedTimeFile] | None] = []
        self._table = np.zeros((64, _COLUMNS), dtype=np.int64)
        self._generation = -1
        self._sharing = queues.config.shared_units_max > 0
        self._limits = np.full(64, -1, dtype=np.int64)  # per slot: see the module docstring
        self._slot_queue_ids = np.zeros(64, dtype=np.int32)
        self._slot_topics = np.zeros(64, dtype=np.int32)  # index into _topics
        self._topics: list[str] = []
        self._topic_index: dict[str, int] = {}
        self._shared_generation = self._ctx.shared_generation

    def _slot(self, topic: str, queue_id: int) -> int:
        """The slot of a queue, -1 for none (yet)."""
        if type(queue_id) is not int and isinstance(queue_id, np.integer):
            queue_id = int(queue_id)  # equal to its int, as it was as a dict key
        if type(queue_id) is int and 0 <= queue_id < SLOT_ARRAY_IDS_MAX:
            slots = self._slots.get(topic)
            return int(slots[queue_id]) if slots is not None and queue_id < len(slots) else -1
        return cast(int, self._slots.get((topic, queue_id), -1))

    def _set_slots(self, topic: str, queue_ids: list[int], first: int) -> None:
        """Slots ``first, first + 1, ...`` for these queues (distinct, valid ids)."""
        low = queue_ids
        if queue_ids and max(queue_ids) >= SLOT_ARRAY_IDS_MAX:
            low = [queue_id for queue_id in queue_ids if queue_id < SLOT_ARRAY_IDS_MAX]
            self._slots.update(
                (key, slot)
                for key, slot in zip(
                    zip(itertools.repeat(topic), queue_ids), itertools.count(first), strict=False
                )
                if key[1] >= SLOT_ARRAY_IDS_MAX
            )
        if not low:
            return
        slots = self._slots.get(topic)
        needed = max(low) + 1
        if slots is None or len(slots) < needed:
            size = max(64, len(slots) if slots is not None else 0)
            while size < needed:
                size *= 2
            grown = np.full(min(size, SLOT_ARRAY_IDS_MAX), -1, dtype=np.int32)
            if slots is not None:
                grown[: len(slots)] = slots
            slots = self._slots[topic] = grown
        assert isinstance(slots, np.ndarray)
        if low is queue_ids:
            slots[low] = np.arange(first, first + len(low), dtype=np.int32)
        else:
            slots[low] = [
                slot
                for queue_id, slot in zip(queue_ids, itertools.count(first), strict=False)
                if queue_id < SLOT_ARRAY_IDS_MAX
            ]

    def slot_of(self, topic: str, queue_id: int) -> int:
        """The slot of a queue (given one on first use)."""
        slot = self._slot(topic, queue_id)
        if slot < 0:
            self._add_slots(topic, [queue_id])
            slot = self._slot(topic, queue_id)
        return slot

    def slots_of(self, keys: list[tuple[str, int]]) -> list[int]:
        """The slots of many queues (``slot_of`` each), new ones given per topic in
        one pass: a round of 100,000 new queues costs no call per queue (issue 15)."""
        slot = self._slot
        missing = list(dict.fromkeys([key for key in keys if slot(*key) < 0]))  # in order
        if missing:
            topic = missing[0][0]
            if all(key[0] == topic for key in missing):
                self._add_slots(topic, [queue_id for _, queue_id in missing])
            else:
                by_topic: dict[str, list[int]] = {}
                for topic, queue_id in missing:
                    by_topic.setdefault(topic, []).append(queue_id)
                for topic, queue_ids in by_topic.items():
                    self._add_slots(topic, queue_ids)
        return [slot(*key) for key in keys]

    def new_slots(self, topics: list[str], queue_ids: list[int]) -> range | list[int]:
        """The slots of queues that have none yet (repeats allowed), given as columns:
        ``slots_of`` without a key tuple per queue when they are of one topic (the
        dispatcher's new queues of a round; issue 15)."""
        topic = topics[0]
        if topics.count(topic) != len(topics):
            return self.slots_of(list(zip(topics, queue_ids, strict=True)))
        assert self._slot(topic, queue_ids[0]) < 0
        unique = list(dict.fromkeys(queue_ids))
        first = len(self._queues)
        self._add_slots(topic, unique)
        if len(unique) == len(queue_ids):
            return range(first, first + len(unique))
        slot_of = dict(zip(unique, range(first, first + len(unique)), strict=True))
        return [slot_of[queue_id] for queue_id in queue_ids]

    def slots_for(self, topic: str, queue_ids: np.ndarray) -> np.ndarray:
        """The int32 slots of distinct queues of one topic, new ones given theirs in
        one pass (``new_slots``), with no Python per queue that has one already."""
        if not len(queue_ids):
            return np.zeros(0, dtype=np.int32)
        if int(queue_ids.min()) < 0 or int(queue_ids.max()) >= SLOT_ARRAY_IDS_MAX:
            return np.asarray(self.slots_of([(topic, q) for q in queue_ids.tolist()]), np.int32)
        slots = np.full(len(queue_ids), -1, dtype=np.int32)
        table = self._slots.get(topic)
        if table is not None:
            known = queue_ids < len(table)
            slots[known] = table[queue_ids[known]]
        missing = np.flatnonzero(slots < 0)
        if len(missing):
            new = queue_ids[missing].tolist()
            slots[missing] = self.new_slots([topic] * len(new), new)
        return slots

    def max_offsets(self, topic: str, queue_ids: list[int]) -> list[int]:
        """``ConsumeQueueStore.max_offsets_of``: the queues' next offsets, no object
        built for a queue that has none and no own files."""
        return self._store.max_offsets_of(topic, queue_ids)

    def confirm_shared(
        self,
        topic: str,
        queue_ids: np.ndarray,
        queue_offsets: np.ndarray,
        commitlog_offsets: np.ndarray,
        sizes: np.ndarray,
        tag_hashes: np.ndarray,
    ) -> np.ndarray:
        """``ConsumeQueueStore.confirm_shared``: which re-puts the shared log holds."""
        return self._store.confirm_shared(
            topic, queue_ids, queue_offsets, commitlog_offsets, sizes, tag_hashes
        )

    @property
    def slots(self) -> dict[str | tuple[str, int], Any]:
        """The slot map for ``feed_columns`` (commitlog/appender.py): per topic an int32
        array of slots by queue id (-1: none), (topic, queue id) -> slot past it."""
        return self._slots

    def _add_slots(self, topic: str, queue_ids: list[int]) -> None:
        """Give slots to queues of one topic that have none (distinct ids). With sharing
        on, a queue without an object or own files gets none (None in ``_queues``) and
        its limit comes from the shared log alone (``shared_append_limits``)."""
        store = self._store
        count = len(queue_ids)
        shared: list[int | None] = (
            store.shared_append_limits(topic, queue_ids) if self._sharing else [None] * count
        )
        queues: list[ConsumeQueue | None]
        limits: list[int]
        if None in shared:
            # Queues the shared log cannot answer for (or all, with sharing off) are
            # built here, which validates them: the typed errors of
            # ConsumeQueueStore.queue.
            queues = [
                store.queue(topic, queue_id) if limit is None else None
                for queue_id, limit in zip(queue_ids, shared, strict=True)
            ]
            limits = list(map(_limit_of, queues, shared))
        else:  # the common case of many new queues: all in the shared log, no object
            queues = [None] * count
            limits = cast(list[int], shared)
        first = len(self._queues)
        self._grow(first + count)
        topic_index = self._topic_index.get(topic)
        if topic_index is None:
            topic_index = self._topic_index[topic] = len(self._topics)
            self._topics.append(topic)
        self._slot_queue_ids[first : first + count] = queue_ids
        self._slot_topics[first : first + count] = topic_index
        self._queues.extend(queues)
        self._refs.extend(itertools.repeat(None, count))
        self._set_slots(topic, queue_ids, first)
        if self._sharing:
            self._limits[first : first + count] = limits

    def _refresh_limits(self) -> None:
        """Every slot's limit again (a run was cut or restarted): the built queues ask
        their object, the others their topic's shared log, one call per topic."""
        by_topic: dict[int, list[int]] = {}
        for slot, queue in enumerate(self._queues):
            if queue is None:
                by_topic.setdefault(int(self._slot_topics[slot]), []).append(slot)
            else:
                self._limits[slot] = queue.append_limit()
        for topic_index, slots in by_topic.items():
            queue_ids = self._slot_queue_ids[slots].tolist()
            limits = self._store.shared_append_limits(self._topics[topic_index], queue_ids)
            for slot, limit in zip(slots, limits, strict=True):
                self._limits[slot] = self._limit(slot) if limit is None else limit

    def _grow(self, slots_needed: int) -> None:
        """Make the per-slot arrays hold ``slots_needed`` slots (doubling)."""
        size = len(self._table)
        if slots_needed <= size:
            return
        while size < slots_needed:
            size *= 2
        used = len(self._queues)
        grown = np.zeros((size, _COLUMNS), dtype=np.int64)
        grown[:used] = self._table[:used]
        self._table = grown
        limits = np.full(size, -1, dtype=np.int64)
        limits[:used] = self._limits[:used]
        self._limits = limits
        queue_ids = np.zeros(size, dtype=np.int32)
        queue_ids[:used] = self._slot_queue_ids[:used]
        self._slot_queue_ids = queue_ids
        topics = np.zeros(size, dtype=np.int32)
        topics[:used] = self._slot_topics[:used]
        self._slot_topics = topics

    def _queue(self, slot: int) -> ConsumeQueue:
        """The slot's queue object, built on first need."""
        queue = self._queues[slot]
        if queue is None:
            topic = self._topics[int(self._slot_topics[slot])]
            queue = self._store.queue(topic, int(self._slot_queue_ids[slot]))
            self._queues[slot] = queue
        return queue

    def _limit(self, slot: int) -> int:
        """The slot's append limit (``ConsumeQueue.append_limit``), from the shared log
        alone while the queue has no object and no own files."""
        if self._queues[slot] is None:
            topic = self._topics[int(self._slot_topics[slot])]
            (limit,) = self._store.shared_append_limits(topic, [int(self._slot_queue_ids[slot])])
            if limit is not None:
                return limit
        return self._queue(slot).append_limit()

    def write(
        self,
        slots: np.ndarray,
        queue_offsets: np.ndarray,
        commitlog_offsets: np.ndarray,
        sizes: np.ndarray,
        tag_hashes: np.ndarray,
        timestamps_ms: np.ndarray,
    ) -> None:
        """Append unit i (``queue_offsets[i]``, ...) to the queue of ``slots[i]``.

        Arrays: int32 slots and sizes, int64 for the rest, one length. Units already
        stored are checked and skipped as ``ConsumeQueue.put`` does (idempotent).

        Raises:
            The errors of ``ConsumeQueue.put``, for the first unit that fails; the
            units before it are written.
        """
        if self._sharing:
            with self._ctx.lock:
                own = self._write_shared(
                    slots, queue_offsets, commitlog_offsets, sizes, tag_hashes, timestamps_ms
                )
            if own is not None:
                slots, queue_offsets, commitlog_offsets = (
                    slots[own],
                    queue_offsets[own],
                    commitlog_offsets[own],
                )
                sizes, tag_hashes, timestamps_ms = sizes[own], tag_hashes[own], timestamps_ms[own]
        count = len(slots)
        if NATIVE is None:
            for index in range(count):
                self._queue(int(slots[index])).put(
                    int(queue_offsets[index]), int(commitlog_offsets[index]),
                    int(sizes[index]), int(tag_hashes[index]), int(timestamps_ms[index]),
                )  # fmt: skip
            return
        write_units = NATIVE.write_units
        with self._ctx.lock:
            if self._generation != self._ctx.cache.generation:
                self._detach_all()
            start = 0
            while True:
                stop = write_units(
                    self._table, slots, queue_offsets, commitlog_offsets, sizes,
                    tag_hashes, timestamps_ms, start,
                )  # fmt: skip
                if stop > start:
                    self._publish(slots[start:stop])
                if stop == count:
                    return
                slot = int(slots[stop])
                self._queue(slot).put(
                    int(queue_offsets[stop]), int(commitlog_offsets[stop]), int(sizes[stop]),
                    int(tag_hashes[stop]), int(timestamps_ms[stop]),
                )  # fmt: skip
                if self._generation != self._ctx.cache.generation:
                    self._detach_all()
                self._attach(slot)
                if self._sharing:
                    self._limits[slot] = self._limit(slot)
                start = stop + 1

    def forget(self, topic: str, queue_id: int) -> None:
        """Detach a queue's row: it was written some other way (``put_batch``)."""
        slot = self._slot(topic, queue_id)
        if slot >= 0:
            self._table[slot, _UNITS_ADDR] = 0
            self._refs[slot] = None
            if self._sharing:
                self._limits[slot] = self._limit(slot)

    def detach_all(self) -> None:
        """Let go of every file (before the queues change behind the dispatcher's
        back: close, truncation)."""
        with self._ctx.lock:
            self._detach_all()

    # ----------------------------------------------------------------- internals

    def _write_shared(
        self,
        slots: np.ndarray,
        queue_offsets: np.ndarray,
        commitlog_offsets: np.ndarray,
        sizes: np.ndarray,
        tag_hashes: np.ndarray,
        timestamps_ms: np.ndarray,
    ) -> np.ndarray | None:
        """Write the units below their slot's limit to the shared logs, per topic in
        log order; return the indexes of the others (None: there were none here)."""
        if self._shared_generation != self._ctx.shared_generation:
            self._shared_generation = self._ctx.shared_generation
            self._refresh_limits()
        if len(slots) <= SMALL_WRITE_UNITS:  # a round of a few units (a reader waits)
            limit = self._limits.item
            if all(map(int.__ge__, queue_offsets.tolist(), map(limit, slots.tolist()))):
                return None
        # An intp index: a fancy index by int32 releases the GIL (numpy 2.x), by intp not.
        elif not (queue_offsets < self._limits[slots.astype(np.intp)]).any():
            return None
        handled = np.zeros(len(slots), dtype=bool)
        # Each pass appends to one topic until its log stops; a stop costs one put.
        # At most one pass per unit, so the loop is bounded by the round's length.
        for _ in range(len(slots) + len(self._topics)):
            pending = np.flatnonzero(~handled & (queue_offsets < self._limits[slots]))
            if not len(pending):
                break
            topics = self._slot_topics[slots[pending]]
            if topics.min() != topics.max():
                pending = pending[topics == topics[0]]
            topic = self._topics[int(topics[0])]
            appended = self._store.shared_log(topic).append(
                self._slot_queue_ids[slots[pending]], queue_offsets[pending],
                commitlog_offsets[pending], sizes[pending], tag_hashes[pending],
                timestamps_ms[pending],
            )  # fmt: skip
            handled[pending[:appended]] = True
            if appended < len(pending):
                stop = int(pending[appended])
                slot = int(slots[stop])
                self._queue(slot).put(
                    int(queue_offsets[stop]), int(commitlog_offsets[stop]), int(sizes[stop]),
                    int(tag_hashes[stop]), int(timestamps_ms[stop]),
                )  # fmt: skip
                handled[stop] = True
                self._limits[slot] = self._limit(slot)
        return np.flatnonzero(~handled)

    def _publish(self, written: np.ndarray) -> None:
        """Tell the queues C wrote to their new tails, and mark their files dirty."""
        if len(written) <= PUBLISH_LIST_UNITS_MAX:  # no sort: see the bound
            item = self._table.item
            touched = list(dict.fromkeys(written.tolist()))
            rows = [[item(slot, _NEXT), item(slot, _LAST_CLOG)] for slot in touched]
        else:
            unique = _distinct(written)
            touched = unique.tolist()
            rows = self._table[unique][:, (_NEXT, _LAST_CLOG)].tolist()
        queues, refs = self._queues, self._refs
        for slot, (next_offset, last_clog) in zip(touched, rows, strict=True):
            queue = queues[slot]
            assert queue is not None  # an attached row's queue is built (_attach)
            queue._max_offset = next_offset
            queue._last_commitlog_offset = last_clog
            files = refs[slot]
            assert files is not None
            files[0].dirty = True
            files[1].dirty = True

    def _detach_all(self) -> None:
        self._table[:, _UNITS_ADDR] = 0
        self._refs = [None] * len(self._refs)
        self._generation = self._ctx.cache.generation

    def _attach(self, slot: int) -> None:
        """Point the slot's row at its queue's current last file, when the next unit
        goes there (else leave it detached: the next unit takes the slow path)."""
        row = self._table[slot]
        row[_UNITS_ADDR] = 0
        self._refs[slot] = None
        cache = self._ctx.cache
        if len(self._queues) * 2 > cache.max_open_files or self._ctx.closed:
            return
        queue = self._queue(slot)
        upf = queue._upf
        next_offset = queue._max_offset
        file_index, unit_in_file = divmod(next_offset, upf)
        if queue._first_offset == next_offset or file_index >= queue._file_hi:
            return  # empty queue, or the next unit opens a file: ConsumeQueue.put does it
        units = queue._files.units(file_index, for_write=True)
        times = queue._files.times(file_index, for_write=True)
        units.ensure_allocated(unit_in_file + 1)
        times.ensure_allocated(unit_in_file + 1)
        if self._generation != cache.generation:
            # Mapping these files evicted others: every other row may be stale.
            self._detach_all()
        reserved = min(
            units.allocated_bytes // UNIT.itemsize,
            (times.allocated_bytes - times_position_bytes()) // 8,
            upf,
        )
        times_addr = times.times.ctypes.data
        row[_TIMES_ADDR] = times_addr
        row[_BLOCKS_ADDR] = times_addr - times_position_bytes() + times._block_max_position
        row[_INTERVAL] = times.interval_units
        row[_FILE_FIRST] = file_index * upf
        row[_NEXT] = next_offset
        row[_LIMIT] = file_index * upf + reserved
        last = queue._last_commitlog_offset
        row[_LAST_CLOG] = -1 if last is None else last
        self._refs[slot] = (units, times)
        row[_UNITS_ADDR] = units.units.ctypes.data  # last: attaches the row


def _limit_of(queue: ConsumeQueue | None, shared_limit: int | None) -> int:
    """A new slot's limit: its queue's, for a built one; else the shared log's."""
    if queue is not None:
        return queue.append_limit()
    assert shared_limit is not None  # a queue is built exactly when the log cannot say
    return shared_limit


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-D int array, ascending: what ``np.unique(values)``
    returns, without it. numpy 2.x's ``np.unique`` imports numpy.ma on its first call
    in a process (15-30 ms, in the middle of a dispatch round that a reader waits
    for: docs/VISIBILITY.md, stop 31), and its hash path takes about 10x longer than
    a sort for the few thousand slots of a round."""
    ordered = np.sort(values)
    keep = np.empty(len(ordered), dtype=np.bool_)
    keep[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
