"""All ConsumeQueues of a store: ``<directory>/<topic>/<queue_id>/<files>``.

``directory`` is the store's ConsumeQueue directory (``<root>/consumequeue``). Opening
is O(1): nothing is listed or mapped until a queue is used, and a queue loads itself
(one listing and an O(log n) search) on first use, so a store with 100,000 queues opens
at once. Directories are made on a queue's first write only; a read-only store never
creates, writes or deletes anything.

Every mapped file of every queue goes through one bounded LRU (``max_open_files``), so
the number of descriptors held stays bounded however many queues are used.

Young queues keep their units in one shared unit log per topic
(``<directory>/<topic>/.shared``, mqstore.consumequeue.shared_log), opened on the
topic's first use, and graduate to files of their own (mqstore.consumequeue.queue_shared).
A young queue needs no object to be written: ``max_offset_of``,
``next_offsets_without_objects`` and ``shared_append_limits`` answer for queues without
one from the shared log and the topic's directory listing (issue 15).

Crash policy: after CommitLog recovery the store calls ``truncate_beyond`` (drop units
that point past the recovered log end) and, after retention, ``correct_min_offsets``;
both treat the shared logs first, then the queues' own files. After a power cut,
``recover_tails`` recovers the shared logs, then every queue's own files.
Durability: ``flush()`` syncs every file written since the previous flush, including
files evicted from the cache meanwhile, the shared logs' files, and the directories
that gained entries.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from types import TracebackType

import numpy as np

from mqstore.commitlog.errors import (
    ConfigError,
    InvalidArgumentError,
    InvalidTypeError,
    ReadOnlyStoreError,
    StoreClosedError,
)
from mqstore.commitlog.record import validate_topic
from mqstore.consumequeue import queue_shared
from mqstore.consumequeue.config import ConsumeQueueConfig
from mqstore.consumequeue.consume_queue import ConsumeQueue
from mqstore.consumequeue.format import SHARED_DIRECTORY
from mqstore.consumequeue.mapped_file import sync_paths
from mqstore.consumequeue.queue_files import QueueContext
from mqstore.consumequeue.shared_log import SharedRun, SharedUnitLog

__all__ = ["ConsumeQueueStore", "QUEUE_ID_MAX"]

QUEUE_ID_MAX = (1 << 31) - 1  # queue ids are int32 in the CommitLog record
# next_offsets_without_objects answers for queue ids below this at most: the CommitLog
# keeps an entry (~100 bytes) per answer, so a topic costs at most ~13 MiB up front;
# higher ids are asked one by one (max_offset_of, still no object).
SEED_QUEUES_MAX = 1 << 17


class ConsumeQueueStore:
    """The ConsumeQueues of one store. Create with ``ConsumeQueueStore.open``.

    Attributes:
        directory: the ConsumeQueue directory.
        config: the configuration.
        read_only: True for a reader beside another process's writer.
    """

    __slots__ = (
        "_ctx",
        "_logs",
        "_next_serial",
        "_on_disk",
        "_queues",
        "config",
        "directory",
        "read_only",
    )

    def __init__(self, directory: str, config: ConsumeQueueConfig, read_only: bool) -> None:
        self.directory = directory
        self.config = config
        self.read_only = read_only
        self._ctx = QueueContext(config, read_only)
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        # Writer only: per topic, the queue directories listed once and not yet loaded.
        # Only this writer creates queue directories, so a queue missing from the list
        # is known empty and skips its own listing (one syscall per new queue).
        self._on_disk: dict[str, set[str]] = {}
        self._next_serial = 0
        self._logs: dict[str, SharedUnitLog] = {}  # per topic, opened on first use

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: ConsumeQueueConfig,
        *,
        read_only: bool = False,
    ) -> ConsumeQueueStore:
        """Open the ConsumeQueues under ``directory`` (which need not exist yet).

        Raises:
            InvalidTypeError: ``config`` is not a ConsumeQueueConfig.
            ConfigError: ``directory`` exists and is not a directory.
        """
        if not isinstance(config, ConsumeQueueConfig):
            raise InvalidTypeError(f"config must be a ConsumeQueueConfig, not {type(config)}")
        path = os.path.abspath(os.fspath(directory))
        if os.path.exists(path) and not os.path.isdir(path):
            raise ConfigError(f"{path} exists and is not a directory")
        return cls(path, config, read_only)

    def __enter__(self) -> ConsumeQueueStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue (topic, queue_id), created lazily (no file until its first write).

        Raises:
            InvalidArgumentError: a bad topic name, or queue_id outside 0..2**31-1.
            InvalidTypeError: topic not a str or queue_id not an int.
            StoreClosedError: after close().
        """
        try:
            found = self._queues.get((topic, queue_id))
        except TypeError:  # unhashable: let validation below name the problem
            found = None
        if found is not None and not self._ctx.closed:
            return found
        with self._ctx.lock:
            self._check_open()
            validate_topic(topic)
            if isinstance(queue_id, bool) or not isinstance(queue_id, int):
                raise InvalidTypeError(f"queue_id must be an int, not {type(queue_id).__name__}")
            if not 0 <= queue_id <= QUEUE_ID_MAX:
                raise InvalidArgumentError(f"queue_id {queue_id} is outside [0, {QUEUE_ID_MAX}]")
            key = (topic, queue_id)
            if key not in self._queues:
                self._queues[key] = self._new_queue(topic, queue_id)
            return self._queues[key]

    def max_offset_of(self, topic: str, queue_id: int) -> int:
        """The queue's next offset, as ``queue(topic, queue_id).max_offset`` answers,
        without building its ConsumeQueue when the writer knows it has no object and no
        own files: its units, if any, are then its shared run's, and the answer is the
        run's end (0 without a run). The CommitLog asks this once per queue it appends
        to (its queue-offset table), so new queues build no object on the put path.

        Raises:
            The errors of ``queue``.
        """
        with self._ctx.lock:
            shared = self._log_of_objectless(topic, queue_id)
            if shared is not None:
                run = shared.runs.get(queue_id)
                return 0 if run is None else run.end
        return self.queue(topic, queue_id).max_offset

    def max_offsets_of(self, topic: str, queue_ids: list[int]) -> list[int]:
        """``max_offset_of`` of many queues of one topic (distinct valid ids), in one
        pass under the lock: a queue with no object and no own files answers from its
        shared run, the others from their object (built when missing).

        Raises:
            The errors of ``queue``.
        """
        ends: list[int] = []
        asked: list[int] = []  # indexes of the queues whose object answers
        with self._ctx.lock:
            if self.read_only or self._ctx.closed:
                asked = list(range(len(queue_ids)))
                ends = [0] * len(queue_ids)
            else:
                validate_topic(topic)
                runs = self.shared_log(topic).runs
                for index, (queue_id, in_log) in enumerate(
                    zip(queue_ids, self._in_log_alone(topic, queue_ids), strict=True)
                ):
                    if not in_log:
                        asked.append(index)
                        ends.append(0)
                        continue
                    run = runs.get(queue_id)
                    ends.append(0 if run is None else run.end)
        for index in asked:
            ends[index] = self.queue(topic, queue_ids[index]).max_offset
        return ends

    def next_offsets_without_objects(self, topic: str, partitions: int) -> np.ndarray:
        """``max_offset_of`` of every queue id below ``partitions`` (and SEED_QUEUES_MAX)
        that has no object and no own files, in one pass: an int64 array by queue id,
        -1 for the others (ask them one by one). Empty for a read-only or closed store.
        The CommitLog seeds its queue-offset table with this on a topic's first put,
        so a new queue's first put is a common one.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad topic name.
            CorruptDataError: the topic's shared log is damaged.
        """
        with self._ctx.lock:
            if self.read_only or self._ctx.closed or partitions <= 0:
                return np.zeros(0, dtype=np.int64)
            validate_topic(topic)
            listed = self._listing(topic)
            count = min(partitions, SEED_QUEUES_MAX)
            offsets = np.zeros(count, dtype=np.int64)
            runs = self.shared_log(topic).runs
            ids = [queue_id for queue_id in runs if queue_id < count]
            offsets[ids] = [runs[queue_id].end for queue_id in ids]
            # Dropping too many is safe: those load one by one.
            ids = [int(name) for name in listed if name.isascii() and name.isdigit()]
            ids += [queue_id for queue_topic, queue_id in self._queues if queue_topic == topic]
            offsets[[queue_id for queue_id in ids if queue_id < count]] = -1
            return offsets

    def shared_append_limits(self, topic: str, queue_ids: list[int]) -> list[int | None]:
        """Per queue id: ``ConsumeQueue.append_limit`` of a queue without an object or
        own files (the offset from which its units would go to own files), from its
        shared run alone; None for a queue with an object or own files, an invalid
        one, or all of them when sharing is off: ask its object (``queue``)."""
        units_max = self.config.shared_units_max
        if units_max == 0:
            return [None] * len(queue_ids)
        with self._ctx.lock:
            if self.read_only or self._ctx.closed:
                return [None] * len(queue_ids)
            try:
                validate_topic(topic)
            except (InvalidArgumentError, InvalidTypeError):
                return [None] * len(queue_ids)  # queue() raises them
            listed, objects = self._listing(topic), self._queues
            runs = self.shared_log(topic).runs
            if (
                not listed
                and set(map(type, queue_ids)) <= {int}
                and (not queue_ids or 0 <= min(queue_ids) <= max(queue_ids) <= QUEUE_ID_MAX)
            ):  # every id valid and no own files: no check per queue (issue 15)
                found = map(runs.get, queue_ids)
                if not objects:
                    return [units_max if run is None else run.first_offset + units_max
                            for run in found]  # fmt: skip
                return [
                    None if (topic, queue_id) in objects
                    else units_max if run is None else run.first_offset + units_max
                    for queue_id, run in zip(queue_ids, found, strict=True)
                ]  # fmt: skip
            limits: list[int | None] = []
            for queue_id in queue_ids:
                if (
                    type(queue_id) is not int
                    or not 0 <= queue_id <= QUEUE_ID_MAX
                    or (topic, queue_id) in objects
                    or (listed and str(queue_id) in listed)
                ):
                    limits.append(None)
                    continue
                run = runs.get(queue_id)
                # An empty run ends at its first offset: the queue's next offset.
                limits.append((0 if run is None else run.first_offset) + units_max)
            return limits

    def confirm_shared(
        self,
        topic: str,
        queue_ids: np.ndarray,
        queue_offsets: np.ndarray,
        commitlog_offsets: np.ndarray,
        sizes: np.ndarray,
        tag_hashes: np.ndarray,
    ) -> np.ndarray:
        """Which of these re-puts (units of queues of ``topic``, commitlog offsets
        ascending) the topic's shared unit log already holds, each as the unit at its
        offset of its queue's readable run: ``ConsumeQueue.put`` would check them and
        write nothing. One lookup for all (the re-dispatch after a SIGKILL of many
        small queues, issue 15); the caller puts the others, which raises or writes.

        Returns:
            A bool mask over the units.
        """
        assert len(queue_ids) == len(queue_offsets) == len(commitlog_offsets) == len(sizes)
        assert len(commitlog_offsets) < 2 or (np.diff(commitlog_offsets) > 0).all()
        confirmed = np.zeros(len(queue_ids), dtype=bool)
        if not len(queue_ids) or self.read_only or self.config.shared_units_max == 0:
            return confirmed
        with self._ctx.lock:
            shared = self.shared_log(topic)
            indexes, records = shared.records_at(commitlog_offsets)
            matched = (
                (indexes >= 0) & (records["size"] > 0) & (records["queue_id"] == queue_ids)
                & (records["queue_offset"] == queue_offsets) & (records["size"] == sizes)
                & (records["tag_hash"] == tag_hashes)
            )  # fmt: skip
            # Per queue its readable run: a queue with no object and no own files has
            # its run in the log (issue 15: no object per queue when 100,000 queues
            # re-dispatch); the others ask their object.
            units = np.flatnonzero(matched)
            unit_ids = queue_ids[units].tolist()
            distinct = list(dict.fromkeys(unit_ids))
            runs: dict[int, SharedRun | None] = {}
            for queue_id, in_log in zip(distinct, self._in_log_alone(topic, distinct), strict=True):
                if in_log:
                    found = shared.runs.get(queue_id)
                    runs[queue_id] = found if found is not None and len(found) else None
                else:
                    runs[queue_id] = queue_shared.shared_run(self.queue(topic, queue_id))
            held = []
            for unit, queue_id, queue_offset, index in zip(
                units.tolist(), unit_ids, queue_offsets[units].tolist(),
                indexes[units].tolist(), strict=True,
            ):  # fmt: skip
                run = runs[queue_id]
                if run is not None:  # is it the run's unit there?
                    at = queue_offset - run.first_offset
                    if 0 <= at < len(run) and run[at] == index:
                        held.append(unit)
            confirmed[held] = True
        return confirmed

    def _in_log_alone(self, topic: str, queue_ids: list[int]) -> list[bool]:
        """Under the lock, for valid ids of an open writer's valid topic: per queue,
        whether it has no object and no own files (its units, if any, are its shared
        run's), as ``_log_of_objectless`` answers one."""
        listed, objects = self._listing(topic), self._queues
        if listed:
            return [(topic, q) not in objects and str(q) not in listed for q in queue_ids]
        return [(topic, q) not in objects for q in queue_ids]

    def _log_of_objectless(self, topic: str, queue_id: int) -> SharedUnitLog | None:
        """Under the lock: the topic's shared log when (topic, queue_id) is a valid
        queue of an open writer with no object yet and no directory on disk (only this
        writer creates queue directories, and only through the queue's object, so the
        listing taken once per topic stays true); else None."""
        if self.read_only or self._ctx.closed:
            return None
        if type(queue_id) is not int or not 0 <= queue_id <= QUEUE_ID_MAX:
            return None  # queue() raises the typed error
        try:
            if (topic, queue_id) in self._queues:
                return None
        except TypeError:  # an unhashable topic: queue() says what is wrong
            return None
        validate_topic(topic)
        if str(queue_id) in self._listing(topic):
            return None
        return self.shared_log(topic)

    def _listing(self, topic: str) -> set[str]:
        """Writer: the topic's queue directories not loaded yet, listed once."""
        listed = self._on_disk.get(topic)
        if listed is None:
            listed = self._on_disk[topic] = set(_list_directory(self.directory + os.sep + topic))
        return listed

    def _new_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        topic_directory = self.directory + os.sep + topic
        known_empty = False
        if not self.read_only:
            listed = self._listing(topic)
            known_empty = str(queue_id) not in listed
            listed.discard(str(queue_id))
        directory = topic_directory + os.sep + str(queue_id)
        queue = ConsumeQueue(
            self._ctx, topic, queue_id, directory, self._next_serial,
            known_empty=known_empty, shared=self.shared_log(topic),
        )  # fmt: skip
        self._next_serial += 1
        return queue

    def shared_log(self, topic: str, *, lenient: bool = False) -> SharedUnitLog:
        """The topic's shared unit log, opened (and loaded) on first use.

        ``lenient``: (re)open it for power-cut recovery (see SharedUnitLog.open).

        Raises:
            CorruptDataError: the log's files are damaged.
        """
        shared = self._logs.get(topic)
        if shared is None or lenient:
            if shared is not None:
                shared.close()
            shared = SharedUnitLog.open(
                os.path.join(self.directory, topic, SHARED_DIRECTORY),
                self.config.units_per_file,
                read_only=self.read_only,
                lenient=lenient,
            )
            self._logs[topic] = shared
        return shared

    def existing_queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue_id) with a directory on disk or units in (or an end
        remembered by) its topic's shared log, sorted. Entries whose name is not a
        valid topic or a canonical queue id are not ours and are skipped."""
        found = set(self._queues_with_files())
        for topic in self._topics_with_logs():
            found.update((topic, queue_id) for queue_id in self.shared_log(topic).runs)
        return sorted(found)

    def _queues_with_files(self) -> list[tuple[str, int]]:
        """Every (topic, queue_id) with a directory on disk, sorted."""
        self._check_open()
        found = []
        for topic in self._topics():
            for name in _list_directory(os.path.join(self.directory, topic)):
                if name.isdigit() and str(int(name)) == name and int(name) <= QUEUE_ID_MAX:
                    found.append((topic, int(name)))
        found.sort()
        return found

    def _topics(self) -> list[str]:
        topics = []
        for topic in _list_directory(self.directory):
            try:
                validate_topic(topic)
            except InvalidArgumentError:
                continue
            topics.append(topic)
        return sorted(topics)

    def _topics_with_logs(self) -> list[str]:
        """Topics whose shared log directory exists (or is open)."""
        self._check_open()
        return sorted(
            {
                topic
                for topic in self._topics()
                if os.path.isdir(os.path.join(self.directory, topic, SHARED_DIRECTORY))
            }
            | set(self._logs)
        )

    def recover_tails(
        self,
        commitlog_claim: int,
        commitlog_min: int,
        verify: Callable[[str, int, int, int, int], bool],
    ) -> tuple[int, int | None]:
        """After a power cut, every queue keeps only the units the checkpoint vouches
        for (``ConsumeQueue.recover_tail``); ``verify(topic, queue_id, commitlog_offset,
        size, queue_offset)`` confirms a unit against its CommitLog record. Loads every
        queue on disk, with one record read for a queue the cut did not touch.

        Returns:
            (units dropped over all queues, rebuild_from): re-dispatch from the claim
            rebuilds dropped units; ``rebuild_from`` (None, or the smallest over the
            queues) is where it must start instead when whole files were dropped.
        """
        if self.read_only:
            raise ReadOnlyStoreError("the ConsumeQueue store is open read-only")
        dropped, rebuild_from = 0, None
        for topic in self._topics_with_logs():
            topic_verify = partial(_verify_shared, verify, topic)
            shared = self.shared_log(topic, lenient=True)
            dropped += shared.recover_tail(commitlog_claim, commitlog_min, topic_verify)
            self._forget_loaded(topic)
        for topic, queue_id in self._queues_with_files():
            queue = self.queue(topic, queue_id)
            units, start = queue.recover_tail(
                commitlog_claim,
                commitlog_min,
                partial(verify, topic, queue_id),
            )
            dropped += units
            if start is not None:
                rebuild_from = start if rebuild_from is None else min(rebuild_from, start)
        return dropped, rebuild_from

    def truncate_beyond(self, commitlog_end: int) -> None:
        """After CommitLog recovery: every queue drops the units whose commitlog_offset
        is >= ``commitlog_end``. Loads every queue on disk (O(queues * log n)).

        Raises:
            ReadOnlyStoreError: the store is read-only.
        """
        if self.read_only:
            raise ReadOnlyStoreError("the ConsumeQueue store is open read-only")
        for topic in self._topics_with_logs():
            self.shared_log(topic).truncate_beyond(commitlog_end)
        for topic, queue_id in self._queues_with_files():
            self.queue(topic, queue_id).truncate_beyond_commitlog(commitlog_end)

    def correct_min_offsets(self, commitlog_min: int) -> None:
        """After retention: every queue's min offset becomes its first unit whose
        commitlog_offset is >= ``commitlog_min``; files wholly below it are deleted
        (never a queue's newest file, nor a shared log's). Read-only: min offsets move,
        nothing is deleted."""
        with self._ctx.lock:
            for topic in self._topics_with_logs():
                self.shared_log(topic).correct_min_offsets(commitlog_min)
        for topic, queue_id in self._queues_with_files():
            self.queue(topic, queue_id).correct_min_offset(commitlog_min)

    def flush(self) -> None:
        """Make every unit written so far durable (no-op when read-only)."""
        self._check_open()
        if not self.read_only:
            self._ctx.cache.flush()
            with self._ctx.lock:  # what to sync; the syncs outside: dispatch goes on
                taken = [shared.take_unsynced() for shared in list(self._logs.values())]
            for files, directories in taken:
                sync_paths(files, directories)

    def sync_everything(self) -> None:
        """Make every file and directory of the ConsumeQueue tree durable, written by
        this process or not (``FileCache.sync_tree``: after an unclean stop). The
        caller flushes too (``flush``), which clears this process's own lists."""
        self._check_open()
        if not self.read_only:
            self._ctx.cache.sync_tree(self.directory)

    def close(self) -> None:
        """Flush (writer), then drop every mapping. Idempotent. Views handed out by
        get_range stay valid; queues obtained earlier raise StoreClosedError.

        Raises:
            DiskFullError, StoreError: the final flush failed (the store is closed anyway;
                what was written stays in the page cache for the kernel to write back).
        """
        with self._ctx.lock:
            if self._ctx.closed:
                return
        try:
            if not self.read_only:
                self._ctx.cache.flush()
                with self._ctx.lock:
                    for shared in self._logs.values():
                        shared.flush()
        finally:  # a failed flush still closes: the kernel writes the pages back later
            with self._ctx.lock:
                self._ctx.closed = True
                self._ctx.cache.close()
                for shared in self._logs.values():
                    shared.close()
                self._logs.clear()
                self._queues.clear()

    @property
    def open_files(self) -> int:
        """Mapped files held by the cache and the shared logs now (each holds one file
        descriptor)."""
        return len(self._ctx.cache) + sum(shared.open_files for shared in self._logs.values())

    def _forget_loaded(self, topic: str) -> None:
        """The topic's log was reopened: its queues take the new one and reload."""
        shared = self._logs[topic]
        for (queue_topic, _), queue in self._queues.items():
            if queue_topic == topic:
                queue._shared = shared
                queue._loaded = False

    def _check_open(self) -> None:
        if self._ctx.closed:
            raise StoreClosedError("the ConsumeQueue store is closed")


def _verify_shared(
    verify: Callable[[str, int, int, int, int], bool],
    topic: str,
    queue_id: int,
    commitlog_offset: int,
    size: int,
    queue_offset: int,
) -> bool:
    return verify(topic, queue_id, commitlog_offset, size, queue_offset)


def _list_directory(path: str) -> list[str]:
    try:
        return [entry.name for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
