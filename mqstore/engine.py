"""The engine interface: the one small surface the Kafka-style adapter talks to.

Two engines implement it: ``MessageStore`` (the CommitLog design) and
``segmented.SegmentedStore`` (Kafka's segmented design, the baseline). The adapter
(``KafkaProducer``, ``KafkaConsumer``) and its conformance tests run unchanged
against either, so benchmarks compare designs, not adapters.

Semantics every engine keeps, as in Kafka:
- offsets of a partition are dense from the log start offset; ``latest_offset`` is
  the next offset to be written (the log end offset), ``earliest_offset`` the log
  start offset after retention;
- ``offset_for_timestamp`` gives the first offset (in offset order) whose timestamp
  is >= T, with that record's timestamp, or None when there is none;
- a topic exists once created, explicitly or (``auto_create_topics``) by a write
  to it; reads never create one (UnknownTopicError);
- a record's timestamp is its CreateTime (given by the producer, else the append
  time) or its LogAppendTime, as the topic's ``timestamp_type`` says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from mqstore.offsets import OffsetStore
from mqstore.topics import TopicConfig

__all__ = ["AppendedRecord", "Engine", "EngineRecord", "ProducerRecord"]

TIMESTAMP_CREATE_TIME = 0  # Kafka's timestamp_type codes
TIMESTAMP_LOG_APPEND_TIME = 1


class ProducerRecord(NamedTuple):
    """One record to append. ``timestamp_ms`` None means "now"."""

    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]
    timestamp_ms: int | None


class AppendedRecord(NamedTuple):
    """Where a record landed."""

    offset: int
    timestamp_ms: int
    serialized_key_size: int
    serialized_value_size: int
    serialized_header_size: int


class EngineRecord(NamedTuple):
    """One record read back."""

    offset: int
    timestamp_ms: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    checksum: int | None
    serialized_key_size: int
    serialized_value_size: int
    serialized_header_size: int


@runtime_checkable
class Engine(Protocol):
    """What ``KafkaProducer(store)`` and ``KafkaConsumer(store=store)`` need."""

    @property
    def offsets(self) -> OffsetStore: ...

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        timestamp_type: str = "CreateTime",
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        cleanup_policy: str = "delete",
    ) -> TopicConfig: ...

    def list_topics(self) -> dict[str, TopicConfig]: ...

    def describe_topic(self, name: str) -> TopicConfig: ...

    def add_partitions(self, name: str, partitions: int) -> TopicConfig: ...

    @property
    def auto_create_topics(self) -> bool:
        """Whether a write to a topic that does not exist creates it."""
        ...

    def topic_for_write(self, name: str) -> TopicConfig:
        """The topic, created by this write if it does not exist and auto-creation is
        on; else UnknownTopicError."""
        ...

    def append_records(
        self, topic: str, partition: int, records: Sequence[ProducerRecord]
    ) -> list[AppendedRecord]: ...

    def read_records(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[EngineRecord]: ...

    def earliest_offset(self, topic: str, partition: int) -> int: ...

    def latest_offset(self, topic: str, partition: int) -> int: ...

    def offset_for_timestamp(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None: ...

    def wait_for_data(self, positions: Sequence[tuple[str, int, int]], timeout_ms: int) -> bool:
        """Block until any (topic, partition, offset) has a record at or after offset."""
        ...
