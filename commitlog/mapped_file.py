"""One fixed-size CommitLog file, memory-mapped.

A file is named by the 20-digit, zero-padded physical offset of its first byte, so
that ``ls`` sorts files in log order. It is created at its full size with
``posix_fallocate`` (so a full disk shows up as ENOSPC when the file is prepared,
never as SIGBUS on a write through the mapping), mapped shared, and optionally
pre-warmed: every page faulted in writable (MADV_POPULATE_WRITE, or one touched byte
per page where the kernel lacks it), optionally mlocked, then madvised.

Crash policy: the file itself holds no positions. What is valid is decided by the
CommitLog's recovery scan; bytes past the last valid record are zeroed by it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import threading
import time
from typing import Final

import numpy as np

from mqstore.commitlog.config import PAGE_SIZE_BYTES
from mqstore.commitlog.durable import fsync_directory, fsync_file
from mqstore.commitlog.errors import CorruptDataError, DiskFullError, StoreError

__all__ = ["MappedFile", "file_name", "parse_file_name"]

log = logging.getLogger(__name__)

FILE_NAME_DIGITS: Final = 20  # zero-padded so that ls sorts files numerically
MADV_POPULATE_WRITE: Final = 23  # Linux 5.14+; Python 3.11's mmap module lacks the name
ZERO_CHUNK_BYTES: Final = 4 << 20  # truncation zeroes in chunks, skipping all-zero ones

#: A background prewarm faults a file in by slices of this size and pauses after each
#: as long as the slice took (at most half a CPU): one madvise over a whole 256 MiB
#: file is ~0.6 s of kernel time zeroing pages, which on this 2-vCPU machine stalled
#: the appending and replicating threads by 50-450 ms (the p99 of bench.
#: replication_acks' lag: a leader and its follower warm their next files at the same
#: moment). RocketMQ's warmMappedFile yields every 1,000 pages likewise. A writer
#: waiting for the file (the allocation service's ``hurry``) ends the pauses.
PREWARM_SLICE_BYTES: Final = 4 << 20
PREWARM_PAUSE_MIN_S: Final = 0.001
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def file_name(start_offset: int) -> str:
    assert start_offset >= 0
    return f"{start_offset:0{FILE_NAME_DIGITS}d}"


def parse_file_name(name: str) -> int | None:
    """The start offset a file name stands for, or None if it is not one of ours."""
    if len(name) != FILE_NAME_DIGITS or not name.isdigit():
        return None
    return int(name)


class MappedFile:
    """A fixed-size file of the log, mapped read-write (or read-only).

    Attributes:
        path: the file's path.
        start_offset: physical offset of the file's first byte.
        size_bytes: the file's fixed size.
        mapping: the shared mapping of the whole file.
    """

    __slots__ = ("_locked", "fd", "mapping", "path", "read_only", "size_bytes", "start_offset")

    def __init__(self, path: str, start_offset: int, size_bytes: int, read_only: bool) -> None:
        self.path = path
        self.start_offset = start_offset
        self.size_bytes = size_bytes
        self.read_only = read_only
        self._locked = False
        flags = os.O_RDONLY if read_only else os.O_RDWR
        self.fd = os.open(path, flags | os.O_CLOEXEC)
        try:
            actual = os.fstat(self.fd).st_size
            if actual != size_bytes:
                raise CorruptDataError(
                    path, actual, f"file is {actual} bytes, expected {size_bytes}"
                )
            access = mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            self.mapping = mmap.mmap(self.fd, size_bytes, access=access)
        except BaseException:
            os.close(self.fd)
            raise

    @classmethod
    def create(
        cls,
        directory: str,
        start_offset: int,
        size_bytes: int,
        prewarm: bool,
        lock_memory: bool,
        write_back: bool = False,
        hurry: threading.Event | None = None,
    ) -> MappedFile:
        """Create, allocate and map a new file; pre-warm it if asked (paced while
        ``hurry`` is given and not set: see ``prewarm``).

        The file is built under a temporary name, its size made durable (fdatasync),
        renamed into place and the directory fsynced: after a power cut the file is
        either absent or present at its full size under its real name, never short,
        and a record acknowledged in it cannot lose its file to a lost rename.

        Raises:
            DiskFullError: the disk has no room for the file.
            StoreError: a sync failed (the file is not used).
        """
        path = os.path.join(directory, file_name(start_offset))
        tmp_path = path + ".allocating"
        fd = os.open(tmp_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            try:
                os.posix_fallocate(fd, 0, size_bytes)
            except OSError as error:
                if error.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise DiskFullError(
                        errno.ENOSPC, f"no room to allocate {size_bytes} bytes for {path}"
                    ) from error
                raise
            fsync_file(fd, tmp_path)
        except BaseException:
            os.close(fd)
            os.unlink(tmp_path)
            raise
        os.close(fd)
        os.rename(tmp_path, path)
        fsync_directory(directory)
        mapped = cls(path, start_offset, size_bytes, read_only=False)
        if prewarm:
            mapped.prewarm(lock_memory, write_back, hurry)
        return mapped

    def prewarm(
        self, lock_memory: bool, write_back: bool = False, hurry: threading.Event | None = None
    ) -> None:
        """Fault every page in writable, optionally mlock, then madvise WILLNEED.

        Args:
            lock_memory: mlock the file (needs RLIMIT_MEMLOCK or root).
            write_back: fdatasync after faulting, as RocketMQ does under sync flush:
                the zero pages are written back now, in the allocation thread, instead
                of by the first group commit that touches the file.
            hurry: given (a background build), the file is faulted in by slices with a
                pause as long as each slice took, until the event is set (a writer
                waits for the file); None: at full speed.

        The madvise and mlock calls go through ctypes, which releases the GIL, so a
        file being warmed in the background never holds the writer threads; paced
        (``hurry``), neither does the kernel's zeroing of its pages hold the CPUs.
        """
        populated = 0
        for start in range(0, self.size_bytes, PREWARM_SLICE_BYTES):
            length = min(PREWARM_SLICE_BYTES, self.size_bytes - start)
            began = time.perf_counter()
            if self._advise(MADV_POPULATE_WRITE, start, length) != 0:
                break
            populated = start + length
            if hurry is not None and populated < self.size_bytes:
                hurry.wait(max(PREWARM_PAUSE_MIN_S, time.perf_counter() - began))
        if populated < self.size_bytes:
            # Older kernels: touch one byte per page (a write fault per page).
            pages = np.frombuffer(self.mapping, dtype=np.uint8)[::PAGE_SIZE_BYTES]
            pages[:] = pages
            del pages
        if lock_memory:
            self._mlock()
        self._advise(mmap.MADV_WILLNEED)
        if write_back:
            os.fdatasync(self.fd)

    def _advise(self, advice: int, start: int = 0, length: int | None = None) -> int:
        """madvise the mapping (or ``length`` bytes of it from ``start``, a page
        boundary) with the GIL released; 0 on success, else errno."""
        size = self.size_bytes - start if length is None else length
        window = (ctypes.c_char * size).from_buffer(self.mapping, start)
        try:
            result = _libc.madvise(
                ctypes.c_void_p(ctypes.addressof(window)),
                ctypes.c_size_t(size),
                ctypes.c_int(advice),
            )
        finally:
            del window
        return 0 if result == 0 else ctypes.get_errno() or -1

    def _mlock(self) -> None:
        window = (ctypes.c_char * self.size_bytes).from_buffer(self.mapping)
        try:
            result = _libc.mlock(
                ctypes.c_void_p(ctypes.addressof(window)), ctypes.c_size_t(self.size_bytes)
            )
        finally:
            del window
        if result != 0:
            code = ctypes.get_errno()
            log.warning("mlock of %s failed: %s", self.path, os.strerror(code))
        else:
            self._locked = True

    def flush(self) -> None:
        """Make every byte written through the mapping durable (fdatasync).

        fdatasync writes back pages dirtied through a shared mapping and, unlike
        mmap.flush on CPython 3.11, releases the GIL while it waits.
        """
        try:
            os.fdatasync(self.fd)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(errno.ENOSPC, f"flush of {self.path}: disk full") from error
            raise StoreError(f"flush of {self.path} failed: {error}") from error

    def zero_from(self, position_in_file: int) -> int:
        """Zero every non-zero byte from ``position_in_file`` to the end of the file.

        Returns:
            How many bytes were written (all-zero chunks are skipped, so a file that
            was only partly used costs a read of its tail, not a rewrite).
        """
        assert 0 <= position_in_file <= self.size_bytes
        assert not self.read_only
        written = 0
        view = np.frombuffer(self.mapping, dtype=np.uint8)
        start = position_in_file
        while start < self.size_bytes:
            end = min(start + ZERO_CHUNK_BYTES, self.size_bytes)
            chunk = view[start:end]
            if chunk.any():
                chunk[:] = 0
                written += end - start
            start = end
        del view
        return written

    def close(self) -> None:
        """Unmap and close. Views still held by readers keep the mapping alive."""
        try:
            self.mapping.close()
        except BufferError:
            # A reader still holds a zero-copy view; the mapping is freed with it.
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __repr__(self) -> str:
        return f"MappedFile({self.path!r}, start_offset={self.start_offset})"
