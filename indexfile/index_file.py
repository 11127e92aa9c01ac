"""One index file: a hash table of key chains over a shared memory mapping.

Format: see ``mqstore.indexfile.format`` (48-byte prefix and header, int32 slots, 20-byte
entries, entry number 0 unused).

Invariants (of a file written by this module):
- entries 1..index_count are written in append order, so their physical offsets
  and their time deltas never decrease with the entry number;
- every entry's ``prev`` is smaller than its own number; a chain therefore ends;
- ``slots[s]`` is 0 or the newest entry whose ``key_hash % slot_count == s``;
- ``begin_ts_ms``/``begin_offset`` are those of entry 1, ``end_offset`` that of entry
  index_count, and ``end_ts_ms`` is at least every entry's store time.

Write order (crash policy): an append writes the entries first, then the slots that
point at them, then the header fields, and the index count last. A reader (another
process sharing the mapping, or a crash that keeps the page cache) therefore sees
either the old count or the new one, never a counted entry half written. A slot may
point past the count (written but not yet published, or left by a killed writer):
readers follow such a slot back through ``prev`` to the first published entry, and a
writer repairs these slots when it opens the file (``repair_slots``). Truncation
publishes the smaller count first, then unlinks the slots, then zeroes the entries,
so the same repair applies after a crash in the middle of it.

After a power loss, pages written after the last ``flush`` may be lost in any
order; the store calls ``flush`` before it checkpoints a dispatched position and
truncates the index back to that position after a crash.

Walks never trust the disk: a chain stops on a ``prev`` that is not smaller than
its entry, on an entry number outside the file, and after index_count steps.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from mqstore.commitlog.durable import fsync_directory
from mqstore.commitlog.errors import CorruptDataError, DiskFullError
from mqstore.indexfile.format import (
    ENTRY,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    FILE_HEADER_SIZE,
    FORMAT_VERSION,
    HEADER_BEFORE_COUNT,
    HEADER_FIELD_POSITION,
    HEADER_POSITION,
    INDEX_COUNT,
    INDEX_COUNT_POSITION,
    INDEX_MAGIC,
    PREFIX,
    SLOT,
    SLOT_DTYPE,
    SLOT_SIZE,
    SLOTS_POSITION,
    TIME_DELTA_MAX_S,
    TIME_GRANULARITY_MS,
    TIME_RANGE,
    IndexHeader,
    entries_position,
    entry_capacity,
    entry_count_for_size,
    file_size_bytes,
)

__all__ = ["IndexFile", "TEMP_SUFFIX"]

log = logging.getLogger(__name__)

TEMP_SUFFIX: Final = ".creating"  # a file being created; renamed into place when ready
CLEAR_CHUNK_ENTRIES: Final = 1 << 16  # entries scanned at a time by clear_past_count

Int64Array = npt.NDArray[np.int64]


class IndexFile:
    """One index file, mapped shared; read-write for the one writer, else read-only.

    The writer keeps the header in memory (``_count``, ``_begin_ts_ms``...) and writes
    it through; a reader re-reads it from the mapping on every call, so it sees the
    entries a writer in another process publishes.

    Attributes:
        path: the file's path.
        name: the file's name (``yyyyMMddHHmmssSSS``).
        slot_count: hash slots (from the header).
        entry_count: entry numbers, number 0 unused (from the file size).
        capacity: entries the file holds, ``entry_count - 1``.
    """

    __slots__ = (
        "_begin_offset",
        "_begin_ts_ms",
        "_count",
        "_end_offset",
        "_end_ts_ms",
        "_entries",
        "_entries_position",
        "_mm",
        "_raw",
        "_slots",
        "capacity",
        "dirty",
        "entry_count",
        "name",
        "path",
        "read_only",
        "slot_count",
    )

    def __init__(self, path: str, mm: mmap.mmap, header: IndexHeader, read_only: bool) -> None:
        """Wrap an open, validated mapping (use ``create`` or ``open``)."""
        self.path = path
        self.name = os.path.basename(path)
        self.read_only = read_only
        self.dirty = False
        self._mm = mm
        self.slot_count = header.slot_count
        self._entries_position = entries_position(header.slot_count)
        self.entry_count = (len(mm) - self._entries_position) // ENTRY_SIZE
        self.capacity = entry_capacity(self.entry_count)
        self._raw = np.frombuffer(mm, dtype=np.uint8)
        self._slots = self._raw[SLOTS_POSITION : self._entries_position].view(SLOT_DTYPE)
        self._entries = self._raw[self._entries_position :].view(ENTRY_DTYPE)
        self._set_header(header)
        if self._count:  # a writer killed before its count left end_offset ahead of it
            _, self._end_offset, _, _ = self.entry(self._count)
        assert len(self._slots) == self.slot_count
        assert len(self._entries) == self.entry_count

    # ----------------------------------------------------------------- lifecycle

    @classmethod
    def create(cls, directory: str, name: str, slot_count: int, entry_count: int) -> IndexFile:
        """Create a new, empty file (allocated with posix_fallocate, never pre-zeroed
        with write()) and map it.

        The file is built under a temporary name and renamed into place once its
        prefix and header are durable, so no reader or restart ever sees a file
        without a header under a real name.

        Raises:
            DiskFullError: the disk has less free space than the file's full size
                (a sparse file filled later through the mapping would hit SIGBUS).
        """
        size_bytes = file_size_bytes(slot_count, entry_count)
        path = os.path.join(directory, name)
        assert not os.path.exists(path), path
        _check_free_space(directory, size_bytes, path)
        tmp_path = path + TEMP_SUFFIX
        fd = os.open(tmp_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            # Reserve every block now: a sparse file filled later through the mapping
            # would raise SIGBUS on a full disk (the free-space check above can race).
            try:
                os.posix_fallocate(fd, 0, size_bytes)
            except OSError as error:
                if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise DiskFullError(
                    errno.ENOSPC, f"no room for {size_bytes} bytes of {path}"
                ) from error
            head = bytearray(FILE_HEADER_SIZE)
            PREFIX.pack_into(head, 0, INDEX_MAGIC, FORMAT_VERSION)
            _empty_header(slot_count).pack_into(head, HEADER_POSITION)
            os.pwrite(fd, head, 0)  # 48 bytes: the header, not a pre-zeroing write
            os.fdatasync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp_path)
            raise
        os.close(fd)
        os.rename(tmp_path, path)
        fsync_directory(directory)
        return cls.open(path, read_only=False)

    @classmethod
    def open(cls, path: str, *, read_only: bool) -> IndexFile:
        """Map an existing file after validating its prefix, header and size.

        Raises:
            CorruptDataError: bad magic or version, a slot count or size that does
                not fit the layout, or header fields out of their bounds.
        """
        fd = os.open(path, (os.O_RDONLY if read_only else os.O_RDWR) | os.O_CLOEXEC)
        try:
            size_bytes = os.fstat(fd).st_size
            if size_bytes < FILE_HEADER_SIZE:
                raise CorruptDataError(path, size_bytes, f"file is only {size_bytes} bytes")
            access = mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            mm = mmap.mmap(fd, size_bytes, access=access)
        finally:
            os.close(fd)  # the mapping holds its own descriptor
        try:
            header = _validate(path, mm)
        except BaseException:
            mm.close()
            raise
        return cls(path, mm, header, read_only)

    def close(self) -> None:
        """Unmap the file (the writer flushes first if anything is unflushed)."""
        if self._mm.closed:
            return
        if self.dirty and not self.read_only:
            self.flush()
        for name in ("_slots", "_entries", "_raw"):  # exported buffers block mm.close()
            if hasattr(self, name):  # a second close after a BufferError
                delattr(self, name)
        try:
            self._mm.close()
        except BufferError:
            # A concurrent walk still holds a view of the mapping (a query racing
            # retention or close); the mapping is freed with that view.
            pass

    def unlink(self) -> None:
        """Remove the file from the directory. The mapping stays valid for walks that
        are still running; it is released with the last reference to this object."""
        assert not self.read_only
        os.unlink(self.path)
        fsync_directory(os.path.dirname(self.path))

    def flush(self) -> None:
        """msync the mapping if an append or truncation dirtied it."""
        if self.dirty:
            self._mm.flush()
            self.dirty = False

    # -------------------------------------------------------------------- header

    def header(self) -> IndexHeader:
        """The header as stored now (read from the mapping)."""
        return IndexHeader.unpack_from(self._mm, HEADER_POSITION)

    def published_count(self) -> int:
        """The index count as stored now, clamped into [0, capacity] (a reader must
        not trust a count that changed on disk after validation)."""
        count = int(INDEX_COUNT.unpack_from(self._mm, INDEX_COUNT_POSITION)[0])
        if not 0 <= count <= self.capacity:
            log.warning("%s: index count %d outside [0, %d]", self.path, count, self.capacity)
            return max(0, min(count, self.capacity))
        return count

    def published_end_offset(self) -> int:
        """Physical offset of the newest published entry as stored now; -1 if none."""
        count = self.published_count()
        if not count:
            return -1
        _, physical_offset, _, _ = self.entry(count)
        return physical_offset

    @property
    def index_count(self) -> int:
        """Entries written (the writer's view; a reader reads the mapping)."""
        return self._count if not self.read_only else self.published_count()

    @property
    def remaining(self) -> int:
        """Entries that still fit (writer)."""
        return self.capacity - self._count

    @property
    def begin_ts_ms(self) -> int:
        """Store time of entry 1, the base of every delta (writer; 0 when empty)."""
        return self._begin_ts_ms

    @property
    def end_offset(self) -> int:
        """Physical offset of the newest entry (writer; -1 when empty)."""
        return self._end_offset if self._count else -1

    def newest_ts_min_ms(self) -> int:
        """The lowest store time the newest entry can have (writer; -1 when empty)."""
        if not self._count:
            return -1
        delta_s = int(self._entries[self._count]["time_delta_s"])
        return self._begin_ts_ms + delta_s * TIME_GRANULARITY_MS

    def overlaps(self, begin_ts_ms: int, end_ts_ms: int) -> bool:
        """Whether the file holds entries and its time range meets [begin, end]."""
        if self.published_count() == 0:  # read first: the fields below precede it
            return False
        file_begin_ts_ms, file_end_ts_ms = TIME_RANGE.unpack_from(self._mm, HEADER_POSITION)
        return file_begin_ts_ms <= end_ts_ms and file_end_ts_ms >= begin_ts_ms

    def _set_header(self, header: IndexHeader) -> None:
        self._count = header.index_count
        self._begin_ts_ms = header.begin_ts_ms
        self._end_ts_ms = header.end_ts_ms
        self._begin_offset = header.begin_offset
        self._end_offset = header.end_offset

    def _publish(self) -> None:
        """Write the cached header: the fields first, the index count last."""
        HEADER_BEFORE_COUNT.pack_into(
            self._mm,
            HEADER_POSITION,
            self._begin_ts_ms,
            self._end_ts_ms,
            self._begin_offset,
            self._end_offset,
            self.slot_count,
        )
        INDEX_COUNT.pack_into(self._mm, INDEX_COUNT_POSITION, self._count)
        self.dirty = True

    # ------------------------------------------------------------------- appends

    def delta_fits(self, store_ts_ms: int, base_ts_ms: int | None = None) -> bool:
        """Whether ``store_ts_ms`` is representable as a delta from the file's begin
        time (or from ``base_ts_ms`` when the file is still empty)."""
        if self._count:
            base_ts_ms = self._begin_ts_ms
        if base_ts_ms is None:
            return True
        return (store_ts_ms - base_ts_ms) // TIME_GRANULARITY_MS <= TIME_DELTA_MAX_S

    def append(self, key_hashes: Sequence[int], physical_offset: int, store_ts_ms: int) -> None:
        """Append one message's entries (one per key hash) and publish them.

        The caller checks room, order and ``delta_fits`` first.
        """
        count = self._count
        assert not self.read_only
        assert 0 < len(key_hashes) <= self.capacity - count
        if count == 0:
            self._begin_ts_ms = store_ts_ms
            self._begin_offset = physical_offset
        delta_s = (store_ts_ms - self._begin_ts_ms) // TIME_GRANULARITY_MS
        assert 0 <= delta_s <= TIME_DELTA_MAX_S
        assert physical_offset >= self._end_offset or count == 0
        mm, slot_count = self._mm, self.slot_count
        for key_hash in key_hashes:
            slot_position = SLOTS_POSITION + (key_hash % slot_count) * SLOT_SIZE
            prev = SLOT.unpack_from(mm, slot_position)[0]
            assert 0 <= prev <= count
            count += 1
            position = self._entries_position + count * ENTRY_SIZE
            ENTRY.pack_into(mm, position, key_hash, physical_offset, delta_s, prev)
            SLOT.pack_into(mm, slot_position, count)
        self._count = count
        self._end_offset = physical_offset
        self._end_ts_ms = max(self._end_ts_ms, store_ts_ms)
        self._publish()

    def append_batch(
        self, key_hashes: Int64Array, physical_offsets: Int64Array, store_ts_ms: Int64Array
    ) -> None:
        """Append many entries at once (numpy), in order, and publish them.

        The file ends byte for byte as after ``append`` per entry: within the batch,
        each entry's ``prev`` is the previous batch entry of its slot (a stable sort
        by slot finds it), or the slot's old head for the first one.
        """
        k = len(key_hashes)
        first = self._count + 1
        assert not self.read_only
        assert 0 < k <= self.capacity - self._count
        assert len(physical_offsets) == k and len(store_ts_ms) == k
        if self._count == 0:
            self._begin_ts_ms = int(store_ts_ms[0])
            self._begin_offset = int(physical_offsets[0])
        deltas_s = (store_ts_ms - self._begin_ts_ms) // TIME_GRANULARITY_MS
        assert deltas_s[0] >= 0 and deltas_s[-1] <= TIME_DELTA_MAX_S
        slots = key_hashes % self.slot_count
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        sorted_numbers = np.arange(first, first + k, dtype=np.int32)[order]
        group_start = np.ones(k, dtype=bool)
        group_start[1:] = sorted_slots[1:] != sorted_slots[:-1]
        prev_sorted = np.empty(k, dtype=np.int32)
        prev_sorted[group_start] = self._slots[sorted_slots[group_start]]
        prev_sorted[~group_start] = sorted_numbers[:-1][~group_start[1:]]
        block = np.empty(k, dtype=ENTRY_DTYPE)
        block["key_hash"] = key_hashes
        block["physical_offset"] = physical_offsets
        block["time_delta_s"] = deltas_s
        block["prev"][order] = prev_sorted
        self._entries[first : first + k] = block  # entries first ...
        group_end = np.ones(k, dtype=bool)
        group_end[:-1] = group_start[1:]
        self._slots[sorted_slots[group_end]] = sorted_numbers[group_end]  # ... then slots
        self._count += k
        self._end_offset = int(physical_offsets[-1])
        self._end_ts_ms = max(self._end_ts_ms, int(store_ts_ms.max()))
        self._publish()  # ... then the header, the count last

    # ------------------------------------------------------------------- queries

    def candidates(self, key_hash: int, begin_ts_ms: int, end_ts_ms: int) -> Iterator[int]:
        """Physical offsets of the entries that may match, newest first.

        An entry is a candidate when its hash equals ``key_hash`` and its time,
        known to the second as [t, t + 999] ms, meets [begin_ts_ms, end_ts_ms]. The
        walk stops at the chain's end, at an entry wholly older than begin_ts_ms
        (deltas never decrease with the entry number), at a corrupt link, and after
        index_count steps. Callers must still check the real record.
        """
        mm = self._mm
        count = self.published_count()  # read first: what it counts is fully written
        if count == 0:
            return
        file_begin_ts_ms, _ = TIME_RANGE.unpack_from(mm, HEADER_POSITION)
        slot_position = SLOTS_POSITION + (key_hash % self.slot_count) * SLOT_SIZE
        number = self._published_head(SLOT.unpack_from(mm, slot_position)[0], count)
        unpack, base = ENTRY.unpack_from, self._entries_position
        for _ in range(count):  # a chain visits each published entry at most once
            if number == 0:
                return
            entry_hash, physical_offset, delta_s, prev = unpack(mm, base + number * ENTRY_SIZE)
            entry_ts_min_ms = file_begin_ts_ms + delta_s * TIME_GRANULARITY_MS
            if entry_ts_min_ms + TIME_GRANULARITY_MS - 1 < begin_ts_ms:
                return
            if entry_hash == key_hash and entry_ts_min_ms <= end_ts_ms:
                yield physical_offset
            if not 0 <= prev < number:
                log.warning("%s: entry %d links to %d; chain cut", self.path, number, prev)
                return
            number = prev
        if number:
            log.warning("%s: chain of hash %d outgrew the index count", self.path, key_hash)

    def _published_head(self, number: int, count: int) -> int:
        """A slot's head moved back to the newest published entry of its chain (the
        slot may point at entries written after ``count`` was read), or 0 if the link
        is corrupt."""
        for _ in range(self.capacity):  # bounded: each step goes to a smaller number
            if 0 <= number <= count:
                return number
            if number > self.capacity or number < 0:
                log.warning("%s: slot points at entry %d, outside the file", self.path, number)
                return 0
            prev = int(self._entries[number]["prev"])
            if not 0 <= prev < number:
                log.warning("%s: entry %d links to %d; chain cut", self.path, number, prev)
                return 0
            number = prev
        return 0

    def entry(self, number: int) -> tuple[int, int, int, int]:
        """Entry ``number`` as (key_hash, physical_offset, time_delta_s, prev)."""
        assert 1 <= number <= self.capacity
        key_hash, physical_offset, delta_s, prev = ENTRY.unpack_from(
            self._mm, self._entries_position + number * ENTRY_SIZE
        )
        return key_hash, physical_offset, delta_s, prev

    # ------------------------------------------------------------ truncation, repair

    def first_entry_at_or_beyond(self, physical_end: int) -> int:
        """Binary search: the first entry number whose physical offset is at least
        ``physical_end``, or index_count + 1 if there is none (writer)."""
        low, high = 1, self._count + 1
        while low < high:  # invariant: entries < low are below, entries >= high are not
            middle = (low + high) // 2
            _, physical_offset, _, _ = self.entry(middle)
            if physical_offset >= physical_end:
                high = middle
            else:
                low = middle + 1
        return low

    def intact_end(
        self, physical_claim: int, physical_min: int, verify: Callable[[int, int], bool]
    ) -> int:
        """After a power cut: how many leading entries are intact (see
        ``IndexService.recover_tail``). Walks back from the published count to the first
        entry below ``physical_claim`` that ``verify(key_hash, physical_offset)``
        confirms against the CommitLog; below ``physical_min`` (records retention
        deleted) an entry in offset order with the one before it is taken as intact."""
        begin = self._begin_offset
        number = min(self._count, self.capacity)
        while number >= 1:
            key_hash_, physical_offset, _, _ = self.entry(number)
            if begin <= physical_offset < physical_claim:
                if physical_offset >= physical_min:
                    if verify(key_hash_, physical_offset):
                        return number
                elif number == 1 or self.entry(number - 1)[1] < physical_offset:
                    return number
            number -= 1
        return 0

    def clear_past_count(self) -> int:
        """Zero every entry past the index count that holds data; return how many
        (power-cut recovery, writer).

        A cut that reverts the header's page but keeps an entry page leaves entries
        past the count. Appends overwrite them only one by one, so some outlive the
        next flush on disk; a later cut that keeps a newer header but reverts their
        page counts them again, and recovery cannot tell them from real entries (an
        entry of a record retention deleted cannot be verified), so their stale
        ``prev`` links would cut chains and lose keys. Scanned in chunks; only entries
        holding data are written, so an empty tail gains no dirty pages.
        """
        assert not self.read_only
        rows = self._raw[self._entries_position :].reshape(self.entry_count, ENTRY_SIZE)
        cleared = 0
        for start in range(self._count + 1, self.entry_count, CLEAR_CHUNK_ENTRIES):
            chunk = rows[start : start + CLEAR_CHUNK_ENTRIES]
            stale = np.flatnonzero(chunk.any(axis=1))
            if len(stale):
                chunk[stale] = 0
                cleared += len(stale)
        if cleared:
            self.dirty = True
        return cleared

    def rebuild_slots(self) -> None:
        """Point every slot at the newest published entry of its chain, computed from
        the entries themselves (power-cut recovery: entries past the count may be torn,
        so their ``prev`` links and key hashes cannot be followed back). The kept
        entries' own ``prev`` links are intact and left as they are. O(index count)."""
        assert not self.read_only
        count = self._count
        heads = np.zeros(self.slot_count, dtype=np.int64)
        if count:
            slots = self._entries[1 : count + 1]["key_hash"].astype(np.int64) % self.slot_count
            newest_first = slots[::-1]
            unique_slots, position = np.unique(newest_first, return_index=True)
            heads[unique_slots] = count - position  # entry numbers are 1-based
        self._slots[:] = heads
        self.dirty = True

    def truncate_from(self, first: int) -> None:
        """Remove entries ``first``..index_count (``first`` >= 2; the service deletes a
        file that would be emptied).

        Order: publish the smaller count, then point each affected slot back at its
        newest surviving entry, then zero the removed entries (see crash policy).
        """
        count = self._count
        assert not self.read_only
        assert 2 <= first <= count
        newest_delta_s = int(self._entries[first - 1]["time_delta_s"])
        newest_ts_max_ms = self._begin_ts_ms + (newest_delta_s + 1) * TIME_GRANULARITY_MS - 1
        self._count = first - 1
        self._end_offset = int(self._entries[first - 1]["physical_offset"])
        self._end_ts_ms = min(self._end_ts_ms, newest_ts_max_ms)
        self._publish()
        removed = self._entries[first : count + 1]
        slots = removed["key_hash"].astype(np.int64) % self.slot_count
        # A slot's oldest removed entry is its first occurrence in entry order; that
        # entry's prev is the slot's newest survivor.
        unique_slots, oldest = np.unique(slots, return_index=True)
        survivors = removed["prev"][oldest]
        survivors = np.where((survivors >= 0) & (survivors < first), survivors, 0)
        pointed_at_removed = self._slots[unique_slots] >= first
        self._slots[unique_slots[pointed_at_removed]] = survivors[pointed_at_removed]
        start = self._entries_position + first * ENTRY_SIZE
        self._raw[start : self._entries_position + (count + 1) * ENTRY_SIZE] = 0
        assert int(self._entries[first - 1]["physical_offset"]) == self._end_offset

    def repair_slots(self) -> int:
        """Point every slot that is past the index count (an append or truncation a
        crash cut short) back at its newest published entry; return how many.

        Reads the whole slot array (20 MB at 5M slots), and the published entries when a
        slot is stale; done once, at a writer's open of the newest file only (older
        files were complete before a newer one began).
        """
        assert not self.read_only
        bad_slots = np.flatnonzero((self._slots > self._count) | (self._slots < 0))
        if len(bad_slots):
            # Recomputed from the published entries, not by following ``prev`` from the
            # stale heads: after a power cut the entries past the count may be zero or
            # torn, and a walk through them would cut the chain (and lose its keys).
            self.rebuild_slots()
            log.warning("%s: repaired %d slots past the index count", self.path, len(bad_slots))
        return len(bad_slots)


def _empty_header(slot_count: int) -> IndexHeader:
    return IndexHeader(
        begin_ts_ms=0,
        end_ts_ms=0,
        begin_offset=-1,
        end_offset=-1,
        slot_count=slot_count,
        index_count=0,
    )


def _validate(path: str, mm: mmap.mmap) -> IndexHeader:
    """Check the prefix, the header and the size; return the header.

    Raises:
        CorruptDataError: naming the file and the position of the bad field.
    """
    magic, version = PREFIX.unpack_from(mm, 0)
    if magic != INDEX_MAGIC:
        raise CorruptDataError(path, 0, f"bad magic {magic:#010x}, expected {INDEX_MAGIC:#010x}")
    if version != FORMAT_VERSION:
        raise CorruptDataError(path, 4, f"format version {version}, expected {FORMAT_VERSION}")
    header = IndexHeader.unpack_from(mm, HEADER_POSITION)
    slot_count_position = HEADER_FIELD_POSITION["slot_count"]
    if header.slot_count < 1:
        raise CorruptDataError(path, slot_count_position, f"slot count {header.slot_count}")
    entry_count = entry_count_for_size(header.slot_count, len(mm))
    if entry_count is None:
        raise CorruptDataError(
            path,
            slot_count_position,
            f"size {len(mm)} does not fit {header.slot_count} slots and whole entries",
        )
    if not 0 <= header.index_count <= entry_capacity(entry_count):
        raise CorruptDataError(
            path, INDEX_COUNT_POSITION, f"index count {header.index_count} of {entry_count}"
        )
    if header.index_count:
        _validate_ranges(path, header)
    return header


def _validate_ranges(path: str, header: IndexHeader) -> None:
    """The begin/end fields of a non-empty file must be ordered."""
    if header.begin_offset < 0:
        raise CorruptDataError(
            path, HEADER_FIELD_POSITION["begin_offset"], f"begin offset {header.begin_offset}"
        )
    if header.end_offset < header.begin_offset:
        raise CorruptDataError(
            path,
            HEADER_FIELD_POSITION["end_offset"],
            f"end offset {header.end_offset} before begin offset {header.begin_offset}",
        )
    if header.end_ts_ms < header.begin_ts_ms:
        raise CorruptDataError(
            path,
            HEADER_FIELD_POSITION["end_ts_ms"],
            f"end time {header.end_ts_ms} before begin time {header.begin_ts_ms}",
        )


def _check_free_space(directory: str, size_bytes: int, path: str) -> None:
    stats = os.statvfs(directory)
    free_bytes = stats.f_bavail * stats.f_frsize
    if free_bytes < size_bytes:
        raise DiskFullError(
            errno.ENOSPC, f"{free_bytes} bytes free, {path} may grow to {size_bytes} bytes"
        )
