"""The broker's storage adapter: Kafka partitions over an engine (mqstore.engine).

The protocol code (mqstore.broker.handlers) reaches storage through ``PartitionLog``
only: append a checked producer batch, fetch batches from an offset, the offsets of
a partition, offsets by time, a long-poll wait, and the topics. ``RecordLog`` is
the implementation over the engine interface that both engines implement (the
CommitLog engine's ``ColumnLog`` and the segmented engine's ``SegmentLog`` refine
it):

- **Produce** (docs/BROKER.md option A, today's per-record model): the batch is
  decoded (inflated if compressed) and its records appended with
  ``Engine.append_records``, one lock and one flush per batch. The Kafka key is
  stored and indexed (``query_by_key`` finds it), headers become properties, the
  producer's timestamp the CreateTime (or the append time on a LogAppendTime
  topic). The producer's id, epoch and sequences are not stored in the records;
  on the CommitLog engine the producer's state record follows the batch as its
  trailer, one append group (``Trailer``, mqstore.broker.producers).
- **Fetch**: records are read as columns (``Engine.read_batch``, ``get_batch`` on the
  CommitLog engine) and built into uncompressed v2 batches, one per read.

Option B2 (each producer batch stored as one CommitLog record with one ConsumeQueue
unit per Kafka record) replaces ``RecordLog`` behind the same interface, with no
change to the protocol code.

Crash policy: the engine's. An append is one ``append_records`` call, so a crash
keeps a prefix of a batch's records, never a torn record (with a trailer, the whole
batch and its trailer or neither); under sync flush it returns only once they are
durable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple, Protocol

from mqstore.broker.batch import ProducedBatch, build_fetch_batch, decode_produced
from mqstore.commitlog.batch import Trailer
from mqstore.commitlog.errors import StoreError
from mqstore.engine import Engine, EngineBatch
from mqstore.topics import TopicConfig

__all__ = ["Appended", "PartitionLog", "RecordLog", "UnsupportedByEngineError"]


class UnsupportedByEngineError(StoreError):
    """The engine cannot do what was asked (e.g. move a CommitLog queue's start)."""


#: One engine read takes at most this many records (both engines' per-call bound).
READ_RECORDS_MAX: Final = 10_000
#: A record of a built batch costs its key, value and headers plus at most this much
#: framing (varints, attributes); what a read asks for is sized from it.
RECORD_OVERHEAD_BYTES: Final = 24
RECORD_BYTES_GUESS: Final = 128  # a first read's record count: max_bytes / this


class Appended(NamedTuple):
    """Where a produced batch landed."""

    base_offset: int
    log_append_time_ms: int  # -1 unless the topic is LogAppendTime
    log_start_offset: int


class PartitionLog(Protocol):
    """What the protocol code needs from storage (see the module docstring)."""

    def topics(self) -> dict[str, TopicConfig]: ...

    def create_topic(
        self,
        name: str,
        partitions: int,
        timestamp_type: str,
        topic_configs: Mapping[str, str] | None = None,
    ) -> TopicConfig: ...

    def describe_topic(self, name: str) -> TopicConfig: ...

    def add_partitions(self, name: str, partitions: int) -> TopicConfig: ...

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int: ...

    def append(
        self, topic: str, partition: int, batch: ProducedBatch, trailer: Trailer | None = None
    ) -> Appended: ...

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int) -> list[bytes]: ...

    def log_start_offset(self, topic: str, partition: int) -> int: ...

    def high_watermark(self, topic: str, partition: int) -> int: ...

    def log_end_offset(self, topic: str, partition: int) -> int: ...

    def offset_for_time(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None: ...

    def wait(self, positions: Sequence[tuple[str, int, int]], timeout_ms: int) -> bool: ...


class RecordLog:
    """``PartitionLog`` over any engine, one engine record per Kafka record."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def topics(self) -> dict[str, TopicConfig]:
        return self.engine.list_topics()

    def create_topic(
        self,
        name: str,
        partitions: int,
        timestamp_type: str,
        topic_configs: Mapping[str, str] | None = None,
    ) -> TopicConfig:
        """Kafka-named ``topic_configs`` (``cleanup.policy``...) win over the rest."""
        return self.engine.create_topic(
            name, partitions, timestamp_type=timestamp_type, topic_configs=topic_configs
        )

    def describe_topic(self, name: str) -> TopicConfig:
        """The topic's config with its ``effective_*`` fields filled in."""
        return self.engine.describe_topic(name)

    def add_partitions(self, name: str, partitions: int) -> TopicConfig:
        return self.engine.add_partitions(name, partitions)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Move the partition's log start offset up to ``before_offset``; the log
        start offset now.

        Raises:
            UnsupportedByEngineError: the engine has no movable log start (CommitLog).
            OffsetOutOfRangeError, UnknownTopicError: as the engine raises them.
        """
        delete = getattr(self.engine, "delete_records", None)
        if delete is None:
            raise UnsupportedByEngineError(
                f"{type(self.engine).__name__} cannot move a log start offset; "
                "retention drops old records"
            )
        return int(delete(topic, partition, before_offset))

    def append(
        self, topic: str, partition: int, batch: ProducedBatch, trailer: Trailer | None = None
    ) -> Appended:
        """Append a checked batch's records (and the ``trailer``, one append group
        with them: only an engine with a CommitLog takes one).

        Raises:
            InvalidBatchError: the records do not decode (nothing appended).
            StoreError: what ``append_records`` raises (nothing appended, or under
                sync flush FlushTimeoutError: appended but not acknowledged).
        """
        records = decode_produced(batch)
        if trailer is None:
            appended = self.engine.append_records(topic, partition, records)
        else:
            appended = self.engine.append_records(  # type: ignore[call-arg]
                topic, partition, records, trailer
            )
        assert len(appended) == len(records)
        config = self.engine.describe_topic(topic)
        stamp = appended[0].timestamp_ms if config.timestamp_type == "LogAppendTime" else -1
        return Appended(appended[0].offset, stamp, self.log_start_offset(topic, partition))

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int) -> list[bytes]:
        """Batches from ``offset`` holding about ``max_bytes``; the first record is
        always included, even when it alone is larger (KIP-74). ``[]`` at the end.

        Raises:
            OffsetOutOfRangeError: ``offset`` below the log start or past the end.
        """
        out: list[bytes] = []
        budget = max_bytes
        wanted = max(1, min(READ_RECORDS_MAX, max_bytes // RECORD_BYTES_GUESS))
        while budget > 0:
            read = self.engine.read_batch(topic, partition, offset, wanted)
            if not len(read):
                break
            count = _fitting(read, budget, must_take_one=not out)
            if count == 0:
                break
            built = build_fetch_batch(read, 0, count)
            out.append(bytes(built))
            budget -= len(built)
            offset = read.offsets[count - 1] + 1
            if count < len(read) or len(read) < wanted:
                break
            wanted = min(READ_RECORDS_MAX, wanted * 2)
        return out

    def log_start_offset(self, topic: str, partition: int) -> int:
        return self.engine.earliest_offset(topic, partition)

    def high_watermark(self, topic: str, partition: int) -> int:
        return self.engine.latest_offset(topic, partition)

    def log_end_offset(self, topic: str, partition: int) -> int:
        """The partition's end in the log: past the high watermark when readers do
        not see all of it yet (a CommitLog's queue end; else the high watermark)."""
        commitlog = getattr(self.engine, "commitlog", None)
        if commitlog is None:
            return self.high_watermark(topic, partition)
        self.engine.describe_topic(topic)  # UnknownTopicError for a topic that is gone
        return int(commitlog.next_queue_offset(topic, partition))

    def offset_for_time(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None:
        return self.engine.offset_for_timestamp(topic, partition, timestamp_ms)

    def wait(self, positions: Sequence[tuple[str, int, int]], timeout_ms: int) -> bool:
        return self.engine.wait_for_data(positions, timeout_ms)


def _fitting(read: EngineBatch, budget: int, *, must_take_one: bool) -> int:
    """How many leading records of ``read`` fit in ``budget``."""
    keys = read.keys
    values = read.values
    header_sizes = read.serialized_header_sizes
    used = 61  # the batch header
    for index in range(len(keys)):
        key, value = keys[index], values[index]
        used += RECORD_OVERHEAD_BYTES + max(header_sizes[index], 0) * 2
        used += (0 if key is None else len(key)) + (0 if value is None else len(value))
        if used > budget:
            return max(index, 1 if must_take_one else 0)
    return len(keys)
