"""A queue's run in the shared unit log, and the log's pass that adds a round's units to
the runs (consumequeue/shared_log.py's ``SharedUnitLog.append``).

``runs_append(runs, new_run, queue_ids, queue_offsets, first, total) -> (count, started)``
takes units ``0 .. total - 1`` in order while each is the next of its queue's run: a
queue without a run, or with an empty one, starts a run there (``new_run(queue offset,
record index)``; ``started`` maps the queue id to what it replaced, a run or None); a
run that ends at the unit's queue offset gets the unit's record index (``first`` +
units taken so far); the first other unit stops the pass. It is ``runs_append`` of the
C module (consumequeue/_runs.c) when built, else ``runs_append_py`` below, its twin:
tests/consumequeue/test_shared_runs.py proves they leave the same runs and return the
same. ``queue_ids`` are int32 and ``queue_offsets`` int64 arrays.

Issue 15: at 4,096 and 100,000 queues nearly every unit of a round lands in a shared
log, and the Python loop cost a few hundred ns a unit. With ``new_run`` the SharedRun
class itself (registered with the C module at import), the C pass makes new runs
without a Python call, as ``SharedRun.of_unit`` would: at 100,000 queues nearly every
unit starts a run.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from mqstore.commitlog.columns import untracked_int_array as _untracked
from mqstore.commitlog.native import NATIVE

__all__ = ["SharedRun", "runs_append", "runs_append_py", "take_records"]

_new_array: Final = array.__new__


class SharedRun(array):
    """The units of one queue in the log: the record index of offset
    ``first_offset + i`` is ``run[i]`` (the run IS its int64 array of positions).

    One object per queue, not a run holding an array, and out of the cyclic garbage
    collector (``untracked_int_array``: raw int64 items and two int slots cannot form
    a cycle): with 100,000 queues every full collection walked 100,000 runs (issue 15:
    a third of the putting thread's time went to collections). So the slots hold ints
    only, always."""

    __slots__ = ("first_offset", "min_offset")

    first_offset: int
    min_offset: int

    def __new__(cls, first_offset: int, position: int | None = None) -> SharedRun:
        """An empty run at ``first_offset``, or one of a unit at record ``position``."""
        run = array.__new__(cls, "q") if position is None else array.__new__(cls, "q", (position,))
        assert isinstance(run, SharedRun)
        run.first_offset = first_offset
        run.min_offset = first_offset
        return _untracked(run)

    @classmethod
    def of_unit(cls, first_offset: int, position: int) -> SharedRun:
        """``SharedRun(first_offset, position)`` without the class call's ``__new__``
        dispatch (append makes one per new queue: 100,000 at 100,000 queues)."""
        run: SharedRun = _new_array(cls, "q", (position,))  # type: ignore[assignment]
        run.first_offset = run.min_offset = first_offset
        return _untracked(run)

    @classmethod
    def of_bytes(cls, first_offset: int, raw: bytes) -> SharedRun:
        """A run at ``first_offset`` of the record indexes ``raw`` holds (native int64
        bytes): a log's load makes one per queue (100,000 at 100,000 queues)."""
        run: SharedRun = _new_array(cls, "q", raw)  # type: ignore[assignment]
        run.first_offset = run.min_offset = first_offset
        return _untracked(run)

    @property
    def positions(self) -> SharedRun:
        """The record indexes (the run itself)."""
        return self

    @property
    def end(self) -> int:
        """The next queue offset after the run."""
        return self.first_offset + len(self)


def runs_append_py(
    runs: dict[int, Any],
    new_run: Callable[[int, int], Any],
    queue_ids: np.ndarray,
    queue_offsets: np.ndarray,
    first: int,
    total: int,
) -> tuple[int, dict[int, Any]]:
    """The pure-Python twin of the C ``runs_append`` (see the module)."""
    if type(runs) is not dict or not callable(new_run):
        raise TypeError("runs_append: runs must be a dict, new_run callable")
    for name, column, itemsize in (
        ("queue_ids", queue_ids, 4),
        ("queue_offsets", queue_offsets, 8),
    ):
        if (
            not isinstance(column, np.ndarray)
            or column.dtype.kind not in "iu"
            or column.itemsize != itemsize
            or not column.flags.c_contiguous
        ):
            raise TypeError(
                f"{name} must be a contiguous, aligned array of {itemsize}-byte integers"
            )
    if (
        not 0 <= total <= min(len(queue_ids), len(queue_offsets))
        or not 0 <= first <= _INT64_MAX - total
    ):
        raise ValueError("runs_append: total or first out of range")
    if new_run is SharedRun:  # the C module makes these runs without the class call
        new_run = SharedRun.of_unit
    find = runs.get
    started: dict[int, Any] = {}
    count = 0
    ids = queue_ids[:total].tolist()
    # map(find, ...) is lazy: each unit sees the runs the units before it made.
    for run, queue_id, queue_offset in zip(
        map(find, ids), ids, queue_offsets[:total].tolist(), strict=True
    ):
        if not run:  # None, or empty: may start anywhere
            runs[queue_id] = new_run(queue_offset, first + count)
            started[queue_id] = run
        elif run.first_offset + len(run) == queue_offset:
            run.append(first + count)
        else:
            break
        count += 1
    return count, started


_INT64_MAX: Final = 2**63 - 1
runs_append: Final = runs_append_py if NATIVE is None else NATIVE.runs_append
if NATIVE is not None:
    NATIVE.runs_register(SharedRun)  # runs_append(..., SharedRun, ...) makes runs in C


def take_records(runs: dict[int, SharedRun], records: np.ndarray, first: int) -> None:
    """A follower's ``runs`` take appended shared records (SHARED_RECORD, the first at
    record index ``first``), as the log builds its runs: a tombstone (size 0) is
    skipped, and a record that does not continue its queue's run starts it afresh."""
    for position, (size, queue_id, queue_offset) in enumerate(
        zip(records["size"].tolist(), records["queue_id"].tolist(),
            records["queue_offset"].tolist(), strict=True),
        first,
    ):  # fmt: skip
        if size == 0:
            continue
        run = runs.get(queue_id)
        if run is None or not run.positions or run.end != queue_offset:
            run = runs[queue_id] = SharedRun(queue_offset)
        run.positions.append(position)
