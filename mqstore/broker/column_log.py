"""``RecordLog`` over the CommitLog engine: Produce and Fetch through columns, in C.

Produce: a checked batch (inflated if compressed) is walked in C into columns
(mqstore.broker.produce_columns) and, when no record has a key or a header (what
librdkafka and kafka-python send without a key), appended with ONE
``MessageStore.put_batch_buffers``: values as an Arrow binary column, per-record
CreateTime as an int64 column, encoded in C under one lock and one flush. A batch
with keys or headers, a compacted topic's, or one the columnar put cannot take as
it is (a negative timestamp, or the producer's LogAppendTime bit) goes through
``RecordLog.append`` (per record: the key is stored as a property and indexed),
which answers it exactly as before.

Fetch (docs/BROKER.md, option A with the batch built in C): the partition is read
with ``MessageStore.get_batch`` (the units' records verified by XXH64 and gathered
into columns in C, compacted queues through their copy) and each read becomes ONE
batch v2 in one C call (mqstore.broker.fetch_batch), sized against the budget there:
no Python object is made per record.

How much is read: stored records are larger than their wire form (a 68-byte header,
the topic, the key's property), so a first read of at most ``max_bytes`` stored
bytes holds no more records than the budget can take; later reads ask for the
records the rest of the budget takes at the wire size seen so far. A Fetch reads
until its budget is spent, a record does not fit, or the partition ends.

Crash policy: the engine's. A put is one ``put_batch_buffers`` (one lock, one flush):
a crash keeps a prefix of a batch's records, never a torn record; under sync flush it
returns once they are durable.
"""

from __future__ import annotations

from typing import Final

from mqstore.broker.batch import CORRUPT_MESSAGE, InvalidBatchError, ProducedBatch, inflated
from mqstore.broker.fetch_batch import build_batch
from mqstore.broker.log import READ_RECORDS_MAX, Appended, RecordLog
from mqstore.broker.produce_columns import ProducedColumns
from mqstore.commitlog.batch import Trailer
from mqstore.reader import GET_BATCH_BYTES_MAX
from mqstore.segmented.record_batch import TIMESTAMP_TYPE_MASK

__all__ = ["ColumnLog"]

#: A Fetch makes at most this many reads (each read is one batch in the answer);
#: 1 MiB of 100-byte records takes 2.
READS_PER_FETCH_MAX: Final = 16
EXTRA_RECORDS: Final = 16  # added to a later read's estimate, so it rarely falls short


class ColumnLog(RecordLog):
    """``PartitionLog`` over a ``MessageStore``: Produce and Fetch as columns, in C."""

    def append(
        self, topic: str, partition: int, batch: ProducedBatch, trailer: Trailer | None = None
    ) -> Appended:
        """Append a checked batch's records (see the module docstring for which path),
        and the ``trailer`` right after them, one append group.

        Raises:
            InvalidBatchError: the records do not decode (nothing appended).
            StoreError: what the engine's put raises (nothing appended, or under sync
                flush FlushTimeoutError: appended but not acknowledged).
        """
        engine = self.engine
        config = engine.topic_for_write(topic)
        if config.compacted or type(partition) is not int or partition >= config.partitions:
            return super().append(topic, partition, batch, trailer)  # or its errors
        header, data = inflated(batch)
        try:
            columns = ProducedColumns.of(
                data, header.base_timestamp, header.records_count, header.last_offset_delta
            )
        except ValueError as error:
            raise InvalidBatchError(f"records do not decode: {error}", CORRUPT_MESSAGE) from None
        producer_stamped = header.attributes & TIMESTAMP_TYPE_MASK  # all at max_timestamp
        if not columns.plain or producer_stamped or (columns.timestamps_ms < 0).any():
            return super().append(topic, partition, batch, trailer)
        nulls = columns.value_sizes < 0
        result = engine.put_batch_buffers(  # type: ignore[attr-defined]
            topic, partition, columns.value_offsets, columns.values,
            nulls=nulls if nulls.any() else None, born_timestamp_ms=columns.timestamps_ms,
            trailer=trailer,
        )  # fmt: skip
        assert len(result.sizes) == header.records_count
        log_append = config.timestamp_type == "LogAppendTime"
        stamp = result.store_timestamp_ms if log_append else -1
        return Appended(result.first_queue_offset, stamp, self.log_start_offset(topic, partition))

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int) -> list[bytes]:
        """Batches from ``offset`` holding at most ``max_bytes`` but the first record,
        which is always included (KIP-74). ``[]`` at the end.

        Raises:
            OffsetOutOfRangeError: ``offset`` below the log start or past the end.
            UnknownTopicError: no such topic or partition.
            CorruptDataError: a record fails verification.
        """
        engine = self.engine
        log_append = engine.describe_topic(topic).timestamp_type == "LogAppendTime"
        out: list[bytes] = []
        budget = max_bytes
        wanted, stored_bytes = READ_RECORDS_MAX, min(max(budget, 1), GET_BATCH_BYTES_MAX)
        for _ in range(READS_PER_FETCH_MAX):
            read = engine.get_batch(  # type: ignore[attr-defined]
                topic, partition, offset, wanted, max_bytes=stored_bytes
            )
            if not len(read):
                break
            built, taken = build_batch(
                read, 0, budget, must_take_one=not out, log_append=log_append
            )
            if built is None:
                break
            out.append(built)  # type: ignore[arg-type]  # a bytearray: joined by the caller
            budget -= len(built)
            offset = int(read.queue_offsets[taken - 1]) + 1
            if taken < len(read) or budget <= 0:
                break
            wire_bytes = len(built) // taken + 1
            wanted = max(1, min(READ_RECORDS_MAX, budget // wire_bytes + EXTRA_RECORDS))
            stored_bytes = GET_BATCH_BYTES_MAX
        return out
