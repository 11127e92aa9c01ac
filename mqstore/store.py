"""MessageStore: the facade that composes the CommitLog, ConsumeQueues, IndexFiles,
the dispatcher and the periodic services of one store directory.

On disk (one store = one directory)::

    <root>/lock          exclusive writer lock (flock)
    <root>/abort         present while a writer has the store open
    <root>/checkpoint    flushed and dispatched positions (two checksummed slots)
    <root>/topics        topic metadata (atomic JSON)
    <root>/layout        layout and defaults recorded at creation (mqstore.layout)
    <root>/commitlog/    the CommitLog files
    <root>/consumequeue/ per topic and queue
    <root>/index/        key index files
    <root>/offsets/      consumer offsets of an older version, imported into the log at
                         open (records of __consumer_offsets: mqstore.offsets_log)
    <root>/inbox/        spool files other processes hand to the writer (mqstore.inbox)
    <root>/notify        the dispatch sequence followers sleep on (dispatch/notify.py)

Open (writer): take the lock, mark ``abort``, load the checkpoint, recover the
CommitLog from min(flushed, dispatched), truncate ConsumeQueue units and index
entries that point past the recovered end, re-dispatch from the dispatched position
(idempotent), then start the dispatcher, the flush service and the scheduled jobs
(checkpoint every second; retention). Close reverses it and removes ``abort``. After
a crash the re-dispatch mostly happens during the CommitLog's recovery scan, run by
run as records verify (dispatch/scan_dispatch.py: its module says when, and how the
truncation after the scan covers what it wrote past the end).

Open (read-only): no lock, no writes; the store follows a live writer in another
process through the ConsumeQueues it dispatches (shared page cache). Its long polls
sleep on the writer's dispatch sequence (``notify``, futex(2)); without that file (an
older writer) they poll every millisecond.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from mqstore import retention
from mqstore.commitlog.checkpoint import Checkpoint, CheckpointFile
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.durable import makedirs_durable
from mqstore.commitlog.errors import (
    CorruptDataError,
    DispatchFailedError,
    FlushFailedError,
    InvalidArgumentError,
    InvalidTypeError,
    OffsetOutOfRangeError,
    StoreClosedError,
    StoreError,
    UnknownTopicError,
)
from mqstore.commitlog.lock import (
    StoreLock,
    clear_abort,
    mark_abort,
    power_loss_possible,
    read_abort,
)
from mqstore.commitlog.record import validate_topic
from mqstore.commitlog_engine import CommitLogEngine
from mqstore.compaction import (
    COMPACTION_DIR,
    COPY_INTERVAL_MS,
    CompactionLogs,
    CopyReader,
)
from mqstore.config import StoreConfig
from mqstore.consumequeue import ConsumeQueueConfig, ConsumeQueueStore
from mqstore.consumequeue.queue_time import TimeProbe
from mqstore.dispatch.dispatcher import Dispatcher
from mqstore.dispatch.notify import Follower, Notifier
from mqstore.inbox import INBOX_DIR, Inbox
from mqstore.indexfile import IndexConfig, IndexService
from mqstore.layout import resolve_config
from mqstore.message import Message, PutResult
from mqstore.reader import StoreReader
from mqstore.reader import check_count as _check_count
from mqstore.reader import check_offset as _check_offset
from mqstore.room import check_room_for_first_files
from mqstore.services import Scheduler
from mqstore.store_recovery import StoreRecovery
from mqstore.store_replica import ReplicaStore
from mqstore.store_retention import StoreRetention
from mqstore.store_write import StoreWriter, check_queue_id
from mqstore.topics import TopicRegistry

__all__ = ["MessageStore"]

log = logging.getLogger(__name__)

QUERY_RESULTS_MAX = 1_000  # one key query returns at most this many messages
READ_ONLY_POLL_S = 0.001
# A follower's longest sleep on ``notify``: a writer that stopped bumping it (killed,
# or an older version that reopened the store) is noticed within this.
FOLLOW_SLICE_S = 0.05
READ_ONLY_RELOADS_MAX = 3  # a reader retries this often when the writer removed files


class MessageStore(
    StoreWriter, CommitLogEngine, StoreReader, ReplicaStore, StoreRecovery, StoreRetention
):
    """An embedded, persistent message store. Build with ``MessageStore.open``.

    Its parts live in mixins: writes in mqstore.store_write, reads (``get``,
    ``get_batch``) in mqstore.reader, the open's recovery of ConsumeQueues and the
    index in mqstore.store_recovery, retention in mqstore.store_retention, a
    follower's side in mqstore.store_replica; it is also an engine for the
    Kafka-style adapter (see ``CommitLogEngine``)."""

    def __init__(self, root: str, config: StoreConfig, read_only: bool) -> None:
        self.root = root
        self.config = config
        self.read_only = read_only
        self._closed = False
        self._lock: StoreLock | None = None
        self._checkpoint_file: CheckpointFile | None = None
        self._checkpoint = Checkpoint()
        self._derived_flushed_at = -float("inf")  # monotonic s of the last derived flush
        self.derived_sync_failure: Exception | None = None  # freezes the dispatched claim
        self._derived_unsynced = False  # an unclean stop's writes not synced yet (_recover)
        self._redispatched_from = 0  # where the open's re-dispatch started (_recover_derived)
        self.redispatched_at_open = 0  # records the open re-dispatched (during the scan too)
        self._checkpoint_guard = threading.Lock()
        self._dispatcher: Dispatcher | None = None
        self._notifier: Notifier | None = None  # writers: bumps ``notify`` after rounds
        self._follower: Follower | None = None  # read-only: sleeps on ``notify``
        self._scheduler: Scheduler | None = None
        self.recovered_from_crash = False
        self.power_loss_possible = False  # an unclean stop that may have lost the page cache
        self._rebuild_derived = False
        self._open_replicated = False  # open(replicated=True): see held_at_open
        self.held_at_open: int | None = None
        self._retention: retention.RetentionService | None = None
        self._described = {}  # describe_topic's cache (CommitLogEngine)
        self._topic_guard = threading.Lock()  # serializes auto-creation (CommitLogEngine)
        self.inbox: Inbox | None = None  # writers only: appends other processes' spool files
        # put's fast path: per topic checked once, its partitions then (see _check_put);
        # empty when not writable. One entry per topic, not per queue (issue 15).
        self._put_topics: dict[str, int] = {}
        self._help_dispatch_past = 0  # put calls _help_dispatch_if_behind past this position
        self._putter: Any = None  # NATIVE.Putter: put in one C call (_install_put)
        self._append: Callable[..., PutResult]  # commitlog.append, bound once
        # Compacted topics' copies: the writer's, or a read-only view of them.
        self._compaction: CompactionLogs | CopyReader | None = None
        self._clock_ms: Callable[[], int] = _wall_clock_ms
        self._disk_usage: Callable[[], float] = _no_disk_usage
        self.open_ms = 0.0
        self.commitlog: CommitLog
        self.consume_queues: ConsumeQueueStore
        self.index: IndexService
        self.topics: TopicRegistry

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        config: StoreConfig | None = None,
        *,
        read_only: bool = False,
        clock_ms: Callable[[], int] | None = None,
        disk_usage_percent: Callable[[], float] | None = None,
        replicated: bool = False,
    ) -> MessageStore:
        """Open (or create) the store at ``path``.

        Args:
            config: settings for this open. A setting left out (or no config at all)
                takes what the store recorded at creation (``mqstore.layout``): its
                layout, flush mode and retention defaults; a new store records them.
            read_only: open without the writer lock, to read while a writer runs.
            clock_ms: the store clock (tests inject a fake one).
            disk_usage_percent: the disk-usage probe retention watches (tests inject one).
            replicated: the store is about to lead followers (``mqstore serve
                --replica-ids``): recovery shows readers no more than the last
                checkpoint recorded as readable (then at most the high watermark),
                and the replication node shows the rest as followers confirm it. A
                crashed leader must not show a tail its followers may lack
                (mqstore.store_replica, ``held_at_open``).

        Raises:
            StoreLockedError: another writer has the store open.
            CorruptDataError: a file cannot be recovered (it names file and position).
            ConfigError: ``config`` sets a layout other than the store's.
            InvalidTypeError: ``config`` is not a StoreConfig.
            DiskFullError: a new store's first files do not fit the filesystem (it
                names the bytes needed and the settings to lower; mqstore.room).
        """
        if config is None:
            config = StoreConfig()
        if not isinstance(config, StoreConfig):
            raise InvalidTypeError(f"config must be a StoreConfig, not {type(config).__name__}")
        root = os.fspath(path)
        started = time.perf_counter()
        if read_only:
            if not os.path.isdir(root):
                raise InvalidArgumentError(f"no store at {root}")
        else:
            makedirs_durable(root)
        store = cls(root, config, read_only)
        store._open_replicated = replicated and not read_only
        store._clock_ms = clock_ms or _wall_clock_ms
        store._disk_usage = disk_usage_percent or (lambda: retention.disk_usage_percent(root))
        try:
            store._open(clock_ms)
        except BaseException:
            store._abandon()
            raise
        store.open_ms = (time.perf_counter() - started) * 1000
        return store

    def _open(self, clock_ms: Callable[[], int] | None) -> None:
        root, config, read_only = self.root, self.config, self.read_only
        if not read_only:
            self._lock = StoreLock.acquire(root)
        # Before any file is touched: adopt what the store recorded (layout, defaults).
        config = resolve_config(root, config, record=False)
        if not read_only:
            # A new store's first files must fit before its layout is recorded: a
            # refused caller may then open it again with smaller files.
            check_room_for_first_files(root, config)
            config = resolve_config(root, config, record=True)
        self.config = config
        if not read_only:
            self.power_loss_possible = power_loss_possible(read_abort(root))
            self.recovered_from_crash = mark_abort(root)
        self.topics = TopicRegistry(root, read_only)
        self._checkpoint_file = CheckpointFile(root, read_only)
        checkpoint = self._checkpoint_file.load()
        queues_dir = os.path.join(root, "consumequeue")
        index_dir = os.path.join(root, "index")
        # Derived files deleted by hand (or lost) are rebuilt from the whole CommitLog.
        self._rebuild_derived = (
            checkpoint is not None
            and checkpoint.dispatched_position > 0  # records were dispatched before
        ) and (
            not os.path.isdir(index_dir)
            or not os.path.isdir(queues_dir)
            or not os.listdir(queues_dir)
        )
        if not read_only:
            makedirs_durable(queues_dir)
            makedirs_durable(index_dir)
        self.consume_queues = ConsumeQueueStore.open(
            queues_dir,
            ConsumeQueueConfig(
                units_per_file=config.consumequeue_units_per_file,
                max_open_files=config.consumequeue_max_open_files,
                shared_units_max=config.consumequeue_shared_units_max,
            ),
            read_only=read_only,
        )
        self.index = IndexService.open(
            index_dir,
            IndexConfig(slot_count=config.index_slot_count, entry_count=config.index_entry_count),
            read_only=read_only,
            # Derived data: a writer rebuilds an index file that does not validate
            # from the CommitLog (torn by a power cut, or damaged) instead of refusing.
            drop_damaged=not read_only,
        )
        recover_from = None
        store_ts_floor_ms = 0
        if checkpoint is not None:
            recover_from = min(checkpoint.flushed_position, checkpoint.dispatched_position)
            store_ts_floor_ms = max(checkpoint.flushed_ts_ms, checkpoint.dispatched_ts_ms)
            self._checkpoint = checkpoint
        scan_dispatch = self._scan_dispatch(checkpoint)
        self.commitlog = CommitLog.open(
            os.path.join(root, "commitlog"),
            config.commitlog_config(),
            read_only=read_only,
            recover_from=recover_from,
            queue_offset_loader=self._queue_max_offset,
            topic_offsets_loader=self._topic_next_offsets,
            clock_ms=clock_ms,
            store_ts_floor_ms=store_ts_floor_ms,
            on_run=scan_dispatch,
        )
        self._append = self.commitlog.append
        if read_only:
            if os.path.isdir(os.path.join(root, COMPACTION_DIR)):
                self._compaction = CopyReader(root, self.topics)
            return
        self._recover_derived(checkpoint, scan_dispatch)
        self._register_written_queues()  # a store from before puts registered topics
        if CompactionLogs.wanted(root, self.topics):
            self._open_compaction()
        self._start_services()

    def _open_compaction(self) -> CompactionLogs:
        """The compacted topics' copies (mqstore.compaction), opened once."""
        if not isinstance(self._compaction, CompactionLogs):
            self._compaction = CompactionLogs(
                self.root, self.commitlog, self.consume_queues, self.topics, self._clock_ms,
                self._read_units, flush_interval_ms=self.config.flush_interval_ms,
            )  # fmt: skip
        return self._compaction

    def _copy_compacted(self) -> None:
        """The copy job: compacted queues' durable records into their copies."""
        if isinstance(self._compaction, CompactionLogs):
            self._compaction.copy_all()

    def _start_services(self) -> None:
        dispatcher = self._dispatcher
        assert dispatcher is not None
        dispatcher.use_feed()
        dispatcher.set_before_publish(self.topics.try_persist_pending)  # topics put grew
        # Async: appends wake the dispatcher thread, or a waiting reader that dispatches
        # (Dispatcher.appended). Sync: bytes become readable when a sync ends, and its
        # leader dispatches them itself (Dispatcher.dispatch_now).
        sync = self.config.flush_mode == "sync"
        if sync:
            self.commitlog.set_append_listener(dispatcher.dispatch_now)
        else:
            self.commitlog.set_append_listener(dispatcher.appended, once=True)
            dispatcher.set_arm(self.commitlog.arm_append_listener)
            self._install_put()
        self._notifier = Notifier.create(self.root)
        if self._notifier is not None:
            dispatcher.set_round_listener(self._notifier.bump)
        dispatcher.start()
        config = self.config
        self._retention = retention.RetentionService(
            self.commitlog,
            self._after_retention,
            retention_ms=self._file_retention_ms,
            retention_bytes=config.retention_bytes,
            clean_percent=config.disk_clean_ratio_percent,
            force_percent=config.disk_force_ratio_percent,
            reject_percent=config.disk_reject_ratio_percent,
            clock_ms=self._clock_ms,
            disk_usage=self._disk_usage,
            # Never delete what the dispatcher, or a compacted queue's copy, still needs.
            dispatched_position=lambda: min(dispatcher.position, self._compaction_floor()),
        )
        self._scheduler = Scheduler()
        self._scheduler.every_ms(
            config.checkpoint_interval_ms, self._write_checkpoint, "checkpoint"
        )
        self._scheduler.every_ms(
            config.retention_check_interval_ms, self.run_retention, "retention"
        )
        commitlog = self.commitlog
        self.inbox = Inbox(
            os.path.join(self.root, INBOX_DIR),
            self,
            sync=lambda: commitlog.flush_to(commitlog.write_position),
            clock_ms=self._clock_ms,
        )
        self._scheduler.every_ms(config.inbox_interval_ms, self.inbox.ingest, "inbox")
        self._scheduler.every_ms(COPY_INTERVAL_MS, self._copy_compacted, "compaction-copy")
        self._scheduler.start()

    def close(self) -> None:
        """Flush everything, stop the services, write the checkpoint, remove ``abort``."""
        if self._closed:
            return
        self._closed = True
        self._put_topics.clear()
        self._uninstall_put()
        if self._scheduler is not None:
            self._scheduler.shutdown()
        if self.read_only:
            self._abandon()
            return
        failure = self.commitlog.failure
        if failure is None:
            try:
                self.commitlog.seal()  # no more appends; everything appended is flushed
            except FlushFailedError as error:
                failure = error
        if failure is not None:
            # A sync failed: nothing after the last good flush may be trusted. Leave
            # ``abort`` and the last checkpoint: the next open recovers as after a crash.
            if self._dispatcher is not None:
                try:
                    self._dispatcher.close()
                except Exception:  # closing the rest matters more
                    log.exception("closing the dispatcher of a poisoned store failed")
            self._abandon()
            raise FlushFailedError(f"closed after a failed sync: {failure}") from failure
        if self._dispatcher is not None:
            self._dispatcher.close()  # dispatches what remains
        self.topics.try_persist_pending()  # a growth no record followed
        self._write_checkpoint(derived=True)
        if isinstance(self._compaction, CompactionLogs):
            self._compaction.copy_all()  # everything is flushed now: copy it all
        clear_abort(self.root)  # still under the lock: _abandon releases it
        self._abandon()

    def _crash(self) -> None:
        """Stop as a SIGKILL would (for fault tests): no final flush, no checkpoint,
        ``abort`` left in place. Appended bytes stay in the page cache, as they do
        when a process dies; the lock is released as the kernel would release it."""
        self._closed = True
        self._put_topics.clear()
        self._uninstall_put()
        if self._scheduler is not None:
            self._scheduler.shutdown()
        dispatcher = self._dispatcher
        if dispatcher is not None:
            dispatcher._stop.set()
            dispatcher._wake.set()
            if dispatcher._thread is not None:
                dispatcher._thread.join()
        self.commitlog._crash()
        self._dispatcher = None
        if self._compaction is not None:
            self._compaction.crash()
            self._compaction = None
        self._abandon()

    def _abandon(self) -> None:
        """Close whatever was opened, without checkpointing (error paths and read-only)."""
        if self._compaction is not None:
            try:
                self._compaction.close()
            except Exception:  # closing the rest matters more
                log.exception("closing the compacted copies failed")
            self._compaction = None
        for part in ("commitlog", "consume_queues", "index"):
            component = getattr(self, part, None)
            if component is not None:
                try:
                    component.close()
                except Exception:  # closing the rest matters more
                    log.exception("closing %s failed", part)
        if self._checkpoint_file is not None:
            self._checkpoint_file.close()
        for notice in (self._notifier, self._follower):
            if notice is not None:
                notice.close()
        self._notifier = self._follower = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _write_checkpoint(self, derived: bool = False, opening: bool = False) -> None:
        """Save the flushed position; every ``consumequeue_flush_interval_ms`` (or when
        ``derived``) flush ConsumeQueues and index first and save the dispatched
        position too.

        The dispatched position is read BEFORE the flush, so the checkpoint never
        claims units that are not yet durable. Between derived flushes it keeps the
        last flushed claim: syncing thousands of queue files every second would cost
        more than re-dispatching a few seconds of log after a power loss (RocketMQ
        likewise flushes a ConsumeQueue only with 2 dirty pages or once a minute).

        After an unclean stop (``_derived_unsynced``) the first call but the one at
        open (``opening``) syncs the whole ConsumeQueue tree first
        (``ConsumeQueueStore.sync_everything``: the dead process's writes); until then
        the claim does not move up. The chaos suite lost a graduated queue's directory
        to a power cut after a claim that vouched for it unsynced.

        The call at open after an unclean stop syncs nothing when the re-dispatch
        started at or above the old claim and reached it: every unit below the claim
        is then as the last checkpoint left it (synced), and the claim stays. Syncing
        there cost a crash reopen 0.8 s of fdatasync with 1 GiB of 100 B messages.
        Otherwise it syncs what the open wrote and lowers the claim to the dispatched
        position: the recovered log may end below the claim (async flush lets the
        dispatcher run ahead of the CommitLog's flush, and a power cut takes the
        log's tail), or the re-dispatch rewrote units below it (dropped ConsumeQueue
        or index files). A claim left above the log's end would vouch for the units
        of records appended there later, unsynced.
        """
        dispatcher = self._dispatcher
        if dispatcher is None or self._checkpoint_file is None:
            return
        with self._checkpoint_guard:
            flushed, flushed_ts_ms = self.commitlog.flushed_mark
            now = time.monotonic()
            interval_s = self.config.consumequeue_flush_interval_ms / 1000
            dispatched = self._checkpoint.dispatched_position
            dispatched_ts_ms = self._checkpoint.dispatched_ts_ms
            unsynced = self._derived_unsynced
            due = derived or unsynced or now - self._derived_flushed_at >= interval_s
            # At open after an unclean stop, with nothing below the claim rewritten and
            # the claim reached, the claim stands as it is (see above).
            untouched = (
                opening
                and unsynced
                and self._redispatched_from >= dispatched
                and dispatcher.position >= dispatched
            )
            if due and self.derived_sync_failure is None and not untouched:
                position, position_ts_ms = dispatcher.position, dispatcher.dispatched_ts_ms
                try:
                    self.consume_queues.flush()
                    self.index.flush()
                    if unsynced and not opening:
                        self.consume_queues.sync_everything()
                        self._derived_unsynced = unsynced = False
                except (StoreError, OSError) as error:
                    # Never retried and trusted (see FlushFailedError): the claim stays
                    # at the last good flush until a reopen re-dispatches past it.
                    self.derived_sync_failure = error
                    log.critical("ConsumeQueue/index sync failed; checkpoint frozen: %s", error)
                else:
                    if unsynced:  # at open: never past the old claim, nor past the log
                        dispatched = min(dispatched, position)
                    else:
                        dispatched, dispatched_ts_ms = position, position_ts_ms
                        self._derived_flushed_at = now
            checkpoint = Checkpoint(
                flushed_position=flushed,
                dispatched_position=dispatched,
                flushed_ts_ms=flushed_ts_ms,
                dispatched_ts_ms=dispatched_ts_ms,
                sequence=self._checkpoint.sequence,
            )
            # The same claims as the slot on disk: nothing to make durable (sequence 0:
            # no slot written yet, and one is, so the file always holds a checkpoint).
            if checkpoint != self._checkpoint or not checkpoint.sequence:
                self._checkpoint = self._checkpoint_file.store(checkpoint)

    # ------------------------------------------------------------------ topics

    def _uses_create_time(self, topic: str) -> bool:
        config = self.topics.get(topic)
        if config is None:
            return self.config.default_timestamp_type == "CreateTime"
        return config.timestamp_type == "CreateTime"

    def _queue_max_offset(self, topic: str, queue_id: int) -> int:
        # No ConsumeQueue object for a queue that has none yet (issue 15).
        return self.consume_queues.max_offset_of(topic, queue_id)

    def _topic_next_offsets(self, topic: str) -> np.ndarray:
        # The CommitLog's seed for a topic's partitions without a ConsumeQueue object.
        config = self.topics.get(topic)
        if config is None:
            return np.zeros(0, dtype=np.int64)
        return self.consume_queues.next_offsets_without_objects(topic, config.partitions)

    # ------------------------------------------------------------------ read

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    def _queue(self, topic: str, queue_id: int) -> Any:
        """The ConsumeQueue, after dispatching whatever is readable but not yet
        dispatched: a reader sees every put that returned before its call."""
        validate_topic(topic)
        check_queue_id(queue_id)
        self._check_readable(topic, queue_id)  # reads never create a topic
        self._catch_up()
        return self.consume_queues.queue(topic, queue_id)

    def _catch_up(self) -> None:
        """Dispatch what is readable before a read; on failure (a full disk...) the
        dispatcher thread retries, and the read sees what is dispatched."""
        dispatcher = self._dispatcher
        if dispatcher is not None and dispatcher.position < dispatcher.readable_end():
            try:
                dispatcher.dispatch_available()
            except DispatchFailedError:
                raise  # dispatch stopped for good: the read would be silently stale
            except StoreError as error:
                log.warning("dispatch before a read failed (retried later): %s", error)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset still stored (Kafka's log start offset)."""
        self._check_open()
        queue = self._queue(topic, queue_id)
        compaction = self._compaction
        if compaction is not None and compaction.compacted(topic, queue_id):
            first = compaction.min_offset(topic, queue_id)  # not the raw queue's (#7540)
            if first is not None:
                return first
        if self.read_only:  # follow the writer's retention: its files may be gone
            self.commitlog.refresh_files()
            for _ in range(READ_ONLY_RELOADS_MAX):
                try:
                    queue.correct_min_offset(self.commitlog.min_position)
                    break
                except OffsetOutOfRangeError:  # a file went away: the queue reloaded
                    continue
        return int(queue.min_offset)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset to be written (Kafka's log end offset)."""
        self._check_open()
        return int(self._queue(topic, queue_id).max_offset)

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        """The first queue offset whose timestamp is >= ``timestamp_ms`` (the topic's
        CreateTime or LogAppendTime), or None when there is none."""
        self._check_open()
        _check_offset(timestamp_ms, "timestamp_ms")
        queue = self._queue(topic, queue_id)
        compaction = self._compaction
        if compaction is not None and compaction.compacted(topic, queue_id):
            found = compaction.offset_for_time(topic, queue_id, timestamp_ms)
            if found is not None:
                return found
        probe = queue.time_probe(timestamp_ms)
        if probe.timestamps_ms:  # else no unit is readable: nothing to check
            self._check_time_answer(queue, topic, queue_id, timestamp_ms, probe)
        return probe.offset

    def _check_time_answer(
        self, queue: Any, topic: str, queue_id: int, timestamp_ms: int, probe: TimeProbe
    ) -> None:
        """Spot-check a time look-up against the CommitLog records it rests on.

        The per-unit timestamps carry no checksum of their own: the unit found (or the
        last unit, when none was) and the one before it must hold the timestamps their
        verified records carry, else the answer could be wrong and CorruptDataError is
        raised instead. Two record reads; the search itself never reads the log.
        """
        stamps = probe.timestamps_ms
        if not stamps:
            return
        actual = self._record_timestamps(
            queue, topic, queue_id, probe.start, probe.commitlog_offsets, probe.sizes,
            create_time=self._uses_create_time(topic),
        )  # fmt: skip
        if actual != stamps:  # the loop below only names the first mismatch
            for index, (stamp, record_stamp) in enumerate(zip(stamps, actual, strict=True)):
                if record_stamp != stamp:
                    raise CorruptDataError(
                        queue.directory,
                        (probe.start + index) * 8,
                        f"time companion of {topic}/{queue_id}@{probe.start + index} says "
                        f"{stamp} ms, the record says {record_stamp} ms",
                    )
        if probe.offset is None and stamps[-1] >= timestamp_ms:
            last = probe.start + len(stamps) - 1
            raise CorruptDataError(queue.directory, last * 8, "time index missed a match")

    def query_by_key(
        self,
        topic: str,
        key: str,
        begin_timestamp_ms: int = 0,
        end_timestamp_ms: int = 2**63 - 1,
        max_results: int = 64,
    ) -> list[Message]:
        """Messages of ``topic`` carrying ``key``, stored within [begin, end], newest
        first, at most ``max_results``. Each hit is checked against the real record,
        so hash collisions never return a wrong message (apache/rocketmq#3613)."""
        self._check_open()
        validate_topic(topic)
        self._topic_config(topic)  # UnknownTopicError: reads never create a topic
        if not isinstance(key, str):
            raise InvalidTypeError(f"key must be a str, not {type(key).__name__}")
        _check_offset(begin_timestamp_ms, "begin_timestamp_ms")
        _check_offset(end_timestamp_ms, "end_timestamp_ms")
        _check_count("max_results", max_results, QUERY_RESULTS_MAX)
        self._catch_up()
        found: dict[int, Message] = {}

        def verify(physical: int) -> bool:
            try:
                record = self.commitlog.record_at(physical)
            except (OffsetOutOfRangeError, CorruptDataError):
                return False
            ok = (
                record.topic == topic
                and begin_timestamp_ms <= record.store_ts_ms <= end_timestamp_ms
                and key in record.keys
            )
            if ok:
                found[physical] = Message.of(record)
            return ok

        offsets = self.index.query(
            topic, key, begin_timestamp_ms, end_timestamp_ms, max_results, verify
        )
        messages = [found[physical] for physical in offsets]
        if self._compaction is not None and self._compaction.compacted(topic):
            messages = self._compaction.add_key_hits(
                messages, topic, key, begin_timestamp_ms, end_timestamp_ms, max_results
            )
        return messages

    def wait_for(self, topic: str, queue_id: int, offset: int, timeout_ms: int) -> bool:
        """Long poll: block until a message at ``offset`` or later is readable.

        A topic not yet created is waited for when a write may create it
        (``auto_create_topics``), as a Kafka subscription waits for its topic.

        Returns:
            True when max_offset > offset, False when ``timeout_ms`` passed first.

        Raises:
            UnknownTopicError: not a partition of a topic, and auto-creation is off.
        """
        self._check_open()
        _check_offset(offset)
        _check_offset(timeout_ms, "timeout_ms")
        try:
            queue = self._queue(topic, queue_id)
        except UnknownTopicError:
            if not self.config.auto_create_topics:
                raise
            return self._wait_until(lambda: self._created_past(topic, queue_id, offset), timeout_ms)
        return self._wait_until(lambda: queue.max_offset > offset, timeout_ms)

    def _created_past(self, topic: str, queue_id: int, offset: int) -> bool:
        """Whether (topic, queue_id) is now a partition holding data past ``offset``."""
        try:
            self._check_readable(topic, queue_id)
        except UnknownTopicError:
            return False
        return bool(self.consume_queues.queue(topic, queue_id).max_offset > offset)

    def _wait_until(self, ready: Callable[[], bool], timeout_ms: int) -> bool:
        """Wait for ``ready()``: woken by the dispatch rounds that make it true; when
        read-only, by the writer's bumps of ``notify`` (each sleep at most
        FOLLOW_SLICE_S, so a writer that stopped bumping costs latency, not a hang), or
        polling every millisecond where there is no ``notify`` (an older writer)."""
        dispatcher = self._dispatcher
        if dispatcher is not None:
            return dispatcher.wait_for(ready, timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            follower = self._follower
            if follower is None and not self._closed:
                follower = self._follower = Follower.open(self.root)
            sequence = None if follower is None else follower.sequence  # before the check
            if ready():
                return True
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or self._closed:
                return False
            if follower is None or sequence is None:
                time.sleep(min(READ_ONLY_POLL_S, remaining_s))
            else:
                follower.wait(sequence, min(FOLLOW_SLICE_S, remaining_s))

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        dispatcher = self._dispatcher
        return {
            "write_position": self.commitlog.write_position,
            "flushed_position": self.commitlog.flushed_position,
            "min_position": self.commitlog.min_position,
            "commitlog_files": self.commitlog.file_count,
            "dispatched_position": dispatcher.position if dispatcher else None,
            "dispatch_lag_bytes": dispatcher.lag_bytes() if dispatcher else None,
            "open_fds": len(os.listdir("/proc/self/fd"))
            if os.path.isdir("/proc/self/fd")
            else None,
            "recovered_from_crash": self.recovered_from_crash,
            "open_ms": self.open_ms,
            "sync_failure": _describe(self.commitlog.failure),
            "derived_sync_failure": _describe(self.derived_sync_failure),
            "dispatch_failure": _describe(dispatcher.failure if dispatcher else None),
            **({"compaction": self._compaction.stats()} if self._compaction else {}),
        }


def _describe(error: BaseException | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {error}"


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _no_disk_usage() -> float:
    return 0.0
