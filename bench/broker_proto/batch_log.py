"""Mapping option B, prototype: a producer's record batch stored as ONE CommitLog record.

    Produce: check the batch (wire_batch.check_produced: CRC-32C, counts, codec), write
             its base offset into it (outside the CRC), append it as the body of one
             CommitLog record with the tag BATCH_TAG, note (base offset, record count).
    Fetch:   find the batch holding the fetch offset (binary search over base offsets),
             then hand out the stored batch bytes, as they are, up to max_bytes: the
             bytes on disk are the bytes on the wire (Kafka's design, KoP's
             entryFormat=kafka).

The ConsumeQueue of (topic, partition) then holds one unit per BATCH, so its queue
offset is the batch's ordinal, not the Kafka offset; this prototype keeps the Kafka
offsets beside it, in memory:

    index of one partition (numpy, grown by doubling)
    +----------------------+-----------------------+
    | base_offset i64      | ordinal = row number  |  row k: the k-th batch, CQ unit k
    +----------------------+-----------------------+

That is RocketMQ 5's batch ConsumeQueue idea (a unit carries msgBaseOffset and
batchSize) kept outside the store, enough to measure. docs/BROKER.md discusses the
shape a real one would take (one unit per Kafka record pointing at its batch keeps
"queue offset = Kafka offset" for every other reader); nothing here survives a
restart, and the store's own readers (get, query_by_key, offset_for_time) see batch
records as opaque bodies.

Limits of the prototype: it must own its topics (a ``put`` from elsewhere into one of
them would shift the ordinals; ``append`` asserts they line up), and its index lives
in memory only.

Crash policy: none (a prototype); the index is rebuilt by nobody.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np

from bench.broker_proto.wire_batch import (
    InvalidBatchError,
    check_produced,
    set_base_offset,
    stamp_log_append_time,
)
from mqstore.commitlog.record import HEADER

if TYPE_CHECKING:
    from mqstore.store import MessageStore

__all__ = ["BATCH_TAG", "BatchLog", "FETCH_BATCHES_MAX"]

BATCH_TAG: Final = "kafka.v2"  # marks a record whose body is a Kafka record batch v2
FETCH_BATCHES_MAX: Final = 4096  # units read per fetch; 4096 x 16 KiB = 64 MiB, above
# Kafka's fetch.max.bytes default (50 MiB), so max_bytes is the limit that bites
INDEX_ROWS_INITIAL: Final = 1024


class _PartitionIndex:
    """Base offsets of one partition's batches, row k = ConsumeQueue unit k."""

    __slots__ = ("base_offsets", "next_offset", "rows")

    def __init__(self) -> None:
        self.base_offsets = np.zeros(INDEX_ROWS_INITIAL, dtype=np.int64)
        self.rows = 0
        self.next_offset = 0

    def add(self, base_offset: int, count: int) -> None:
        assert base_offset == self.next_offset  # offsets are dense
        assert count >= 1
        if self.rows == len(self.base_offsets):
            self.base_offsets = np.concatenate(
                [self.base_offsets, np.zeros_like(self.base_offsets)]
            )
        self.base_offsets[self.rows] = base_offset
        self.rows += 1
        self.next_offset = base_offset + count

    def ordinal_of(self, offset: int) -> int:
        """The row of the batch that holds ``offset`` (0 <= offset < next_offset)."""
        assert 0 <= offset < self.next_offset
        row = int(np.searchsorted(self.base_offsets[: self.rows], offset, side="right")) - 1
        assert row >= 0
        return row


class BatchLog:
    """Option B over one MessageStore (the store stays the one writer of its files)."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store
        self._indexes: dict[tuple[str, int], _PartitionIndex] = {}

    def end_offset(self, topic: str, partition: int) -> int:
        index = self._indexes.get((topic, partition))
        return 0 if index is None else index.next_offset

    def append(
        self, topic: str, partition: int, batch: bytearray, log_append_time_ms: int | None = None
    ) -> int:
        """Store one produced batch; return its base offset.

        ``batch`` is modified in place (base offset; LogAppendTime stamp). The caller
        serialises appends per partition, as the broker's partition lock will.

        Raises:
            InvalidBatchError: the batch fails the broker's checks.
        """
        header = check_produced(batch)
        if header.size != len(batch):
            raise InvalidBatchError(f"{len(batch) - header.size} bytes after the batch")
        index = self._indexes.get((topic, partition))
        if index is None:
            index = self._indexes[(topic, partition)] = _PartitionIndex()
        base_offset = index.next_offset
        set_base_offset(batch, base_offset)
        if log_append_time_ms is not None:
            stamp_log_append_time(batch, log_append_time_ms)
        result = self._store.put(
            topic, partition, batch, tag=BATCH_TAG, born_timestamp_ms=header.max_timestamp
        )
        assert result.queue_offset == index.rows  # unit k is batch k
        index.add(base_offset, header.records_count)
        return base_offset

    def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int, verify: bool = True
    ) -> list[memoryview]:
        """The stored batches from the one holding ``offset``, up to ``max_bytes`` (the
        first batch always, as Kafka: a client skips the records below ``offset``).

        ``verify`` reads through MessageStore.get (every batch record's XXH64 checked,
        a Message made per batch); without it the bytes are sliced out of the mapping
        by the ConsumeQueue units alone, what a sendfile/sendmsg path would do.
        """
        index = self._indexes[(topic, partition)]
        first = index.ordinal_of(offset)
        queue = self._store.consume_queues.queue(topic, partition)
        units = queue.get_range(first, FETCH_BATCHES_MAX)
        sizes = units["size"]
        # A batch record has no keys or properties: its body (the batch) follows the
        # header, topic and tag. Cut by batch sizes, at least one batch.
        fixed = HEADER.size + len(topic) + len(BATCH_TAG)
        cumulative = np.cumsum(sizes.astype(np.int64) - fixed)
        take = max(1, int(np.searchsorted(cumulative, max_bytes, side="right")))
        if verify:
            messages = self._store.get(topic, partition, first, take)
            return [message.body for message in messages]  # type: ignore[misc]
        views = []
        commitlog = self._store.commitlog
        for physical, size in zip(
            units["commitlog_offset"][:take].tolist(), sizes[:take].tolist(), strict=True
        ):
            views.append(commitlog.read(physical, size)[fixed:])
        return views
