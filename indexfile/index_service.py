"""All index files of one store: ``<root>/index/<yyyyMMddHHmmssSSS>``.

The service appends key entries to the newest file, starts a new file when it is
full (or when a time delta would overflow its i32), answers key queries across
files newest first, truncates after CommitLog recovery and deletes old files for
retention. The file format is in ``mqstore.indexfile.format``; one file's invariants and
write order are in ``mqstore.indexfile.index_file``.

Invariants:
- files sort by name in creation order (a clashing name is bumped by 1 ms), and
  their physical offset ranges are disjoint and increasing in that order;
- a message's entries (one per distinct key hash) live in one file, and messages
  are indexed in increasing physical offset order with store times that never go
  back by a whole second, so within a chain time deltas never increase going back.

Queries are candidates, not answers: the index stores 31-bit hashes and times to
the second, so a hit requires the caller's ``verify(physical_offset)`` to read the
real record and check its topic, key and store timestamp (the fix for
apache/rocketmq#3613). Time filtering in the index is conservative: an entry known
to lie in [t, t + 999] ms is a candidate if that interval meets the query range.

Crash policy: appends are idempotent (a message at or below ``last_physical_offset``
is skipped), so re-dispatch after a crash rebuilds what is missing. A writer's open
repairs slots of the newest file left past its index count by a killed append or
truncation. After a power loss the store truncates back to its checkpointed
dispatched position (``truncate_beyond``), which it recorded only after ``flush``.

Threads: one lock serialises writers and file-list changes; a query walks a snapshot
of the file list without the lock (entries are published after they are written, and
a file removed meanwhile stays mapped until the walk drops it).

Read-only services never create or write anything. They share the writer's pages
(MAP_SHARED), re-read each file's index count on every query, and re-list the
directory when its mtime changed or when the last listing may have raced a change
(made less than a second after the mtime it saw: a change within the same mtime
tick would leave the mtime as it was).
"""

from __future__ import annotations

import logging
import operator
import os
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Final

import numpy as np

from mqstore.commitlog.durable import fsync_directory, makedirs_durable
from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    InvalidTypeError,
    LimitExceededError,
    ReadOnlyStoreError,
    StoreClosedError,
)
from mqstore.indexfile.config import IndexConfig
from mqstore.indexfile.format import (
    HEADER_FIELD_POSITION,
    TIME_GRANULARITY_MS,
    entry_capacity,
    key_hash,
    next_file_name,
    parse_file_name,
)
from mqstore.indexfile.index_file import TEMP_SUFFIX, IndexFile

__all__ = ["IndexService"]

log = logging.getLogger(__name__)

RACY_LISTING_WINDOW_NS: Final = 1_000_000_000  # a listing this close to the mtime may miss
# a change made in the same mtime tick; re-list until the directory has been quiet this long


