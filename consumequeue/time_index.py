"""The in-memory sparse time index of one queue: a running maximum over blocks.

Blocks: each unit file is cut into ``blocks_per_file`` blocks of N units (the last one
short when N does not divide ``units_per_file``). Blocks are numbered across the queue:
block ``g`` is block ``g % blocks_per_file`` of file ``g // blocks_per_file``. Time files
store each block's local maximum timestamp (see mqstore.consumequeue.format).

Index: entry ``e`` holds ``max(block_max[block_start .. block_start + e])``, a running
maximum, so it is sorted and ``np.searchsorted`` finds the first block whose running
maximum reaches T in O(log n). That block holds the first unit (in offset order, from
``block_start`` on) whose timestamp is >= T, because every earlier block's maximum is
< T. This is Kafka's .timeindex idea (max timestamp so far), kept per block rather than
per segment, and it holds for out-of-order CreateTime timestamps.

Head: the units of a queue's run in the shared unit log (before its own files) are
kept unit by unit, as the running maximum of their timestamps: its first item >= T is
the first such unit >= T. So a look-up is one search over the head and the blocks
(``time_search``), then, when a block holds the answer, one scan of that block
(``first_reaching``); both are C when the module is built, with the pure-Python twins
below (the same answers; the tests compare them).

The index is derived data, rebuilt from the persisted block maxima (n / N reads, not n)
when the queue's minimum offset moves, and extended lazily from the last covered block
when the queue has grown. It is never persisted, so it cannot be stale after a crash.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import numpy as np

from mqstore.commitlog.native import NATIVE
from mqstore.consumequeue.format import blocks_per_file

if TYPE_CHECKING:
    from mqstore.consumequeue.mapped_file import MappedTimeFile, MappedUnitFile

__all__ = [
    "BlockGeometry",
    "TimeIndex",
    "first_reaching",
    "first_reaching_py",
    "time_search",
    "time_search_py",
]

INITIAL_CAPACITY_ENTRIES = 64  # grows by doubling; one entry per N units of the queue
# Files whose mappings an index remembers (weakly): a queue's look-ups hit a few files;
# past this many the oldest half is forgotten (a miss costs one FileCache look-up).
REMEMBERED_FILES_MAX = 64


class BlockGeometry:
    """Offsets <-> blocks arithmetic for one configuration."""

    __slots__ = ("blocks_per_file", "interval_units", "units_per_file")

    def __init__(self, units_per_file: int, interval_units: int) -> None:
        self.units_per_file = units_per_file
        self.interval_units = interval_units
        self.blocks_per_file = blocks_per_file(units_per_file, interval_units)

    def block_of(self, offset: int) -> int:
        """The global block that holds queue offset ``offset``."""
        file_index, unit_in_file = divmod(offset, self.units_per_file)
        return file_index * self.blocks_per_file + unit_in_file // self.interval_units

    def block_bounds(self, block: int) -> tuple[int, int]:
        """Queue offsets ``[start, end)`` of a global block (never crosses a file)."""
        file_index, block_in_file = divmod(block, self.blocks_per_file)
        file_start = file_index * self.units_per_file
        start = file_start + block_in_file * self.interval_units
        end = file_start + min((block_in_file + 1) * self.interval_units, self.units_per_file)
        assert start < end
        return start, end


class TimeIndex:
    """Running maxima of blocks ``block_start ..``, reflecting units below ``covered_max``,
    and of the head's units ``head_start ..`` (see the module docstring).

    Attributes:
        block_start: global block of entry 0.
        covered_max_offset: the queue's max_offset when the index was last extended.
        head_start: queue offset of the head's first unit.
        head_max: running maximum of the head units' timestamps (int64).
        head_key: what the head was built from (the owner compares it to reuse it).
        low_offset: the queue's min_offset when the index was made.
    """

    __slots__ = (
        "_count",
        "_files",
        "_running_max",
        "block_start",
        "covered_max_offset",
        "head_key",
        "head_max",
        "head_start",
        "low_offset",
    )

    def __init__(self, block_start: int, low_offset: int = 0) -> None:
        assert block_start >= 0 and low_offset >= 0
        self.block_start = block_start
        self.low_offset = low_offset
        self.covered_max_offset = 0
        self._running_max = np.zeros(INITIAL_CAPACITY_ENTRIES, dtype=np.int64)
        self._count = 0
        self.head_start = 0
        self.head_max = np.zeros(0, dtype=np.int64)
        self.head_key: Hashable = None
        self._files: dict[int, tuple[weakref.ref[MappedTimeFile], weakref.ref[MappedUnitFile]]]
        self._files = {}

    @property
    def count(self) -> int:
        """Entries (blocks) in the index."""
        return self._count

    @property
    def running_max(self) -> np.ndarray:
        """The entries' buffer (its first ``count`` items are the entries)."""
        return self._running_max

    def set_head(self, head_start: int, timestamps_ms: np.ndarray, key: Hashable) -> None:
        """Make the units ``head_start ..`` with ``timestamps_ms`` the head."""
        assert head_start >= 0 and timestamps_ms.ndim == 1
        self.head_start = head_start
        self.head_max = np.maximum.accumulate(timestamps_ms.astype(np.int64, copy=False))
        self.head_key = key

    @property
    def end_block(self) -> int:
        """One past the last block with an entry."""
        return self.block_start + self._count

    def replace_from(self, block: int, block_maxima: np.ndarray, covered_max_offset: int) -> None:
        """Drop the entries of blocks >= ``block``; append entries for ``block_maxima``,
        the local maxima of blocks ``block, block + 1, ...``."""
        assert self.block_start <= block <= self.end_block
        assert block_maxima.ndim == 1
        self._count = block - self.block_start
        needed = self._count + len(block_maxima)
        if needed > len(self._running_max):
            grown = np.zeros(max(needed, 2 * len(self._running_max)), dtype=np.int64)
            grown[: self._count] = self._running_max[: self._count]
            self._running_max = grown
        window = self._running_max[self._count : needed]
        np.maximum.accumulate(block_maxima, out=window)
        if self._count:
            np.maximum(window, self._running_max[self._count - 1], out=window)
        self._count = needed
        self.covered_max_offset = covered_max_offset

    def files(self, file_index: int) -> tuple[MappedTimeFile, MappedUnitFile] | None:
        """The time and unit file ``file_index`` as ``remember_files`` was given them,
        while the store's FileCache (or a reader's view) still holds both; else None."""
        refs = self._files.get(file_index)
        if refs is None:
            return None
        times, units = refs[0](), refs[1]()
        if times is None or units is None:
            return None
        return times, units

    def remember_files(self, file_index: int, times: MappedTimeFile, units: MappedUnitFile) -> None:
        """Keep weak references to file ``file_index``'s mappings, so that a look-up
        skips the FileCache (its LRU and key tuples: about 3 us a file when the
        caches are cold) while the mappings live; the index never keeps one alive.

        Sound because the index lives only while the units it covers do not change
        (the queue drops it on truncation, deletion and reload): a file's mapping
        stays the file's for the index's lifetime."""
        if len(self._files) >= REMEMBERED_FILES_MAX:
            for key in list(self._files)[: REMEMBERED_FILES_MAX // 2]:
                del self._files[key]
        self._files[file_index] = (weakref.ref(times), weakref.ref(units))
        assert len(self._files) <= REMEMBERED_FILES_MAX

    def first_block_reaching(self, timestamp_ms: int) -> int | None:
        """The first global block whose running maximum is >= ``timestamp_ms``, or None."""
        entries = self._running_max[: self._count]
        position = int(np.searchsorted(entries, timestamp_ms, side="left"))
        if position == self._count:
            return None
        assert entries[position] >= timestamp_ms
        return self.block_start + position


def time_search_py(
    head_max: Any, head_count: int, block_max: Any, block_count: int, timestamp_ms: int
) -> int:
    """Where the first item >= ``timestamp_ms`` of two running maxima lies: ``i`` for
    item i of ``head_max[:head_count]``, else ``head_count + b`` for item b of
    ``block_max[:block_count]``, else -1. Each is searched as ``bisect_left`` does.

    Raises:
        ValueError: a count outside ``[0, len(array)]``.
    """
    if not 0 <= head_count <= len(head_max):
        raise ValueError("head_max count out of range")
    if head_count and head_max[head_count - 1] >= timestamp_ms:
        return bisect.bisect_left(head_max, timestamp_ms, 0, head_count)
    if not 0 <= block_count <= len(block_max):
        raise ValueError("block_max count out of range")
    block = bisect.bisect_left(block_max, timestamp_ms, 0, block_count)
    return -1 if block == block_count else head_count + block


def first_reaching_py(times: Any, start: int, end: int, timestamp_ms: int) -> int:
    """The first index in ``[start, end)`` of ``times`` whose item >= ``timestamp_ms``,
    or -1.

    Raises:
        ValueError: not ``0 <= start <= end <= len(times)``.
    """
    if not 0 <= start <= end <= len(times):
        raise ValueError("first_reaching: need 0 <= start <= end <= len(times)")
    reached = np.asarray(times[start:end]) >= timestamp_ms
    position = int(np.argmax(reached)) if len(reached) else 0
    return start + position if len(reached) and reached[position] else -1


time_search: Callable[[Any, int, Any, int, int], int]
first_reaching: Callable[[Any, int, int, int], int]
if NATIVE is None:
    time_search, first_reaching = time_search_py, first_reaching_py
else:
    time_search, first_reaching = NATIVE.time_search, NATIVE.first_reaching
