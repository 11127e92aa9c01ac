"""Arrow RecordBatches of one queue's messages, straight from the columnar read.

For each run of ConsumeQueue units inside one CommitLog file, ``mqstore.batch.read_run``
(the same read as ``MessageStore.get_batch``: one C call when built) verifies every
record against its unit (magic, size, physical and queue offsets, queue id, topic,
section lengths, flags, the XXH64 checksum unless option ``verifyChecksums`` is off,
UTF-8 tag, parseable properties) and gathers the run into columns. Its buffers become
the Arrow columns as they are: the bodies are the ``value`` column's data buffer and
the Kafka keys the ``key`` column's (zero-copy; only the int64 offsets are narrowed
to the int32 of Arrow's binary type, which Spark's Kafka schema uses). Tags and index
keys are gathered out of the batch's extras in one C call each; headers are decoded
only for records that have any.

Any mismatch is a ``CorruptDataError`` naming the file and position. Nothing here
writes; the store is opened read-only by the caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqstore.batch import MessageBatch, read_run
from mqstore.commitlog.errors import OffsetOutOfRangeError
from mqstore.commitlog.record import gather
from mqstore.spark.offsets import DataLossError, OffsetRange

__all__ = ["arrow_schema", "read_range"]

UNITS_PER_READ_MAX: Final = 65_536  # units fetched per ConsumeQueue read: ~1.3 MB of units
ROWS_PER_BATCH_MAX: Final = 65_536  # Arrow batch rows; Spark's default maxRecordsPerBatch is 10k
_BINARY_BYTES_MAX: Final = 2**31 - 1  # an Arrow binary column's int32 offsets address this
_TIMESTAMP: Final = pa.timestamp("us", tz="UTC")
_HEADER_TYPE: Final = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def arrow_schema(include_headers: bool, include_rocketmq_columns: bool) -> pa.Schema:
    """Spark's Kafka source schema, plus headers and the RocketMQ columns on demand."""
    fields = [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", _TIMESTAMP),
        ("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(("headers", _HEADER_TYPE))
    if include_rocketmq_columns:
        fields += [
            ("tags", pa.string()),
            ("keys", pa.list_(pa.string())),
            ("storeTimestamp", _TIMESTAMP),
            ("bornTimestamp", _TIMESTAMP),
        ]
    return pa.schema(fields)


def read_range(
    store: Any,
    offset_range: OffsetRange,
    schema: pa.Schema,
    *,
    log_append_time: bool,
    verify_checksums: bool,
    fail_on_data_loss: bool,
    max_bytes_per_batch: int,
) -> Iterator[pa.RecordBatch]:
    """Yield the range's messages as RecordBatches of ``schema``.

    Raises:
        DataLossError: offsets of the range were deleted and ``fail_on_data_loss``.
        CorruptDataError: a record does not verify.
    """
    topic, partition = offset_range.topic, offset_range.partition
    queue = store.consume_queues.queue(topic, partition)
    offset, end = offset_range.start, offset_range.end
    # Rows per batch so that one batch's values stay under max_bytes_per_batch.
    while offset < end:
        try:
            units = queue.get_range(offset, min(end - offset, UNITS_PER_READ_MAX))
        except OffsetOutOfRangeError:
            earliest = queue.min_offset
            if fail_on_data_loss or earliest <= offset:
                raise DataLossError(
                    f"{topic}/{partition}: offset {offset} was deleted while the query ran "
                    f"(earliest is now {earliest}); set failOnDataLoss=false to skip"
                ) from None
            offset = min(earliest, end)
            continue
        if len(units) == 0:
            raise DataLossError(f"{topic}/{partition}: offsets up to {end} are not in the store")
        physicals = units["commitlog_offset"]
        # A reader's ConsumeQueue can lag the writer's retention: units may point
        # below the CommitLog's first file. Those offsets are lost.
        lost = int(np.searchsorted(physicals, store.commitlog.min_position, side="left"))
        if lost:
            if fail_on_data_loss:
                raise DataLossError(
                    f"{topic}/{partition}: offsets [{offset}, {offset + lost}) were deleted "
                    "by retention; set failOnDataLoss=false to skip them"
                )
            offset += lost
            continue
        sizes = units["size"].astype(np.int64)
        chunk_start = 0
        while chunk_start < len(units):
            mapped = store.commitlog.file_for(int(physicals[chunk_start]))
            file_end = mapped.start_offset + mapped.size_bytes
            chunk_end = int(np.searchsorted(physicals, file_end, side="left"))
            assert chunk_end > chunk_start
            # Cap rows so values fit the byte budget (sizes bound the value bytes).
            cum = np.cumsum(sizes[chunk_start:chunk_end])
            rows = int(np.searchsorted(cum, max_bytes_per_batch, side="right"))
            chunk_end = chunk_start + max(1, min(rows, ROWS_PER_BATCH_MAX))
            batch = read_run(
                mapped.mapping, mapped.path, mapped.start_offset, physicals[chunk_start:chunk_end],
                sizes[chunk_start:chunk_end], topic, partition, offset + chunk_start,
                verify_checksums,
            )  # fmt: skip
            yield _record_batch(batch, schema, log_append_time)
            chunk_start = chunk_end
        offset += len(units)


def _binary(data: Any, offsets: np.ndarray, valid: np.ndarray) -> pa.Array:
    """An Arrow binary column over ``data`` as it is (no copy): Arrow's layout with
    int32 offsets and a validity bitmap where a row is not valid."""
    assert int(offsets[-1]) <= _BINARY_BYTES_MAX, "a batch's column passed 2 GiB"
    count = len(valid)
    null_count = int(count - np.count_nonzero(valid))
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if null_count else None
    buffers = [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), count, buffers, null_count)


def _gathered(data: bytes, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> pa.Array:
    """A binary column of ``data[starts[i]:starts[i] + lengths[i]]`` (one C copy)."""
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    gather(data, starts.astype(np.int64), lengths.astype(np.int64), out)
    return _binary(out, offsets, valid)


def _record_batch(batch: MessageBatch, schema: pa.Schema, log_append_time: bool) -> pa.RecordBatch:
    count = len(batch)
    columns: dict[str, pa.Array] = {}
    columns["key"] = _binary(batch.kafka_key_data, batch.kafka_key_offsets, batch.kafka_key_valid)
    columns["value"] = _binary(batch.body_data, batch.body_offsets, batch.body_valid)
    columns["topic"] = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(count, np.int32)), pa.array([batch.topic])
    ).cast(pa.string())
    columns["partition"] = pa.array(np.full(count, batch.queue_id, np.int32))
    columns["offset"] = pa.array(batch.queue_offsets)
    stamps = batch.store_timestamps_ms if log_append_time else batch.born_timestamps_ms
    columns["timestamp"] = _timestamps(stamps)
    columns["timestampType"] = pa.array(np.full(count, int(log_append_time), np.int32))
    names = schema.names
    if "headers" in names:
        columns["headers"] = pa.array(batch.headers_lists(), type=_HEADER_TYPE)
    if "tags" in names:
        starts = batch.extra_offsets[:-1]
        tags = _gathered(batch.extra_data, starts, batch.tag_lengths, batch.tag_lengths > 0)
        columns["tags"] = tags.cast(pa.string())
        every = np.ones(count, dtype=bool)
        raw_keys = _gathered(
            batch.extra_data, starts + batch.tag_lengths, batch.keys_lengths, every
        ).cast(pa.string())
        split = pc.split_pattern(raw_keys, "\x00")
        columns["keys"] = pc.if_else(
            pc.equal(pc.utf8_length(raw_keys), 0), pa.scalar([], pa.list_(pa.string())), split
        ) if count else split  # fmt: skip
        columns["storeTimestamp"] = _timestamps(batch.store_timestamps_ms)
        columns["bornTimestamp"] = _timestamps(batch.born_timestamps_ms)
    return pa.RecordBatch.from_arrays([columns[name] for name in names], schema=schema)


def _timestamps(ms: np.ndarray) -> pa.Array:
    return pa.array(ms.astype(np.int64) * 1000, type=pa.int64()).view(_TIMESTAMP)
