"""Compaction for the CommitLog engine: a compacted copy of each compacted queue.

The shared CommitLog holds every topic's records in one stream, so it cannot be
compacted per queue in place. RocketMQ 5's answer (RIP-30) is a second copy: each
queue of a compacted topic is copied, in queue-offset order, into a log of its own,
that log is compacted in the background, and reads of the topic come from it, so the
CommitLog's ordinary retention may delete the originals without losing a key.

Here the copy is a partition of a Kafka-design segmented log (mqstore.segmented,
one store under ``<root>/compaction/``), so the cleaner is the segmented engine's
LogCleaner, with all of Kafka's rules: the dirty ratio, min/max compaction lag, the
bounded key map, the delete horizon that KIP-534 stamps on tombstone batches, and
the ``.cleaned``/``.swap`` files recovered after a crash. Each copied record is a
Kafka record whose key is the compaction key, whose offset is the queue offset and
whose value is the CommitLog record's bytes as stored (checksum included), so a read
decodes the very record ``get`` would have returned. A tombstone (a message with no
body) is a Kafka record with a null value, its CommitLog record in a header.

The compaction key of a message is its Kafka key (the ``KEY_PROPERTY`` property
every Kafka-style write sets), else its message keys as stored (``keys=``; all of
them, in order). A compacted topic refuses a message with neither
(InvalidRecordError, Kafka's INVALID_RECORD).

What it fixes from RocketMQ:

- **Copying is a pull from the queue's end of copy**, not a push from the
  dispatcher: after a restart it continues from the copy's end (apache/rocketmq#6587:
  compaction stopped after a restart).
- **A queue's first offset comes from the copy**, not from the raw ConsumeQueue
  that CommitLog retention moves (apache/rocketmq#7540 lost live messages so).
- **CommitLog retention waits for the copy**: a file is deleted only when every
  compacted queue's copy is durable past it (``floor``).
- **Tombstones have a horizon** (delete.retention.ms), as in Kafka; RocketMQ drops
  them in the first pass, so a lagging consumer never sees a delete.

Only what the CommitLog made durable is copied (its flushed position), so after a
power cut the copy never holds a record the CommitLog lost, and a queue offset
never names two records. Reads below the copy's end come from the copy (a read at
an offset compacted away returns the next record); reads at or past it come from
the ConsumeQueue as for any topic.

A store opened read-only reads the writer's copies from their files (``CopyReader``):
the same records, without the writer's end of copy, so past what the copy holds it
reads the ConsumeQueue (records not yet compacted, as written). Its key look-ups see
only what CommitLog retention left.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from mqstore.batch import MessageBatch
from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    StoreError,
)
from mqstore.commitlog.record import FLAG_NULL_BODY, decode
from mqstore.commitlog_engine import KEY_PROPERTY
from mqstore.segmented.config import MESSAGE_SIZE_MAX_BYTES, SegmentedConfig
from mqstore.segmented.files import partition_directory
from mqstore.segmented.record_batch import (
    MalformedBatchError,
    build_batch,
    decode_batches,
    zigzag_varint,
)
from mqstore.segmented.store import SegmentedStore
from mqstore.topics import TopicConfig

if TYPE_CHECKING:
    from mqstore.commitlog.commitlog import CommitLog
    from mqstore.commitlog.record import Record
    from mqstore.consumequeue import ConsumeQueueStore
    from mqstore.segmented.cleaner import CleanResult
    from mqstore.topics import TopicRegistry

__all__ = ["COMPACTION_DIR", "CompactionLogs", "CopyReader", "check_compaction_keys"]

log = logging.getLogger(__name__)

COMPACTION_DIR: Final = "compaction"
COPY_INTERVAL_MS: Final = 200  # the copy job's period
COPY_BATCH_RECORDS: Final = 1_000  # records per copied batch
COPY_RUN_RECORDS_MAX: Final = 50_000  # records one queue copies per run (then the next)
COPY_BATCH_BYTES: Final = 1 << 20  # bytes of records per copied batch (one record may pass)
SEGMENT_BYTES = 64 << 20  # the copies' segment size (Kafka's default is 1 GiB)
DEDUPE_BUFFER_BYTES = 32 << 20  # the cleaner's key map (Kafka: 128 MiB): ~190,000 keys
CLEANER_BACKOFF_MS = 15_000  # the copies' cleaner period (Kafka's log.cleaner.backoff.ms)
RECORD_HEADER: Final = "mq.record"  # a tombstone's CommitLog record
RECORD_HEADER_BYTES: Final = RECORD_HEADER.encode()
_PHYSICAL: Final = struct.Struct("<q")
READ_ATTEMPTS: Final = 5  # a read-only view re-lists the copy's files this often
_PHYSICAL_AT: Final = 24  # the record's stored physical offset (commitlog/record.py)


def check_compaction_keys(
    topic: str,
    keys: Sequence[Sequence[str] | str | None] | None,
    properties: Sequence[Any] | None,
    count: int,
) -> None:
    """Refuse a write to a compacted topic holding a message without a compaction key.

    Raises:
        InvalidRecordError: message i has neither a Kafka key nor message keys.
    """
    for index in range(count):
        item = None if keys is None else keys[index]
        if item:
            continue
        pairs = None if properties is None else properties[index]
        if isinstance(pairs, dict):
            pairs = pairs.items()
        if pairs and any(name == KEY_PROPERTY for name, _ in pairs):
            continue
        raise InvalidRecordError(
            f"compacted topic {topic!r} cannot accept a message without a key (message "
            f"{index}: give it keys= or a Kafka key; nothing was appended)"
        )


class CompactionLogs:
    """The compacted copies of one MessageStore's compacted topics (a writer's)."""

    def __init__(
        self,
        root: str,
        commitlog: CommitLog,
        consume_queues: ConsumeQueueStore,
        topics: TopicRegistry,
        clock_ms: Callable[[], int],
        read_units: Callable[[Any, str, int, int, np.ndarray], list[MessageBatch]],
        *,
        flush_interval_ms: int,
    ) -> None:
        self.root = os.path.join(root, COMPACTION_DIR)
        self._commitlog = commitlog
        self._consume_queues = consume_queues
        self._topics = topics
        self._read_units = read_units  # the store's verified read of units (C when built)
        self._copy_lock = threading.Lock()
        self.copied_records = 0
        self.store = SegmentedStore.open(
            self.root,
            SegmentedConfig(
                segment_bytes=SEGMENT_BYTES,
                flush_interval_ms=flush_interval_ms,
                retention_ms=-1,
                max_message_size_bytes=MESSAGE_SIZE_MAX_BYTES,
                auto_create_topics=False,
                cleaner_dedupe_buffer_bytes=DEDUPE_BUFFER_BYTES,
                cleaner_backoff_ms=CLEANER_BACKOFF_MS,
                file_delete_delay_ms=0,  # no reader of the copies holds a file by name
            ),
            clock_ms=clock_ms,
        )
        try:
            self.sync_topics()
        except BaseException:
            self.store.close()
            raise

    @staticmethod
    def wanted(root: str, topics: TopicRegistry) -> bool:
        """Whether a writer's open must open the copies: a compacted topic, or copies
        on disk (a topic compacted before keeps its copy)."""
        return any(t.compacted for t in topics.all().values()) or os.path.isdir(
            os.path.join(root, COMPACTION_DIR)
        )

    # ------------------------------------------------------------------ topics

    def sync_topics(self) -> None:
        """Give every compacted topic a copy with its settings and partitions."""
        for topic in self._topics.all().values():
            if topic.compacted:
                self.sync_topic(topic)

    def sync_topic(self, topic: TopicConfig) -> None:
        """Create or update the copy of ``topic`` (compacted): same partitions, same
        compaction settings, and for "compact,delete" the same retention."""
        store = self.store
        configs = {
            "cleanup.policy": topic.cleanup_policy,
            "min.cleanable.dirty.ratio": topic.min_cleanable_dirty_ratio,
            "min.compaction.lag.ms": topic.min_compaction_lag_ms,
            "max.compaction.lag.ms": topic.max_compaction_lag_ms,
            "delete.retention.ms": topic.delete_retention_ms,
            "retention.ms": _or_unlimited(topic.retention_ms),
            "retention.bytes": _or_unlimited(topic.retention_bytes),
        }
        copy = store.topics.get(topic.name)
        if copy is None:
            store.create_topic(topic.name, topic.partitions, topic_configs=configs)
            return
        if copy.partitions < topic.partitions:
            store.add_partitions(topic.name, topic.partitions)
        store.alter_topic(topic.name, configs)

    def compacted(self, topic: str, queue_id: int | None = None) -> bool:
        """Whether reads of ``topic`` (its queue ``queue_id``) go through a copy: the
        topic is compacted now and its copy has that partition. Arguments of the
        wrong type are not compacted: the ordinary read path says what is wrong."""
        if not _queue_args(topic, queue_id):
            return False
        config = self._topics.get(topic)
        if config is None or not config.compacted:
            return False
        copy = self.store.topics.get(topic)
        return copy is not None and (queue_id is None or queue_id < copy.partitions)

    # ------------------------------------------------------------------ copy

    def copy_all(self) -> int:
        """Copy every compacted queue up to the CommitLog's flushed position (the
        scheduled job; also run before retention and ``compact``). Returns how many
        records were copied."""
        copied = 0
        with self._copy_lock:
            flushed = self._commitlog.flushed_position
            for topic in list(self._topics.all().values()):
                if not topic.compacted or self.store.topics.get(topic.name) is None:
                    continue
                for queue_id in range(topic.partitions):
                    copied += self._copy_queue(topic, queue_id, flushed)
        self.copied_records += copied
        return copied

    def _copy_queue(self, topic: TopicConfig, queue_id: int, flushed: int) -> int:
        name = topic.name
        copy = self.store.topics.get(name)
        if copy is None or copy.partitions <= queue_id:  # the topic grew since
            self.sync_topic(topic)
        if self._consume_queues.max_offset_of(name, queue_id) == 0:
            return 0  # nothing was ever written: no ConsumeQueue object made for it
        queue = self._consume_queues.queue(name, queue_id)
        end = self.store.latest_offset(name, queue_id)
        if end > queue.max_offset:
            log.error(
                "the compacted copy of %s/%d ends at %d, past its queue's end %d: not "
                "copying until the queue passes it", name, queue_id, end, queue.max_offset,
            )  # fmt: skip
            return 0
        offset = max(end, queue.min_offset)
        create_time = topic.timestamp_type == "CreateTime"
        copied = 0
        while offset < queue.max_offset and copied < COPY_RUN_RECORDS_MAX:
            units = queue.get_range(offset, COPY_BATCH_RECORDS)
            ends = units["commitlog_offset"] + units["size"]
            durable = int(np.searchsorted(ends, flushed, side="right"))
            sizes = units["size"][:durable]
            fits = int(np.searchsorted(np.cumsum(sizes), COPY_BATCH_BYTES, side="right"))
            count = max(1, fits) if durable else 0
            if count == 0:
                break
            for run in self._read_units(queue, name, queue_id, offset, units[:count]):
                self._copy_run(run, create_time)
            offset += count
            copied += count
            if count < len(units):
                break
        return copied

    def _copy_run(self, run: MessageBatch, create_time: bool) -> None:
        """Append one run of verified records (read in C by the store's reader, one
        CommitLog file) to the copy as one batch: Kafka records encoded here, with no
        ProducerRecord made per record."""
        physicals = run.physical_offsets.tolist()
        mapped = self._commitlog.file_for(physicals[0])  # a run is one CommitLog file
        mapping, file_start = mapped.mapping, mapped.start_offset
        sizes = run.sizes.tolist()
        stamps = (run.born_timestamps_ms if create_time else run.store_timestamps_ms).tolist()
        tombstones = (run.flags & FLAG_NULL_BODY).astype(bool).tolist()
        keys = run.kafka_keys()
        extra, extra_offsets = run.extra_data, run.extra_offsets.tolist()
        tag_lengths, keys_lengths = run.tag_lengths.tolist(), run.keys_lengths.tolist()
        first = int(run.queue_offsets[0])
        base_ms = stamps[0]
        varint = zigzag_varint
        encoded = []
        for i, physical in enumerate(physicals):
            at = physical - file_start
            raw = mapping[at : at + sizes[i]]  # verified by the run's read
            key = keys[i]
            if key is None:
                start = extra_offsets[i] + tag_lengths[i]
                key = extra[start : start + keys_lengths[i]] or b"\x00offset:%d" % (first + i)
            if tombstones[i]:
                value_part = b"\x01"  # null value (varint -1), then one header: the record
                headers = b"\x02" + varint(len(RECORD_HEADER_BYTES)) + RECORD_HEADER_BYTES
                headers += varint(len(raw)) + raw
            else:
                value_part = varint(len(raw)) + raw
                headers = b"\x00"
            body = b"".join(
                (b"\x00", varint(stamps[i] - base_ms), varint(i), varint(len(key)), key,
                 value_part, headers)
            )  # fmt: skip
            encoded.append(varint(len(body)) + body)
        max_ms = max(stamps)
        batch = build_batch(encoded, base_ms, max_ms, False)
        self.store.append_log_batch(run.topic, run.queue_id, first, batch, len(encoded), max_ms)

    def flush(self) -> None:
        """Make every copied record durable."""
        self.store.flush()

    def floor(self) -> int:
        """The CommitLog position below which every compacted queue's copy is durable:
        retention must not delete a file past it (RocketMQ lost keys so, #7540)."""
        floor = 2**63 - 1
        for topic in list(self._topics.all().values()):
            if not topic.compacted or self.store.topics.get(topic.name) is None:
                continue
            for queue_id in range(topic.partitions):
                if self._consume_queues.max_offset_of(topic.name, queue_id) == 0:
                    continue
                queue = self._consume_queues.queue(topic.name, queue_id)
                durable = self.store._log(topic.name, queue_id).recovery_point
                start = max(durable, queue.min_offset)
                if start < queue.max_offset:
                    floor = min(floor, int(queue.get(start)["commitlog_offset"]))
        return floor

    # ------------------------------------------------------------------ read

    def copy_end(self, topic: str, queue_id: int) -> int:
        """The queue offset the copy reaches: reads below it come from the copy."""
        return self.store.latest_offset(topic, queue_id)

    def min_offset(self, topic: str, queue_id: int) -> int | None:
        """The copy's first offset, or None while the copy is empty."""
        copy = self.store._log(topic, queue_id)
        if copy.next_offset == copy.log_start_offset:
            return None
        return copy.log_start_offset

    def read(
        self, topic: str, queue_id: int, offset: int, max_messages: int, max_bytes: int | None
    ) -> MessageBatch:
        """The surviving messages of the copy from ``offset`` (below ``copy_end``): at
        most ``max_messages``, records of at most ``max_bytes`` (one at least).

        Raises:
            OffsetOutOfRangeError: ``offset`` is below the copy's first offset.
            CorruptDataError: a copied record does not verify.
        """
        records: list[Record] = []
        while len(records) < max_messages:
            found = self.store.read_records(
                topic, queue_id, offset, min(max_messages - len(records), 10_000)
            )
            if not found:
                break
            full = _take_copies(records, found, topic, queue_id, max_bytes)
            if full:
                break
            offset = found[-1].offset + 1
        if not records:
            return MessageBatch.empty(topic, queue_id)
        return MessageBatch.from_records(records)

    def read_from(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int | None,
        read_queue: Callable[[int], MessageBatch],
    ) -> MessageBatch | None:
        """A store read at ``offset`` of a compacted queue: from the copy below its end
        (the next surviving records), else None (the caller reads the ConsumeQueue).
        ``read_queue(end)`` reads the queue from the copy's end, when every record the
        copy holds past ``offset`` was compacted away.

        Raises:
            OffsetOutOfRangeError: ``offset`` is below the copy's first offset.
        """
        if not self.compacted(topic, queue_id):
            return None
        end = self.copy_end(topic, queue_id)
        if offset >= end:
            return None
        first = self.min_offset(topic, queue_id)
        if first is None or offset < first:
            raise OffsetOutOfRangeError(
                f"offset {offset} of compacted {topic}/{queue_id} is below its first offset "
                f"{end if first is None else first}"
            )
        batch = self.read(topic, queue_id, offset, max_messages, max_bytes)
        return batch if len(batch) else read_queue(end)

    def add_key_hits(
        self,
        messages: list[Any],
        topic: str,
        key: str,
        begin_ms: int,
        end_ms: int,
        max_results: int,
    ) -> list[Any]:
        """``query_by_key``'s hits from the index, with those the copies hold (whose
        originals retention may have deleted): one per record, newest first."""
        seen = {message.physical_offset for message in messages}
        found = self.find_key(topic, key, begin_ms, end_ms)
        extra = [record for record in found if record.physical_offset not in seen]
        if not extra:
            return messages
        merged = messages + MessageBatch.from_records(extra).messages()
        merged.sort(key=lambda m: (m.store_timestamp_ms, m.physical_offset), reverse=True)
        return merged[:max_results]

    def find_key(self, topic: str, key: str, begin_ms: int, end_ms: int) -> list[Record]:
        """Every copied record of ``topic`` carrying message key ``key``, stored
        within [begin_ms, end_ms]: a scan of the topic's copies (a compacted log holds
        about one record per key, so this is the size of the table it keeps)."""
        config = self._topics.get(topic)
        found: list[Record] = []
        if config is None:
            return found
        for queue_id in range(config.partitions):
            offset = self.store.earliest_offset(topic, queue_id)
            end = self.store.latest_offset(topic, queue_id)
            while offset < end:
                items = self.store.read_records(topic, queue_id, offset, 10_000)
                if not items:
                    break
                for item in items:
                    raw = item.value if item.value is not None else _header(item.headers)
                    record = _decode_copy(raw, topic, queue_id, item.offset)
                    if begin_ms <= record.store_ts_ms <= end_ms and key in record.keys:
                        found.append(record)
                offset = items[-1].offset + 1
        return found

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        """The first copied offset whose timestamp is >= ``timestamp_ms``, or None."""
        found = self.store.offset_for_timestamp(topic, queue_id, timestamp_ms)
        return None if found is None else found[0]

    # ------------------------------------------------------------------ compaction

    def compact(self, topic: str) -> list[CleanResult]:
        """Copy what is durable, roll every partition's active segment of the copy
        (the cleaner never cleans the active one), then clean the whole topic now.
        What the CommitLog holds unflushed is flushed first, so all of it is copied."""
        self._commitlog.flush_to(self._commitlog.write_position)
        self.copy_all()
        config = self._topics.get(topic)
        assert config is not None
        for queue_id in range(config.partitions):
            self.store.roll(topic, queue_id)
        return self.store.compact(topic)

    def stats(self) -> dict[str, Any]:
        stats = self.store.stats()
        return {
            "copied_records": self.copied_records,
            "copy_bytes": stats["bytes"],
            "copy_segments": stats["segments"],
            **{k: v for k, v in stats.items() if k.startswith("cleaner")},
        }

    def close(self) -> None:
        self.store.close()

    def crash(self) -> None:
        self.store._crash()


def _queue_args(topic: object, queue_id: object) -> bool:
    """Whether (topic, queue_id) have the types a queue's name has."""
    return type(topic) is str and (queue_id is None or (type(queue_id) is int and queue_id >= 0))


def _or_unlimited(value: int | None) -> int:
    return -1 if value is None else value


def _take_copies(
    records: list[Record], items: Sequence[Any], topic: str, queue_id: int, max_bytes: int | None
) -> bool:
    """Append the CommitLog records the copy's ``items`` carry, decoded and verified,
    while their sizes (with those already in ``records``) fit ``max_bytes`` (one at
    least); True when one did not fit."""
    taken = sum(record.size for record in records)
    for item in items:
        raw = item.value if item.value is not None else _header(item.headers)
        record = _decode_copy(raw, topic, queue_id, item.offset)
        if max_bytes is not None and records and taken + record.size > max_bytes:
            return True
        records.append(record)
        taken += record.size
    return False


def _header(headers: Sequence[tuple[str, bytes]] | None) -> bytes:
    for name, value in headers or ():
        if name == RECORD_HEADER:
            return value
    raise StoreError("a copied tombstone without its record header")


def _decode_copy(raw: Any, topic: str, queue_id: int, offset: int) -> Record:
    """Decode and verify a copied CommitLog record (its checksum, and that it is the
    record of ``topic``/``queue_id`` at ``offset``)."""
    view = memoryview(raw)
    (physical,) = _PHYSICAL.unpack_from(view, _PHYSICAL_AT) if len(view) >= 32 else (-1,)
    where = f"{COMPACTION_DIR}/{topic}-{queue_id}@{offset}"
    record = decode(view, 0, len(view), where, physical)
    if record is None or (record.topic, record.queue_id, record.queue_offset) != (
        topic,
        queue_id,
        offset,
    ):
        raise CorruptDataError(where, 0, "the copied record is not the queue's record")
    return record


class CopyReader:
    """A read-only store's view of the writer's copies: it reads the copy's segment
    files as they are on disk (the writer appends and swaps them; a segment read here
    stays readable while open, and a swapped one held the same offsets and more).

    Each read scans its first segment from the segment's start (no index): the
    copies are compacted, so their segments are small, except the active one.
    Without the writer's end of copy, a read that finds nothing in the copy goes on
    in the ConsumeQueue from the same offset (or its first offset still stored):
    what lies between was compacted away, or is still in the CommitLog as written.
    """

    def __init__(self, root: str, topics: TopicRegistry) -> None:
        self.root = os.path.join(root, COMPACTION_DIR)
        self._topics = topics

    def compacted(self, topic: str, queue_id: int | None = None) -> bool:
        if not _queue_args(topic, queue_id):
            return False
        config = self._topics.get(topic)
        if config is None or not config.compacted:
            return False
        return queue_id is None or bool(self._segments(topic, queue_id))

    def _segments(self, topic: str, queue_id: int) -> list[tuple[int, str]]:
        """The copy's segments by base offset: ``.log`` files, and ``.swap`` ones (a
        cleaned segment about to replace the ones it was made from, which may already
        be gone) where no ``.log`` has its base."""
        directory = partition_directory(self.root, topic, queue_id)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        found: dict[int, str] = {}
        for name in sorted(names, key=lambda n: not n.endswith(".log")):  # .log first
            stem, _, suffix = name.partition(".")
            if suffix in ("log", "log.swap") and stem.isdigit():
                found.setdefault(int(stem), os.path.join(directory, name))
        return sorted(found.items())

    def min_offset(self, topic: str, queue_id: int) -> int | None:
        segments = self._segments(topic, queue_id)
        return segments[0][0] if segments else None

    def _records(self, topic: str, queue_id: int, offset: int, count_max: int) -> list[Any]:
        """Records from ``offset``; read again from a new listing when a file listed
        went away meanwhile (the writer's cleaner swapped it)."""
        for _ in range(READ_ATTEMPTS):
            try:
                return self._read_segments(topic, queue_id, offset, count_max)
            except FileNotFoundError:
                continue
        raise OffsetOutOfRangeError(
            f"the copy of {topic}/{queue_id} kept changing under a read at {offset}"
        )

    def _read_segments(self, topic: str, queue_id: int, offset: int, count_max: int) -> list[Any]:
        segments = self._segments(topic, queue_id)
        start = max(0, bisect_right([base for base, _ in segments], offset) - 1)
        found: list[Any] = []
        for _, path in segments[start:]:
            with open(path, "rb") as file:
                data = file.read()
            try:
                decoded = decode_batches(data, 0, offset, count_max - len(found), 1 << 30)
            except MalformedBatchError as error:
                raise CorruptDataError(path, error.position, error.reason) from None
            found += decoded.records
            if found:
                offset = found[-1].offset + 1
            if len(found) >= count_max:
                break
        return found

    def read_from(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int | None,
        read_queue: Callable[[int], MessageBatch],
    ) -> MessageBatch | None:
        if not self.compacted(topic, queue_id):
            return None
        items = self._records(topic, queue_id, offset, min(max_messages, 10_000))
        records: list[Record] = []
        _take_copies(records, items, topic, queue_id, max_bytes)
        if records:
            return MessageBatch.from_records(records)
        return None  # the ConsumeQueue from ``offset``, as for any topic

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        return None  # the ConsumeQueue's answer (a compacted-away offset reads as the next)

    def add_key_hits(
        self, messages: list[Any], topic: str, key: str, begin: int, end: int, most: int
    ) -> list[Any]:
        return messages  # the index's hits, while retention keeps their originals

    def stats(self) -> dict[str, Any]:
        return {"read_only": True}

    def close(self) -> None:
        pass

    def crash(self) -> None:
        pass
