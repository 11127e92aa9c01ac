"""Power-cut recovery of one ConsumeQueue's own files (``ConsumeQueue.recover_tail``).

Kept apart from consume_queue.py (one concern per module): these functions run once,
when a writer opens a store that may have lost power, and read the queue's state
directly. The queue's shared-log part (mqstore.consumequeue.shared_log) is recovered
before, by ``SharedUnitLog.recover_tail``; here only the files from the queue's first
own offset on are checked.

Crash policy: see ``recover_tail``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import numpy as np

from mqstore.commitlog.errors import CorruptDataError
from mqstore.consumequeue.format import TIME_FILE_SUFFIX, UNIT_SIZE_BYTES, parse_unit_file_name

if TYPE_CHECKING:
    from mqstore.consumequeue.consume_queue import ConsumeQueue

__all__ = ["DAMAGED_FILE_DROPS_MAX", "UnitVerifier", "recover_tail"]

log = logging.getLogger(__name__)

#: verify(commitlog_offset, size, queue_offset): is the record there this queue's?
UnitVerifier = Callable[[int, int, int], bool]
DAMAGED_FILE_DROPS_MAX: Final = 8  # unreadable files dropped per queue before it counts as corrupt


def recover_tail(
    queue: ConsumeQueue, commitlog_claim: int, commitlog_min: int, verify: UnitVerifier
) -> tuple[int, int | None]:
    """After a power cut: keep the units the checkpoint vouches for, drop the rest.

    Every unit of a record before ``commitlog_claim`` (the checkpoint's dispatched
    position) was synced before the checkpoint was written, so those units, a prefix
    of the queue, are intact. What the queue holds after them was written later and
    may be torn, zero, or in a file whose size or header did not survive. The newest
    intact unit is found walking back from the end: the first unit that points
    below the claim at a record ``verify`` confirms as this queue's record at that
    queue offset (one CommitLog read for a queue the cut did not touch). A unit
    below ``commitlog_min`` cannot be verified (retention deleted its record): the
    walk stops at the first such unit that is in order with the one before it, so
    offsets are never reused (a torn one at worst skips a few). The queue is loaded
    leniently (sizes only; each kept unit is verified here instead). A file that
    cannot be read at all (its size or header) is deleted with every newer file,
    and the position after the last kept unit's record is returned, so that
    re-dispatch starts there and puts back whatever those files held.

    Returns:
        (units dropped, rebuild_from): ``rebuild_from`` is None unless whole files
        were dropped; then re-dispatch must start at or before it.
    """
    with queue._ctx.lock:
        dropped_files = False
        for _ in range(DAMAGED_FILE_DROPS_MAX):
            try:
                queue._enter_for_write(lenient=True)
                break
            except CorruptDataError as error:
                _drop_damaged_files(queue, error)
                dropped_files = True
        else:
            queue._enter_for_write(lenient=True)  # still failing: corrupt, not torn
        dropped = 0
        if (
            queue._first_offset < queue._max_offset
            or _garbage_end(
                queue,
            )
            > 0
        ):
            keep = _intact_end(queue, commitlog_claim, commitlog_min, verify)
            dropped = queue._max_offset - keep
            garbage_end = _garbage_end(
                queue,
            )
            if dropped > 0 or garbage_end > 0:
                newest = queue._file_hi - 1
                queue._max_offset = max(queue._max_offset, newest * queue._upf + garbage_end)
                queue._truncate(keep)
        rebuild_from = None
        if dropped_files:  # the record after the last kept unit's: a record boundary
            rebuild_from = 0
            if queue._max_offset > queue._first_offset:
                file_index, unit_in_file = divmod(queue._max_offset - 1, queue._upf)
                units = queue._files.units(file_index)
                rebuild_from = int(units.commitlog_offsets[unit_in_file]) + int(
                    units.sizes[unit_in_file]
                )
        return max(dropped, 0), rebuild_from


def _intact_end(queue: ConsumeQueue, claim: int, commitlog_min: int, verify: UnitVerifier) -> int:
    """The end of the intact prefix (see ``recover_tail``)."""
    offset = queue._max_offset - 1
    while offset >= queue._first_offset:
        file_index, unit_in_file = divmod(offset, queue._upf)
        units = queue._files.units(file_index)
        size = int(units.sizes[unit_in_file])
        position = int(units.commitlog_offsets[unit_in_file])
        if size > 0 and 0 <= position < claim:
            if position >= commitlog_min:
                if verify(position, size, offset):
                    return offset + 1
            elif offset == queue._first_offset or _in_order_below(queue, offset, position):
                return offset + 1
        offset -= 1
    return queue._first_offset


def _in_order_below(queue: ConsumeQueue, offset: int, position: int) -> bool:
    file_index, unit_in_file = divmod(offset - 1, queue._upf)
    units = queue._files.units(file_index)
    return (
        int(units.sizes[unit_in_file]) > 0 and int(units.commitlog_offsets[unit_in_file]) < position
    )


def _garbage_end(queue: ConsumeQueue) -> int:
    """In the newest file, the end (unit index) of written units past max_offset
    (torn garbage the binary search of ``_load`` stepped over), or 0 if none.

    Only the allocated part is read: a queue's file is reserved as it grows
    (RESERVE_CHUNK_BYTES at a time, from its first unit), so every page a write
    reached lies within ``st_blocks`` of the start; an untouched queue costs one
    stat and a few KiB, not its whole sparse file."""
    if queue._file_lo == queue._file_hi:
        return 0
    newest = queue._file_hi - 1
    units = queue._files.units(newest)
    first = queue._first_offset - newest * queue._upf if newest == queue._file_lo else 0
    allocated_units = -(-os.stat(units.path).st_blocks * 512 // UNIT_SIZE_BYTES)
    start = max(queue._max_offset - newest * queue._upf, 0)
    stop = min(queue._upf, max(first, 0) + allocated_units)
    if stop <= start:
        return 0
    written = np.flatnonzero(units.sizes[start:stop])
    return 0 if len(written) == 0 else start + int(written[-1]) + 1


def _drop_damaged_files(queue: ConsumeQueue, error: CorruptDataError) -> None:
    """Delete the unreadable file named by ``error`` and every newer file of this
    queue; re-raise if the error is not about one of this queue's files."""
    name = os.path.basename(error.path).removesuffix(TIME_FILE_SUFFIX)
    if os.path.dirname(error.path) != queue.directory:
        raise error
    index = parse_unit_file_name(name, queue._upf, queue.directory)
    if index is None:
        raise error
    log.warning("%s: dropping %s and newer files after a power cut: %s", queue, name, error)
    for newer in sorted((i for i in queue._files.indexes() if i >= index), reverse=True):
        queue._files.delete(newer)
    queue._loaded = False
