"""The files of one queue directory, mapped on demand through the store's file cache.

A queue's files are pairs (unit file, time file) numbered by file index; see
mqstore.consumequeue.format for names and layouts. This module lists, maps, creates and deletes
them; it holds no offsets (that is ConsumeQueue's job) and no mapping of its own: every
access goes through the shared, bounded FileCache, so a queue never pins a descriptor.

Ordering on disk (crash policy): the time file is created before its unit file and
deleted after it, so a unit file never exists without its time file. A writer's
listing removes what an interrupted creation or deletion left: temporary files, and
time files whose unit file is gone.

A read-only queue may find that the writer removed a file it expected (retention or
truncation). That raises OffsetOutOfRangeError and marks the listing stale, so the
queue reloads its state before its next operation.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Final

import numpy as np

from mqstore.commitlog.errors import CorruptDataError, OffsetOutOfRangeError, StoreError
from mqstore.consumequeue.config import ConsumeQueueConfig
from mqstore.consumequeue.file_cache import FileCache
from mqstore.consumequeue.format import (
    TEMP_SUFFIX,
    TIME_FILE_SUFFIX,
    parse_unit_file_name,
    time_file_name,
    unit_file_name,
)
from mqstore.consumequeue.mapped_file import (
    MappedTimeFile,
    MappedUnitFile,
    make_directories,
    remove_file,
)
from mqstore.consumequeue.time_index import BlockGeometry

__all__ = ["QueueContext", "QueueFiles"]

UNITS_KIND: Final = 0  # file kinds in cache keys
TIMES_KIND: Final = 1


class QueueContext:
    """What every queue of a store shares: config, file cache, lock and mode."""

    __slots__ = ("cache", "closed", "config", "geometry", "lock", "read_only", "shared_generation")

    def __init__(self, config: ConsumeQueueConfig, read_only: bool) -> None:
        self.config = config
        self.read_only = read_only
        self.lock = threading.RLock()
        self.cache = FileCache(config.max_open_files, self.lock)
        self.geometry = BlockGeometry(config.units_per_file, config.time_index_interval_units)
        self.closed = False
        # Moves when a queue's shared run is cut or restarted: the TailWriter's cached
        # graduation offsets are stale then.
        self.shared_generation = 0


class QueueFiles:
    """The unit and time files of one queue directory.

    Attributes:
        directory: the queue's directory.
        stale: read-only only: a file vanished under us; the owner must reload.
    """

    __slots__ = ("_ctx", "_interval", "_prefix", "_serial", "_upf", "directory", "stale")

    def __init__(self, context: QueueContext, directory: str, serial: int) -> None:
        self._ctx = context
        self._serial = serial  # unique per queue in the store: the cache key's first part
        self._upf = context.config.units_per_file
        self._interval = context.config.time_index_interval_units
        self.directory = directory
        self._prefix = directory + os.sep  # paths are built per put: keep them cheap
        self.stale = False

    def unit_path(self, file_index: int) -> str:
        return self._prefix + unit_file_name(file_index, self._upf)

    def time_path(self, file_index: int) -> str:
        return time_file_name(self.unit_path(file_index))

    def exists(self, file_index: int) -> bool:
        return os.path.exists(self.unit_path(file_index))

    def units(self, file_index: int, *, for_write: bool = False) -> MappedUnitFile:
        """The mapped unit file ``file_index`` (mapped now if it is not in the cache).

        ``for_write`` marks it dirty before the caller writes, so that an eviction
        between here and the write still remembers to sync it.

        Raises:
            CorruptDataError: missing (writer), wrong size.
            OffsetOutOfRangeError: read-only, and the writer removed the file.
        """
        key = (self._serial, file_index, UNITS_KIND)
        mapped = self._ctx.cache.get(key)
        if mapped is None:
            path = self.unit_path(file_index)
            try:
                mapped = MappedUnitFile.open(path, self._upf, self._ctx.read_only)
            except FileNotFoundError:
                raise self._missing(path, file_index) from None
            self._ctx.cache.add(key, mapped)
        assert isinstance(mapped, MappedUnitFile)
        if for_write:
            mapped.dirty = True
        return mapped

    def times(self, file_index: int, *, for_write: bool = False) -> MappedTimeFile:
        """The mapped time file ``file_index``; as ``units``, and its header is checked."""
        key = (self._serial, file_index, TIMES_KIND)
        mapped = self._ctx.cache.get(key)
        if mapped is None:
            path = self.time_path(file_index)
            try:
                mapped = MappedTimeFile.open(path, self._upf, self._interval, self._ctx.read_only)
            except FileNotFoundError:
                raise self._missing(path, file_index) from None
            self._ctx.cache.add(key, mapped)
        assert isinstance(mapped, MappedTimeFile)
        if for_write:
            mapped.dirty = True
        return mapped

    def _missing(self, path: str, file_index: int) -> StoreError:
        if not self._ctx.read_only or self.exists(file_index):
            return CorruptDataError(path, 0, "file of the queue is missing")
        self.stale = True  # the writer's retention or truncation removed the pair
        return OffsetOutOfRangeError(f"{path} was removed by the writer; the queue moved on")

    def indexes(self) -> list[int]:
        """Indexes of the unit files present, sorted; a writer also removes leftovers.

        Raises:
            CorruptDataError: a gap between file indexes, or a misaligned file name.
        """
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        except OSError as error:
            raise StoreError(f"cannot list {self.directory}: {error}") from error
        indexes = sorted(
            index
            for name in names
            if (index := parse_unit_file_name(name, self._upf, self.directory)) is not None
        )
        for before, after in itertools.pairwise(indexes):
            if after != before + 1:
                missing = self.unit_path(before + 1)
                raise CorruptDataError(missing, 0, "file missing: queue files must be contiguous")
        if not self._ctx.read_only:
            self._remove_leftovers(names, indexes)
        self.stale = False
        return indexes

    def _remove_leftovers(self, names: list[str], indexes: list[int]) -> None:
        """Temporary files of an interrupted creation; time files whose unit file is gone."""
        unit_names = {unit_file_name(index, self._upf) for index in indexes}
        for name in names:
            unit_name = name.removesuffix(TIME_FILE_SUFFIX)
            orphan = unit_name != name and unit_name not in unit_names
            if name.endswith(TEMP_SUFFIX) or orphan:
                remove_file(os.path.join(self.directory, name))

    def create(
        self, file_index: int, first_unit_in_file: int, units: np.ndarray, timestamps: np.ndarray
    ) -> None:
        """Create a new pair holding ``units`` (UNIT records) and their ``timestamps`` from
        unit ``first_unit_in_file``: the time file first, then the unit file. Neither is
        mapped; both are remembered for the next flush."""
        assert not self._ctx.read_only
        assert len(units) == len(timestamps) > 0
        cache = self._ctx.cache
        make_directories(self.directory, cache.note_directory_changed)
        unit_path = self.unit_path(file_index)
        time_path = time_file_name(unit_path)
        MappedTimeFile.create(
            time_path, self._upf, self._interval, first_unit_in_file, first_unit_in_file, timestamps
        )
        cache.note_file_written(time_path)
        MappedUnitFile.create(unit_path, self._upf, first_unit_in_file, units)
        cache.note_file_written(unit_path)
        cache.note_directory_changed(self.directory)

    def delete(self, file_index: int) -> None:
        """Delete a pair: the unit file first. Views held by readers keep their mappings."""
        assert not self._ctx.read_only
        cache = self._ctx.cache
        cache.discard((self._serial, file_index, UNITS_KIND))
        cache.discard((self._serial, file_index, TIMES_KIND))
        remove_file(self.unit_path(file_index))
        remove_file(self.time_path(file_index))
        cache.note_directory_changed(self.directory)
