"""The end a shared unit log's writer has published, for its read-only followers.

The writer appends records with pwrite (consumequeue/shared_log.py), and a pwrite is
not atomic to a reader of the same pages through a mapping: a follower can see a
record's commitlog offset (its first 8 bytes) before its size, and a record with an
offset and no size is what a tombstone looks like. A follower that took such a
record stepped past it and then saw the queue's next record as the start of a new
run, dropping the queue's units before it (a review found it: a record straddling
two pages is written one page at a time, so the window is as long as the kernel
takes between the pages). So the writer publishes how many records are whole: an
8-byte count in ``<log directory>/published``, stored through a shared mapping after
the records' pwrite returned, and lowered before a cut zeroes or deletes any. A
follower reads the count first and no record at or past it.

The file is never synced: it matters only to processes that share the writer's page
cache, and a writer that opens the log stores its end again. A log without the file
(its writer an older version) is followed as before, up to the first unused record.
"""

from __future__ import annotations

import mmap
import os
from typing import Final

import numpy as np

__all__ = ["PUBLISHED_FILE", "PublishedEnd"]

PUBLISHED_FILE: Final = "published"  # in the log's directory; not 20 digits: never a log file
_BYTES: Final = 8


class PublishedEnd:
    """The ``published`` count of one shared log directory, mapped."""

    __slots__ = ("_directory", "_mapping", "_read_only", "_value")

    def __init__(self, directory: str, read_only: bool) -> None:
        self._directory = directory
        self._read_only = read_only
        self._mapping: mmap.mmap | None = None
        self._value: np.ndarray | None = None

    def set(self, end: int) -> None:
        """Writer: publish ``end`` (records below it are whole). The log's directory
        must exist; the file is made on the first call."""
        assert not self._read_only
        value = self._value
        if value is None:
            value = self._map(create=True)
            assert value is not None
        value[0] = end  # one aligned 8-byte store, after the pwrite it covers returned

    def get(self) -> int | None:
        """Follower: the published end, or None when the writer publishes none."""
        value = self._value
        if value is None:
            value = self._map(create=False)
            if value is None:
                return None
        return int(value[0])

    def _map(self, create: bool) -> np.ndarray | None:
        path = os.path.join(self._directory, PUBLISHED_FILE)
        flags = os.O_RDWR | os.O_CREAT if create else os.O_RDONLY
        try:
            fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size != _BYTES:
                if not create:
                    return None  # being made, or not ours: follow without it
                os.ftruncate(fd, _BYTES)
            access = mmap.ACCESS_WRITE if create else mmap.ACCESS_READ
            self._mapping = mmap.mmap(fd, _BYTES, access=access)
        finally:
            os.close(fd)
        self._value = np.frombuffer(self._mapping, dtype=np.int64, count=1)
        if not create:
            self._value.flags.writeable = False
        return self._value

    def close(self) -> None:
        self._value = None
        if self._mapping is not None:
            try:
                self._mapping.close()
            except BufferError:  # a view is still alive: the mapping goes with it
                pass
            self._mapping = None
