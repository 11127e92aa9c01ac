"""Arrow RecordBatches of one queue's messages, decoded with numpy.

The CommitLog record layout is declared in ``mqstore.commitlog.record``; ``HEADER_DTYPE``
below is its numpy twin (checked against ``record.HEADER`` at import), so a run of
records is parsed as one structured array rather than record by record.

For each run of ConsumeQueue units inside one CommitLog file:

1. gather the 68-byte headers (a strided view when the records are equally spaced,
   else one fancy index) and check every field against its unit, vectorized: magic,
   size, physical offset, queue offset, queue id, topic, section lengths, flags;
2. verify every record's XXH64 checksum (one C call per run; option
   ``verifyChecksums``), so a torn or corrupt record is never returned;
3. copy values (and keys) into one Arrow data buffer, and build the columns.

Any mismatch is a ``CorruptDataError`` naming the file and position. Nothing here
writes; the store is opened read-only by the caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqstore.commitlog.errors import CorruptDataError, OffsetOutOfRangeError
from mqstore.commitlog.record import (
    FLAG_NULL_BODY,
    FLAGS_KNOWN,
    HEADER,
    HEADER_SIZE,
    MESSAGE_MAGIC,
    decode_properties,
    gather,
    verify_records,
)
from mqstore.commitlog_engine import KEY_PROPERTY
from mqstore.spark.offsets import DataLossError, OffsetRange

__all__ = ["HEADER_DTYPE", "arrow_schema", "read_range"]

HEADER_DTYPE: Final = np.dtype(
    [
        ("total_size", "<u4"),
        ("magic", "<u4"),
        ("checksum", "<u8"),
        ("queue_offset", "<i8"),
        ("physical_offset", "<i8"),
        ("born_ts_ms", "<i8"),
        ("store_ts_ms", "<i8"),
        ("queue_id", "<i4"),
        ("flags", "<u4"),
        ("body_len", "<u4"),
        ("properties_len", "<u4"),
        ("keys_len", "<u2"),
        ("topic_len", "u1"),
        ("tag_len", "u1"),
    ]
)
assert HEADER_DTYPE.itemsize == HEADER_SIZE
_SAMPLE = HEADER.pack(*range(1, 15))
assert np.frombuffer(_SAMPLE, HEADER_DTYPE)[0].tolist() == tuple(range(1, 15))

UNITS_PER_READ_MAX: Final = 65_536  # units fetched per ConsumeQueue read: ~1.3 MB of units
ROWS_PER_BATCH_MAX: Final = 65_536  # Arrow batch rows; Spark's default maxRecordsPerBatch is 10k
_KEY_NAME: Final = KEY_PROPERTY.encode()
_KEY_PREFIX: Final = len(_KEY_NAME).to_bytes(2, "little") + _KEY_NAME  # u16 len, name
_KEY_VALUE_AT: Final = len(_KEY_PREFIX) + 4  # the key bytes follow its u32 length
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
            yield _decode_run(
                mapped, physicals[chunk_start:chunk_end] - mapped.start_offset,
                sizes[chunk_start:chunk_end], topic, partition, offset + chunk_start,
                schema, log_append_time, verify_checksums,
            )  # fmt: skip
            chunk_start = chunk_end
        offset += len(units)


def _gather_headers(buffer: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The headers at ``positions`` as a HEADER_DTYPE array (a copy)."""
    count = len(positions)
    first = int(positions[0])
    stride = int(positions[1] - positions[0]) if count > 1 else HEADER_SIZE
    if stride >= HEADER_SIZE and bool(np.all(np.diff(positions) == stride)):
        view = np.lib.stride_tricks.as_strided(
            buffer[first:], shape=(count, HEADER_SIZE), strides=(stride, 1), writeable=False
        )
        raw = np.ascontiguousarray(view)
    else:
        raw = buffer[positions[:, None] + np.arange(HEADER_SIZE)]
    return raw.view(HEADER_DTYPE).reshape(count)


