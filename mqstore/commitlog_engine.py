"""The engine interface (mqstore.engine) on top of the CommitLog store.

A Kafka partition is a ConsumeQueue: partition p of topic t is queue (t, p), and
Kafka offsets are queue offsets. A Kafka record maps onto a message:

- value -> body (None -> a tombstone body);
- key -> the property ``KEY_PROPERTY`` (exact bytes); a key that is UTF-8 text
  without NUL is also indexed as a message key, so ``query_by_key`` finds it;
- headers -> the other properties, in order;
- timestamp -> born timestamp (CreateTime); LogAppendTime topics use the store
  timestamp set under the append lock.

Topics must be created (``create_topic``) before the engine accepts records for
them, and partitions are checked against the topic's count, as a Kafka broker does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from commitlog.errors import InvalidArgumentError, InvalidTypeError, UnknownTopicError
from mqstore.engine import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    AppendedRecord,
    EngineRecord,
    ProducerRecord,
)
from mqstore.message import Message
from mqstore.offsets import OffsetStore
from mqstore.topics import PARTITIONS_MAX, TopicConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from commitlog.commitlog import CommitLog
    from mqstore.message import PutResult
    from mqstore.topics import TopicRegistry

__all__ = ["KEY_PROPERTY", "CommitLogEngine"]

KEY_PROPERTY = "\x00key"  # a NUL-prefixed name no user header can collide with in practice
READ_RECORDS_MAX = 10_000  # bounded like MessageStore.get


class CommitLogEngine:
    """Mixed into MessageStore: the engine interface."""

    _offset_store: OffsetStore | None = None

    if TYPE_CHECKING:  # what MessageStore provides
        root: str
        read_only: bool
        topics: TopicRegistry
        commitlog: CommitLog

        def _check_writable(self) -> None: ...
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
        ) -> list[PutResult]: ...
        def get(
            self, topic: str, queue_id: int, offset: int, max_messages: int = 32
        ) -> list[Message]: ...
        def min_offset(self, topic: str, queue_id: int) -> int: ...
        def max_offset(self, topic: str, queue_id: int) -> int: ...
        def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None: ...

    @property
    def offsets(self) -> OffsetStore:
        if self._offset_store is None:
            self._offset_store = OffsetStore(self.root, self.read_only)
        return self._offset_store

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
    ) -> TopicConfig:
        """Create a topic with ``partitions`` partitions (queues 0..partitions-1).

        Raises:
            InvalidArgumentError: the topic exists, or a setting is invalid.
        """
        self._check_writable()
        if self.topics.get(name) is not None:
            raise InvalidArgumentError(f"topic {name!r} already exists")
        config = TopicConfig(
            name=name,
            partitions=partitions,
            timestamp_type=timestamp_type,  # type: ignore[arg-type]
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            cleanup_policy=cleanup_policy,  # type: ignore[arg-type]
        )
        return self.topics.put(config)

    def list_topics(self) -> dict[str, TopicConfig]:
        if self.read_only:
            self.topics.refresh()
        return self.topics.all()

    def describe_topic(self, name: str) -> TopicConfig:
        config = self.topics.get(name)
        if config is None and self.read_only:
            self.topics.refresh()
            config = self.topics.get(name)
        if config is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        return config

    def add_partitions(self, name: str, partitions: int) -> TopicConfig:
        """Grow a topic to ``partitions`` partitions (Kafka never shrinks them)."""
        self._check_writable()
        config = self.describe_topic(name)
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise InvalidTypeError("partitions must be an int")
        if not config.partitions < partitions <= PARTITIONS_MAX:
            raise InvalidArgumentError(
                f"topic {name!r} has {config.partitions} partitions; the new count must be "
                f"larger and at most {PARTITIONS_MAX}"
            )
        return self.topics.put(attrs.evolve(config, partitions=partitions))

    def _partition(self, topic: str, partition: int) -> TopicConfig:
        config = self.describe_topic(topic)
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise InvalidTypeError(f"partition must be an int, not {type(partition).__name__}")
        if not 0 <= partition < config.partitions:
            raise UnknownTopicError(
                f"topic {topic!r} has no partition {partition} (it has {config.partitions})"
            )
        return config

    # ------------------------------------------------------------------ records

    def append_records(
        self, topic: str, partition: int, records: Sequence[ProducerRecord]
    ) -> list[AppendedRecord]:
        """Append records to one partition under one lock and one flush."""
        config = self._partition(topic, partition)
        if not records:
            return []
        log_append = config.timestamp_type == "LogAppendTime"
        prepared = [_prepare(record) for record in records]
        if len(prepared) == 1:  # the per-message path skips the batch machinery
            value, keys, pairs, born, sizes = prepared[0]
            result = self.put(
                topic, partition, value, keys=keys, properties=pairs, born_timestamp_ms=born
            )
            stamp = result.store_timestamp_ms if log_append or born is None else born
            return [AppendedRecord(result.queue_offset, stamp, *sizes)]
        results = self.put_batch(
            topic,
            partition,
            [item[0] for item in prepared],
            keys=[item[1] for item in prepared],
            properties=[item[2] for item in prepared],
            born_timestamp_ms=[item[3] for item in prepared],
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
        config = self._partition(topic, partition)
        messages = self.get(topic, partition, offset, min(max_records, READ_RECORDS_MAX))
        log_append = config.timestamp_type == "LogAppendTime"
        return [_to_engine_record(message, log_append) for message in messages]

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
    header_size = sum(len(name) + len(data) for name, data in pairs)
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


def _to_engine_record(message: Message, log_append: bool) -> EngineRecord:
    key = None
    headers = []
    for name, value in message.properties:
        if name == KEY_PROPERTY and key is None:
            key = value
        else:
            headers.append((name, value))
    value_bytes = message.value
    return EngineRecord(
        message.queue_offset,
        message.store_timestamp_ms if log_append else message.born_timestamp_ms,
        TIMESTAMP_LOG_APPEND_TIME if log_append else TIMESTAMP_CREATE_TIME,
        key,
        value_bytes,
        headers,
        None,
        -1 if key is None else len(key),
        -1 if value_bytes is None else len(value_bytes),
        sum(len(k) + len(v) for k, v in headers),
    )
