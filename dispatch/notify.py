"""Cross-process dispatch notices: a futex word in a small shared file of the store.

Read-only followers (``MessageStore.open(path, read_only=True)`` in other processes)
read the ConsumeQueues the writer dispatches. To learn of new units without polling,
they sleep in futex(2) on a sequence word that the writer bumps after every dispatch
round that added records, then wakes every sleeper on it (FUTEX_WAKE). The file is
mapped shared, so the futex is keyed by the file's page, not by an address space.

Format of ``<root>/notify`` (NOTICE, 64 bytes, little-endian)::

    0   u32  magic    0x4E51534D ("MSQN")
    4   u32  version  1
    8   u32  sequence bumped (mod 2**32) by the writer after each round; the futex word
    12  52 B reserved, zero

Invariants: one writer process bumps (the store lock); followers only read. A round's
units are written before the bump (x86 stores are not reordered with stores; the
futex call is a full barrier). A follower reads the sequence BEFORE it checks its
condition and sleeps only while the word still holds that value, so a bump between
its check and its sleep makes the sleep return at once.

Crash policy: the file holds no state worth recovering: the writer rewrites the
header when it opens and the sequence starts wherever it was. A dead writer bumps no
more and its followers wake at their own timeouts. A missing file (a store written
before this file existed, or one whose writer is not open yet), a short or foreign
file, or a platform without futex(2) makes ``Follower.open`` return None and the
follower polls as before; nothing here ever raises on bad file contents.

futex(2) is reached through ctypes' ``syscall`` (libc): FUTEX_WAIT drops the GIL for
the call, FUTEX_WAKE (which never blocks) keeps it. No C of our own, so no twin is
needed and ``MQSTORE_PURE_PYTHON`` does not apply.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import struct
import sys
from typing import Final

import numpy as np

__all__ = ["NOTICE_NAME", "Follower", "Notifier"]

log = logging.getLogger(__name__)

NOTICE_NAME: Final = "notify"
NOTICE_SIZE: Final = 64
MAGIC: Final = 0x4E51534D
VERSION: Final = 1
_HEADER: Final = struct.Struct(
    "<II"  # magic, version
)
_SEQUENCE: Final = struct.Struct("<I")  # the futex word
SEQUENCE_OFFSET: Final = _HEADER.size
assert SEQUENCE_OFFSET == 8
_SEQUENCE_MASK: Final = 0xFFFF_FFFF

_SYS_FUTEX: Final = {"x86_64": 202, "aarch64": 98}.get(os.uname().machine)
_FUTEX_WAIT: Final = 0  # shared (not FUTEX_PRIVATE_FLAG): other processes map the file
_FUTEX_WAKE: Final = 1
_WAKE_ALL: Final = 0x7FFF_FFFF


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


def _load_syscall(keep_gil: bool) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """libc's syscall(); through PyDLL (``keep_gil``) the call keeps the GIL."""
    if not sys.platform.startswith("linux") or _SYS_FUTEX is None:
        return None
    try:
        library = ctypes.PyDLL(None) if keep_gil else ctypes.CDLL(None, use_errno=True)
        syscall = library.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    return syscall


# FUTEX_WAIT sleeps: it must drop the GIL (CDLL). FUTEX_WAKE never blocks (about 1 µs):
# keeping the GIL (PyDLL) spares the dispatcher thread a wait to get it back from the
# writer thread, which takes it whenever it is dropped.
_syscall = _load_syscall(keep_gil=False)
_syscall_keeping_gil = _load_syscall(keep_gil=True)


class _Mapping:
    """The mapped file and the address of its futex word."""

    def __init__(self, fd: int, writable: bool) -> None:
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self.map = mmap.mmap(fd, NOTICE_SIZE, access=access)
        # ctypes.from_buffer needs a writable buffer; a read-only mapping's address
        # comes from numpy, which reads the address of read-only buffers too.
        self._word = ctypes.c_uint32.from_buffer(self.map, SEQUENCE_OFFSET) if writable else None
        if writable:
            assert self._word is not None
            self.address = ctypes.addressof(self._word)
        else:
            self.address = _address_of_readonly(self.map)

    @property
    def sequence(self) -> int | None:
        """The word, or None once closed (another thread may close it meanwhile)."""
        try:
            return int(_SEQUENCE.unpack_from(self.map, SEQUENCE_OFFSET)[0])
        except ValueError:  # closed
            return None

    def close(self) -> None:
        self._word = None  # release the buffer export before closing
        self.map.close()


