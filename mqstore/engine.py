"""The engine interface: the one small surface the Kafka-style adapter talks to.

Two engines implement it: ``MessageStore`` (the CommitLog design) and
``segmented.SegmentedStore`` (Kafka's segmented design, the baseline). The adapter
(``KafkaProducer``, ``KafkaConsumer``) and its conformance tests run unchanged
against either, so benchmarks compare designs, not adapters.

Semantics every engine keeps, as in Kafka:
- offsets of a partition are dense from the log start offset (on a compacted
  topic, compaction leaves gaps: a read returns the next record); ``latest_offset`` is
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

from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple, Protocol, runtime_checkable

import attrs

from mqstore.commitlog.columns import tuples, untracked_empty_list
from mqstore.offsets import CommittedOffsets
from mqstore.topics import TopicConfig

__all__ = [
    "AppendedBatch",
    "AppendedRecord",
    "Engine",
    "EngineBatch",
    "EngineRecord",
    "NO_HEADERS",
    "ProducerRecord",
    "ReadOnlyHeaders",
    "no_headers",
]

TIMESTAMP_CREATE_TIME = 0  # Kafka's timestamp_type codes
TIMESTAMP_LOG_APPEND_TIME = 1


class ReadOnlyHeaders(list):
    """The headers of a record read back without any: an empty list that refuses to
    change. Every such record shares one (NO_HEADERS), out of the cyclic GC, so its
    ConsumerRecord holds nothing the collector must walk (issue 15: a poll's 500
    records with a list of their own each made the collections half of its time).
    It equals [] and is a list, as kafka-python's headers are."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:
            self._read_only()
        super().__init__()

    def _read_only(self, *_args: Any, **_kwargs: Any) -> Any:
        raise TypeError("a consumed record's headers are read-only; copy them: list(headers)")

    append = extend = insert = remove = pop = clear = sort = reverse = _read_only
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only


#: The headers of every record read back without headers (see ReadOnlyHeaders).
NO_HEADERS: Final = untracked_empty_list(ReadOnlyHeaders())


def no_headers() -> list[tuple[str, bytes]]:
    """NO_HEADERS for a batch of records about to be read, emptied first if code went
    around its refusals (``list.append(NO_HEADERS, ...)``), so that no record shows
    headers it does not have. (The C rows holding it stay tracked by the garbage
    collector while it is not empty: commitlog/columns.py.)"""
    if NO_HEADERS:
        list.clear(NO_HEADERS)
        untracked_empty_list(NO_HEADERS)
    return NO_HEADERS


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


class AppendedBatch(NamedTuple):
    """Where a batch appended as it came (the segmented engine's ``append_batch``)
    landed."""

    base_offset: int
    record_count: int
    max_timestamp_ms: int  # the batch's; the append time on a LogAppendTime topic


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


@attrs.frozen
class EngineBatch:
    """Records read back, one list per EngineRecord field (record i is item i of
    each): what the adapter builds its ConsumerRecords from without an EngineRecord
    per record. A ``headers`` item is NO_HEADERS for a record without headers (one
    shared read-only empty list), else a list of its own."""

    offsets: list[int]
    timestamps_ms: list[int]
    timestamp_types: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[tuple[str, bytes]]]
    checksums: list[int | None]
    serialized_key_sizes: list[int]
    serialized_value_sizes: list[int]
    serialized_header_sizes: list[int]

    def __attrs_post_init__(self) -> None:
        lengths = {len(column) for column in attrs.astuple(self, recurse=False)}
        assert len(lengths) <= 1, f"EngineBatch columns differ in length: {lengths}"

    def __len__(self) -> int:
        return len(self.offsets)

    def records(self) -> list[EngineRecord]:
        """The records, one EngineRecord each (made column by column, in C when built)."""
        return tuples(EngineRecord, attrs.astuple(self, recurse=False), NO_HEADERS)

    @classmethod
    def of_records(cls, records: Sequence[EngineRecord]) -> EngineBatch:
        """The batch of records read one by one (an engine without a bulk read)."""
        columns: list[Any] = [list(column) for column in zip(*records, strict=True)]
        return cls(*columns) if columns else cls(*([] for _ in range(10)))


@runtime_checkable
class Engine(Protocol):
    """What ``KafkaProducer(store)`` and ``KafkaConsumer(store=store)`` need."""

    @property
    def offsets(self) -> CommittedOffsets: ...

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

    def read_batch(self, topic: str, partition: int, offset: int, max_records: int) -> EngineBatch:
        """``read_records`` as columns (what ``KafkaConsumer.poll`` reads)."""
        ...

    def earliest_offset(self, topic: str, partition: int) -> int: ...

    def latest_offset(self, topic: str, partition: int) -> int: ...

    def offset_for_timestamp(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None: ...

    def wait_for_data(self, positions: Sequence[tuple[str, int, int]], timeout_ms: int) -> bool:
        """Block until any (topic, partition, offset) has a record at or after offset."""
        ...
