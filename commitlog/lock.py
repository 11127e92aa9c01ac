"""The single-writer lock (``<root>/lock``) and the crash marker (``<root>/abort``).

The lock is an ``flock`` on ``<root>/lock``. flock locks belong to an open file
description, so a second writer is refused whether it lives in another process or in
this one, and the kernel drops the lock when its holder dies: a lock left by a killed
process is taken over by the next writer with no stale-lock heuristics. The holder's
pid is written into the file for operators; it is informational only.

``<root>/abort`` exists while a writer has the store open. Finding it at open means
the last writer did not close cleanly, and recovery must scan instead of trusting
the checkpoint.
"""

from __future__ import annotations

import errno
import fcntl
import os

from commitlog.durable import fsync_directory
from commitlog.errors import StoreLockedError

__all__ = ["ABORT_NAME", "LOCK_NAME", "StoreLock", "clear_abort", "mark_abort"]

LOCK_NAME = "lock"
ABORT_NAME = "abort"


class StoreLock:
    """An exclusive writer lock held for the life of a writable store."""

    def __init__(self, fd: int, path: str) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, root: str) -> StoreLock:
        """Take the writer lock of the store at ``root``.

        Raises:
            StoreLockedError: another writer holds it.
        """
        path = os.path.join(root, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _read_holder(fd)
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreLockedError(
                    f"store {root} is open for writing by another writer{holder}"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (pid {text})" if text.isdigit() else ""


def mark_abort(root: str) -> bool:
    """Create ``<root>/abort`` durably; return True if it was already there (a crash)."""
    path = os.path.join(root, ABORT_NAME)
    existed = os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.close(fd)
    fsync_directory(root)
    return existed


def clear_abort(root: str) -> None:
    """Remove ``<root>/abort`` after a clean close."""
    try:
        os.unlink(os.path.join(root, ABORT_NAME))
    except FileNotFoundError:
        pass
    fsync_directory(root)