def _address_of_readonly(mapping: mmap.mmap) -> int:
    """The address of a read-only mapping's futex word (numpy reads buffer addresses
    of read-only buffers; ctypes.from_buffer refuses them)."""
    return int(np.frombuffer(mapping, dtype=np.uint8).ctypes.data) + SEQUENCE_OFFSET


class Notifier:
    """The writer's side: bump the sequence and wake every follower."""

    def __init__(self, path: str, mapping: _Mapping) -> None:
        self.path = path
        self._mapping = mapping
        self.bumps = 0

    @classmethod
    def create(cls, root: str) -> Notifier | None:
        """Create or take over ``<root>/notify``; None where futex(2) is missing, or
        where something that is not a file holds the name (a directory made by hand:
        the notice is an optimisation, so followers poll instead; logged).

        Raises:
            OSError: the file cannot be created or mapped (the store's open fails, as
                for its other files).
        """
        if _syscall_keeping_gil is None:
            return None
        path = os.path.join(root, NOTICE_NAME)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except IsADirectoryError:
            log.warning("%s is a directory, not the notice file: followers will poll", path)
            return None
        try:
            if os.fstat(fd).st_size != NOTICE_SIZE:
                os.ftruncate(fd, NOTICE_SIZE)
            mapping = _Mapping(fd, writable=True)
        finally:
            os.close(fd)
        _HEADER.pack_into(mapping.map, 0, MAGIC, VERSION)
        return cls(path, mapping)

    def bump(self) -> None:
        """After a round: the next sequence value, then FUTEX_WAKE for all sleepers
        (about 1 µs with none; a word of "someone sleeps" would need atomics that
        Python has not, and a lost wake-up costs a follower its whole timeout)."""
        mapping = self._mapping
        sequence = mapping.sequence
        if sequence is None:  # closed (the store is closing): nobody to tell
            return
        _SEQUENCE.pack_into(mapping.map, SEQUENCE_OFFSET, (sequence + 1) & _SEQUENCE_MASK)
        assert _syscall_keeping_gil is not None
        address = ctypes.c_void_p(mapping.address)
        _syscall_keeping_gil(_SYS_FUTEX, address, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)
        self.bumps += 1

    def close(self) -> None:
        self._mapping.close()


class Follower:
    """A read-only follower's side: read the sequence, sleep until it changes."""

    def __init__(self, path: str, mapping: _Mapping) -> None:
        self.path = path
        self._mapping = mapping

    @classmethod
    def open(cls, root: str) -> Follower | None:
        """Map ``<root>/notify`` read-only; None when it is missing, not a notice file
        of this version, or futex(2) is not available (the caller polls)."""
        if _syscall is None:
            return None
        path = os.path.join(root, NOTICE_NAME)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size != NOTICE_SIZE:
                return None
            mapping = _Mapping(fd, writable=False)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        magic, version = _HEADER.unpack_from(mapping.map, 0)
        if magic != MAGIC or version != VERSION:
            mapping.close()
            return None
        return cls(path, mapping)

    @property
    def sequence(self) -> int | None:
        """The writer's sequence now, or None once this follower is closed."""
        return self._mapping.sequence

    def wait(self, sequence: int, timeout_s: float) -> None:
        """Sleep while the word holds ``sequence``, at most ``timeout_s``; return on a
        wake, a changed word, a signal or the timeout alike (the caller re-checks)."""
        if timeout_s <= 0:
            return
        seconds = int(timeout_s)
        spec = _Timespec(seconds, int((timeout_s - seconds) * 1e9))
        assert _syscall is not None
        _syscall(
            _SYS_FUTEX, ctypes.c_void_p(self._mapping.address), _FUTEX_WAIT,
            ctypes.c_uint32(sequence), ctypes.byref(spec), None, 0,
        )  # fmt: skip

    def close(self) -> None:
        self._mapping.close()
