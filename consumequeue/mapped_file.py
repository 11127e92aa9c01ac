"""One ConsumeQueue file (a unit file or its time file), memory-mapped shared.

A mapped file is only a window: numpy arrays over an ``mmap`` of the whole file. It
owns no file descriptor of its own; Python's mmap keeps a duplicate, so each mapping
holds exactly one descriptor until the last array over it is dropped. Nothing here ever
calls ``mmap.close()``: a reader may hold a zero-copy view (from ``get_range``), and
numpy keeps the mapping alive through that view's base, so dropping our references is
the only safe way to let a mapping go.

Creation (``create``): the file is allocated at its full size with ``posix_fallocate``
(a full disk shows up as ENOSPC here, never as SIGBUS on a later write through a
mapping) and given its header and its first units with pwrite; a unit file is built
under a temporary name and renamed into place (a time file is only read once its unit
file exists, so it is built in place). It is never pre-zeroed with write(), and it is not mapped:
with 100,000 queues most files are written once or twice, and a mapping (mmap, page
faults, munmap, a descriptor) would cost more than the write. Later writes map it.

Crash policy: a file under its real name always has its full size, its header and its
first units; opening checks size and header and raises CorruptDataError otherwise.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import operator
import os
import struct
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np

from mqstore.commitlog.errors import CorruptDataError, DiskFullError, StoreError
from mqstore.consumequeue.format import (
    TEMP_SUFFIX,
    TIME_HEADER,
    TIMESTAMP,
    UNIT,
    block_max_position_bytes,
    blocks_per_file,
    check_time_header,
    encode_time_header,
    time_file_size_bytes,
    times_position_bytes,
    unit_file_size_bytes,
)

__all__ = [
    "MappedUnitFile",
    "MappedTimeFile",
    "block_maxima",
    "create_file",
    "make_directories",
    "remove_file",
    "sync_filesystem",
    "sync_path",
    "sync_paths",
]

FILE_MODE: Final = 0o644
PAGE_SIZE_BYTES: Final = 4096  # writes of a new file closer than this are merged into one
#: ``followed_end`` reads this many units past a follower's end in one slice (1.3 KiB).
#: A dispatch round at 50,000 msg/s adds a few dozen units to a queue; a follower that
#: fell further behind takes ``written_end``'s binary search instead.
FOLLOW_WINDOW_UNITS: Final = 64

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


class MappedUnitFile:
    """A mapped unit file: ``units`` and a view per field over the same bytes.

    Attributes:
        path: the file's path.
        units: structured UNIT array over the whole file.
        commitlog_offsets, sizes, tag_hashes: field views of ``units``.
        dirty: written through since the last flush (set by the writer before writing).
    """

    __slots__ = (
        "__weakref__",  # a TimeIndex remembers the files it reads (time_index.py)
        "_mapping",
        "allocated_bytes",
        "commitlog_offsets",
        "dirty",
        "path",
        "sizes",
        "tag_hashes",
        "units",
    )

    def __init__(self, path: str, mapping: mmap.mmap) -> None:
        self.path = path
        self.allocated_bytes = 0  # blocks known reserved from byte 0 (see ensure_allocated)
        self._mapping = mapping
        self.units = np.frombuffer(mapping, dtype=UNIT)
        self.commitlog_offsets = self.units["commitlog_offset"]
        self.sizes = self.units["size"]
        self.tag_hashes = self.units["tag_hash"]
        self.dirty = False

    def write_one(self, index: int, commitlog_offset: int, size: int, tag_hash: int) -> None:
        """Write unit ``index`` with struct on the mapping (a numpy item assignment per
        field costs several times more on the one-unit path); size last: it makes the
        unit visible."""
        mapping = self._mapping
        position = index * UNIT.itemsize
        _INT64.pack_into(mapping, position + _COMMITLOG_OFFSET_AT, commitlog_offset)
        _INT64.pack_into(mapping, position + _TAG_HASH_AT, tag_hash)
        _INT32.pack_into(mapping, position + _SIZE_AT, size)

    def ensure_allocated(self, end_unit: int) -> None:
        """Reserve disk blocks for units ``[0, end_unit)`` before writing them through
        the mapping (a write to an unreserved page of a full disk raises SIGBUS)."""
        self.allocated_bytes = reserve(
            self.path, self.allocated_bytes, end_unit * UNIT.itemsize, self.units.nbytes
        )

    @classmethod
    def open(cls, path: str, units_per_file: int, read_only: bool) -> MappedUnitFile:
        """Map an existing unit file.

        Raises:
            FileNotFoundError: the file is gone (the caller decides what that means).
            CorruptDataError: the file does not have its full size.
        """
        return cls(path, _map_existing(path, unit_file_size_bytes(units_per_file), read_only))

    @staticmethod
    def create(path: str, units_per_file: int, start: int, units: np.ndarray) -> None:
        """Create a unit file holding ``units`` from unit ``start`` (the rest unwritten)."""
        assert units.dtype == UNIT
        assert start >= 0 and start + len(units) <= units_per_file
        writes = [(start * UNIT.itemsize, units.tobytes())]
        create_file(path, unit_file_size_bytes(units_per_file), writes)

    def written_end(
        self, start: int, floor_commitlog_offset: int, *, check_order: bool = True
    ) -> int:
        """Binary search for the end of the written run of units that begins at ``start``.

        Units ``[start, end)`` are written and unit ``end`` is not (or ``end`` is the file's
        unit count). Every probe is checked: a negative size, or commitlog offsets that do
        not increase from probe to probe (starting above ``floor_commitlog_offset``), mean
        the file is corrupt. O(log units_per_file) probes.

        ``check_order=False`` (recovery after a power cut, which checks each unit it
        keeps against the CommitLog itself) only finds where the sizes end.

        Raises:
            CorruptDataError: naming the file and the byte position of the bad unit.
        """
        low, high = start, len(self.units)
        assert 0 <= low <= high
        previous = floor_commitlog_offset
        while low < high:
            middle = (low + high) // 2
            size = int(self.sizes[middle])
            if size == 0:
                high = middle
                continue
            commitlog_offset = int(self.commitlog_offsets[middle])
            if check_order and (size < 0 or commitlog_offset <= previous):
                raise CorruptDataError(
                    self.path,
                    middle * UNIT.itemsize,
                    f"unit (commitlog_offset={commitlog_offset}, size={size}) breaks the order "
                    f"of the queue (previous commitlog_offset {previous})",
                )
            previous = commitlog_offset
            low = middle + 1
        if low > start and check_order:
            self._check_run_ends(start, low - 1)
        return low

    def followed_end(self, start: int, floor_commitlog_offset: int) -> int:
        """``written_end`` for a read-only follower, which expects a few new units past
        ``start``: the sizes of up to FOLLOW_WINDOW_UNITS units in one slice, the end at
        the first unwritten one, and every unit of the run checked (written, its
        commitlog offset above the one before, the first above
        ``floor_commitlog_offset``). One numpy call where the search makes two per
        probe (about 20 probes in a 300,000-unit file). A run that fills the window, or
        reaches the file's end, takes ``written_end``.

        The writer makes a unit visible by its size, written last with release order,
        in queue order (``write_units``): the first zero size is the end it published.

        Raises:
            CorruptDataError: naming the file and the byte position of the bad unit.
        """
        stop = start + FOLLOW_WINDOW_UNITS
        if stop >= len(self.units):
            return self.written_end(start, floor_commitlog_offset)
        sizes = self.sizes[start:stop].tolist()
        try:
            count = sizes.index(0)
        except ValueError:
            return self.written_end(start, floor_commitlog_offset)
        if count == 0:
            return start
        offsets = self.commitlog_offsets[start : start + count].tolist()
        if (
            min(sizes[:count]) < 0
            or offsets[0] <= floor_commitlog_offset
            or not all(map(operator.lt, offsets, offsets[1:]))
        ):
            self._raise_disorder(start, sizes[:count], offsets, floor_commitlog_offset)
        return start + count

    def _raise_disorder(
        self, start: int, sizes: list[int], offsets: list[int], floor_commitlog_offset: int
    ) -> None:
        """CorruptDataError at the first of units ``start``... (``sizes``, ``offsets``)
        that is negative or not above the one before."""
        previous = floor_commitlog_offset
        for index, (size, commitlog_offset) in enumerate(zip(sizes, offsets, strict=True)):
            if size < 0 or commitlog_offset <= previous:
                raise CorruptDataError(
                    self.path,
                    (start + index) * UNIT.itemsize,
                    f"unit (commitlog_offset={commitlog_offset}, size={size}) breaks the order "
                    f"of the queue (previous commitlog_offset {previous})",
                )
            previous = commitlog_offset
        raise AssertionError("no unit out of order")

    def _check_run_ends(self, first: int, last: int) -> None:
        """The run's first unit must be written and below its last (the search may not
        have probed either)."""
        first_offset = int(self.commitlog_offsets[first])
        last_offset = int(self.commitlog_offsets[last])
        if self.sizes[first] <= 0 or (first < last and first_offset >= last_offset):
            raise CorruptDataError(
                self.path,
                first * UNIT.itemsize,
                f"unit {first} (commitlog_offset={first_offset}, size={int(self.sizes[first])}) "
                f"does not start the run that ends at unit {last} (commitlog_offset="
                f"{last_offset})",
            )


class MappedTimeFile:
    """A mapped time file: its header, per-unit timestamps and per-block maxima.

    Attributes:
        path: the file's path.
        first_unit_in_file: from the header (non-zero only in a queue's first file).
        times: int64 timestamp (ms) per unit.
        block_max: int64 largest timestamp of the written units of each block.
        interval_units: N, units per block.
        dirty: written through since the last flush.
    """

    __slots__ = (
        "__weakref__",  # a TimeIndex remembers the files it reads (time_index.py)
        "_block_max_position",
        "_mapping",
        "allocated_bytes",
        "block_max",
        "dirty",
        "first_unit_in_file",
        "interval_units",
        "path",
        "times",
    )

    def __init__(self, path: str, mapping: mmap.mmap, units_per_file: int, interval: int) -> None:
        self.path = path
        self.allocated_bytes = 0  # blocks known reserved from byte 0 (see ensure_allocated)
        self.interval_units = interval
        self._mapping = mapping
        self._block_max_position = block_max_position_bytes(units_per_file)
        header = np.frombuffer(mapping, dtype=TIME_HEADER, count=1)
        self.first_unit_in_file = check_time_header(path, header, units_per_file, interval)
        self.times = np.frombuffer(
            mapping, dtype=TIMESTAMP, count=units_per_file, offset=times_position_bytes()
        )
        self.block_max = np.frombuffer(
            mapping,
            dtype=TIMESTAMP,
            count=blocks_per_file(units_per_file, interval),
            offset=block_max_position_bytes(units_per_file),
        )
        self.dirty = False

    @classmethod
    def open(cls, path: str, units_per_file: int, interval: int, read_only: bool) -> MappedTimeFile:
        """Map an existing time file and check its header.

        Raises:
            FileNotFoundError: the file is gone.
            CorruptDataError: wrong size or a header that does not match the config.
        """
        size = time_file_size_bytes(units_per_file, interval)
        return cls(path, _map_existing(path, size, read_only), units_per_file, interval)

    @staticmethod
    def create(
        path: str,
        units_per_file: int,
        interval: int,
        first_unit_in_file: int,
        start: int,
        timestamps_ms: np.ndarray,
    ) -> None:
        """Create a time file: its header, ``timestamps_ms`` from unit ``start`` and the
        maxima of the blocks they touch."""
        assert start >= 0 and start + len(timestamps_ms) <= units_per_file
        stamps = np.ascontiguousarray(timestamps_ms, dtype=TIMESTAMP)
        first_block, maxima = block_maxima(start, stamps, interval)
        writes = [
            (0, encode_time_header(units_per_file, interval, first_unit_in_file)),
            (times_position_bytes() + start * TIMESTAMP.itemsize, stamps.tobytes()),
            (
                block_max_position_bytes(units_per_file) + first_block * TIMESTAMP.itemsize,
                maxima.astype(TIMESTAMP).tobytes(),
            ),
        ]
        block_region = (
            block_max_position_bytes(units_per_file),
            time_file_size_bytes(units_per_file, interval)
            - block_max_position_bytes(units_per_file),
        )
        # In place: nobody opens a time file before its unit file exists.
        create_file(
            path,
            time_file_size_bytes(units_per_file, interval),
            writes,
            in_place=True,
            reserved=[block_region],
        )

    def write_one(self, index: int, timestamp_ms: int) -> None:
        """Write unit ``index``'s timestamp and raise its block maximum (struct, as
        MappedUnitFile.write_one)."""
        mapping = self._mapping
        _INT64.pack_into(mapping, times_position_bytes() + index * TIMESTAMP.itemsize, timestamp_ms)
        block_position = self._block_max_position + (index // self.interval_units) * 8
        (current,) = _INT64.unpack_from(mapping, block_position)
        if current < timestamp_ms:
            _INT64.pack_into(mapping, block_position, timestamp_ms)

    def ensure_allocated(self, end_unit: int) -> None:
        """Reserve disk blocks for the timestamps of units ``[0, end_unit)`` before
        writing them through the mapping (the header and block maxima are reserved
        when the file is created)."""
        end = times_position_bytes() + end_unit * TIMESTAMP.itemsize
        limit = times_position_bytes() + self.times.nbytes
        self.allocated_bytes = reserve(self.path, self.allocated_bytes, end, limit)

    def raise_block_maxima(self, start: int, end: int) -> None:
        """Raise the maxima of the blocks of units ``[start, end)`` to cover their
        (already written) timestamps. Vectorized: one reduceat over the range."""
        assert 0 <= start < end <= len(self.times)
        first_block, maxima = block_maxima(start, self.times[start:end], self.interval_units)
        stored = self.block_max[first_block : first_block + len(maxima)]
        np.maximum(stored, maxima, out=stored)

    def recompute_block_maxima(
        self, start: int, end: int, written_start: int, written_end: int
    ) -> None:
        """Recompute the maxima of the blocks overlapping units ``[start, end)`` from the
        timestamps of the written units ``[written_start, written_end)`` (0 for a block
        with none). Reads at most ``end - start + 2N`` timestamps."""
        assert 0 <= start < end <= len(self.times)
        interval = self.interval_units
        for block in range(start // interval, (end - 1) // interval + 1):
            low = max(block * interval, written_start)
            high = min((block + 1) * interval, written_end)
            self.block_max[block] = int(self.times[low:high].max()) if high > low else 0


def _map_existing(path: str, size_bytes: int, read_only: bool) -> mmap.mmap:
    try:
        fd = os.open(path, (os.O_RDONLY if read_only else os.O_RDWR) | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise _wrap_os_error(error, f"open {path}") from error
    try:
        actual = os.fstat(fd).st_size
        if actual != size_bytes:
            raise CorruptDataError(path, actual, f"file is {actual} bytes, expected {size_bytes}")
        access = mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
        mapping = mmap.mmap(fd, size_bytes, access=access)
        if not read_only:
            # The writer's mappings skip readahead: a queue file is sparse and grows a
            # page at a time, and a fault on its next page (an unwritten extent) would
            # zero-fill a whole readahead window, measured here at ~2 ms a fault (512
            # queues: 512 such faults and 1 s of system time in a 3 s window). Readers
            # in other processes keep readahead for their sequential reads.
            mapping.madvise(mmap.MADV_RANDOM)
        return mapping
    except OSError as error:
        raise _wrap_os_error(error, f"map {path}") from error
    finally:
        os.close(fd)  # the mapping holds its own duplicate


def block_maxima(start: int, timestamps_ms: np.ndarray, interval: int) -> tuple[int, np.ndarray]:
    """The maxima, per block of ``interval`` units, of timestamps of units ``start ..``.

    Returns:
        The first block touched, and one maximum per block touched (one reduceat).
    """
    assert len(timestamps_ms) > 0
    first_block = start // interval
    if len(timestamps_ms) == 1:  # the common single put: skip the reduceat set-up
        return first_block, np.asarray(timestamps_ms, dtype=TIMESTAMP)
    last_block = (start + len(timestamps_ms) - 1) // interval
    boundaries = np.arange(first_block + 1, last_block + 1) * interval - start
    maxima = np.maximum.reduceat(timestamps_ms, np.concatenate(([0], boundaries)))
    assert len(maxima) == last_block - first_block + 1
    return first_block, maxima


def create_file(
    path: str,
    size_bytes: int,
    writes: list[tuple[int, bytes]],
    *,
    in_place: bool = False,
    reserved: Sequence[tuple[int, int]] = (),
    sync_size: bool = False,
) -> None:
    """Build ``path`` at ``size_bytes`` with ``writes`` (position, bytes) done by pwrite.

    Normally the file is built under a temporary name and renamed into place, so that
    nobody ever sees it short. ``in_place`` builds it under its own name (one rename
    less) for a file nobody reads before another file appears: a time file, read only
    once its unit file exists. A stale file of that name is removed first, never
    truncated (a reader may still map the old one). Writes less than a page apart are
    merged into one pwrite (the gap is written as the zeros it already holds: the page
    is written back whole either way). ``sync_size``: fsync the file before the rename,
    so that its name never becomes durable (by any later fsync of the directory)
    without its size: a power cut then cannot leave it short under its final name.

    Raises:
        DiskFullError: no room to allocate the file.
        StoreError: any other failure to create it.
    """
    assert all(position + len(data) <= size_bytes for position, data in writes)
    build_path = path if in_place else path + TEMP_SUFFIX
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if in_place else os.O_TRUNC)
    try:
        try:
            fd = os.open(build_path, flags, FILE_MODE)
        except FileExistsError:
            remove_file(build_path)  # a stale file (crash leftover): never truncate it
            fd = os.open(build_path, flags, FILE_MODE)
    except OSError as error:
        raise _wrap_os_error(error, f"create {build_path}") from error
    try:
        # Sparse: a queue's blocks are reserved as it grows (ensure_allocated), so an
        # idle queue costs a page, not units_per_file * 20 bytes (6 MB by default).
        os.ftruncate(fd, size_bytes)
        for position, length in reserved:
            os.posix_fallocate(fd, position, length)
        for position, data in _merge_writes(writes):
            written = os.pwrite(fd, data, position)
            assert written == len(data)
        if sync_size:
            os.fsync(fd)
        if not in_place:
            os.rename(build_path, path)
    except OSError as error:
        _unlink_quietly(build_path)
        raise _wrap_os_error(error, f"allocate {size_bytes} bytes for {path}") from error
    finally:
        os.close(fd)


_INT64: Final = struct.Struct("<q")
_INT32: Final = struct.Struct("<i")
assert UNIT.fields is not None
_COMMITLOG_OFFSET_AT: Final = UNIT.fields["commitlog_offset"][1]  # byte positions in a unit
_SIZE_AT: Final = UNIT.fields["size"][1]
_TAG_HASH_AT: Final = UNIT.fields["tag_hash"][1]
assert (_COMMITLOG_OFFSET_AT, _SIZE_AT, _TAG_HASH_AT) == (0, 8, 12)
RESERVE_CHUNK_BYTES: Final = 16 * 1024  # blocks reserved ahead of a growing queue


def reserve(path: str, reserved_bytes: int, needed_bytes: int, limit_bytes: int) -> int:
    """Reserve blocks of ``path`` up to ``needed_bytes`` (rounded up to a chunk, at most
    ``limit_bytes``) with posix_fallocate, so writes through a mapping never fault on
    a full disk; returns the new reserved end. A no-op when already reserved.

    Raises:
        DiskFullError: no room (nothing was written).
    """
    if needed_bytes <= reserved_bytes:
        return reserved_bytes
    end = min(limit_bytes, -(-needed_bytes // RESERVE_CHUNK_BYTES) * RESERVE_CHUNK_BYTES)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as error:
        raise _wrap_os_error(error, f"open {path}") from error
    try:
        os.posix_fallocate(fd, reserved_bytes, end - reserved_bytes)
    except OSError as error:
        raise _wrap_os_error(error, f"reserve {end - reserved_bytes} bytes of {path}") from error
    finally:
        os.close(fd)
    return end


def _merge_writes(writes: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    merged: list[tuple[int, bytes]] = []
    for position, data in sorted(writes):
        if merged:
            last_position, last_data = merged[-1]
            gap = position - (last_position + len(last_data))
            assert gap >= 0  # writes never overlap
            if gap < PAGE_SIZE_BYTES:
                merged[-1] = (last_position, last_data + bytes(gap) + data)
                continue
        merged.append((position, data))
    return merged


def sync_filesystem(directory: str) -> bool:
    """syncfs(2) the filesystem holding ``directory``: every dirty page and inode of it
    is written back before this returns.

    Returns:
        False when ``directory`` is gone or the call is unavailable (the caller then
        syncs path by path).

    Raises:
        DiskFullError, StoreError: the kernel reported a writeback error.
    """
    syncfs = getattr(_libc, "syncfs", None)
    if syncfs is None:
        return False
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        if syncfs(fd) == 0:
            return True
        code = ctypes.get_errno()
    finally:
        os.close(fd)
    if code == errno.ENOSYS:
        return False
    raise _wrap_os_error(OSError(code, os.strerror(code)), f"syncfs of {directory}")


def sync_path(path: str, *, directory: bool = False) -> None:
    """fdatasync a file (or fsync a directory) by path; a file already gone is fine.

    Writes through any shared mapping of the file are in the page cache, so syncing
    through a fresh descriptor makes them durable. The GIL is released meanwhile.

    Raises:
        DiskFullError: ENOSPC/EDQUOT while writing back.
        StoreError: any other I/O error.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0))
    except FileNotFoundError:
        return
    except OSError as error:
        raise _wrap_os_error(error, f"open {path} to sync") from error
    try:
        if directory:
            os.fsync(fd)
        else:
            os.fdatasync(fd)
    except OSError as error:
        raise _wrap_os_error(error, f"sync {path}") from error
    finally:
        os.close(fd)


