"""Directory durability: what makes a name (not just its bytes) survive a power cut.

fsync/fdatasync of a file makes its data (and, for fdatasync, the size needed to read
it) durable, but not the directory entry that names it. A file created, renamed into
place or unlinked is durable under that name only after an fsync of its directory;
a directory made by ``mkdir`` only after an fsync of its parent. Every package that
creates, renames or removes files calls these helpers, so the rule lives in one place.

Crash policy: a failed directory fsync raises (``StoreError``, or ``DiskFullError`` for
ENOSPC/EDQUOT); the caller must not report the change as durable.
"""

from __future__ import annotations

import errno
import os

from mqstore.commitlog.errors import DiskFullError, StoreError

__all__ = ["fsync_directory", "fsync_file", "makedirs_durable"]


def fsync_directory(path: str) -> None:
    """fsync the directory at ``path`` so entries added, renamed or removed in it
    survive a power cut.

    Raises:
        DiskFullError: ENOSPC or EDQUOT while writing the directory back.
        StoreError: any other failure (the entries may not be durable).
    """
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as error:
        raise _sync_error(f"fsync of directory {path}", error) from error
    finally:
        os.close(fd)


def fsync_file(fd: int, path: str) -> None:
    """fdatasync an open file (its data and the size needed to read it back).

    Raises:
        DiskFullError, StoreError: as ``fsync_directory``.
    """
    try:
        os.fdatasync(fd)
    except OSError as error:
        raise _sync_error(f"fdatasync of {path}", error) from error


def makedirs_durable(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, then fsync the parent of every directory
    it created (outermost first), so each new entry is durable before this returns."""
    missing: list[str] = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    if not missing:
        return
    os.makedirs(path, exist_ok=True)
    for created in reversed(missing):  # outermost first: its parent already existed
        fsync_directory(os.path.dirname(created))


def _sync_error(what: str, error: OSError) -> StoreError:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(errno.ENOSPC, f"{what}: disk full")
    return StoreError(f"{what} failed: {error}")
