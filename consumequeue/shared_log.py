"""The shared unit log of one topic: the units of its young queues, in one file series.

Why (issue 15): a queue with files of its own costs a directory, a unit file and a
time file before its first unit is readable: three metadata operations at 150-580 us
each on this machine (measured), so 100,000 queues spend 45 s creating files for
200,000 units, and a mapping (one descriptor) per hot file. Here every young queue's
units are appended, one 40-byte record each, to one log per topic: one pwrite per
dispatch round, whatever the number of queues. A queue leaves the log ("graduates")
for files of its own once it holds enough units to pay for them; see
mqstore.consumequeue.format for the record layout and the file names.

Invariants:
- Records are appended in dispatch order, so the commitlog offsets of the written
  records (tombstones included: they keep theirs) strictly increase along the log;
  truncating by commitlog position is cutting a suffix.
- A queue's records (its "run") hold consecutive queue offsets
  ``[first_offset, end)``; ``min_offset`` (retention) lies in ``[first_offset, end]``.
- Records ``[0, end)`` of the log are written or tombstones; from ``end`` on, zero.
- Files are contiguous; a file under its real name has its full size; every file
  but the newest is written to its last record.

Memory: per queue a ``SharedRun`` and 8 bytes per unit (the record indexes).

Crash policy: a record is written with one pwrite, after the blocks under it were
reserved (posix_fallocate, so a full disk fails before anything is written). A kill
loses nothing (the page cache keeps it). After a power cut, ``recover_tail`` keeps
the records the checkpoint vouches for: every record whose commitlog offset is below
the checkpoint's dispatched position was synced before the checkpoint was written,
and so was every record before it in the log; the last such record is found walking
back from the end (checked against the CommitLog by ``verify``), and everything after
it is zeroed, so re-dispatch from the checkpoint writes it again.

Threading: callers hold the ConsumeQueue store lock.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import mmap
import os
from collections.abc import Callable
from typing import Final

import numpy as np

from mqstore.commitlog.errors import CorruptDataError
from mqstore.consumequeue.format import (
    FILE_NAME_DIGITS,
    SHARED_RECORD,
    SHARED_RECORD_SIZE_BYTES,
    SHARED_UNIT_VIEW,
    TEMP_SUFFIX,
    TIMESTAMP,
    UNIT,
)
from mqstore.consumequeue.mapped_file import (
    create_file,
    make_directories,
    remove_file,
    reserve,
    sync_paths,
)
from mqstore.consumequeue.shared_ends import read_ends, write_ends
from mqstore.consumequeue.shared_published import PublishedEnd
from mqstore.consumequeue.shared_runs import SharedRun, runs_append, take_records

__all__ = ["RESERVE_CHUNK_BYTES", "SharedRun", "SharedUnitLog", "SharedVerifier"]

log = logging.getLogger(__name__)

#: verify(queue_id, commitlog_offset, size, queue_offset): the CommitLog holds that record.
SharedVerifier = Callable[[int, int, int, int], bool]
RESERVE_CHUNK_BYTES: Final = 1 << 20  # reserved ahead of the end: 26,214 records, one call
_SIZE_AT: Final = 8  # byte position of the size field in a record (tombstones zero it)
assert SHARED_RECORD.fields is not None and SHARED_RECORD.fields["size"][1] == _SIZE_AT
_FILE_NAME_FORMAT: Final = f"%0{FILE_NAME_DIGITS}d"
FOLLOW_CHUNK_RECORDS: Final = 4096  # records a reader's follow() scans per step (160 KiB)
#: follow()'s first step: a follower looks often and finds a few new records, or none
#: (a scan of the whole chunk was 9 µs of it, per look); 2.5 KiB.
FOLLOW_FIRST_RECORDS: Final = 64


class SharedUnitLog:
    """The shared unit log of one topic (``<topic dir>/.shared``). Create with ``open``.

    Attributes:
        directory: the log's directory (made on the first append).
        runs: the run of every queue that has units here, by queue id.
    """

    def __init__(self, directory: str, records_per_file: int, read_only: bool) -> None:
        assert records_per_file >= 1
        self.directory = directory
        self.read_only = read_only
        self.runs: dict[int, SharedRun] = {}
        self._rpf = records_per_file
        self._file_bytes = records_per_file * SHARED_RECORD_SIZE_BYTES
        self._file_lo = self._file_hi = 0  # files [lo, hi) are on disk
        self._records: dict[int, np.ndarray] = {}  # file index -> records, mapped
        self._end = 0  # next record index of the log
        self._reserved_end = 0  # records of the newest file whose blocks are reserved
        self._last_commitlog_offset = -1
        self._fd: int | None = None  # the newest file, for pwrite (writer)
        self._unsynced: set[int] = set()  # files written since the last flush
        self._directories_changed = False
        self._ends: dict[int, int] = {}  # the ``ends`` file: queue id -> next offset
        self._published = PublishedEnd(directory, read_only)  # whole records, for followers

    @classmethod
    def open(
        cls, directory: str, records_per_file: int, *, read_only: bool, lenient: bool = False
    ) -> SharedUnitLog:
        """Open (and load) the log in ``directory``, which need not exist.

        ``lenient``: only find the written end, do not check the order of the records
        (power-cut recovery, which checks what it keeps itself: ``recover_tail``).

        Raises:
            CorruptDataError: a file of the wrong size, a gap between files, records out
                of commitlog order or a written record past the end of the log.
        """
        shared = cls(directory, records_per_file, read_only)
        shared._load(check_order=not lenient)
        return shared

    # ----------------------------------------------------------------- state

    @property
    def end_record(self) -> int:
        """The index of the next record appended."""
        return self._end

    @property
    def last_commitlog_offset(self) -> int:
        """The commitlog offset of the newest record (-1 when the log is empty)."""
        return self._last_commitlog_offset

    @property
    def open_files(self) -> int:
        """Mapped files (each holds one descriptor), plus the writer's own."""
        return len(self._records) + (self._fd is not None)

    def can_append(self, commitlog_offset: int) -> bool:
        """Whether a unit of that commitlog offset keeps the log in commitlog order."""
        return commitlog_offset > self._last_commitlog_offset

    # ----------------------------------------------------------------- writes

    def append(
        self,
        queue_ids: np.ndarray,
        queue_offsets: np.ndarray,
        commitlog_offsets: np.ndarray,
        sizes: np.ndarray,
        tag_hashes: np.ndarray,
        timestamps_ms: np.ndarray,
    ) -> int:
        """Append units (one length, in dispatch order) as long as each one is the
        next of its queue's run and above the previous commitlog offset; stop at the
        first that is not. An empty run (never written, truncated away, or emptied by
        retention) may start at any offset: whether a queue may restart there is the
        ConsumeQueue's rule, not the log's.

        The caller has validated the values (sizes >= 1, offsets >= 0).

        Returns:
            How many units, from the first, were appended.

        Raises:
            DiskFullError, StoreError: nothing of this call was written.
        """
        assert not self.read_only
        total = self._ordered_prefix(commitlog_offsets)
        if total == 0:
            return 0
        # One pass takes each unit while it is the next of its queue's run (after the
        # call's unit before it, which it has appended already) and adds it to the run
        # at once: the runs are set back if the write then fails. (A check per distinct
        # queue before a pass to append cost two per-unit loops: issue 15.)
        first = self._end
        runs = self.runs
        # runs begun here: what they replaced (consumequeue/shared_runs.py)
        ids = np.ascontiguousarray(queue_ids[:total], dtype=np.int32)
        offsets = np.ascontiguousarray(queue_offsets[:total], dtype=np.int64)
        count, started = runs_append(runs, SharedRun, ids, offsets, first, total)
        if count == 0:
            return 0
        try:  # from here on a failure (the write, or building its records) sets back
            records = np.empty(count, dtype=SHARED_RECORD)
            records["commitlog_offset"] = commitlog_offsets[:count]
            records["size"] = sizes[:count]
            records["tag_hash"] = tag_hashes[:count]
            records["queue_id"] = queue_ids[:count]
            records["queue_offset"] = queue_offsets[:count]
            records["timestamp_ms"] = timestamps_ms[:count]
            assert (records["size"] > 0).all()
            self._write_records(first, records)
        except BaseException:
            for queue_id in queue_ids[:count].tolist():
                runs[queue_id].pop()
            for queue_id, replaced in started.items():
                if replaced is None:
                    del runs[queue_id]
                else:
                    runs[queue_id] = replaced
            raise
        self._last_commitlog_offset = int(commitlog_offsets[count - 1])
        return count

    def _ordered_prefix(self, commitlog_offsets: np.ndarray) -> int:
        """How many units, from the first, keep the log in commitlog order (each above
        the log's last commitlog offset and the unit before it)."""
        total = len(commitlog_offsets)
        if total == 0 or int(commitlog_offsets[0]) <= self._last_commitlog_offset:
            return 0
        if total > 1:
            out_of_order = np.flatnonzero(commitlog_offsets[1:] <= commitlog_offsets[:-1])
            if len(out_of_order):
                total = int(out_of_order[0]) + 1
        return total

    def _write_records(self, first: int, records: np.ndarray) -> None:
        """pwrite records from record index ``first``, file by file, blocks reserved first."""
        done = 0
        while done < len(records):
            index = first + done
            file_index, in_file = divmod(index, self._rpf)
            take = min(len(records) - done, self._rpf - in_file)
            if file_index == self._file_hi:
                self._create_file(file_index)
            assert self._fd is not None and file_index == self._file_hi - 1
            end_bytes = (in_file + take) * SHARED_RECORD_SIZE_BYTES
            if in_file + take > self._reserved_end:
                reserved = reserve(
                    self._path(file_index),
                    self._reserved_end * SHARED_RECORD_SIZE_BYTES,
                    end_bytes,
                    self._file_bytes,
                )
                self._reserved_end = -(-reserved // SHARED_RECORD_SIZE_BYTES)
            data = records[done : done + take].tobytes()
            written = os.pwrite(self._fd, data, in_file * SHARED_RECORD_SIZE_BYTES)
            assert written == len(data)
            self._unsynced.add(file_index)
            done += take
            self._end = first + done
            self._published.set(self._end)  # whole now: followers may take them

    def _create_file(self, file_index: int) -> None:
        """Create the next file (full size, sparse) and make it the one written."""
        assert file_index == self._file_hi
        make_directories(self.directory, lambda _: self._note_directories())
        path = self._path(file_index)
        create_file(path, self._file_bytes, [], sync_size=True)  # never short after a cut
        self._note_directories()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        if self._file_lo == self._file_hi:
            self._file_lo = file_index
        self._file_hi = file_index + 1
        self._reserved_end = 0

    def _note_directories(self) -> None:
        self._directories_changed = True

    def truncate_queue(self, queue_id: int, offset: int) -> None:
        """Drop the queue's units at or above ``offset`` (tombstones: sizes zeroed)."""
        assert not self.read_only
        run = self.runs.get(queue_id)
        if run is None or offset >= run.end:
            return
        keep = max(offset - run.first_offset, 0)
        for position in run.positions[keep:]:
            file_index, in_file = divmod(position, self._rpf)
            self._pwrite_at(file_index, in_file * SHARED_RECORD_SIZE_BYTES + _SIZE_AT, bytes(4))
        del run.positions[keep:]
        if keep == 0:  # nothing left: the queue's next offset is ``offset``
            run.first_offset = offset
        run.min_offset = min(run.min_offset, run.end)

    def restart_queue(self, queue_id: int, offset: int) -> None:
        """Forget the queue's records (retention made them all unreadable, or its own
        files take over from scratch): its run is empty and ends at ``offset``. The
        records stay in the log; a reload takes the run after the queue's last break."""
        assert not self.read_only
        run = self.runs.get(queue_id)
        if run is None:
            return
        if run.positions:
            del run.positions[:]
        run.first_offset = run.min_offset = offset

    def truncate_beyond(self, commitlog_end: int) -> int:
        """Drop every record whose commitlog offset is >= ``commitlog_end`` (a suffix).

        Returns:
            The number of units dropped.
        """
        assert not self.read_only
        return self._cut(self._first_record_at_or_above(commitlog_end))

    def _cut(self, cut: int) -> int:
        """Zero records ``[cut, end)`` and delete the files after the one holding ``cut``
        (newest first: a crash leaves a contiguous prefix)."""
        if cut >= self._end:
            return 0
        assert cut >= self._file_lo * self._rpf
        self._published.set(cut)  # before any record goes: followers stop below the cut
        file_index, in_file = divmod(cut, self._rpf)
        dropped = 0
        for index in range(file_index, self._file_hi):
            sizes = self._file_records(index)["size"]
            dropped += int((sizes[in_file if index == file_index else 0 :] != 0).sum())
        # Newest first, so a crash leaves a contiguous prefix; the file holding ``cut``
        # goes too when none of its records stay (the newest file holds the last record).
        oldest_kept = file_index if in_file or file_index == self._file_lo else file_index - 1
        for newer in range(self._file_hi - 1, oldest_kept, -1):
            self._delete_file(newer)
        if oldest_kept < file_index:
            self._end = cut
            self._trim_runs(cut)
            return dropped
        written_end = min(self._end - file_index * self._rpf, self._rpf)
        if written_end > in_file:
            zeros = bytes((written_end - in_file) * SHARED_RECORD_SIZE_BYTES)
            self._pwrite_at(file_index, in_file * SHARED_RECORD_SIZE_BYTES, zeros)
        self._end = cut
        self._trim_runs(cut)
        return dropped

    def _trim_runs(self, cut: int) -> None:
        """Forget the records from ``cut`` on (they were zeroed or deleted)."""
        for run in self.runs.values():
            keep = bisect.bisect_left(run.positions, cut)
            if keep < len(run.positions):
                del run.positions[keep:]
                run.min_offset = min(run.min_offset, run.end)
        self._last_commitlog_offset = self._commitlog_offset_before(cut)

    def records_at(self, commitlog_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The records of the given commitlog offsets (ascending): (record indexes, -1
        where none has that offset; the records, zeros there). Bounded by the log."""
        indexes = np.full(len(commitlog_offsets), -1, dtype=np.int64)
        records = np.zeros(len(commitlog_offsets), dtype=SHARED_RECORD)
        for file_index in range(self._file_lo, self._file_hi):
            file_records = self._file_records(file_index)
            clogs = file_records["commitlog_offset"]
            if not len(clogs):
                continue
            lo = int(np.searchsorted(commitlog_offsets, clogs[0], side="left"))
            hi = int(np.searchsorted(commitlog_offsets, clogs[-1], side="right"))
            at = np.searchsorted(clogs, commitlog_offsets[lo:hi])  # < len(clogs): in range
            found = clogs[at] == commitlog_offsets[lo:hi]
            indexes[lo:hi][found] = at[found] + file_index * self._rpf
            records[lo:hi][found] = file_records[at[found]]
        return indexes, records

    def _file_records(self, file_index: int) -> np.ndarray:
        """The written part of a file's records (a read-only view)."""
        records = self._map(file_index)
        end = min(self._end - file_index * self._rpf, self._rpf)
        return records[: max(end, 0)]

    def _delete_file(self, file_index: int) -> None:
        """Delete the oldest or the newest file, never the only one."""
        assert self._file_hi - self._file_lo >= 2
        assert file_index in (self._file_lo, self._file_hi - 1)
        self._records.pop(file_index, None)
        self._unsynced.discard(file_index)
        if file_index == self._file_lo:
            self._file_lo += 1
        else:
            self._file_hi -= 1
            if self._fd is not None:
                os.close(self._fd)
                self._fd = os.open(self._path(self._file_hi - 1), os.O_RDWR | os.O_CLOEXEC)
            self._reserved_end = self._rpf  # an older file was written, so reserved, whole
        remove_file(self._path(file_index))
        self._note_directories()

    def _pwrite_at(self, file_index: int, position: int, data: bytes) -> None:
        fd = os.open(self._path(file_index), os.O_RDWR | os.O_CLOEXEC)
        try:
            written = os.pwrite(fd, data, position)
            assert written == len(data)
        finally:
            os.close(fd)
        self._unsynced.add(file_index)

    # ----------------------------------------------------------------- reads

    def units(self, queue_id: int, start: int, count: int) -> np.ndarray:
        """The units of offsets ``[start, start + count)`` of the queue's run (a copy).

        Raises:
            CorruptDataError: a record there is not this queue's unit (the log changed
                under a reader, or damage).
        """
        records = self._gather(queue_id, start, count)
        if not len(records):
            return np.empty(0, dtype=UNIT)
        return records.view(SHARED_UNIT_VIEW).astype(UNIT)

    def timestamps(self, queue_id: int, start: int, count: int) -> np.ndarray:
        """The timestamps of the same units (a copy)."""
        return self._gather(queue_id, start, count)["timestamp_ms"].astype(TIMESTAMP)

    def records(self, queue_id: int, start: int, count: int) -> np.ndarray:
        """The records (SHARED_RECORD: unit, queue id and offset, timestamp) of the same
        units (a copy): units and timestamps in one read."""
        return self._gather(queue_id, start, count)

    def point_records(self, queue_id: int, start: int, count: int) -> list[tuple[int, ...]]:
        """As ``records``, for the few units of a point read (a time probe): Python
        tuples of SHARED_RECORD's fields, checked one by one (no numpy temporaries)."""
        run = self.runs[queue_id]
        assert run.first_offset <= start and start + count <= run.end
        rows = []
        for offset in range(start, start + count):
            file_index, index = divmod(run.positions[offset - run.first_offset], self._rpf)
            row = self._map(file_index)[index].item()
            _, size, _, record_queue_id, record_offset, _ = row  # SHARED_RECORD's fields
            if record_offset != offset or size <= 0 or record_queue_id != queue_id:
                raise CorruptDataError(self._path(file_index), index * SHARED_RECORD_SIZE_BYTES,
                                       f"shared record of queue {queue_id} offset {offset} is "
                                       "not that unit")  # fmt: skip
            rows.append(row)
        return rows

    def _gather(self, queue_id: int, start: int, count: int) -> np.ndarray:
        run = self.runs[queue_id]
        assert run.first_offset <= start and start + count <= run.end
        positions = np.frombuffer(run.positions, dtype=np.int64)[
            start - run.first_offset : start - run.first_offset + count
        ]
        if count == 0:
            return np.empty(0, dtype=SHARED_RECORD)
        file_first = int(positions[0]) // self._rpf
        file_last = int(positions[-1]) // self._rpf
        if file_first == file_last:
            records = self._map(file_first)[positions - file_first * self._rpf]
        else:  # one fancy index per file: positions only grow (a queue's units in order)
            records = np.empty(count, dtype=SHARED_RECORD)
            files = positions // self._rpf
            cuts = [0, *(np.flatnonzero(files[1:] != files[:-1]) + 1).tolist(), count]
            for begin, stop in itertools.pairwise(cuts):
                file_index = int(files[begin])
                records[begin:stop] = self._map(file_index)[
                    positions[begin:stop] - file_index * self._rpf
                ]
        expected = np.arange(start, start + count)
        if not ((records["queue_offset"] == expected).all() and (records["size"] > 0).all()
                and (records["queue_id"] == queue_id).all()):  # fmt: skip
            bad = int(np.argmax(records["queue_offset"] != expected))
            raise CorruptDataError(
                self._path(int(positions[bad]) // self._rpf),
                int(positions[bad]) % self._rpf * SHARED_RECORD_SIZE_BYTES,
                f"shared record of queue {queue_id} offset {start + bad} is not that unit",
            )
        return records

    def _map(self, file_index: int) -> np.ndarray:
        records = self._records.get(file_index)
        if records is None:
            path = self._path(file_index)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise CorruptDataError(path, 0, "shared unit file is missing") from None
            try:
                actual = os.fstat(fd).st_size
                if actual != self._file_bytes:
                    raise CorruptDataError(
                        path, actual, f"file is {actual} bytes, expected {self._file_bytes}"
                    )
                mapping = mmap.mmap(fd, self._file_bytes, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            records = np.frombuffer(mapping, dtype=SHARED_RECORD)
            self._records[file_index] = records
        return records

    # ----------------------------------------------------------------- load

    def _load(self, *, check_order: bool) -> None:
        indexes = self._list()
        self.runs = {}
        self._records.clear()
        self._ends = read_ends(self.directory)
        if not indexes:
            self._file_lo = self._file_hi = self._end = 0
            self._last_commitlog_offset = -1
            self._seed_ends()
            if not self.read_only and os.path.isdir(self.directory):
                self._published.set(0)
            return
        self._file_lo, self._file_hi = indexes[0], indexes[-1] + 1
        newest = self._file_hi - 1
        self._end = newest * self._rpf + self._written_end(newest)
        if not self.read_only:
            self._fd = os.open(self._path(newest), os.O_RDWR | os.O_CLOEXEC)
            self._reserved_end = self._end - newest * self._rpf
            self._published.set(self._end)
        else:  # not past what the writer published: a record past it may be half written
            published = self._published.get()
            if published is not None:
                self._end = min(self._end, max(published, self._file_lo * self._rpf))
        self._build_runs(check_order)

    def _list(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        indexes = []
        for name in names:
            if name.endswith(TEMP_SUFFIX):
                if not self.read_only:
                    remove_file(os.path.join(self.directory, name))
                continue
            if len(name) != FILE_NAME_DIGITS or not name.isdigit():
                continue
            position = int(name)
            if position % self._file_bytes:
                raise CorruptDataError(
                    os.path.join(self.directory, name), 0,
                    f"name is not a multiple of the shared file size {self._file_bytes}",
                )  # fmt: skip
            indexes.append(position // self._file_bytes)
        indexes.sort()
        for before, after in itertools.pairwise(indexes):
            if after != before + 1:
                raise CorruptDataError(self._path(before + 1), 0, "shared unit file missing")
        return indexes

    def _written_end(self, file_index: int) -> int:
        """Records of the newest file up to its last written one: every write was
        reserved first, so only the allocated blocks are read (a sparse file)."""
        records = self._map(file_index)
        allocated = os.stat(self._path(file_index)).st_blocks * 512
        stop = min(len(records), -(-allocated // SHARED_RECORD_SIZE_BYTES))
        # A tombstone keeps its commitlog offset: the end is past the last of either.
        used = (records["size"][:stop] != 0) | (records["commitlog_offset"][:stop] != 0)
        written = np.flatnonzero(used)
        return int(written[-1]) + 1 if len(written) else 0

    def _build_runs(self, check_order: bool) -> None:
        """Every queue's run from the records (vectorized but for one step per queue)."""
        parts = [(i, self._file_records(i)) for i in range(self._file_lo, self._file_hi)]
        clogs = np.concatenate([records["commitlog_offset"] for _, records in parts])
        sizes = np.concatenate([records["size"] for _, records in parts])
        if check_order and len(clogs) > 1 and not (np.diff(clogs) > 0).all():
            bad = int(np.argmax(np.diff(clogs) <= 0)) + 1
            raise self._corrupt(self._file_lo * self._rpf + bad, "commitlog offsets out of order")
        self._last_commitlog_offset = int(clogs[-1]) if len(clogs) else -1
        written = np.flatnonzero(sizes != 0)
        if not len(written):
            self._seed_ends()
            return
        queue_ids = np.concatenate([records["queue_id"] for _, records in parts])[written]
        queue_offsets = np.concatenate([records["queue_offset"] for _, records in parts])[written]
        positions = written + self._file_lo * self._rpf
        order = np.argsort(queue_ids, kind="stable")  # per queue, in log order
        queue_ids, queue_offsets, positions = (
            queue_ids[order],
            queue_offsets[order],
            positions[order],
        )
        starts = np.flatnonzero(np.diff(queue_ids, prepend=-1) != 0)
        bounds = np.append(starts, len(queue_ids))
        # A break in a queue's offsets: the queue restarted higher (retention, see
        # ConsumeQueue._restarts_at); its run is what follows the last break.
        breaks = np.flatnonzero(
            (np.diff(queue_offsets, prepend=-2) != 1) | (np.diff(queue_ids, prepend=-1) != 0)
        )
        lows, highs = bounds[:-1], bounds[1:]
        firsts = np.maximum(breaks[np.searchsorted(breaks, highs, side="left") - 1], lows)
        raw = positions.astype(np.int64).tobytes()  # every run's record indexes, sliced
        of_bytes, runs = SharedRun.of_bytes, self.runs
        for queue_id, first_offset, first, high in zip(
            queue_ids[lows].tolist(), queue_offsets[firsts].tolist(), (firsts * 8).tolist(),
            (highs * 8).tolist(), strict=True,
        ):  # fmt: skip
            runs[queue_id] = of_bytes(first_offset, raw[first:high])
        self._seed_ends()

    def _seed_ends(self) -> None:
        """Queues the ``ends`` file remembers and the log holds nothing of: an empty
        run at their next offset."""
        for queue_id, next_offset in self._ends.items():
            if queue_id not in self.runs:
                self.runs[queue_id] = SharedRun(next_offset)

    def _first_record_at_or_above(self, commitlog_offset: int) -> int:
        for file_index in range(self._file_lo, self._file_hi):
            clogs = self._file_records(file_index)["commitlog_offset"]
            if len(clogs) and clogs[-1] >= commitlog_offset:
                return file_index * self._rpf + int(np.searchsorted(clogs, commitlog_offset))
        return self._end

    def _commitlog_offset_before(self, record: int) -> int:
        if record <= self._file_lo * self._rpf:
            return -1
        return self.commitlog_offset_of(record - 1)

    def commitlog_offset_of(self, record: int) -> int:
        """The commitlog offset of written record ``record`` (not checked: a run's)."""
        file_index, in_file = divmod(record, self._rpf)
        return int(self._map(file_index)["commitlog_offset"][in_file])

    def _corrupt(self, record: int, reason: str) -> CorruptDataError:
        file_index, in_file = divmod(record, self._rpf)
        return CorruptDataError(
            self._path(file_index), in_file * SHARED_RECORD_SIZE_BYTES, f"record {record}: {reason}"
        )

    # ----------------------------------------------------------------- recovery

    def recover_tail(self, claim: int, commitlog_min: int, verify: SharedVerifier) -> int:
        """After a power cut (the log opened ``lenient``): keep the records up to the
        last one the checkpoint vouches for, zero the rest (see the module docstring).

        The last kept record is the newest written one whose commitlog offset is below
        ``claim`` and that ``verify`` confirms; one below ``commitlog_min`` (retention
        deleted its record) is taken when it is in order with the record before it.

        Returns:
            The number of units dropped (re-dispatch from ``claim`` writes them again).

        Raises:
            CorruptDataError: the kept records are out of commitlog order.
        """
        assert not self.read_only
        keep = self._intact_end(claim, commitlog_min, verify)
        dropped = self._cut(keep)
        self._build_runs(check_order=True)
        return dropped

    def _intact_end(self, claim: int, commitlog_min: int, verify: SharedVerifier) -> int:
        for file_index in range(self._file_hi - 1, self._file_lo - 1, -1):
            records = self._file_records(file_index)
            candidates = np.flatnonzero(
                (records["size"] > 0)
                & (records["commitlog_offset"] >= 0)
                & (records["commitlog_offset"] < claim)
            )
            for in_file in candidates[::-1].tolist():
                record = records[in_file]
                position = int(record["commitlog_offset"])
                if position >= commitlog_min:
                    if verify(int(record["queue_id"]), position, int(record["size"]),
                              int(record["queue_offset"])):  # fmt: skip
                        return file_index * self._rpf + in_file + 1
                elif in_file == 0 or int(records["commitlog_offset"][in_file - 1]) < position:
                    return file_index * self._rpf + in_file + 1
        return self._file_lo * self._rpf

    # ----------------------------------------------------------------- retention

    def correct_min_offset(self, queue_id: int, commitlog_min: int) -> None:
        """Raise one run's min_offset past its units below ``commitlog_min`` (a
        reader following the writer's retention; nothing is deleted)."""
        run = self.runs.get(queue_id)
        if run is None or not run.positions:
            return
        first_kept = self._first_record_at_or_above(commitlog_min)
        below = bisect.bisect_left(run.positions, first_kept)
        run.min_offset = max(run.min_offset, run.first_offset + below)

    def correct_min_offsets(self, commitlog_min: int) -> None:
        """Raise every run's min_offset past its units below ``commitlog_min``; delete
        the files wholly below it (never the newest). Read-only: min offsets only."""
        first_kept = self._first_record_at_or_above(commitlog_min)
        for run in self.runs.values():
            below = bisect.bisect_left(run.positions, first_kept)
            run.min_offset = max(run.min_offset, run.first_offset + below)
        if self.read_only:
            return
        floor_file = self._file_lo
        while floor_file < self._file_hi - 1 and (floor_file + 1) * self._rpf <= first_kept:
            floor_file += 1
        if floor_file > self._file_lo:
            self._remember_ends(floor_file * self._rpf)
        while self._file_lo < floor_file:
            self._delete_file(self._file_lo)
        floor = self._file_lo * self._rpf
        for run in self.runs.values():
            gone = bisect.bisect_left(run.positions, floor)
            if gone:
                del run.positions[:gone]
                run.first_offset += gone

    # ----------------------------------------------------------------- durability

    def flush(self) -> None:
        """fdatasync the files written since the last flush, then the directories.

        Raises:
            DiskFullError, StoreError: a sync failed.
        """
        sync_paths(*self.take_unsynced())

    def take_unsynced(self) -> tuple[list[str], list[str]]:
        """The files written and the directories changed since the last call (the
        caller syncs them, ``sync_paths``: outside the store lock, so that dispatch
        and reads do not wait for the disk; a file deleted meanwhile needs none)."""
        files = [self._path(index) for index in sorted(self._unsynced)
                 if self._file_lo <= index < self._file_hi]  # fmt: skip
        self._unsynced.clear()
        directories: list[str] = []
        if self._directories_changed:
            self._directories_changed = False
            topic_directory = os.path.dirname(self.directory)
            directories = [self.directory, topic_directory, os.path.dirname(topic_directory)]
        return files, directories

    def close(self) -> None:
        """Drop the mappings and the writer's descriptor (flush first)."""
        self._records.clear()
        self._published.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def refresh(self) -> None:
        """Read-only: see what the writer appended, truncated or deleted since."""
        assert self.read_only
        self._load(check_order=False)

    def follow(self) -> None:
        """Read-only: take in the records the writer appended since the last look
        (one record read when there are none); reload wholly when the writer cut the
        log under us (its last record we know changed)."""
        assert self.read_only
        if self._end > 0 and not self._last_record_intact():
            self.refresh()
            return
        chunk = FOLLOW_FIRST_RECORDS
        published = self._published.get()  # first: no record at or past it is whole
        while True:
            if published is not None:
                if self._end >= published:
                    return
                chunk = min(chunk, published - self._end)
            file_index, in_file = divmod(self._end, self._rpf)
            if file_index >= self._file_hi:
                if not os.path.exists(self._path(file_index)):
                    return
                if self._file_lo == self._file_hi:
                    self._file_lo = file_index
                self._file_hi = file_index + 1
            records = self._map(file_index)[in_file : in_file + chunk]
            chunk = FOLLOW_CHUNK_RECORDS
            used = (records["size"] != 0) | (records["commitlog_offset"] != 0)
            taken = len(records) if used.all() else int(np.argmin(used))
            if taken == 0:
                return
            take_records(self.runs, records[:taken], self._end)
            self._end += taken
            self._last_commitlog_offset = int(records["commitlog_offset"][taken - 1])
            if taken < len(records):
                return

    def _last_record_intact(self) -> bool:
        file_index, in_file = divmod(self._end - 1, self._rpf)
        if not self._file_lo <= file_index < self._file_hi:
            return False
        try:
            record = self._map(file_index)[in_file]
        except CorruptDataError:  # the file is gone
            return False
        return int(record["commitlog_offset"]) == self._last_commitlog_offset

    def _remember_ends(self, floor: int) -> None:
        """Before records below ``floor`` are deleted: remember the next offset of
        every queue that keeps none, durably (the file replaced atomically)."""
        ends = {
            queue_id: next_offset
            for queue_id, next_offset in self._ends.items()
            if not self.runs.get(queue_id, SharedRun(0)).positions
            or self.runs[queue_id].positions[-1] < floor
        }
        for queue_id, run in self.runs.items():
            if run.positions and run.positions[-1] < floor:
                ends[queue_id] = run.end
        if ends == self._ends:
            return
        write_ends(self.directory, ends)
        self._ends = ends

    def _path(self, file_index: int) -> str:
        return os.path.join(self.directory, _FILE_NAME_FORMAT % (file_index * self._file_bytes))
