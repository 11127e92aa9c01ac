"""SegmentedStore: Kafka's segmented log design behind mqstore's engine interface.

This is the baseline the CommitLog engine is measured against: one log per
partition, cut into segments, each with a sparse offset index and a time index.

On disk (one store = one directory)::

    <root>/lock                               writer lock (mqstore.commitlog.lock.StoreLock)
    <root>/.kafka_cleanshutdown               written by a clean close, removed at open
    <root>/recovery-point-offset-checkpoint   per partition: the offset below which the
                                              .log and the indexes are durable
    <root>/log-start-offset-checkpoint        per partition: the log start offset
    <root>/topics, <root>/offsets/            mqstore.topics / mqstore.offsets
    <root>/<topic>-<partition>/<20-digit base offset>.log|.index|.timeindex

Open: take the lock; note whether the clean-shutdown marker is there; load every
partition of every registered topic (``log_loader``: trusted after a clean shutdown,
recovered from its recovery point after a crash); then remove the marker, so a crash
from now on is seen as one. Close: flush every partition, trim the indexes, write
both checkpoints, then write the marker.

Durability: ``flush_mode="async"``: a scheduled job flushes every dirty partition
every ``flush_interval_ms``. ``flush_mode="sync"``: an append returns once its
partition's ``.log`` is fdatasynced; concurrent appenders to the same partition share
one fdatasync (commitlog's GroupCommitService, leader/follower), but every partition
is its own file, so a producer touching N partitions pays N syncs. That is the
design difference the benchmarks measure.

Open files. Each partition costs, at least, 3 descriptors: its active segment's
``.log`` plus one per mapped index (Python's mmap duplicates the fd), so 4,096
partitions hold about 12,300 of this machine's 20,000. Every older segment adds one
(its ``.log`` stays open, as in Kafka), and each of its two indexes one more while it
is mapped for a look-up; at most ``inactive_index_maps_max`` such maps are open in
the whole store. ``stats()["open_fds"]`` reports the process's count.

Thread safety: appends to one partition are serialized by its lock; appends to
different partitions run concurrently (fdatasync and pwrite release the GIL).
Reads take no lock. Topic changes are serialized by one admin lock.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final

import attrs

from mqstore.commitlog.durable import makedirs_durable
from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    InvalidTypeError,
    LimitExceededError,
    OffsetOutOfRangeError,
    StoreClosedError,
    UnknownTopicError,
)
from mqstore.commitlog.flush import GroupCommitService
from mqstore.commitlog.lock import StoreLock
from mqstore.commitlog.record import validate_topic
from mqstore.engine import AppendedBatch, AppendedRecord, EngineBatch, EngineRecord, ProducerRecord
from mqstore.offsets import OffsetStore
from mqstore.segmented import batch_builder
from mqstore.segmented.batch_builder import BuiltBatch
from mqstore.segmented.checkpoint import read_offsets
from mqstore.segmented.config import SegmentedConfig
from mqstore.segmented.file_records import FileSlices
from mqstore.segmented.files import (
    CLEAN_SHUTDOWN_NAME,
    LOG_START_OFFSET_CHECKPOINT_NAME,
    RECOVERY_POINT_CHECKPOINT_NAME,
    fsync_directory,
    partition_directory,
)
from mqstore.segmented.index_file import MappedIndexCache
from mqstore.segmented.log_cleaner import LogCleaner
from mqstore.segmented.log_loader import load_partition
from mqstore.segmented.partition_log import LogSettings, PartitionLog
from mqstore.segmented.segment import LogSegment, SegmentSettings
from mqstore.segmented.store_services import SegmentedServices
from mqstore.services import Scheduler
from mqstore.topics import (
    TopicConfig,
    TopicRegistry,
    check_key_sizes,
    check_keyed,
    check_topic_config,
    parse_kafka_configs,
)

__all__ = ["SegmentedStore"]

log = logging.getLogger(__name__)

READ_RECORDS_MAX: Final = 10_000  # one read returns at most this many records
FETCH_BYTES_MAX: Final = 16 * 1024 * 1024  # no further batch once a read holds this much
DELETE_CHECK_INTERVAL_MS: Final = 1_000  # how often renamed segments are checked for removal
PARTITION_MAX: Final = 2**31 - 1
FDS_PER_PARTITION_MIN: Final = 3  # active .log + two index maps


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class SegmentedStore(SegmentedServices):
    """An embedded message store in Kafka's design. Build with ``SegmentedStore.open``.

    Its periodic work (flush, retention, deletion, the cleaner) lives in
    segmented/store_services.py."""

    def __init__(self, root: str, config: SegmentedConfig, clock_ms: Callable[[], int]) -> None:
        self.root = root
        self.config = config
        self._clock_ms = clock_ms
        self._closed = False
        self._lock: StoreLock | None = None
        self._scheduler: Scheduler | None = None
        self._admin_lock = threading.Lock()
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._group_commits: dict[tuple[str, int], GroupCommitService] = {}
        self._cache = MappedIndexCache(config.inactive_index_maps_max)
        self._data = threading.Condition()
        self._waiters = 0
        self._pending_lock = threading.Lock()
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self._log_settings = LogSettings(
            segment_bytes=config.segment_bytes,
            segment_ms=config.segment_ms,
            segment=SegmentSettings(
                index_interval_bytes=config.index_interval_bytes,
                index_max_bytes=config.index_max_bytes,
            ),
        )
        self._sync = config.flush_mode == "sync"
        self._cleaner = LogCleaner(
            root, self._compacted_logs, self._delete_later, clock_ms,
            segment_bytes=config.segment_bytes,
            dedupe_buffer_bytes=config.cleaner_dedupe_buffer_bytes,
            backoff_ms=config.cleaner_backoff_ms,
        )  # fmt: skip
        # Kafka refuses a batch above max.message.bytes, or above segment.bytes.
        self._batch_size_max_bytes = min(config.max_message_size_bytes, config.segment_bytes)
        self.recovered_from_crash = False
        self.open_ms = 0.0
        self.topics: TopicRegistry
        self._offsets: OffsetStore

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        config: SegmentedConfig | None = None,
        *,
        clock_ms: Callable[[], int] | None = None,
    ) -> SegmentedStore:
        """Open (or create) the store at ``path``.

        Args:
            path: the store directory.
            config: settings; the defaults are Kafka's.
            clock_ms: wall clock in ms (tests inject one for retention and roll).

        Raises:
            StoreLockedError: another writer has the store open.
            CorruptDataError: the topics file does not validate.
            InvalidTypeError: ``config`` is not a SegmentedConfig.
            LimitExceededError: too many open files for the partitions.
        """
        if config is None:
            config = SegmentedConfig()
        if not isinstance(config, SegmentedConfig):
            raise InvalidTypeError(f"config must be a SegmentedConfig, not {type(config).__name__}")
        root = os.fspath(path)
        makedirs_durable(root)
        started = time.perf_counter()
        store = cls(root, config, clock_ms or _wall_clock_ms)
        try:
            store._open()
        except BaseException:
            store._crash()
            raise
        store.open_ms = (time.perf_counter() - started) * 1000
        return store

    def _open(self) -> None:
        root = self.root
        self._lock = StoreLock.acquire(root)
        marker = os.path.join(root, CLEAN_SHUTDOWN_NAME)
        clean = os.path.exists(marker)
        self.topics = TopicRegistry(root, read_only=False)
        self.recovered_from_crash = not clean and bool(self.topics.all())
        self._offsets = OffsetStore(root, read_only=False)
        recovery_points = self._read_checkpoint(RECOVERY_POINT_CHECKPOINT_NAME)
        log_starts = self._read_checkpoint(LOG_START_OFFSET_CHECKPOINT_NAME)
        for name, topic in sorted(self.topics.all().items()):
            for partition in range(topic.partitions):
                key = (name, partition)
                self._open_partition(
                    topic, partition, clean, recovery_points.get(key, 0), log_starts.get(key, 0)
                )
        if clean:
            os.unlink(marker)
            fsync_directory(root)
        self._start_services()

    def _read_checkpoint(self, name: str) -> dict[tuple[str, int], int]:
        """Kafka falls back when a checkpoint does not parse: recovery points to 0
        (recover everything), log starts to each log's first base offset."""
        try:
            return read_offsets(os.path.join(self.root, name))
        except CorruptDataError as error:
            log.warning("ignoring %s: %s", name, error)
            return {}

    def _open_partition(
        self,
        topic: TopicConfig,
        partition: int,
        clean: bool,
        recovery_point: int = 0,
        log_start_offset: int = 0,
    ) -> None:
        directory = partition_directory(self.root, topic.name, partition)
        try:
            loaded = load_partition(
                directory, self._log_settings.segment, self._cache,
                clean_shutdown=clean, recovery_point=recovery_point,
                log_start_offset=log_start_offset,
            )  # fmt: skip
        except OSError as error:
            if error.errno in (errno.EMFILE, errno.ENFILE):
                raise LimitExceededError(
                    f"too many open files at partition {len(self._logs) + 1}: each partition "
                    f"holds at least {FDS_PER_PARTITION_MIN} descriptors (its .log and two "
                    "mapped indexes)"
                ) from error
            raise
        partition_log = PartitionLog(
            topic.name, partition, directory, self._settings_for(topic), self._cache, loaded,
            log_append_time=topic.timestamp_type == "LogAppendTime",
        )  # fmt: skip
        key = (topic.name, partition)
        if self._sync:
            self._group_commits[key] = GroupCommitService(
                partition_log, self.config.sync_flush_timeout_ms
            )
        self._logs[key] = partition_log

    def _open_partitions(self, topic: TopicConfig, partitions: range) -> None:
        """Open new partitions of ``topic``, all or none (a failure closes the ones
        already opened; their empty directories stay, unregistered and harmless)."""
        try:
            for partition in partitions:
                self._open_partition(topic, partition, clean=True)
        except BaseException:
            for partition in partitions:
                opened = self._logs.pop((topic.name, partition), None)
                self._group_commits.pop((topic.name, partition), None)
                if opened is not None:
                    opened.abandon()
            raise

    def _start_services(self) -> None:
        config = self.config
        scheduler = Scheduler()
        scheduler.every_ms(config.flush_interval_ms, self.flush, "segmented-flush")
        scheduler.every_ms(
            config.recovery_point_checkpoint_interval_ms,
            self.checkpoint_recovery_points,
            "segmented-recovery-point-checkpoint",
        )
        scheduler.every_ms(
            config.retention_check_interval_ms, self.enforce_retention, "segmented-retention"
        )
        scheduler.every_ms(DELETE_CHECK_INTERVAL_MS, self.delete_expired_files, "segmented-delete")
        if config.cleaner_enable:
            scheduler.every_ms(config.cleaner_backoff_ms, self._cleaner.run, "segmented-cleaner")
        scheduler.start()
        self._scheduler = scheduler

    def close(self) -> None:
        """Flush everything and close cleanly (the next open trusts the files)."""
        if self._closed:
            return
        self._closed = True
        if self._scheduler is not None:
            self._scheduler.shutdown()
        with self._data:
            self._data.notify_all()
        for group_commit in self._group_commits.values():
            group_commit.close()
        for partition_log in self._logs.values():
            partition_log.close()
        with self._pending_lock:
            pending, self._pending_deletes = self._pending_deletes, []
        for _, segment in pending:  # their .deleted files are removed at the next open
            segment.close_files()
        self.checkpoint_recovery_points()
        self._write_log_start_offsets()
        marker = os.path.join(self.root, CLEAN_SHUTDOWN_NAME)
        with open(marker, "wb") as handle:
            os.fsync(handle.fileno())
        fsync_directory(self.root)
        assert self._lock is not None
        self._lock.release()

    def _crash(self) -> None:
        """Stop without flushing or writing anything: what a SIGKILL leaves (tests,
        and a failed open)."""
        self._closed = True
        if self._scheduler is not None:
            self._scheduler.shutdown()
        for partition_log in self._logs.values():
            partition_log.abandon()
        with self._pending_lock:
            for _, segment in self._pending_deletes:
                segment.close_files()
            self._pending_deletes = []
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> SegmentedStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    # ------------------------------------------------------------------ topics

    @property
    def offsets(self) -> OffsetStore:
        """Committed consumer offsets (``<root>/offsets/``)."""
        return self._offsets

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        timestamp_type: str = "CreateTime",
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        cleanup_policy: str = "delete",
        topic_configs: Mapping[str, object] | None = None,
    ) -> TopicConfig:
        """Create a topic and its partition directories.

        Args:
            cleanup_policy: "delete", "compact" or "compact,delete" (Kafka's).
            topic_configs: Kafka-named settings (``min.compaction.lag.ms``...,
                ``mqstore.topics.KAFKA_TOPIC_CONFIGS``); they win over the arguments.

        Raises:
            InvalidArgumentError, InvalidTypeError: a bad name or setting, or the topic
                exists.
            LimitExceededError: too many open files for its partitions.
        """
        self._check_open()
        fields: dict[str, Any] = dict(
            timestamp_type=timestamp_type, retention_ms=retention_ms,
            retention_bytes=retention_bytes, cleanup_policy=cleanup_policy,
        )  # fmt: skip
        fields.update(parse_kafka_configs(name, topic_configs or {}))
        config = TopicConfig(name=name, partitions=partitions, **fields)
        check_topic_config(config)
        with self._admin_lock:
            if self.topics.get(name) is not None:
                raise InvalidArgumentError(f"topic {name!r} already exists")
            self._open_partitions(config, range(partitions))
            return self.topics.put(config)

    def alter_topic(self, name: str, topic_configs: Mapping[str, object]) -> TopicConfig:
        """Change Kafka-named topic settings (``cleanup.policy``,
        ``max.compaction.lag.ms``...; kafka-configs --alter). Partitions keep their
        data; a new roll time applies from the next append.

        Raises:
            UnknownTopicError: no such topic.
            InvalidArgumentError, InvalidTypeError: a bad name or value.
        """
        self._check_open()
        with self._admin_lock:
            config = self.topics.get(name)
            if config is None:
                raise UnknownTopicError(f"unknown topic {name!r}")
            altered = attrs.evolve(config, **parse_kafka_configs(name, topic_configs))
            check_topic_config(altered)
            altered = self.topics.put(altered)
            for partition in range(altered.partitions):
                self._logs[(name, partition)].settings = self._settings_for(altered)
        self._cleaner.reset_failures(name)
        return altered

    def _settings_for(self, topic: TopicConfig) -> LogSettings:
        """A compacted topic rolls at min(max.compaction.lag.ms, segment.ms), so its
        head becomes cleanable in time (Kafka's LogConfig.maxSegmentMs)."""
        if not topic.compacted:
            return self._log_settings
        segment_ms = min(self._log_settings.segment_ms, topic.max_compaction_lag_ms)
        return attrs.evolve(self._log_settings, segment_ms=segment_ms)

    def list_topics(self) -> dict[str, TopicConfig]:
        return self.topics.all()

    def describe_topic(self, name: str) -> TopicConfig:
        """The topic's config, with the retention in force (``effective_*``).

        Raises:
            UnknownTopicError: ``name`` is not a topic.
        """
        config = self.topics.get(name)
        if config is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        default_ms = self.config.retention_ms
        described = config.described(default_ms, f"store default, retention_ms={default_ms}")
        if config.retention_bytes is None and self.config.retention_bytes != -1:
            size = self.config.retention_bytes
            described = attrs.evolve(
                described,
                effective_retention_bytes=size,
                effective_retention_bytes_source=f"store default, retention_bytes={size}",
            )
        return described

    @property
    def auto_create_topics(self) -> bool:
        """Whether a write to a topic that does not exist creates it."""
        return self.config.auto_create_topics

    def topic_for_write(self, name: str) -> TopicConfig:
        """The topic a write goes to, created with ``auto_create_topic_partitions``
        partitions if it does not exist and ``auto_create_topics`` is on (Kafka's
        auto.create.topics.enable and num.partitions).

        Raises:
            UnknownTopicError: no such topic and auto-creation is off.
        """
        config = self.topics.get(name)
        if config is not None:
            return config
        validate_topic(name)
        if not self.config.auto_create_topics:
            raise UnknownTopicError(
                f"unknown topic {name!r} (auto_create_topics is off: create it first)"
            )
        try:
            return self.create_topic(name, self.config.auto_create_topic_partitions)
        except InvalidArgumentError:  # another thread created it first
            config = self.topics.get(name)
            if config is None:
                raise
            return config

    def add_partitions(self, name: str, partitions: int) -> TopicConfig:
        """Grow ``name`` to ``partitions`` partitions in total (Kafka's
        create_partitions: the count never shrinks).

        Raises:
            UnknownTopicError: no such topic.
            InvalidArgumentError: ``partitions`` is not above the current count.
        """
        self._check_open()
        with self._admin_lock:
            self.describe_topic(name)  # UnknownTopicError
            config = self.topics.get(name)
            assert config is not None
            grown = attrs.evolve(config, partitions=partitions)
            check_topic_config(grown)
            if partitions <= config.partitions:
                raise InvalidArgumentError(
                    f"topic {name!r} has {config.partitions} partitions; "
                    f"{partitions} does not add any"
                )
            self._open_partitions(grown, range(config.partitions, partitions))
            return self.topics.put(grown)

    def _log(self, topic: str, partition: int) -> PartitionLog:
        partition_log = self._logs.get((topic, partition))
        if partition_log is not None and type(partition) is not bool:
            return partition_log
        validate_topic(topic)
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise InvalidTypeError(f"partition must be an int, not {type(partition).__name__}")
        config = self.topics.get(topic)
        if config is None:
            raise UnknownTopicError(f"unknown topic {topic!r}")
        raise UnknownTopicError(
            f"topic {topic!r} has no partition {partition} (it has {config.partitions})"
        )

    # ------------------------------------------------------------------ write

    def append_records(
        self, topic: str, partition: int, records: Sequence[ProducerRecord]
    ) -> list[AppendedRecord]:
        """Append ``records`` to one partition as ONE record batch.

        Returns:
            Each record's offset, timestamp and serialized sizes (-1 for a null key
            or value, or no headers).

        Raises:
            UnknownTopicError: no such partition, or no such topic and
                ``auto_create_topics`` is off (on, it is created first).
            InvalidTypeError, InvalidArgumentError: bad records (nothing appended).
            InvalidRecordError: a record without a key on a compacted topic (Kafka's
                INVALID_RECORD; nothing appended).
            LimitExceededError: the batch is over max_message_size_bytes or
                segment_bytes (nothing appended).
            DiskFullError: no room (nothing appended).
            FlushTimeoutError: sync mode and the batch was not durable in time (it was
                appended, and may still become durable, but was not acknowledged).
            StoreClosedError: the store is closed.
        """
        self._check_open()
        config = self.topics.get(topic)
        if config is None:
            config = self.topic_for_write(topic)  # auto-creates, or UnknownTopicError
        partition_log = self._log(topic, partition)
        if config.compacted:
            check_keyed(topic, records)
        built = batch_builder.build(
            records, self._clock_ms(), partition_log.log_append_time, self._batch_size_max_bytes
        )
        return self._append_built(topic, partition, partition_log, built)

    def append_batch(self, topic: str, partition: int, batch: bytes) -> AppendedBatch:
        """Append a producer's record batch v2 as it is, base offset assigned (Kafka's
        in-place LogValidator path: the producer's CRC reaches the consumer). On a
        LogAppendTime topic the batch takes the append time, as in Kafka.

        Raises:
            InvalidArgumentError: not one valid batch v2 (see
                ``batch_builder.adopt``); nothing appended.
            InvalidRecordError: a record without a key on a compacted topic.
            others: as ``append_records``.
        """
        self._check_open()
        config = self.topics.get(topic)
        if config is None:
            config = self.topic_for_write(topic)
        partition_log = self._log(topic, partition)
        adopted = batch_builder.adopt(
            batch, self._clock_ms(), partition_log.log_append_time, self._batch_size_max_bytes
        )
        if config.compacted:
            check_key_sizes(topic, adopted.key_sizes)
        base_offset = self._append_bytes(
            topic, partition, partition_log, adopted.batch, adopted.record_count,
            adopted.max_timestamp_ms,
        )  # fmt: skip
        return AppendedBatch(base_offset, adopted.record_count, adopted.max_timestamp_ms)

    def _append_built(
        self, topic: str, partition: int, partition_log: PartitionLog, built: BuiltBatch
    ) -> list[AppendedRecord]:
        base_offset = self._append_bytes(
            topic, partition, partition_log, built.batch, built.record_count,
            built.max_timestamp_ms,
        )  # fmt: skip
        return [AppendedRecord(base_offset + i, *sizes) for i, sizes in enumerate(built.sizes)]

    def _append_bytes(
        self,
        topic: str,
        partition: int,
        partition_log: PartitionLog,
        batch: bytearray,
        record_count: int,
        max_timestamp_ms: int,
    ) -> int:
        """Append one checked batch; its base offset (after the sync wait, if any)."""
        base_offset = partition_log.append(batch, record_count, max_timestamp_ms)
        if self._waiters:
            with self._data:
                self._data.notify_all()
        if self._sync:
            self._group_commits[(topic, partition)].wait_durable(base_offset + record_count)
        return base_offset

    def append_log_batch(
        self,
        topic: str,
        partition: int,
        base_offset: int,
        batch: bytearray,
        count: int,
        max_timestamp_ms: int,
    ) -> None:
        """Append one record batch, already encoded (``record_batch.build_batch``),
        at ``base_offset`` (at or past the log end; a gap is left as compaction
        leaves one): the CommitLog engine's compaction logs (mqstore.compaction)
        copy queues this way, keeping their offsets. No auto-creation, no key check,
        never a sync wait.

        Raises:
            UnknownTopicError: no such partition.
            InvalidArgumentError: ``base_offset`` is below the log end.
            LimitExceededError: the batch is over max_message_size_bytes.
            DiskFullError: no room (nothing appended).
        """
        self._check_open()
        partition_log = self._log(topic, partition)
        if len(batch) > self._batch_size_max_bytes:
            raise LimitExceededError(
                f"a batch of {len(batch)} bytes is over the {self._batch_size_max_bytes}-byte limit"
            )
        start = partition_log.log_start_offset
        partition_log.append(batch, count, max_timestamp_ms, base_offset=base_offset)
        if partition_log.log_start_offset != start:  # an empty log started at a gap
            self._write_log_start_offsets()

    def roll(self, topic: str, partition: int) -> None:
        """Start a new segment now unless the active one is empty (the active segment
        is never cleaned: ``mqstore compact`` on the CommitLog engine rolls first)."""
        self._check_open()
        self._log(topic, partition).roll()

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Move the log start offset up to ``before_offset`` (Kafka's DeleteRecords).
        Whole segments below it go at the next retention run.

        Returns:
            The log start offset now.

        Raises:
            OffsetOutOfRangeError: ``before_offset`` is negative or past the log end.
        """
        self._check_open()
        partition_log = self._log(topic, partition)
        _check_offset(before_offset, "before_offset")
        if partition_log.increment_log_start_offset(before_offset):
            self._write_log_start_offsets()
        return partition_log.log_start_offset

    # ------------------------------------------------------------------ read

    def read_records(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[EngineRecord]:
        """Records from ``offset`` (it may lie inside a batch), at most
        ``max_records``; ``[]`` at the log end. ``checksum`` is the batch's CRC-32C,
        verified before any record of the batch is returned.

        Raises:
            OffsetOutOfRangeError: ``offset`` is below the log start or past the end.
            UnknownTopicError: no such topic or partition.
            InvalidArgumentError: ``max_records`` outside [1, READ_RECORDS_MAX].
            CorruptDataError: a batch does not validate (it names file and position).
        """
        self._check_open()
        partition_log = self._log(topic, partition)
        _check_offset(offset, "offset")
        _check_count("max_records", max_records, READ_RECORDS_MAX)
        return partition_log.read(offset, max_records, FETCH_BYTES_MAX)

    def read_slices(self, topic: str, partition: int, offset: int, max_bytes: int) -> FileSlices:
        """``PartitionLog.read_slices``: pinned ``.log`` ranges of whole batches from
        ``offset`` for a zero-copy Fetch; the caller must ``release`` them.

        Raises:
            OffsetOutOfRangeError: ``offset`` is below the log start or past the end.
            UnknownTopicError: no such topic or partition.
            InvalidArgumentError: ``max_bytes`` outside [0, 2**31 - 1].
            CorruptDataError: a batch header does not validate.
        """
        self._check_open()
        partition_log = self._log(topic, partition)
        _check_offset(offset, "offset")
        if type(max_bytes) is not int or not 0 <= max_bytes <= PARTITION_MAX:
            raise InvalidArgumentError(f"max_bytes must be an int in [0, 2**31 - 1]: {max_bytes!r}")
        return partition_log.read_slices(offset, max_bytes)

    def read_batch(self, topic: str, partition: int, offset: int, max_records: int) -> EngineBatch:
        """``read_records`` as columns (the engine interface's bulk read): this
        engine decodes Kafka record batches record by record, so it regroups them."""
        return EngineBatch.of_records(self.read_records(topic, partition, offset, max_records))

    def earliest_offset(self, topic: str, partition: int) -> int:
        """The log start offset."""
        self._check_open()
        return self._log(topic, partition).log_start_offset

    def latest_offset(self, topic: str, partition: int) -> int:
        """The log end offset: the next offset to be written."""
        self._check_open()
        return self._log(topic, partition).next_offset

    def offset_for_timestamp(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record, in offset order from the log
        start, whose timestamp is >= ``timestamp_ms``; None if there is none.

        Raises:
            InvalidArgumentError: a negative timestamp.
        """
        self._check_open()
        partition_log = self._log(topic, partition)
        _check_offset(timestamp_ms, "timestamp_ms")
        return partition_log.offset_for_timestamp(timestamp_ms)

    def wait_for_data(self, positions: Sequence[tuple[str, int, int]], timeout_ms: int) -> bool:
        """Block until some (topic, partition, offset) has latest_offset > offset.

        Returns:
            True when one has, False when ``timeout_ms`` passed first (or the store
            closed meanwhile).
        """
        self._check_open()
        _check_offset(timeout_ms, "timeout_ms")
        watched: list[tuple[PartitionLog, int]] = []
        for topic, partition, offset in positions:
            _check_offset(offset, "offset")
            watched.append((self._log(topic, partition), offset))

        def ready() -> bool:
            return any(p.next_offset > offset for p, offset in watched)

        if ready():
            return True
        deadline = time.monotonic() + timeout_ms / 1000
        with self._data:
            self._waiters += 1  # appenders notify only while someone waits
            try:
                while not ready():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closed:
                        return False
                    self._data.wait(remaining)
                return True
            finally:
                self._waiters -= 1

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        logs = list(self._logs.values())
        return {
            "partitions": len(logs),
            "segments": sum(len(p.segments) for p in logs),
            "bytes": sum(p.size_bytes for p in logs),
            "open_fds": _open_fds(),
            "mapped_inactive_indexes": len(self._cache),
            "pending_deletes": len(self._pending_deletes),
            "recovered_from_crash": self.recovered_from_crash,
            "open_ms": self.open_ms,
            **self._cleaner.stats(),
        }


def _check_offset(value: object, name: str) -> None:
    """Offsets and timestamps are non-negative ints; a negative offset is out of range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        if name in ("offset", "before_offset"):
            raise OffsetOutOfRangeError(f"{name} {value} is negative")
        raise InvalidArgumentError(f"{name} {value} is negative")


def _check_count(name: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 1 <= value <= maximum:
        raise InvalidArgumentError(f"{name} must be in [1, {maximum}], not {value}")


def _open_fds() -> int | None:
    """The process's open file descriptors (Linux), mmap duplicates included."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except FileNotFoundError:
        return None
