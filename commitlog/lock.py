"""The single-writer lock (``<root>/lock``) and the crash marker (``<root>/abort``).

The lock is an ``flock`` on ``<root>/lock``. flock locks belong to an open file
description, so a second writer is refused whether it lives in another process or in
this one, and the kernel drops the lock when its holder dies: a lock left by a killed
process is taken over by the next writer with no stale-lock heuristics. The holder's
pid is written into the file for operators; it is informational only.

``<root>/abort`` exists while a writer has the store open. Finding it at open means
the last writer did not close cleanly, and recovery must scan instead of trusting
the checkpoint. It holds the kernel's boot id of the writer's open: the same boot id
at the next open means the process died but the machine did not, so the page cache,
and every byte written through it, survived; another (or none) means a power cut or
a kernel crash may have lost or torn anything no sync covered (``power_loss_possible``).
"""

from __future__ import annotations

import errno
import fcntl
import os

from mqstore.commitlog.durable import fsync_directory, fsync_file
from mqstore.commitlog.errors import StoreLockedError

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


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
BOOT_ID_BYTES_MAX = 64  # a UUID with its newline is 37 bytes
#: A simulated power cut (bench/powerloss.py) does not reboot the machine: the harness
#: turns this off so that recovery treats every unclean stop as a possible power cut.
trust_same_boot = True


def boot_id() -> str:
    """The kernel's boot id ("" where there is none): it changes at every boot."""
    try:
        with open(BOOT_ID_PATH) as handle:
            return handle.read(BOOT_ID_BYTES_MAX).strip()
    except OSError:
        return ""


def read_abort(root: str) -> str | None:
    """The boot id in ``<root>/abort`` ("" if it holds none), or None if there is no
    marker (the last writer closed cleanly)."""
    try:
        with open(os.path.join(root, ABORT_NAME), "rb") as handle:
            return handle.read(BOOT_ID_BYTES_MAX).decode("ascii", "replace").strip()
    except FileNotFoundError:
        return None


def power_loss_possible(marker: str | None) -> bool:
    """Whether an unclean stop recorded as ``marker`` (from ``read_abort``) may have
    lost the page cache: the machine rebooted since, or nobody can tell."""
    if marker is None:
        return False
    current = boot_id()
    return not (trust_same_boot and current and marker == current)


def mark_abort(root: str) -> bool:
    """Create ``<root>/abort`` durably, holding this boot's id; return True if it was
    already there (a crash)."""
    path = os.path.join(root, ABORT_NAME)
    existed = os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (boot_id() + "\n").encode("ascii"))
        fsync_file(fd, path)
    finally:
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