class IndexService:
    """The index of one store: its files, oldest first.

    Use ``IndexService.open``; close it (or use it as a context manager) when done.
    """

    __slots__ = (
        "_closed",
        "_files",
        "_last_offset",
        "_last_ts_min_ms",
        "_listed_at_ns",
        "_listed_mtime_ns",
        "_lock",
        "config",
        "directory",
        "dropped_files",
        "read_only",
    )

    def __init__(self, directory: str, config: IndexConfig, read_only: bool) -> None:
        """Use ``open``."""
        self.directory = directory
        self.config = config
        self.read_only = read_only
        self._files: list[IndexFile] = []
        self._lock = threading.Lock()
        self._closed = False
        self._last_offset = -1  # physical offset of the newest indexed message
        self.dropped_files = 0  # newest files deleted at open after a power cut
        self._last_ts_min_ms = -1  # lowest store time the newest entry can have
        self._listed_mtime_ns = -1
        self._listed_at_ns = -1

    @classmethod
    def open(
        cls,
        directory: str,
        config: IndexConfig,
        *,
        read_only: bool = False,
        drop_damaged: bool = False,
    ) -> IndexService:
        """Open (a writer also creates) the index directory and every file in it.

        Args:
            directory: ``<root>/index``.
            config: shapes new files only; existing files keep their own sizes.
            read_only: never create or write; see entries a writer adds later.
            drop_damaged: (a writer only) a file that does not validate (after a power
                cut, one written since the checkpoint's flush may have a torn header) is
                deleted with every newer file (``dropped_files`` counts them), and the
                caller re-dispatches from ``last_physical_offset`` (put skips what the
                remaining files hold): the index is derived data, which the CommitLog
                rebuilds.

        Raises:
            CorruptDataError: a file has a bad prefix, header or size, or files
                overlap in physical offsets.
        """
        service = cls(os.fspath(directory), config, read_only)
        if not read_only:
            makedirs_durable(service.directory)
            _remove_temp_files(service.directory)
        while True:
            try:
                service._relist()
                break
            except CorruptDataError as error:
                if read_only or not drop_damaged:
                    raise
                service._drop_from(error)
        if not read_only and service._files:
            service._files[-1].repair_slots()
        service._load_last()
        return service

    # ------------------------------------------------------------------ writes

    def put(self, topic: str, keys: Sequence[str], physical_offset: int, store_ts_ms: int) -> None:
        """Index one message: an entry per distinct key hash, all in one file.

        Idempotent: a message at or below ``last_physical_offset`` is skipped (a
        re-dispatch after a crash). A message without keys is not indexed.

        Raises:
            InvalidArgumentError: a bad topic, a negative offset or time, or a store
                time more than a second before the newest indexed entry's.
            LimitExceededError: more distinct keys than a whole file holds.
            ReadOnlyStoreError, StoreClosedError.
        """
        hashes = _message_hashes(topic, keys)
        physical_offset, store_ts_ms = _check_position(physical_offset, store_ts_ms)
        with self._lock:
            self._check_writable()
            if physical_offset <= self._last_offset or not hashes:
                return
            self._check_time_order(store_ts_ms)
            file = self._newest_with_room(len(hashes), store_ts_ms, pending=_Pending())
            file.append(hashes, physical_offset, store_ts_ms)
            self._last_offset = physical_offset
            self._last_ts_min_ms = file.newest_ts_min_ms()

    def put_batch(
        self,
        topics: Sequence[str],
        keys: Sequence[Sequence[str]],
        physical_offsets: Sequence[int],
        store_ts_ms: Sequence[int],
    ) -> None:
        """Index many messages at once; message ``i`` is ``(topics[i], keys[i],
        physical_offsets[i], store_ts_ms[i])``. The files end exactly as after
        ``put`` per message, with one numpy write per file instead of one per entry.

        Messages come in physical offset order (the dispatcher's). On an error,
        the messages before the bad one stay indexed.

        Raises:
            InvalidArgumentError: sequences of different lengths, or as ``put``.
            LimitExceededError, ReadOnlyStoreError, StoreClosedError: as ``put``.
        """
        if not len(topics) == len(keys) == len(physical_offsets) == len(store_ts_ms):
            raise InvalidArgumentError("put_batch needs sequences of one length")
        messages = [
            (_message_hashes(topic, message_keys), *_check_position(offset, ts_ms))
            for topic, message_keys, offset, ts_ms in zip(
                topics, keys, physical_offsets, store_ts_ms, strict=True
            )
        ]
        with self._lock:
            self._check_writable()
            if self._put_batch_at_once(messages):
                return
            pending = _Pending()
            file = self._files[-1] if self._files else None
            try:
                for hashes, physical_offset, ts_ms in messages:
                    if physical_offset <= self._last_offset or not hashes:
                        continue
                    self._check_time_order(ts_ms)
                    file = self._newest_with_room(len(hashes), ts_ms, pending)
                    pending.add(hashes, physical_offset, ts_ms)
                    self._last_offset = physical_offset
                    self._last_ts_min_ms = pending.ts_min_ms(file, ts_ms)
            finally:
                if file is not None:
                    pending.write_to(file)

    def _put_batch_at_once(self, messages: list[tuple[list[int], int, int]]) -> bool:
        """The dispatcher's common case in one numpy write: every message is new,
        times do not go back, and all entries fit the newest file. Returns False
        (nothing written) when any of that does not hold; put_batch then goes
        message by message."""
        if not messages or not self._files:
            return False
        newest = self._files[-1]
        first_offset, first_ts_ms = messages[0][1], messages[0][2]
        last_ts_ms = messages[-1][2]
        if first_offset <= self._last_offset or first_ts_ms < self._last_ts_min_ms:
            return False
        if not newest.index_count or not newest.delta_fits(last_ts_ms):
            return False
        hashes: list[int] = []
        offsets: list[int] = []
        stamps: list[int] = []
        previous_offset, previous_ts_ms = self._last_offset, first_ts_ms
        for message_hashes, physical_offset, ts_ms in messages:
            if physical_offset <= previous_offset or ts_ms < previous_ts_ms or not message_hashes:
                return False
            hashes.extend(message_hashes)
            offsets.extend([physical_offset] * len(message_hashes))
            stamps.extend([ts_ms] * len(message_hashes))
            previous_offset, previous_ts_ms = physical_offset, ts_ms
        if len(hashes) > newest.remaining:
            return False
        newest.append_batch(
            np.array(hashes, dtype=np.int64),
            np.array(offsets, dtype=np.int64),
            np.array(stamps, dtype=np.int64),
        )
        self._last_offset = previous_offset
        self._last_ts_min_ms = newest.newest_ts_min_ms()
        return True

    def _newest_with_room(self, key_count: int, store_ts_ms: int, pending: _Pending) -> IndexFile:
        """The newest file if ``key_count`` more entries (after ``pending``) fit and
        the time delta is representable, else a new file (``pending`` written first)."""
        if self._files:
            newest = self._files[-1]
            base_ts_ms = pending.first_ts_ms()
            fits = newest.remaining - len(pending) >= key_count
            if fits and newest.delta_fits(store_ts_ms, base_ts_ms):
                return newest
            pending.write_to(newest)
        if key_count > entry_capacity(self.config.entry_count):
            raise LimitExceededError(
                f"a message with {key_count} distinct keys does not fit an index file of "
                f"{entry_capacity(self.config.entry_count)} entries"
            )
        return self._roll()

    def _roll(self) -> IndexFile:
        """Create the next file, named by the wall clock (bumped past the newest)."""
        newest_name = self._files[-1].name if self._files else None
        name = next_file_name(time.time_ns() // 1_000_000, newest_name)
        file = IndexFile.create(
            self.directory, name, self.config.slot_count, self.config.entry_count
        )
        self._files.append(file)
        return file

    def _check_time_order(self, store_ts_ms: int) -> None:
        if store_ts_ms < self._last_ts_min_ms:
            raise InvalidArgumentError(
                f"store timestamp {store_ts_ms} ms goes back past the second of the newest "
                f"indexed entry ({self._last_ts_min_ms} ms); the CommitLog never does this"
            )

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"index {self.directory} is closed")
        if self.read_only:
            raise ReadOnlyStoreError(f"index {self.directory} is open read-only")

    # ------------------------------------------------------------------ queries

    def query(
        self,
        topic: str,
        key: str,
        begin_ts_ms: int,
        end_ts_ms: int,
        max_results: int,
        verify: Callable[[int], bool],
    ) -> list[int]:
        """Physical offsets of messages of ``topic`` carrying ``key`` with a store
        time in [begin_ts_ms, end_ts_ms], newest first, at most ``max_results``.

        Each file whose time range meets the query is walked, newest file first,
        along the key's chain from newest to oldest. ``verify(physical_offset)``
        decides each candidate (hash equal, time possibly in range: see the module
        docstring); it must check the real topic, key and store timestamp. A message
        is offered to ``verify`` once: ``put`` stores one entry per distinct hash.

        Raises:
            InvalidArgumentError: a bad topic, ``max_results`` < 1, or begin > end.
            StoreClosedError.
        """
        target_hash = key_hash(topic, key)
        begin_ts_ms, end_ts_ms = operator.index(begin_ts_ms), operator.index(end_ts_ms)
        if operator.index(max_results) < 1:
            raise InvalidArgumentError(f"max_results must be at least 1, not {max_results}")
        if begin_ts_ms > end_ts_ms:
            raise InvalidArgumentError(f"time range [{begin_ts_ms}, {end_ts_ms}] is reversed")
        results: list[int] = []
        for file in reversed(self._snapshot()):
            if not file.overlaps(begin_ts_ms, end_ts_ms):
                continue
            for physical_offset in file.candidates(target_hash, begin_ts_ms, end_ts_ms):
                if verify(physical_offset):
                    results.append(physical_offset)
                    if len(results) >= max_results:
                        return results
        return results

    @property
    def last_physical_offset(self) -> int:
        """Physical offset of the newest indexed message; -1 when nothing is indexed.

        Dispatch resumes after it: ``put`` skips any message at or below it.
        """
        if not self.read_only:
            with self._lock:
                self._check_open()
                return self._last_offset
        for file in reversed(self._snapshot()):
            physical_offset = file.published_end_offset()
            if physical_offset >= 0:
                return physical_offset
        return -1

    @property
    def file_names(self) -> list[str]:
        """Names of the files, oldest first (as of the last listing for a reader)."""
        return [file.name for file in self._snapshot()]

    def _snapshot(self) -> tuple[IndexFile, ...]:
        with self._lock:
            self._check_open()
            if self.read_only:
                self._refresh()
            return tuple(self._files)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"index {self.directory} is closed")

    def _refresh(self) -> None:
        """Reader: re-list the directory if it may have changed since the last look."""
        try:
            mtime_ns = os.stat(self.directory).st_mtime_ns
        except FileNotFoundError:
            mtime_ns = -1
        racy = self._listed_at_ns - self._listed_mtime_ns < RACY_LISTING_WINDOW_NS
        if mtime_ns != self._listed_mtime_ns or racy:
            self._relist()

    def _drop_from(self, error: CorruptDataError) -> None:
        """Delete the file ``error`` names and every newer one (files written since the
        checkpoint's flush: the newest, and the one before it if the index rolled since);
        re-raise if ``error`` names no file of this directory."""
        names = sorted(n for n in os.listdir(self.directory) if parse_file_name(n) is not None)
        paths = [os.path.join(self.directory, name) for name in names]
        if error.path not in paths:
            raise error
        for path in reversed(paths[paths.index(error.path) :]):  # newest first
            log.warning("dropping index file %s after a power cut: %s", path, error)
            os.unlink(path)
            self.dropped_files += 1
        fsync_directory(self.directory)

    def _relist(self) -> None:
        """List the directory; keep mapped files still listed, open new ones.

        Raises:
            CorruptDataError: a new file is corrupt, or the files overlap.
        """
        listed_at_ns = time.time_ns()  # taken first: a change after it shows as racy
        try:
            mtime_ns = os.stat(self.directory).st_mtime_ns
            names = sorted(n for n in os.listdir(self.directory) if parse_file_name(n) is not None)
        except FileNotFoundError:
            mtime_ns, names = -1, []
        known = {file.name: file for file in self._files}
        files: list[IndexFile] = []
        try:
            for name in names:
                file = known.get(name) or _open_if_present(self.directory, name, self.read_only)
                if file is not None:
                    files.append(file)
            _check_offsets_ordered(files)
        except BaseException:
            for file in files:
                if file.name not in known:
                    file.close()
            raise
        self._files = files
        self._listed_mtime_ns, self._listed_at_ns = mtime_ns, listed_at_ns

    def _load_last(self) -> None:
        """Writer: remember the newest indexed offset and time from the files."""
        self._last_offset, self._last_ts_min_ms = -1, -1
        for file in reversed(self._files):
            if file.index_count:
                self._last_offset = file.end_offset
                self._last_ts_min_ms = file.newest_ts_min_ms()
                return

    # ----------------------------------------------------- truncation, retention

    def recover_tail(
        self, physical_claim: int, physical_min: int, verify: Callable[[int, int], bool]
    ) -> int:
        """After a power cut: keep the entries the checkpoint vouches for, drop the rest.

        Entries of records before ``physical_claim`` (the checkpoint's dispatched
        position) were synced before the checkpoint was written: a prefix of the index,
        intact. Later entries may be torn or zero while the header, a sector of its own,
        already counts them. From the newest file back, the newest intact entry is the
        first one ``verify(key_hash, physical_offset)`` confirms against the CommitLog
        (one read when the cut spared the index); a file with none is deleted, the file
        holding it is truncated after it (an empty file is deleted too, so it cannot
        hide torn entries of the file before it), and whatever lies past its count is
        zeroed (``IndexFile.clear_past_count``). Re-dispatch from the claim puts the
        rest back.

        Returns:
            How many entries were dropped.
        """
        dropped = 0
        with self._lock:
            self._check_writable()
            cleared = 0
            while self._files:
                newest = self._files[-1]
                count = newest.index_count
                keep = newest.intact_end(physical_claim, physical_min, verify)
                dropped += count - keep
                if keep == 0:  # an empty file too: the one before may hold torn entries
                    self._files.pop()
                    newest.unlink()
                    continue
                if keep < count:
                    newest.truncate_from(keep + 1)
                    newest.rebuild_slots()  # slots may still name the torn entries
                else:
                    newest.repair_slots()  # open repaired only the newest file
                # Entries past the count are stale; zeroed now (and flushed before the
                # checkpoint's next claim), no later cut can count them again.
                cleared = newest.clear_past_count()
                break
            self._load_last()
        if dropped:
            log.warning("index: dropped %d entries past the checkpoint's claim", dropped)
        if cleared:
            log.warning("index: cleared %d stale entries past the index count", cleared)
        return dropped

    def truncate_beyond(self, physical_end: int) -> None:
        """Remove every entry whose physical offset is >= ``physical_end`` (after
        CommitLog recovery cut the log there). Files wholly beyond are deleted, newest
        first; in the one file that straddles the cut, a binary search finds the
        first removed entry (entries are in offset order) and the file is truncated.

        Raises:
            InvalidArgumentError: a negative ``physical_end``.
            ReadOnlyStoreError, StoreClosedError.
        """
        physical_end = operator.index(physical_end)
        if physical_end < 0:
            raise InvalidArgumentError(f"physical_end must be >= 0, not {physical_end}")
        with self._lock:
            self._check_writable()
            while self._files:
                newest = self._files[-1]
                if newest.index_count == 0 or newest.header().begin_offset >= physical_end:
                    self._files.pop()
                    newest.unlink()  # a running query keeps its mapping until it is done
                    continue
                first = newest.first_entry_at_or_beyond(physical_end)
                if first <= newest.index_count:
                    newest.truncate_from(first)
                break
            self._load_last()

    def delete_files_before(self, physical_min: int) -> int:
        """Retention: delete the oldest files whose newest entry is below
        ``physical_min`` (and empty old files); never the newest file.

        Returns:
            How many files were deleted.
        """
        physical_min = operator.index(physical_min)
        deleted = 0
        with self._lock:
            self._check_writable()
            while len(self._files) > 1:
                oldest = self._files[0]
                if oldest.index_count and oldest.end_offset >= physical_min:
                    break
                self._files.pop(0)
                oldest.unlink()  # a running query keeps its mapping until it is done
                deleted += 1
        return deleted

    # --------------------------------------------------------------- lifecycle

    def flush(self) -> None:
        """msync every file an append or truncation dirtied since the last flush."""
        with self._lock:
            self._check_open()
            for file in self._files:
                file.flush()

    def close(self) -> None:
        """Flush (writer) and unmap every file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            files, self._files = self._files, []
            for file in files:
                file.close()

    def __enter__(self) -> IndexService:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "writer"
        return f"IndexService({self.directory!r}, {len(self._files)} files, {mode})"


class _Pending:
    """Entries of ``put_batch`` gathered for one file, written with one numpy call."""

    __slots__ = ("hashes", "offsets", "ts_ms")

    def __init__(self) -> None:
        self.hashes: list[int] = []
        self.offsets: list[int] = []
        self.ts_ms: list[int] = []

    def __len__(self) -> int:
        return len(self.hashes)

    def add(self, hashes: list[int], physical_offset: int, store_ts_ms: int) -> None:
        self.hashes.extend(hashes)
        self.offsets.extend([physical_offset] * len(hashes))
        self.ts_ms.extend([store_ts_ms] * len(hashes))

    def first_ts_ms(self) -> int | None:
        return self.ts_ms[0] if self.ts_ms else None

    def ts_min_ms(self, file: IndexFile, store_ts_ms: int) -> int:
        """The lowest time an entry at ``store_ts_ms`` will read back as in ``file``."""
        base_ts_ms = file.begin_ts_ms if file.index_count else self.ts_ms[0]
        delta_s = (store_ts_ms - base_ts_ms) // TIME_GRANULARITY_MS
        return base_ts_ms + delta_s * TIME_GRANULARITY_MS

    def write_to(self, file: IndexFile) -> None:
        if self.hashes:
            file.append_batch(
                np.array(self.hashes, dtype=np.int64),
                np.array(self.offsets, dtype=np.int64),
                np.array(self.ts_ms, dtype=np.int64),
            )
        self.hashes, self.offsets, self.ts_ms = [], [], []


def _message_hashes(topic: str, keys: Sequence[str]) -> list[int]:
    """The distinct key hashes of one message, in key order (validates the keys)."""
    if isinstance(keys, str | bytes):
        raise InvalidTypeError("keys must be a sequence of str, not a single str or bytes")
    return list(dict.fromkeys(key_hash(topic, key) for key in keys))


def _check_position(physical_offset: int, store_ts_ms: int) -> tuple[int, int]:
    physical_offset, store_ts_ms = operator.index(physical_offset), operator.index(store_ts_ms)
    if physical_offset < 0:
        raise InvalidArgumentError(f"physical_offset must be >= 0, not {physical_offset}")
    if store_ts_ms < 0:
        raise InvalidArgumentError(f"store_ts_ms must be >= 0, not {store_ts_ms}")
    return physical_offset, store_ts_ms


def _open_if_present(directory: str, name: str, read_only: bool) -> IndexFile | None:
    """Open a listed file; None if it vanished since the listing (retention)."""
    try:
        return IndexFile.open(os.path.join(directory, name), read_only=read_only)
    except FileNotFoundError:
        return None


def _check_offsets_ordered(files: Sequence[IndexFile]) -> None:
    """Non-empty files must cover increasing, disjoint physical offset ranges."""
    previous_end = -1
    for file in files:
        if not file.published_count():
            continue
        header = file.header()
        if header.begin_offset <= previous_end:
            raise CorruptDataError(
                file.path,
                HEADER_FIELD_POSITION["begin_offset"],
                f"begins at offset {header.begin_offset}, not after {previous_end} "
                "where the previous file ends",
            )
        previous_end = header.end_offset


def _remove_temp_files(directory: str) -> None:
    """A writer's open: drop files a crash left half created."""
    for name in os.listdir(directory):
        if name.endswith(TEMP_SUFFIX):
            os.unlink(os.path.join(directory, name))