def _wrap_os_error(error: OSError, action: str) -> StoreError:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(errno.ENOSPC, f"{action}: disk full")
    return StoreError(f"{action} failed: {error}")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def make_directories(path: str, created_in: Callable[[str], None]) -> None:
    """mkdir -p ``path``; call ``created_in(parent)`` for each directory that gained an
    entry, so that a flush can fsync it.

    Raises:
        StoreError: a directory cannot be created.
    """
    try:
        os.mkdir(path)
    except FileExistsError:
        return
    except FileNotFoundError:
        make_directories(os.path.dirname(path), created_in)
        try:
            os.mkdir(path)
        except FileExistsError:
            return
        except OSError as error:
            raise _wrap_os_error(error, f"create {path}") from error
    except OSError as error:
        raise _wrap_os_error(error, f"create {path}") from error
    created_in(os.path.dirname(path))


def remove_file(path: str) -> None:
    """Unlink ``path``; a file already gone is fine.

    Raises:
        StoreError: the file exists and cannot be removed.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise _wrap_os_error(error, f"remove {path}") from error


def sync_paths(files: list[str], directories: list[str]) -> None:
    """fdatasync ``files``, then fsync ``directories`` (a shared log's ``take_unsynced`` lists).

    Raises:
        DiskFullError, StoreError: a sync failed.
    """
    for path in files:
        sync_path(path)
    for directory in directories:
        sync_path(directory, directory=True)
