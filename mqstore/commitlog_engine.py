"""The engine interface (mqstore.engine) on top of the CommitLog store.

A Kafka partition is a ConsumeQueue: partition p of topic t is queue (t, p), and
Kafka offsets are queue offsets. A Kafka record maps onto a message:

- value -> body (None -> a tombstone body);
- key -> the property ``KEY_PROPERTY`` (exact bytes); a key that is UTF-8 text
  without NUL is also indexed as a message key, so ``query_by_key`` finds it;
- headers -> the other properties, in order;
- timestamp -> born timestamp (CreateTime); LogAppendTime topics use the store
  timestamp set under the append lock.

One notion of a topic, for every entry point: a topic exists once it is created,
explicitly (``create_topic``) or, with ``StoreConfig.auto_create_topics`` (the
default), by the first write to it (Kafka's auto.create.topics.enable, RocketMQ's
autoCreateTopicEnable) with ``auto_create_topic_partitions`` partitions. ``put`` names
its queue, so a put to queue q makes (or grows) the topic to at least q + 1
partitions; the Kafka-style path refuses a partition past the count, as a broker
does. Reads never create a topic: an unknown topic or partition is UnknownTopicError.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from mqstore.commitlog.batch import Trailer
from mqstore.commitlog.errors import (
    InvalidArgumentError,
    InvalidRecordError,
    InvalidTypeError,
    UnknownTopicError,
)
from mqstore.commitlog.record import validate_topic
from mqstore.engine import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    AppendedRecord,
    EngineBatch,
    EngineRecord,
    ProducerRecord,
    no_headers,
)
from mqstore.internal_log import INTERNAL_TOPICS, OFFSETS_TOPIC, PRODUCERS_TOPIC, InternalLog
from mqstore.message import Message
from mqstore.offsets_log import LogOffsetStore
from mqstore.retention import hours_to_ms
from mqstore.topics import (
    PARTITIONS_MAX,
    TopicConfig,
    check_keyed,
    check_topic_config,
    parse_kafka_configs,
)

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from mqstore.batch import MessageBatch
    from mqstore.commitlog.commitlog import CommitLog
    from mqstore.compaction import CompactionLogs, CopyReader
    from mqstore.config import StoreConfig
    from mqstore.consumequeue import ConsumeQueueStore
    from mqstore.dispatch.dispatcher import Dispatcher
    from mqstore.message import PutResult
    from mqstore.segmented.cleaner import CleanResult
    from mqstore.topics import TopicRegistry

__all__ = ["KEY_PROPERTY", "CommitLogEngine"]

log = logging.getLogger(__name__)

_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (per send)

RESERVED_PREFIX = "\x00"  # property names the store keeps for itself; headers may not
KEY_PROPERTY = RESERVED_PREFIX + "key"  # the Kafka key, a property of that namespace
READ_RECORDS_MAX = 10_000  # bounded like MessageStore.get


class CommitLogEngine:
    """Mixed into MessageStore: the engine interface."""

    _offset_store: LogOffsetStore | None = None
    _described: dict[str, tuple[TopicConfig, TopicConfig]]  # name: (registry's, described)

    if TYPE_CHECKING:  # what MessageStore provides
        root: str
        read_only: bool
        config: StoreConfig
        topics: TopicRegistry
        commitlog: CommitLog
        consume_queues: ConsumeQueueStore
        _topic_guard: threading.Lock  # serializes auto-creation

        _compaction: CompactionLogs | CopyReader | None
        _put_topics: dict[str, int]
        _dispatcher: Dispatcher | None

        def _check_writable(self) -> None: ...
        def _open_compaction(self) -> CompactionLogs: ...
        def _catch_up(self) -> None: ...
        def _queue(self, topic: str, queue_id: int) -> Any: ...
        def _wait_until(self, ready: Callable[[], bool], timeout_ms: int) -> bool: ...
        def put(
            self,
            topic: str,
            queue_id: int,
            body: bytes | bytearray | memoryview | None,
            *,
            keys: Sequence[str] | str = (),
            tag: str | None = None,
            properties: Any = None,
            born_timestamp_ms: int | None = None,
        ) -> PutResult: ...
        def put_batch(
            self,
            topic: str,
            queue_id: int,
            bodies: Sequence[bytes | bytearray | memoryview | None],
            *,
            keys: Sequence[Sequence[str] | str | None] | None = None,
            tags: Sequence[str | None] | str | None = None,
            properties: Sequence[Any] | None = None,
            born_timestamp_ms: Sequence[int | None] | int | None = None,
            trailer: Trailer | None = None,
        ) -> list[PutResult]: ...
        def get(
            self, topic: str, queue_id: int, offset: int, max_messages: int = 32
        ) -> list[Message]: ...
        def get_batch(
            self,
            topic: str,
            queue_id: int,
            offset: int,
            max_messages: int = ...,
            *,
            max_bytes: int = ...,
        ) -> MessageBatch: ...
        def min_offset(self, topic: str, queue_id: int) -> int: ...
        def max_offset(self, topic: str, queue_id: int) -> int: ...
        def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None: ...

    @property
    def offsets(self) -> LogOffsetStore:
        """Committed consumer offsets, kept in the log (mqstore.offsets_log)."""
        if self._offset_store is None:
            offset_log = self._internal_log(OFFSETS_TOPIC, durable=True)
            self._offset_store = LogOffsetStore(self.root, offset_log, self.read_only)
        return self._offset_store

    def reload_offsets(self) -> int:
        """Rebuild the committed offsets from the log (after a promotion or a
        truncation: the replication code calls it); returns the records read."""
        if not self.read_only:
            self._catch_up()  # every replicated record in its ConsumeQueue first
        return self.offsets.reload()

    @property
    def producer_log(self) -> InternalLog:
        """The idempotent producers' state topic, for the broker (mqstore.broker.producers)."""
        return self._internal_log(PRODUCERS_TOPIC, durable=False)

    def _internal_log(self, topic: str, durable: bool) -> InternalLog:
        """An internal topic (mqstore.internal_log): one partition, compacted.
        ``durable``: its appends return once flushed, whatever the flush mode."""

        def append(records: Sequence[tuple[bytes, bytes | None]]) -> None:
            if self.topics.get(topic) is None:  # its users serialize their appends
                self.create_topic(topic, 1, cleanup_policy="compact")
            if len(records) == 1:  # one producer's state after each batch: put's path
                key, value = records[0]
                self.put(topic, 0, value, properties=[(KEY_PROPERTY, key)])
            else:
                self.put_batch(
                    topic,
                    0,
                    [value for _, value in records],
                    properties=[[(KEY_PROPERTY, key)] for key, _ in records],
                )
            if durable and self.config.flush_mode != "sync":  # sync: put_batch waited
                self.commitlog.flush_to(self.commitlog.write_position)

        def read(offset: int) -> EngineBatch:
            return self.read_batch(topic, 0, offset, READ_RECORDS_MAX)

        def bounds() -> tuple[int, int]:
            try:
                self._partition(topic, 0)
            except UnknownTopicError:
                return 0, 0
            return self.min_offset(topic, 0), self.max_offset(topic, 0)

        def trailer(key: bytes, value_for: Callable[[int], bytes]) -> Trailer:
            if self.topics.get(topic) is None:
                self.create_topic(topic, 1, cleanup_policy="compact")
            properties = [(KEY_PROPERTY, key)]
            return Trailer(topic, 0, lambda first: (value_for(first), properties))

        def read_unexposed(offset: int) -> list[tuple[bytes | None, bytes | None]]:
            dispatcher = self._dispatcher
            commitlog = self.commitlog
            start = commitlog.write_position if dispatcher is None else dispatcher.position
            return [
                (next((v for name, v in r.properties if name == KEY_PROPERTY), None),
                 None if r.body is None else bytes(r.body))
                for r in commitlog.iter_records(start, commitlog.write_position)
                if r.topic == topic and r.queue_id == 0 and r.queue_offset >= offset
            ]  # fmt: skip

        return InternalLog(
            append=append,
            read=read,
            bounds=bounds,
            is_follower=lambda: self.commitlog.is_follower,
            trailer=trailer,
            read_unexposed=read_unexposed,
        )

    # ------------------------------------------------------------------ topics

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
        """Create a topic with ``partitions`` partitions (queues 0..partitions-1).

        Args:
            retention_ms: how long its records stay readable: -1 for ever, left out
                (None) the store's ``retention_hours`` (72 h unless the store was
                created with another), else ms. ``describe_topic`` shows the value
                in force.
            retention_bytes: per partition; -1 or left out: no limit.
            cleanup_policy: "delete", "compact" or "compact,delete" (Kafka's). A
                compacted topic is read from a compacted copy of each queue
                (mqstore.compaction) and refuses messages without a key.
            topic_configs: Kafka-named settings (``mqstore.topics.KAFKA_TOPIC_CONFIGS``:
                ``min.compaction.lag.ms``...); they win over the arguments.

        Raises:
            InvalidArgumentError: the topic exists, or a setting is invalid.
        """
        self._check_writable()
        if self.topics.get(name) is not None:
            raise InvalidArgumentError(f"topic {name!r} already exists")
        fields: dict[str, Any] = dict(
            timestamp_type=timestamp_type, retention_ms=retention_ms,
            retention_bytes=retention_bytes, cleanup_policy=cleanup_policy,
        )  # fmt: skip
        fields.update(parse_kafka_configs(name, topic_configs or {}))
        config = TopicConfig(name=name, partitions=partitions, **fields)
        check_topic_config(config)
        if config.compacted:  # its copy first: a put may follow at once
            self._open_compaction().sync_topic(config)
        return self.topics.put(config)

    def alter_topic(self, name: str, topic_configs: Mapping[str, object]) -> TopicConfig:
        """Change Kafka-named topic settings (``retention.ms``...).

        Raises:
            UnknownTopicError: no such topic.
            InvalidArgumentError: a bad name or value, or compaction asked for.
        """
        self._check_writable()
        altered = attrs.evolve(self._topic_config(name), **parse_kafka_configs(name, topic_configs))
        check_topic_config(altered)
        if altered.compacted:
            self._open_compaction().sync_topic(altered)
            self._put_topics.pop(name, None)  # its puts now check their keys
        return self.topics.put(altered)

    def compact(self, topic: str) -> list[CleanResult]:
        """Run a cleaning pass now over every partition of a compacted topic: its
        durable records are copied, the copy's active segment rolled, and everything
        but the head younger than min.compaction.lag.ms is cleaned (``mqstore
        compact``; mqstore.compaction).

        Returns:
            One result per partition cleaned (bytes read and written, keys...).

        Raises:
            UnknownTopicError: no such topic.
            InvalidArgumentError: the topic is not compacted.
            ReadOnlyStoreError: the store is open read-only.
        """
        self._check_writable()
        config = self._topic_config(topic)
        if not config.compacted:
            raise InvalidArgumentError(
                f"topic {topic!r} has cleanup_policy {config.cleanup_policy!r}: nothing to "
                "compact (alter it with cleanup.policy=compact)"
            )
        self._catch_up()  # every appended record in its ConsumeQueue, to be copied
        return self._open_compaction().compact(topic)

    def list_topics(self) -> dict[str, TopicConfig]:
        """Every topic but the internal ones (``INTERNAL_TOPICS``), as Kafka lists."""
        if self.read_only:
            self.topics.refresh()
        return {n: c for n, c in self.topics.all().items() if n not in INTERNAL_TOPICS}

    def describe_topic(self, name: str) -> TopicConfig:
        """The topic's config, with the retention in force (``effective_*``).

        Raises:
            UnknownTopicError: no such topic.
        """
        config = self._topic_config(name)
        cached = self._described.get(name)
        if cached is not None and cached[0] is config:  # a per-send path: no evolve
            return cached[1]
        hours = self.config.retention_hours
        described = config.described(hours_to_ms(hours), f"store default, retention_hours={hours}")
        self._described[name] = (config, described)
        return described

    def _topic_config(self, name: str) -> TopicConfig:
        config = self.topics.get(name)
        if config is None and self.read_only:
            self.topics.refresh()
            config = self.topics.get(name)
        if config is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        return config

    @property
    def auto_create_topics(self) -> bool:
        """Whether a write to a topic that does not exist creates it."""
        return self.config.auto_create_topics

    def topic_for_write(self, name: str) -> TopicConfig:
        """The topic a write goes to, created with ``auto_create_topic_partitions``
        partitions if it does not exist and ``auto_create_topics`` is on.

        Raises:
            UnknownTopicError: no such topic and auto-creation is off.
            ReadOnlyStoreError: no such topic and the store is open read-only.
        """
        config = self.topics.get(name)
        if config is not None:
            return config
        return self._create_queue(name, 0)

    def _create_queue(self, name: str, queue_id: int) -> TopicConfig:
        """Create ``name`` (or grow it) so that it has queue ``queue_id`` (put's path
        when the queue is not yet a partition of a topic).

        Raises:
            UnknownTopicError: auto-creation is off.
            InvalidArgumentError: ``queue_id`` is past the largest partition count.
        """
        validate_topic(name)
        with self._topic_guard:  # two writers racing to create: one creates
            config = self.topics.get(name)
            if config is not None and queue_id < config.partitions:
                return config
            if not self.config.auto_create_topics:
                if config is None:
                    raise UnknownTopicError(
                        f"unknown topic {name!r} (auto_create_topics is off: create it first)"
                    )
                raise UnknownTopicError(
                    f"topic {name!r} has no partition {queue_id} (it has {config.partitions}; "
                    "auto_create_topics is off: add partitions first)"
                )
            self._check_writable()
            if queue_id >= PARTITIONS_MAX:
                raise InvalidArgumentError(
                    f"queue_id {queue_id}: a topic has at most {PARTITIONS_MAX} partitions"
                )
            if config is not None:
                # In memory; the registry file follows before the dispatch round that
                # makes the new queue's records readable (TopicRegistry.grow).
                return self.topics.grow(name, queue_id + 1)
            config = TopicConfig(
                name=name,
                partitions=max(queue_id + 1, self.config.auto_create_topic_partitions),
                timestamp_type=self.config.default_timestamp_type,
            )
            log.info("auto-created %s with %d partition(s)", name, config.partitions)
            return self.topics.put(config)

    def _check_readable(self, name: str, queue_id: int) -> None:
        """Reads never create a topic. Raises UnknownTopicError unless ``queue_id`` is
        a partition of topic ``name`` (a read-only store first looks for topics a
        writer created since it opened)."""
        config = self.topics.get(name)
        if config is not None and queue_id < config.partitions:
            return
        if self.read_only:
            self.topics.refresh()
            config = self.topics.get(name)
            if config is not None and queue_id < config.partitions:
                return
        if config is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        raise UnknownTopicError(
            f"topic {name!r} has no partition {queue_id} (it has {config.partitions})"
        )

    def _register_written_queues(self) -> int:
        """Register the topics and queues that hold records but no topic entry (a
        store written before every put registered its topic, or a crash before the
        registry followed a put's growth); return how many topics were added or
        grown. A writer's open calls it; a reader never does."""
        counts: dict[str, int] = {}
        # The ConsumeQueues' queues, and those recovery counted in the CommitLog: a
        # store held at open (replicated) dispatches some of them only later, and a
        # put's growth is not written before its records (TopicRegistry.grow).
        found = self.consume_queues.existing_queues(), self.commitlog.queue_offsets()
        for queues in found:
            for topic, queue_id in queues:
                if queue_id >= counts.get(topic, 0):
                    counts[topic] = queue_id + 1
        changed = 0
        for topic, partitions in sorted(counts.items()):
            config = self.topics.get(topic)
            if config is not None and partitions <= config.partitions:
                continue
            if partitions > PARTITIONS_MAX:
                log.warning("%s has queues past %d: not registered", topic, PARTITIONS_MAX)
                continue
            if config is None:
                config = TopicConfig(
                    name=topic,
                    partitions=partitions,
                    timestamp_type=self.config.default_timestamp_type,
                )
            self.topics.put(attrs.evolve(config, partitions=partitions))
            log.info("registered topic %s (%d partitions) found on disk", topic, partitions)
            changed += 1
        return changed

    def add_partitions(self, name: str, partitions: int) -> TopicConfig:
        """Grow a topic to ``partitions`` partitions (Kafka never shrinks them)."""
        self._check_writable()
        config = self._topic_config(name)
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise InvalidTypeError("partitions must be an int")
        if not config.partitions < partitions <= PARTITIONS_MAX:
            raise InvalidArgumentError(
                f"topic {name!r} has {config.partitions} partitions; the new count must be "
                f"larger and at most {PARTITIONS_MAX}"
            )
        grown = attrs.evolve(config, partitions=partitions)
        if grown.compacted:
            self._open_compaction().sync_topic(grown)
        return self.topics.put(grown)

    def _partition(self, topic: str, partition: int) -> TopicConfig:
        config = self._topic_config(topic)
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise InvalidTypeError(f"partition must be an int, not {type(partition).__name__}")
        if not 0 <= partition < config.partitions:
            raise UnknownTopicError(
                f"topic {topic!r} has no partition {partition} (it has {config.partitions})"
            )
        return config

    # ------------------------------------------------------------------ records

    def append_records(
        self,
        topic: str,
        partition: int,
        records: Sequence[ProducerRecord],
        trailer: Trailer | None = None,
    ) -> list[AppendedRecord]:
        """Append records to one partition under one lock and one flush; an unknown
        topic is created first when ``auto_create_topics`` is on. ``trailer``: a
        record appended right after, as one append group (``InternalLog.trailer``)."""
        config = self.topic_for_write(topic)
        if type(partition) is not int or not 0 <= partition < config.partitions:
            config = self._partition(topic, partition)  # raises what is wrong
        if not records:
            return []
        if config.compacted:
            if topic in INTERNAL_TOPICS:  # only the store writes them
                raise InvalidRecordError(f"{topic} is an internal topic: it takes no records")
            check_keyed(topic, records)  # Kafka's INVALID_RECORD
        log_append = config.timestamp_type == "LogAppendTime"
        if len(records) == 1 and trailer is None:  # the per-message path: no batch machinery
            value, keys, pairs, born, sizes = _prepare(records[0])
            result = self.put(
                topic, partition, value, keys=keys, properties=pairs, born_timestamp_ms=born
            )
            stamp = result[2] if log_append or born is None else born  # store_timestamp_ms
            return [_new_tuple(AppendedRecord, (result[1], stamp, *sizes))]
        prepared = [_prepare(record) for record in records]
        results = self.put_batch(
            topic,
            partition,
            [item[0] for item in prepared],
            keys=[item[1] for item in prepared],
            properties=[item[2] for item in prepared],
            born_timestamp_ms=[item[3] for item in prepared],
            trailer=trailer,
        )
        return [
            AppendedRecord(
                result.queue_offset,
                result.store_timestamp_ms if log_append or item[3] is None else item[3],
                *item[4],
            )
            for result, item in zip(results, prepared, strict=True)
        ]

    def read_records(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[EngineRecord]:
        return self.read_batch(topic, partition, offset, max_records).records()

    def read_batch(self, topic: str, partition: int, offset: int, max_records: int) -> EngineBatch:
        """Records from ``offset`` as columns, straight from one ``get_batch``: no
        Message or EngineRecord is made per record."""
        config = self._partition(topic, partition)
        batch = self.get_batch(topic, partition, offset, min(max_records, READ_RECORDS_MAX))
        return _engine_batch(batch, config.timestamp_type == "LogAppendTime")

    def earliest_offset(self, topic: str, partition: int) -> int:
        self._partition(topic, partition)
        return self.min_offset(topic, partition)

    def latest_offset(self, topic: str, partition: int) -> int:
        self._partition(topic, partition)
        return self.max_offset(topic, partition)

    def offset_for_timestamp(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None:
        config = self._partition(topic, partition)
        offset = self.offset_for_time(topic, partition, timestamp_ms)
        if offset is None:
            return None
        message = self.get(topic, partition, offset, 1)[0]
        log_append = config.timestamp_type == "LogAppendTime"
        stamp = message.store_timestamp_ms if log_append else message.born_timestamp_ms
        return offset, stamp

    def wait_for_data(self, positions: Sequence[tuple[str, int, int]], timeout_ms: int) -> bool:
        queues = [(self._queue(topic, partition), offset) for topic, partition, offset in positions]

        def ready() -> bool:
            return any(queue.max_offset > offset for queue, offset in queues)

        return self._wait_until(ready, timeout_ms)


def _prepare(
    record: ProducerRecord,
) -> tuple[Any, tuple[str, ...], list[tuple[str, Any]] | None, int | None, tuple[int, int, int]]:
    """(body, index keys, properties, born timestamp, serialized sizes) of a record."""
    key, value, headers, timestamp_ms = record
    _check_bytes("key", key)
    _check_bytes("value", value)
    pairs = list(headers) if headers else []
    if pairs and any(name.startswith(RESERVED_PREFIX) for name, _ in pairs):
        # The store's own properties (KEY_PROPERTY) live there: such a header would
        # read back as the record's key (found by hypothesis in test_fetch_batch).
        raise InvalidRecordError("header names starting with NUL are reserved by the store")
    header_size = sum(len(name) + len(data) for name, data in pairs) if pairs else 0
    if key is not None:
        pairs.insert(0, (KEY_PROPERTY, key))
    sizes = (-1 if key is None else len(key), -1 if value is None else len(value), header_size)
    return value, _index_keys(key), pairs or None, timestamp_ms, sizes


def _check_bytes(name: str, value: object) -> None:
    if value is not None and not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidTypeError(f"{name} must be bytes or None, not {type(value).__name__}")


def _index_keys(key: bytes | bytearray | memoryview | None) -> tuple[str, ...]:
    if not key:
        return ()
    try:
        text = bytes(key).decode("utf-8")
    except UnicodeDecodeError:
        return ()
    return () if "\x00" in text or len(key) > 0xFFFF else (text,)


def _engine_batch(batch: MessageBatch, log_append: bool) -> EngineBatch:
    """A batch's records as Kafka records (see the module docstring for the mapping):
    one list per field, made by C loops (``values``, ``kafka_keys``, ``tolist``)."""
    count = len(batch)
    headers: list[list[tuple[str, bytes]]] = [no_headers()] * count  # shared, read-only
    header_sizes = [0] * count
    for row in batch.header_rows():
        pairs = headers[row] = batch.headers(row)
        header_sizes[row] = sum(len(name) + len(value) for name, value in pairs)
    stamps = batch.store_timestamps_ms if log_append else batch.born_timestamps_ms
    stamp_type = TIMESTAMP_LOG_APPEND_TIME if log_append else TIMESTAMP_CREATE_TIME
    return EngineBatch(
        batch.queue_offsets.tolist(), stamps.tolist(), [stamp_type] * count,
        batch.kafka_keys(), batch.values(), headers, [None] * count,
        _sizes(batch.kafka_key_offsets, batch.kafka_key_valid, bool(batch.extra_data)),
        _sizes(batch.body_offsets, batch.body_valid, True), header_sizes,
    )  # fmt: skip


def _sizes(offsets: np.ndarray, valid: np.ndarray, any_valid: bool) -> list[int]:
    """Kafka's serialized sizes of a binary column: its lengths, -1 where null."""
    if not any_valid:
        return [-1] * len(valid)
    lengths = np.diff(offsets)
    return (lengths if valid.all() else np.where(valid, lengths, -1)).tolist()
