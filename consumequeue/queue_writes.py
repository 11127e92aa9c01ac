"""How a ConsumeQueue writes its own files (a mixin of consumequeue/consume_queue.py's
ConsumeQueue): where a queue starts or restarts, the commitlog order of its units,
appending one unit or a batch across files, re-putting units a re-dispatch finds
already written (identical units are kept, a differing one is corrupt), and the time
files' block maxima.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

import numpy as np

from mqstore.commitlog.errors import CorruptDataError, InvalidArgumentError, OffsetOutOfRangeError
from mqstore.consumequeue import queue_shared
from mqstore.consumequeue.format import UNIT, UNIT_SIZE_BYTES
from mqstore.consumequeue.mapped_file import block_maxima
from mqstore.consumequeue.queue_files import QueueContext, QueueFiles
from mqstore.consumequeue.shared_log import SharedUnitLog
from mqstore.consumequeue.time_index import TimeIndex
from mqstore.consumequeue.unit_batch import UnitBatch

if TYPE_CHECKING:
    from mqstore.consumequeue.consume_queue import ConsumeQueue

__all__ = ["QueueWrites"]

log = logging.getLogger("mqstore.consumequeue.consume_queue")


class QueueWrites:
    """The writes of a ConsumeQueue to its own files (see the module)."""

    # The state these writes move lives here; ConsumeQueue holds the rest.
    __slots__ = ("_file_hi", "_last_commitlog_offset", "_max_offset", "_time_index")

    # ConsumeQueue's slots (and these).
    queue_id: int
    _ctx: QueueContext
    _files: QueueFiles
    _upf: int
    _file_lo: int
    _file_hi: int
    _first_offset: int
    _max_offset: int
    _last_commitlog_offset: int | None
    _time_index: TimeIndex | None
    _shared: SharedUnitLog | None

    if TYPE_CHECKING:  # ConsumeQueue's

        def _set_empty(self, offset: int) -> None: ...

    def _restarts_at(self, offset: int) -> bool:
        """A gap is allowed only into a queue whose every unit retention already made
        unreadable (min_offset == max_offset after ``correct_min_offset``): the skipped
        offsets' records lay below the CommitLog's start and are gone with it. After a
        power cut, retention may have deleted CommitLog files (durably) past the
        checkpoint's dispatched claim while the units of those files were not yet
        synced; re-dispatch then resumes such a queue at a higher offset."""
        restart = queue_shared.low_offset(cast("ConsumeQueue", self)) == self._max_offset < offset
        if restart:
            log.warning(
                "%s: every unit is below the CommitLog start; resuming at queue offset %d "
                "(offsets %d..%d were removed by retention)",
                self, offset, self._max_offset, offset - 1,
            )  # fmt: skip
        return restart

    def _start_at(self, offset: int) -> None:
        """The queue holds no readable unit: drop leftover files (and forget its shared
        run), begin afresh at ``offset``."""
        for file_index in range(self._file_hi - 1, self._file_lo - 1, -1):
            self._files.delete(file_index)
        if self._shared is not None and not self._ctx.read_only:
            self._shared.restart_queue(self.queue_id, offset)
            self._ctx.shared_generation += 1
        self._set_empty(offset)

    def _is_empty(self) -> bool:
        """No unit at all, own or shared: the next put may start anywhere."""
        return (
            self._first_offset == self._max_offset
            and queue_shared.shared_run(cast("ConsumeQueue", self)) is None
        )

    def _check_commitlog_order(self, commitlog_offset: int) -> None:
        last = self._last_commitlog_offset
        if last is not None and commitlog_offset <= last:
            raise InvalidArgumentError(
                f"{self}: commitlog offset {commitlog_offset} at queue offset "
                f"{self._max_offset} is not above the previous unit's {last}"
            )

    def _append_one(
        self, offset: int, commitlog_offset: int, size: int, tag_hash: int, timestamp_ms: int
    ) -> None:
        """Append one unit at ``offset == max_offset``, its size field last."""
        assert offset == self._max_offset
        file_index, unit_in_file = divmod(offset, self._upf)
        if file_index == self._file_hi:
            unit = np.array([(commitlog_offset, size, tag_hash)], dtype=UNIT)
            self._create_file(file_index, unit_in_file, unit, np.array([timestamp_ms]))
        else:
            units = self._files.units(file_index, for_write=True)
            times = self._files.times(file_index, for_write=True)
            units.ensure_allocated(unit_in_file + 1)
            times.ensure_allocated(unit_in_file + 1)
            times.write_one(unit_in_file, timestamp_ms)
            units.write_one(unit_in_file, commitlog_offset, size, tag_hash)  # size last
        self._max_offset = offset + 1
        self._last_commitlog_offset = commitlog_offset

    def _write_units(self, first: int, batch: UnitBatch) -> None:
        """Append units at ``first == max_offset``, file by file, size fields last."""
        assert first == self._max_offset
        for file_index, unit_in_file, chunk in self._chunks(first, len(batch)):
            end = unit_in_file + chunk.stop - chunk.start
            if file_index == self._file_hi:
                self._create_file(
                    file_index, unit_in_file, batch.units(chunk), batch.timestamps_ms[chunk]
                )
            else:
                units = self._files.units(file_index, for_write=True)
                times = self._files.times(file_index, for_write=True)
                units.ensure_allocated(end)
                times.ensure_allocated(end)
                times.times[unit_in_file:end] = batch.timestamps_ms[chunk]
                times.raise_block_maxima(unit_in_file, end)
                units.commitlog_offsets[unit_in_file:end] = batch.commitlog_offsets[chunk]
                units.tag_hashes[unit_in_file:end] = batch.tag_hashes[chunk]
                units.sizes[unit_in_file:end] = batch.sizes[chunk]  # last: makes them visible
            self._max_offset = first + chunk.stop
            self._last_commitlog_offset = int(batch.commitlog_offsets[chunk.stop - 1])

    def _create_file(
        self, file_index: int, unit_in_file: int, units: np.ndarray, timestamps_ms: np.ndarray
    ) -> None:
        """Create the next file holding its first units (the queue's first file may begin
        anywhere; any later one begins at its unit 0)."""
        assert file_index == self._file_hi
        assert unit_in_file == 0 or self._file_lo == self._file_hi
        self._files.create(file_index, unit_in_file, units, timestamps_ms)
        self._file_hi = file_index + 1

    def _reput_one(
        self, offset: int, commitlog_offset: int, size: int, tag_hash: int, timestamp_ms: int
    ) -> None:
        batch = UnitBatch.of(
            np.array([commitlog_offset]),
            np.array([size]),
            np.array([tag_hash]),
            np.array([timestamp_ms]),
        )
        self._check_reput_range(offset, batch)
        self._reput_range(offset, batch)

    def _check_reput_range(self, first: int, batch: UnitBatch) -> None:
        """Every stored unit of ``[first, first + len)`` must equal the batch's."""
        if first < self._first_offset:
            raise OffsetOutOfRangeError(
                f"{self}: queue offset {first} lies below the queue's first unit "
                f"{self._first_offset} (removed by retention)"
            )
        for file_index, unit_in_file, chunk in self._chunks(first, len(batch)):
            units = self._files.units(file_index)
            stored = units.units[unit_in_file : unit_in_file + chunk.stop - chunk.start]
            if (
                np.array_equal(stored["commitlog_offset"], batch.commitlog_offsets[chunk])
                and np.array_equal(stored["size"], batch.sizes[chunk])
                and np.array_equal(stored["tag_hash"], batch.tag_hashes[chunk])
            ):
                continue  # the re-dispatch after a SIGKILL: every unit in place
            written = stored["size"] != 0
            differs = written & (
                (stored["commitlog_offset"] != batch.commitlog_offsets[chunk])
                | (stored["size"] != batch.sizes[chunk])
                | (stored["tag_hash"] != batch.tag_hashes[chunk])
            )
            if differs.any():
                bad = int(np.argmax(differs))
                raise CorruptDataError(
                    units.path,
                    (unit_in_file + bad) * UNIT_SIZE_BYTES,
                    f"re-put of queue offset {first + chunk.start + bad} with "
                    f"{batch.describe(chunk.start + bad)} conflicts with the stored unit "
                    f"{tuple(int(value) for value in stored[bad].item())}",
                )

    def _reput_range(self, first: int, batch: UnitBatch) -> None:
        """Fill unwritten slots and repair timestamps and block maxima (a page lost in
        a crash) in ``[first, first + len)``; a no-op when everything is in place."""
        interval = self._ctx.config.time_index_interval_units
        for file_index, unit_in_file, chunk in self._chunks(first, len(batch)):
            end = unit_in_file + chunk.stop - chunk.start
            units = self._files.units(file_index)
            times = self._files.times(file_index)
            holes = units.sizes[unit_in_file:end] == 0
            stale = times.times[unit_in_file:end] != batch.timestamps_ms[chunk]
            first_block, maxima = block_maxima(unit_in_file, batch.timestamps_ms[chunk], interval)
            low_maxima = times.block_max[first_block : first_block + len(maxima)] < maxima
            if not (holes.any() or stale.any() or low_maxima.any()):
                continue
            units.dirty = times.dirty = True
            self._time_index = None
            times.times[unit_in_file:end] = batch.timestamps_ms[chunk]
            self._recompute_block_maxima(file_index, unit_in_file, end)
            positions = np.flatnonzero(holes)
            sources = positions + chunk.start
            positions += unit_in_file
            units.commitlog_offsets[positions] = batch.commitlog_offsets[sources]
            units.tag_hashes[positions] = batch.tag_hashes[sources]
            units.sizes[positions] = batch.sizes[sources]

    def _chunks(self, first: int, count: int) -> list[tuple[int, int, slice]]:
        """Split ``[first, first + count)`` by file: (file index, unit in file, slice)."""
        chunks = []
        done = 0
        while done < count:
            file_index, unit_in_file = divmod(first + done, self._upf)
            take = min(count - done, self._upf - unit_in_file)
            chunks.append((file_index, unit_in_file, slice(done, done + take)))
            done += take
        return chunks

    def _recompute_block_maxima(self, file_index: int, start: int, end: int) -> None:
        """Recompute the block maxima of one file around units ``[start, end)``."""
        file_start = file_index * self._upf
        self._files.times(file_index, for_write=True).recompute_block_maxima(
            start,
            end,
            max(self._first_offset - file_start, 0),
            min(self._max_offset - file_start, self._upf),
        )
