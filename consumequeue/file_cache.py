"""The bounded LRU of mapped ConsumeQueue files, shared by every queue of a store.

Why: a store serves 100,000 queues (two files each) on a machine that allows about
20,000 open files, and Python's mmap duplicates the descriptor of every mapping. So
files are mapped lazily, on first use, and at most ``max_open_files`` mappings are kept;
beyond that the least recently used one is dropped.

Eviction never calls msync or ``mmap.close()``. Dropping our references unmaps the file
once no reader view (from ``get_range``) still refers to it; a reader's view keeps its
mapping, and that mapping's descriptor, alive until the reader drops it. The dirty pages
of an evicted file stay in the page cache (the mapping is shared), so nothing written
is lost; its path is remembered and synced by the next ``flush()`` (as are files
created by pwrite without a mapping, and directories that gained or lost entries).
That defers the cost
of an fdatasync per eviction (about 250 us here) to the flush, where one sync per file
covers every write since the previous flush, or, from SYNCFS_MIN_PATHS files on, one
syncfs(2) of the store's filesystem covers them all.

Limits: at most ``max_open_files`` mappings held by the cache, and at most
``PENDING_SYNC_MAX`` remembered paths (beyond it they are synced at once, so memory
stays bounded when nobody calls flush).

Threading: the cache does not lock by itself; callers hold the store lock it is given.
``flush()`` takes that lock only to collect the paths, and syncs outside it.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, TypeAlias

from mqstore.commitlog.errors import FlushFailedError
from mqstore.consumequeue.mapped_file import (
    MappedTimeFile,
    MappedUnitFile,
    sync_filesystem,
    sync_path,
)

__all__ = ["PENDING_SYNC_MAX", "SYNCFS_MIN_PATHS", "CacheKey", "FileCache", "MappedFile"]

CacheKey: TypeAlias = tuple[int, int, int]  # (queue serial, file index, file kind)
MappedFile: TypeAlias = MappedUnitFile | MappedTimeFile
PENDING_SYNC_MAX: Final = 65_536  # remembered paths (~100 bytes each) before a forced sync
SYNCFS_MIN_PATHS: Final = 256  # from this many paths, one syncfs beats a sync per path


class FileCache:
    """Mapped files by key, least recently used first, at most ``max_open_files``."""

    __slots__ = (
        "_files",
        "_lock",
        "_max_open_files",
        "_pending_dirs",
        "_pending_files",
        "failure",
        "generation",
    )

    def __init__(self, max_open_files: int, lock: threading.RLock) -> None:
        assert max_open_files >= 2
        self._max_open_files = max_open_files
        self._lock = lock
        self._files: OrderedDict[CacheKey, MappedFile] = OrderedDict()
        self._pending_files: dict[str, None] = {}  # evicted while dirty; insertion-ordered
        self._pending_dirs: dict[str, None] = {}  # directories with new or removed entries
        # Goes up whenever a mapping leaves the cache or a queue drops units, so that a
        # holder of raw addresses (TailWriter) knows to let go and look again.
        self.generation = 0
        self.failure: Exception | None = None  # the sync failure that ends all syncing

    def __len__(self) -> int:
        return len(self._files)

    @property
    def max_open_files(self) -> int:
        return self._max_open_files

    def get(self, key: CacheKey) -> MappedFile | None:
        """The mapped file under ``key``, marked most recently used; None if not mapped."""
        mapped = self._files.get(key)
        if mapped is not None:
            self._files.move_to_end(key)
        return mapped

    def add(self, key: CacheKey, mapped: MappedFile) -> None:
        """Keep ``mapped`` as the most recently used file; evict the coldest beyond the bound."""
        assert key not in self._files
        self._files[key] = mapped
        while len(self._files) > self._max_open_files:
            _, coldest = self._files.popitem(last=False)
            self.generation += 1
            if coldest.dirty:
                self._remember(self._pending_files, coldest.path)
        assert len(self._files) <= self._max_open_files

    def discard(self, key: CacheKey) -> None:
        """Forget a file that is being deleted (no sync: its bytes no longer matter)."""
        mapped = self._files.pop(key, None)
        if mapped is not None:
            self.generation += 1
            self._pending_files.pop(mapped.path, None)

    def discard_queue(self, serial: int) -> None:
        """Forget every mapped file of one queue (O(open files))."""
        for key in [key for key in self._files if key[0] == serial]:
            self.discard(key)

    def note_file_written(self, path: str) -> None:
        """Remember a file written without a mapping (by pwrite), so flush() syncs it."""
        self._remember(self._pending_files, path)

    def note_directory_changed(self, path: str) -> None:
        """Remember that ``path`` gained or lost an entry, so flush() fsyncs it."""
        self._remember(self._pending_dirs, path)

    def _remember(self, pending: dict[str, None], path: str) -> None:
        pending[path] = None
        if len(pending) > PENDING_SYNC_MAX:
            # Backstop when flush() is not called: sync now, so memory stays bounded.
            files, directories = list(self._pending_files), list(self._pending_dirs)
            self._pending_files.clear()
            self._pending_dirs.clear()
            self._sync(files, directories)

    def flush(self, queue_directory: str | None = None) -> None:
        """Make every write so far durable: dirty mapped files, evicted dirty files, then
        directories with new entries. With ``queue_directory``, only that queue's files
        and the directories on its path.

        Raises:
            FlushFailedError: a sync failed, now or in an earlier flush (the first
                failure is the cause); no later flush is trusted.
        """
        with self._lock:
            files, directories = self._collect(queue_directory)
        self._sync(files, directories)

    def sync_tree(self, root: str) -> None:
        """Make every file and directory under ``root`` durable now, whoever wrote it:
        after an unclean stop, the dead process's writes (a queue directory it created,
        units it wrote) are in no list of this process's, and the first checkpoint must
        not vouch for them unsynced (the chaos suite lost a graduated queue's directory
        that way: created before a SIGKILL, never fsynced in its parent, lost with
        power later). As ``flush`` (``_sync``): one syncfs(2) from SYNCFS_MIN_PATHS
        paths on.

        Raises:
            FlushFailedError: a sync failed (as ``flush``).
        """
        files: list[str] = []
        directories: list[str] = []
        for directory, _, names in os.walk(root):
            directories.append(directory)
            files.extend(os.path.join(directory, name) for name in names)
        directories.reverse()  # deepest first: a directory's entries before its parent's
        self._sync(files, directories)

    def _sync(self, files: list[str], directories: list[str]) -> None:
        """Sync files then directories; many paths at once by one syncfs of their
        filesystem (one syscall instead of an open, sync and close per path).

        A failure is final: Linux marks the pages of a failed writeback clean, so a
        retry would "succeed" without writing them. Every later flush raises
        FlushFailedError, so nobody (the store's checkpoint) ever claims units written
        since the last good flush; the next open re-dispatches them from the CommitLog.
        """
        if self.failure is not None:
            raise FlushFailedError(
                f"an earlier ConsumeQueue sync failed ({self.failure}); "
                "nothing is synced until the store is reopened"
            ) from self.failure
        try:
            if len(files) + len(directories) >= SYNCFS_MIN_PATHS and _sync_filesystem_of(
                directories + [os.path.dirname(path) for path in files[:1]]
            ):
                return
            for path in files:
                sync_path(path)
            for path in directories:
                sync_path(path, directory=True)
        except Exception as error:
            self.failure = error
            raise FlushFailedError(f"ConsumeQueue sync failed: {error}") from error

    def _collect(self, queue_directory: str | None) -> tuple[list[str], list[str]]:
        prefix = None if queue_directory is None else queue_directory + os.sep
        files: list[str] = []
        for mapped in self._files.values():
            if mapped.dirty and (prefix is None or mapped.path.startswith(prefix)):
                mapped.dirty = False
                files.append(mapped.path)
        files.extend(_take(self._pending_files, lambda path: path.startswith(prefix or "")))
        if queue_directory is None:
            directories = _take(self._pending_dirs, lambda path: True)
        else:
            topic_directory = os.path.dirname(queue_directory)
            on_path = {queue_directory, topic_directory, os.path.dirname(topic_directory)}
            directories = _take(self._pending_dirs, lambda path: path in on_path)
        return files, directories

    def close(self) -> None:
        """Drop every mapping (views held by readers keep theirs); flush() first."""
        with self._lock:
            self.generation += 1
            self._files.clear()


def _sync_filesystem_of(candidates: list[str]) -> bool:
    """syncfs the filesystem of the first candidate directory that still exists (a few
    tries: a directory may have been deleted). Assumes the store's directory tree is one
    filesystem (no mount point inside it)."""
    return any(sync_filesystem(directory) for directory in candidates[:8])


def _take(pending: dict[str, None], wanted: Callable[[str], bool]) -> list[str]:
    """Remove and return the paths of ``pending`` that ``wanted(path)`` accepts."""
    taken = [path for path in pending if wanted(path)]
    for path in taken:
        del pending[path]
    return taken
