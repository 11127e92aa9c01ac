"""The re-dispatch's check of units a queue's file holds already.

After a SIGKILL the page cache keeps every unit the dead process wrote, so the
re-dispatch from the checkpoint finds most units in place: ``put_batch`` would compare
them and do nothing. ``units_in_place`` makes that comparison straight from a run's
dispatch columns (dispatch/log_scan.py), one call per queue file, without gathering
the queue's rows into new arrays or validating them as a batch first.

Contract (the C version, commitlog/_dispatch.c, and ``units_in_place_py`` agree on
it; tests/consumequeue/test_reput_check.py holds them to it): unit ``i`` of
``[0, count)`` is row ``r = order[lo + i]`` (``r = lo + i`` when ``order`` is None) of
the columns ``queue_offsets``, ``physical``, ``sizes``, ``tags`` (None: every tag hash
is 0) and ``timestamps``; it is *in place* when

- its queue offset is ``first_offset + i``,
- its values are in a unit's range (physical and timestamp >= 0, size 1..2**31-1),
- the file's unit ``unit_in_file + i`` holds its physical offset, size and tag hash,
- the time file holds its timestamp at the same index, and the unit's block maximum
  (``block_max[(unit_in_file + i) // interval]``) is at least that timestamp.

It returns how many leading units are in place: exactly the units for which
``ConsumeQueue.put_batch`` would write nothing (no hole to fill, no timestamp or block
maximum to repair, nothing to refuse). The first unit not in place, and those after
it, are the caller's to put as before. A bad range or a row of ``order`` outside the
columns is a ValueError, as is a strided array; an array of another item size or kind
a TypeError. Nothing is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, NamedTuple

import numpy as np

from mqstore.commitlog.native import NATIVE

if TYPE_CHECKING:
    from mqstore.consumequeue.consume_queue import ConsumeQueue

__all__ = ["RunColumns", "queue_units_in_place", "units_in_place", "units_in_place_py"]

_INT64_MAX: Final = (1 << 63) - 1
_SIZE_MAX_BYTES: Final = (1 << 31) - 1  # the unit's size field is an int32


class RunColumns(NamedTuple):
    """A run's unit columns in run order (int64, one item per record), and the order
    that lays its rows out queue by queue (None: one queue, rows as they are)."""

    queue_offsets: np.ndarray
    physical: np.ndarray
    sizes: np.ndarray
    tags: np.ndarray | None  # tag hashes; None: no record of the run has a tag
    timestamps: np.ndarray  # the time each unit is indexed by (born or store)
    order: np.ndarray | None


def _int64(array: Any, name: str) -> np.ndarray:
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "iu" or array.itemsize != 8:
        raise TypeError(f"{name} must be a contiguous, aligned array of 8-byte integers")
    if not array.flags.c_contiguous:  # as numpy's buffer export refuses it to C
        raise ValueError(f"{name} is not C-contiguous")
    return array.view(np.int64)


def units_in_place_py(
    units: np.ndarray, times: np.ndarray, block_max: np.ndarray, interval: int,
    unit_in_file: int, first_offset: int, queue_offsets: np.ndarray, physical: np.ndarray,
    sizes: np.ndarray, tags: np.ndarray | None, timestamps: np.ndarray,
    order: np.ndarray | None, lo: int, count: int,
) -> int:  # fmt: skip
    """The pure-Python twin of the C ``units_in_place`` (see the module)."""
    for value in (interval, unit_in_file, first_offset, lo, count):  # C reads int64s
        if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
            raise OverflowError("Python int too large to convert to C long")
    times, block_max = _int64(times, "times"), _int64(block_max, "block_max")
    queue_offsets = _int64(queue_offsets, "queue_offsets")
    physical, sizes = _int64(physical, "physical"), _int64(sizes, "sizes")
    timestamps = _int64(timestamps, "timestamps")
    tags = None if tags is None else _int64(tags, "tags")
    order = None if order is None else _int64(order, "order")
    stored = np.frombuffer(units, dtype=np.uint8)
    units_len, rows_len = len(stored) // 20, len(physical)
    picks_len = rows_len if order is None else len(order)
    if (
        min(len(queue_offsets), len(sizes), len(timestamps)) < rows_len
        or (tags is not None and len(tags) < rows_len)
        or interval <= 0
        or not 0 <= lo <= picks_len
        or not 0 <= count <= picks_len - lo
        or not 0 <= unit_in_file <= min(units_len, len(times))
        or count > min(units_len, len(times)) - unit_in_file
        or not 0 <= first_offset <= _INT64_MAX - count
    ):
        raise ValueError("units_in_place: bad range or short arrays")
    rows = np.arange(lo, lo + count) if order is None else order[lo : lo + count]
    bad = (rows < 0) | (rows >= rows_len)
    if bad.any():  # C reads rows one by one: it raises only on reaching a bad one
        count = int(np.argmax(bad))
        rows = rows[:count]
        raise_at = count
    else:
        raise_at = -1
    at = np.arange(unit_in_file, unit_in_file + count)
    blocks = at // interval
    unit = stored[: units_len * 20].view(
        np.dtype([("physical", "<i8"), ("size", "<i4"), ("tag", "<i8")])
    )[unit_in_file : unit_in_file + count]
    size, stamp = sizes[rows], timestamps[rows]
    tag = np.zeros(count, np.int64) if tags is None else tags[rows]
    ok = (
        (queue_offsets[rows] == first_offset + np.arange(count))
        & (physical[rows] >= 0) & (size >= 1) & (size <= _SIZE_MAX_BYTES) & (stamp >= 0)
        & (blocks < len(block_max))
    )  # fmt: skip
    ok &= (unit["physical"] == physical[rows]) & (unit["size"] == size) & (unit["tag"] == tag)
    ok &= times[at] == stamp
    ok[ok] &= block_max[blocks[ok]] >= stamp[ok]
    in_place = count if ok.all() else int(np.argmin(ok))
    if raise_at >= 0 and in_place == raise_at:
        raise ValueError("units_in_place: a row of order is out of range")
    return in_place


units_in_place: Any = units_in_place_py if NATIVE is None else NATIVE.units_in_place


def queue_units_in_place(queue: ConsumeQueue, first: int, run: RunColumns, lo: int, count: int
                         ) -> int:  # fmt: skip
    """``ConsumeQueue.units_in_place`` (under the queue's lock, loaded for write): one
    ``units_in_place`` call per file of the queue's own units from ``first``, up to its
    max offset; 0 when ``first`` lies in the shared log or the queue has no own file
    (``put_batch`` handles those)."""
    if first < queue._first_offset or queue._file_lo == queue._file_hi:
        return 0
    interval = queue._ctx.config.time_index_interval_units
    done = 0
    for file_index, unit_in_file, chunk in queue._chunks(
        first, max(0, min(count, queue._max_offset - first))
    ):
        times = queue._files.times(file_index)
        took = chunk.stop - chunk.start
        found = units_in_place(
            queue._files.units(file_index).units, times.times, times.block_max, interval,
            unit_in_file, first + chunk.start, *run, lo + chunk.start, took,
        )  # fmt: skip
        done += found
        if found < took:
            break
    return done