def _gather(
    mapping: Any, buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, pa.Buffer]:
    """Copy byte slices into one buffer; return (int32 Arrow offsets, data)."""
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    assert offsets[-1] < 2**31
    total = int(offsets[-1])
    if total == 0:
        return offsets.astype(np.int32), pa.py_buffer(b"")
    count = len(starts)
    length = int(lengths[0])
    stride = int(starts[1] - starts[0]) if count > 1 else length
    if bool(np.all(lengths == length)) and (
        count == 1 or (stride >= length and bool(np.all(np.diff(starts) == stride)))
    ):
        view = np.lib.stride_tricks.as_strided(
            buffer[int(starts[0]) :], shape=(count, length), strides=(stride, 1), writeable=False
        )
        data = pa.py_buffer(np.ascontiguousarray(view))
    else:
        out = np.empty(total, dtype=np.uint8)
        gather(mapping, starts.astype(np.int64), lengths.astype(np.int64), out)
        data = pa.py_buffer(out)
    return offsets.astype(np.int32), data


def _binary(
    mapping: Any, buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray
) -> pa.Array:
    offsets, data = _gather(mapping, buffer, starts, lengths)
    validity = None
    null_count = int(len(valid) - np.count_nonzero(valid))
    if null_count:
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        pa.binary(), len(starts), [validity, pa.py_buffer(offsets), data], null_count
    )


def _decode_run(
    mapped: Any,
    positions: np.ndarray,
    sizes: np.ndarray,
    topic: str,
    partition: int,
    first_offset: int,
    schema: pa.Schema,
    log_append_time: bool,
    verify_checksums: bool,
) -> pa.RecordBatch:
    mapping, path = mapped.mapping, mapped.path
    buffer = np.frombuffer(mapping, dtype=np.uint8)
    count = len(positions)
    if int(positions.min()) < 0 or int((positions + sizes).max()) > len(buffer):
        raise CorruptDataError(path, int(positions[0]), "unit points outside the file")
    headers = _gather_headers(buffer, positions)
    topic_raw = topic.encode("ascii")
    _check_headers(headers, positions, sizes, mapped, topic_raw, partition, first_offset)
    if verify_checksums:
        _verify_checksums(mapping, path, positions, sizes)
    topic_at = positions + HEADER_SIZE
    topics = buffer[topic_at[:, None] + np.arange(len(topic_raw))]
    if not np.array_equal(
        topics, np.broadcast_to(np.frombuffer(topic_raw, np.uint8), topics.shape)
    ):
        bad = int(np.argmax(np.any(topics != np.frombuffer(topic_raw, np.uint8), axis=1)))
        raise CorruptDataError(path, int(positions[bad]), "topic differs from its ConsumeQueue")
    tag_at = topic_at + headers["topic_len"]
    keys_at = tag_at + headers["tag_len"]
    props_at = keys_at + headers["keys_len"]
    props_len = headers["properties_len"].astype(np.int64)
    body_at = props_at + props_len
    body_len = headers["body_len"].astype(np.int64)
    flags = headers["flags"]
    columns: dict[str, pa.Array] = {}
    columns["key"] = _keys(mapping, buffer, props_at, props_len)
    columns["value"] = _binary(mapping, buffer, body_at, body_len, (flags & FLAG_NULL_BODY) == 0)
    columns["topic"] = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(count, np.int32)), pa.array([topic])
    ).cast(pa.string())
    columns["partition"] = pa.array(np.full(count, partition, np.int32))
    columns["offset"] = pa.array(np.arange(first_offset, first_offset + count, dtype=np.int64))
    stamps = headers["store_ts_ms" if log_append_time else "born_ts_ms"]
    columns["timestamp"] = _timestamps(stamps)
    columns["timestampType"] = pa.array(np.full(count, int(log_append_time), np.int32))
    names = schema.names
    if "headers" in names:
        columns["headers"] = _headers(mapping, props_at, props_len, path, positions)
    if "tags" in names:
        tag_len = headers["tag_len"].astype(np.int64)
        columns["tags"] = _binary(mapping, buffer, tag_at, tag_len, tag_len > 0).cast(pa.string())
        keys_len = headers["keys_len"].astype(np.int64)
        raw_keys = _binary(mapping, buffer, keys_at, keys_len, keys_len >= 0).cast(pa.string())
        split = pc.split_pattern(raw_keys, "\x00")
        columns["keys"] = pc.if_else(
            pc.equal(pc.utf8_length(raw_keys), 0), pa.scalar([], pa.list_(pa.string())), split
        ) if count else split  # fmt: skip
        columns["storeTimestamp"] = _timestamps(headers["store_ts_ms"])
        columns["bornTimestamp"] = _timestamps(headers["born_ts_ms"])
    return pa.RecordBatch.from_arrays([columns[name] for name in names], schema=schema)


