"""The common part of ``.index`` and ``.timeindex`` (Kafka's AbstractIndex + LazyIndex).

An index file is an array of fixed-size big-endian entries, sorted by key, held in a
memory map:

- The active segment's indexes are preallocated to ``index_max_bytes`` and mapped
  writable; the number of valid entries is kept in memory (the tail is zeros).
- When the segment rolls (or the store closes cleanly) the file is trimmed to its
  valid entries, so on disk ``entries = file size / entry size``.
- An inactive segment's index is mapped read-only only when a look-up needs it
  (KAFKA-7283), and ``MappedIndexCache`` bounds how many such maps are open store-wide:
  on Python 3.11 every mmap holds a duplicated file descriptor.

Crash policy: an index is derived data. Recovery rebuilds it from the ``.log``;
``sanity_check`` at open catches a missing file, a size that is not a multiple of
the entry size and first/last entries outside the segment, and the segment is then
rebuilt too. Index contents are never trusted beyond what they claim to bound:
readers re-check every position against the batch they find there.

Thread safety: one lock per index guards the map and the entry count, so a look-up
never races a trim, an unmap or an append.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections import OrderedDict
from typing import ClassVar, Final, Self

__all__ = ["IndexFile", "IndexSanityError", "MappedIndexCache"]

WARM_SECTION_BYTES: Final = 8192  # Kafka's warm tail: two pages every append touches
PAGE_BYTES: Final = 4096


class IndexSanityError(Exception):
    """The file is missing or does not pass the sanity check; rebuild it."""


class IndexFile:
    """A sorted array of fixed-size entries in a (lazily) mapped file."""

    ENTRY: ClassVar[struct.Struct]

    def __init__(self, path: str, base_offset: int, max_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = self._max_entries_configured = max_bytes // self.ENTRY.size
        assert self.max_entries >= 2
        self._lock = threading.Lock()
        self._map: mmap.mmap | None = None
        self._writable = False
        self._entries = 0
        self._dirty = False  # written or resized since the last flush
        self._cache: MappedIndexCache | None = None

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def create(cls, path: str, base_offset: int, max_bytes: int) -> Self:
        """A new, empty index, preallocated and mapped writable (an active segment)."""
        index = cls(path, base_offset, max_bytes)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        os.close(fd)
        index.make_writable()
        return index

    @classmethod
    def load(cls, path: str, base_offset: int, max_bytes: int) -> Self:
        """An existing trimmed index; entries = file size / entry size. Not mapped.

        Raises:
            IndexSanityError: missing, or a size that is not a whole number of entries.
        """
        index = cls(path, base_offset, max_bytes)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise IndexSanityError(f"{path} is missing") from None
        if size % cls.ENTRY.size:
            raise IndexSanityError(f"{path}: size {size} is not a multiple of {cls.ENTRY.size}")
        index._entries = size // cls.ENTRY.size
        if index._entries > index.max_entries:
            index.max_entries = index._entries  # an older, larger index_max_bytes
        return index

    def make_writable(self) -> None:
        """Grow the file to its preallocated size and map it writable (the active
        segment, at creation and again after a clean open: Kafka's resizeIndexes)."""
        with self._lock:
            self._unmap()
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                length = self.max_entries * self.ENTRY.size
                size = os.fstat(fd).st_size
                if size < PAGE_BYTES <= length:
                    # The first page fault into a new file's map costs 3-4 ms on this
                    # VM (a write through pwrite: 8 us, and later faults about 7 us).
                    # One byte past any entry puts the first page in the page cache.
                    os.pwrite(fd, b"\x00", PAGE_BYTES - 1)
                if size != length:
                    os.ftruncate(fd, length)  # sparse: pages are allocated as entries land
                self._map = mmap.mmap(fd, length, access=mmap.ACCESS_WRITE)
            finally:
                os.close(fd)  # the map keeps its own duplicate
            self._writable = True
            self._dirty = True

    def trim(self) -> None:
        """Unmap and cut the file to its valid entries (roll and clean close)."""
        with self._lock:
            self._unmap()
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, self._entries * self.ENTRY.size)
            finally:
                os.close(fd)
            self._writable = False
            self._dirty = True

    def reset(self) -> None:
        """Forget every entry and map the file writable, empty (recovery rebuilds
        the entries). The file is cut to 0 and regrown sparse: never zero-filled."""
        with self._lock:
            self._unmap()
            os.truncate(self.path, 0)
            self._entries = 0
            self.max_entries = self._max_entries_configured
        self.make_writable()

    def flush(self) -> None:
        """Make the entries and the file size durable.

        fdatasync on a descriptor of its own, outside the lock: it writes back the
        pages dirtied through the map as well, and unlike ``mmap.flush`` on CPython
        3.11 it releases the GIL, so appends and look-ups go on meanwhile.
        """
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except BaseException:
            self._dirty = True  # the next flush tries again
            raise

    def close(self) -> None:
        with self._lock:
            self._unmap()

    def unmap_if_inactive(self) -> None:
        """Drop a read-only map (the cache evicts it); the next look-up remaps."""
        with self._lock:
            if not self._writable:
                self._unmap()

    def rename(self, path: str) -> None:
        with self._lock:
            os.rename(self.path, path)
            self.path = path

    def attach_cache(self, cache: MappedIndexCache) -> None:
        self._cache = cache

    def _unmap(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
            if self._cache is not None:
                self._cache.forget(self)

    # ------------------------------------------------------------------ entries

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def dirty(self) -> bool:
        """Entries or size changed since the last flush."""
        return self._dirty

    @property
    def is_mapped(self) -> bool:
        return self._map is not None

    @property
    def size_bytes(self) -> int:
        return self._entries * self.ENTRY.size

    def _mapped(self) -> tuple[mmap.mmap | None, bool]:
        """The map, opening a read-only one lazily, and whether it was just opened.

        Caller holds the lock, and calls ``_note_use`` after releasing it: the cache
        may unmap other indexes, whose locks must never be taken under this one.
        """
        if self._map is not None or not self._entries:
            return self._map, False
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, self._entries * self.ENTRY.size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        return self._map, True

    def _note_use(self, newly_mapped: bool) -> None:
        """Tell the cache about a look-up (no lock held)."""
        cache = self._cache
        if cache is None or self._writable:
            return
        if newly_mapped:
            cache.mapped(self)
        else:
            cache.used(self)

    def _append(self, *fields: int) -> None:
        """Write one entry. Caller holds the lock; the index is writable, not full."""
        assert self._map is not None and self._writable
        assert self._entries < self.max_entries
        self.ENTRY.pack_into(self._map, self._entries * self.ENTRY.size, *fields)
        self._entries += 1
        self._dirty = True

    def _entry(self, buffer: mmap.mmap, n: int) -> tuple[int, ...]:
        return self.ENTRY.unpack_from(buffer, n * self.ENTRY.size)

    def _read_entry(self, n: int) -> tuple[int, ...]:
        """Entry ``n`` read with pread: sanity checks never map a file."""
        size = self.ENTRY.size
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.pread(fd, size, n * size)
        finally:
            os.close(fd)
        if len(data) != size:
            raise IndexSanityError(f"{self.path}: entry {n} cut short")
        return self.ENTRY.unpack(data)

    def _largest_lower_bound(self, buffer: mmap.mmap, target: int, field: int) -> int:
        """Index of the last entry whose ``field`` is <= target, or -1.

        Searches the warm tail first, as Kafka does: appends and tail reads keep those
        pages hot, and a binary search over the whole file would fault in cold ones.
        """
        entries = self._entries
        if entries == 0:
            return -1
        first_warm = max(0, entries - 1 - WARM_SECTION_BYTES // self.ENTRY.size)
        if self._entry(buffer, first_warm)[field] <= target:
            return self._binary_search(buffer, target, field, first_warm, entries - 1)
        if self._entry(buffer, 0)[field] > target:
            return -1
        return self._binary_search(buffer, target, field, 0, first_warm)

    def _binary_search(
        self, buffer: mmap.mmap, target: int, field: int, low: int, high: int
    ) -> int:
        """Largest n in [low, high] with entry[n][field] <= target; entry[low] qualifies."""
        unpack, size = self.ENTRY.unpack_from, self.ENTRY.size
        while low < high:
            middle = (low + high + 1) // 2
            if unpack(buffer, middle * size)[field] <= target:
                low = middle
            else:
                high = middle - 1
        return low


class MappedIndexCache:
    """Bounds the read-only maps of inactive segments' indexes, least recently used
    out. Active segments' indexes are never here: they stay mapped while active."""

    def __init__(self, capacity: int) -> None:
        assert capacity >= 1
        self.capacity = capacity
        self._lock = threading.Lock()
        self._maps: OrderedDict[int, IndexFile] = OrderedDict()
        self.evictions = 0

    def mapped(self, index: IndexFile) -> None:
        """``index`` mapped itself; unmap the least recently used beyond capacity.
        Called with no index lock held, so taking the victims' locks cannot deadlock."""
        victims: list[IndexFile] = []
        with self._lock:
            self._maps[id(index)] = index
            self._maps.move_to_end(id(index))
            while len(self._maps) > self.capacity:
                victims.append(self._maps.popitem(last=False)[1])
        for victim in victims:
            self.evictions += 1
            victim.unmap_if_inactive()

    def used(self, index: IndexFile) -> None:
        with self._lock:
            if id(index) in self._maps:
                self._maps.move_to_end(id(index))

    def forget(self, index: IndexFile) -> None:
        with self._lock:
            self._maps.pop(id(index), None)

    def __len__(self) -> int:
        return len(self._maps)