def _check_headers(
    headers: np.ndarray,
    positions: np.ndarray,
    sizes: np.ndarray,
    mapped: Any,
    topic_raw: bytes,
    partition: int,
    first_offset: int,
) -> None:
    """Every header must be exactly its unit's record (raise at the first that is not)."""
    count = len(headers)
    lengths = (
        HEADER_SIZE
        + headers["topic_len"].astype(np.int64)
        + headers["tag_len"]
        + headers["keys_len"]
        + headers["properties_len"]
        + headers["body_len"]
    )
    ok = headers["magic"] == MESSAGE_MAGIC
    ok &= headers["total_size"] == sizes
    ok &= headers["physical_offset"] == positions + mapped.start_offset
    ok &= headers["queue_offset"] == np.arange(first_offset, first_offset + count)
    ok &= headers["queue_id"] == partition
    ok &= headers["topic_len"] == len(topic_raw)
    ok &= (headers["flags"] & ~np.uint32(FLAGS_KNOWN)) == 0
    ok &= lengths == sizes
    if not bool(ok.all()):
        bad = int(np.argmin(ok))
        raise CorruptDataError(
            mapped.path,
            int(positions[bad]),
            f"not the record of {topic_raw.decode()}/{partition}@{first_offset + bad}",
        )


def _verify_checksums(mapping: Any, path: str, positions: np.ndarray, sizes: np.ndarray) -> None:
    """Every record's checksum, in one call (C when built; see commitlog/native.py)."""
    bad = verify_records(mapping, positions.astype(np.int64), sizes.astype(np.int64))
    if bad >= 0:
        raise CorruptDataError(path, int(positions[bad]), "checksum mismatch")


def _keys(
    mapping: Any, buffer: np.ndarray, props_at: np.ndarray, props_len: np.ndarray
) -> pa.Array:
    """The Kafka key: the value of the first property when it is named KEY_PROPERTY."""
    count = len(props_at)
    has = props_len >= _KEY_VALUE_AT
    if has.any():
        prefix = buffer[props_at[:, None] + np.arange(len(_KEY_PREFIX))] if count else None
        assert prefix is not None
        has &= np.all(prefix == np.frombuffer(_KEY_PREFIX, np.uint8), axis=1)
    if not has.any():
        return pa.nulls(count, pa.binary())
    at = np.where(has, props_at + len(_KEY_PREFIX), 0)
    length_bytes = buffer[at[:, None] + np.arange(4)].copy().view("<u4").reshape(count)
    key_len = np.where(has, length_bytes, 0).astype(np.int64)
    return _binary(mapping, buffer, props_at + _KEY_VALUE_AT, key_len, has)


def _headers(
    mapping: Any, props_at: np.ndarray, props_len: np.ndarray, path: str, positions: np.ndarray
) -> pa.Array:
    """Kafka headers: every property but the key (a Python decode per record that
    has properties; records without any cost nothing)."""
    mv = memoryview(mapping)
    rows: list[list[tuple[str, bytes]]] = []
    for i, (at, n) in enumerate(zip(props_at.tolist(), props_len.tolist(), strict=True)):
        if not n:
            rows.append([])
            continue
        try:
            pairs = decode_properties(mv[at : at + n])
        except (ValueError, UnicodeDecodeError):
            raise CorruptDataError(path, int(positions[i]), "malformed properties") from None
        if pairs and pairs[0][0] == KEY_PROPERTY:
            pairs = pairs[1:]
        rows.append(list(pairs))
    return pa.array(rows, type=_HEADER_TYPE)


def _timestamps(ms: np.ndarray) -> pa.Array:
    return pa.array(ms.astype(np.int64) * 1000, type=pa.int64()).view(_TIMESTAMP)
