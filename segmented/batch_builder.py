"""From ``ProducerRecord``s to one record batch (Kafka's MemoryRecordsBuilder on the
client plus the checks of the broker's LogValidator).

Each call builds exactly one batch, as a producer with linger 0 sends one batch per
send. Everything is checked before anything is written: a bad record rejects the
whole call and changes nothing.

Timestamps: CreateTime takes the record's ``timestamp_ms`` or ``now_ms``. A
LogAppendTime topic keeps the producer's timestamps in the records, sets attribute
bit 3 and writes the append time as the batch's max timestamp, which is what every
reader reports for its records (as Kafka's broker does).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import numpy as np
from crc32c import crc32c

from mqstore.commitlog.errors import InvalidArgumentError, InvalidTypeError, LimitExceededError
from mqstore.segmented.compression import InflateError
from mqstore.segmented.record_batch import (
    ATTRIBUTES_POSITION,
    COMPRESSION_MASK,
    COVERED,
    CRC_POSITION,
    DELETE_HORIZON_MASK,
    HEADER_SIZE,
    TIMESTAMP_TYPE_MASK,
    MalformedBatchError,
    build_batch,
    check_batch,
    decode_records,
    encode_record,
    inflated_batch,
    record_span_rows,
)

__all__ = ["RECORDS_PER_BATCH_MAX", "AdoptedBatch", "BuiltBatch", "adopt", "build"]

_CRC: Final = struct.Struct(">I")

RECORDS_PER_BATCH_MAX: Final = 1 << 20  # one batch holds the partition lock; bound how long
TIMESTAMP_MAX_MS: Final = 2**63 - 1
_BYTES_LIKE: Final = (bytes, bytearray, memoryview)
# Columns of record_span_rows (SPAN_FIELDS): key size, value start and size, record
# start, timestamp delta.
_KEY_SIZE, _VALUE_START, _VALUE_SIZE, _RECORD_START, _STAMP = 2, 3, 4, 5, 6


class BuiltBatch(NamedTuple):
    """A batch ready to append (base offset still 0) and what each record became."""

    batch: bytearray
    record_count: int
    max_timestamp_ms: int
    # per record: (timestamp_ms, serialized key size, value size, header size), -1 = none
    sizes: list[tuple[int, int, int, int]]


def build(
    records: Sequence[Any], now_ms: int, log_append_time: bool, size_max_bytes: int
) -> BuiltBatch:
    """Validate ``records`` and encode them as one batch.

    Raises:
        InvalidTypeError: a record, key, value, header or timestamp of the wrong type.
        InvalidArgumentError: no records, a negative timestamp.
        LimitExceededError: more than RECORDS_PER_BATCH_MAX records, or a batch
            larger than ``size_max_bytes``.
    """
    if type(records) not in (list, tuple) and (  # the ABC check is slow: lists skip it
        not isinstance(records, Sequence) or isinstance(records, (str, bytes))
    ):
        raise InvalidTypeError(f"records must be a sequence, not {type(records).__name__}")
    count = len(records)
    if count == 0:
        raise InvalidArgumentError("records must hold at least one record")
    if count > RECORDS_PER_BATCH_MAX:
        raise LimitExceededError(f"one call appends at most {RECORDS_PER_BATCH_MAX} records")
    encoded: list[bytes] = []
    sizes: list[tuple[int, int, int, int]] = []
    base_timestamp_ms = max_timestamp_ms = -1
    total_bytes = HEADER_SIZE
    for offset_delta, record in enumerate(records):
        try:
            key, value, headers, timestamp_ms = (
                record.key, record.value, record.headers, record.timestamp_ms
            )  # fmt: skip
        except AttributeError:
            raise InvalidTypeError(
                f"record {offset_delta} is a {type(record).__name__}, not a ProducerRecord"
            ) from None
        if timestamp_ms is None:
            timestamp_ms = now_ms
        elif type(timestamp_ms) is not int or not 0 <= timestamp_ms <= TIMESTAMP_MAX_MS:
            timestamp_ms = _timestamp(timestamp_ms)
        if offset_delta == 0:
            base_timestamp_ms = timestamp_ms
        if timestamp_ms > max_timestamp_ms:
            max_timestamp_ms = timestamp_ms
        if key is not None and type(key) is not bytes:
            key = _bytes(key, "key")
        if value is not None and type(value) is not bytes:
            value = _bytes(value, "value")
        if headers:
            header_pairs, header_size = _headers(headers)
        elif headers is None or type(headers) is list or type(headers) is tuple:
            header_pairs, header_size = [], -1
        else:
            raise InvalidTypeError(f"headers must be a sequence, not {type(headers).__name__}")
        data = encode_record(
            offset_delta, timestamp_ms - base_timestamp_ms, key, value, header_pairs
        )
        total_bytes += len(data)
        if total_bytes > size_max_bytes:
            raise LimitExceededError(
                f"the batch exceeds the {size_max_bytes}-byte limit at record {offset_delta}"
            )
        encoded.append(data)
        sizes.append(
            (
                now_ms if log_append_time else timestamp_ms,
                -1 if key is None else len(key),
                -1 if value is None else len(value),
                header_size,
            )
        )
    if log_append_time:
        max_timestamp_ms = now_ms
    batch = build_batch(encoded, base_timestamp_ms, max_timestamp_ms, log_append_time)
    return BuiltBatch(batch, count, max_timestamp_ms, sizes)


class AdoptedBatch(NamedTuple):
    """A producer's batch checked and ready to append as it is (base offset still to
    fill in): no Python object per record."""

    batch: bytearray
    record_count: int
    max_timestamp_ms: int  # the append time on a LogAppendTime topic
    key_sizes: Any  # int64 array, -1: a null key (what a compacted topic refuses)


def adopt(
    data: bytes | bytearray, now_ms: int, log_append_time: bool, size_max_bytes: int
) -> AdoptedBatch:
    """A producer's whole batch, validated to be stored as it is: Kafka's LogValidator
    in place, so the producer's bytes and CRC reach the consumer. On a LogAppendTime
    topic bit 3 and the max timestamp are set and the CRC recomputed, as Kafka does.

    The records are walked and checked in one C call (``record_span_rows``, Kafka's
    DefaultRecord.readFrom checks); a batch with record headers is decoded in full
    as well, so that a header key that is not UTF-8 is refused here rather than
    found by a reader.

    Raises:
        LimitExceededError: larger than ``size_max_bytes``.
        InvalidArgumentError: not exactly one valid batch v2 (size, magic, CRC-32C,
            a known codec, records that inflate within the bound), a count that
            does not match its offset deltas, records that do not decode or fill
            it, a timestamp out of [0, 2**63 - 1], a delete horizon.
    """
    if len(data) > size_max_bytes:
        raise LimitExceededError(f"a {len(data)}-byte batch exceeds {size_max_bytes} bytes")
    raw = bytes(data)
    try:
        header = check_batch(raw, 0)
        if header.size != len(raw):
            raise MalformedBatchError(header.size, f"{len(raw) - header.size} bytes after it")
        count = header.records_count
        if count < 1 or count != header.last_offset_delta + 1:
            raise MalformedBatchError(0, f"{count} records for offset delta {count - 1}")
        if header.attributes & DELETE_HORIZON_MASK:
            raise MalformedBatchError(0, "a producer's batch sets no delete horizon")
        codec = header.attributes & COMPRESSION_MASK
        body = inflated_batch(raw, 0, codec) if codec else raw
        rows = record_span_rows(body, HEADER_SIZE, len(body), count, header.last_offset_delta)
        if _any_headers(rows, len(body)):
            decode_records(raw, 0, header, header.base_offset, count)
    except MalformedBatchError as error:
        raise InvalidArgumentError(f"not a valid record batch: {error.reason}") from None
    except InflateError as error:
        raise InvalidArgumentError(f"not a valid record batch: compressed: {error}") from None
    # The records' own timestamps: what readers report once the batch carries the
    # topic's timestamp type (below; the append time instead on a LogAppendTime topic).
    lowest = header.base_timestamp + int(rows[:, _STAMP].min())
    highest = header.base_timestamp + int(rows[:, _STAMP].max())
    if lowest < 0:
        raise InvalidArgumentError(f"a record timestamp {lowest} is negative")
    if highest > TIMESTAMP_MAX_MS:
        raise InvalidArgumentError(f"a record timestamp {highest} is past 2**63 - 1")
    # Kafka's assignOffsetsNonCompressed: a max timestamp that is not the records'
    # largest (CreateTime) or the append time (LogAppendTime) is set, CRC and all.
    max_timestamp_ms = now_ms if log_append_time else highest
    batch = bytearray(raw)
    # The topic's timestamp type, as Kafka's setMaxTimestamp writes it: a producer's
    # LogAppendTime bit on a CreateTime topic is cleared.
    attributes = header.attributes & ~TIMESTAMP_TYPE_MASK
    attributes |= TIMESTAMP_TYPE_MASK if log_append_time else 0
    if attributes != header.attributes or max_timestamp_ms != header.max_timestamp:
        COVERED.pack_into(
            batch, ATTRIBUTES_POSITION, attributes, header.last_offset_delta,
            header.base_timestamp, max_timestamp_ms, header.producer_id,
            header.producer_epoch, header.base_sequence, count,
        )  # fmt: skip
        _CRC.pack_into(batch, CRC_POSITION, crc32c(memoryview(batch)[ATTRIBUTES_POSITION:]))
    return AdoptedBatch(batch, count, max_timestamp_ms, rows[:, _KEY_SIZE])


def _any_headers(rows: Any, end: int) -> bool:
    """Whether a record of ``rows`` (record_span_rows') has a header: a record without
    one ends one byte (its header count, 0) after its value."""
    ends = np.empty(len(rows), dtype=np.int64)
    ends[:-1] = rows[1:, _RECORD_START]
    ends[-1] = end
    value_ends = rows[:, _VALUE_START] + np.maximum(rows[:, _VALUE_SIZE], 0)
    return bool((ends - value_ends != 1).any())


def _timestamp(value: object) -> int:
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidTypeError(f"timestamp_ms must be an int, not {type(value).__name__}")
        value = int(value)
    if not 0 <= value <= TIMESTAMP_MAX_MS:
        raise InvalidArgumentError(f"timestamp_ms {value} is outside [0, 2**63 - 1]")
    return value


def _bytes(value: object, name: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, _BYTES_LIKE):
        return bytes(value)
    raise InvalidTypeError(f"{name} must be bytes or None, not {type(value).__name__}")


def _headers(headers: Any) -> tuple[list[tuple[bytes, bytes]], int]:
    """UTF-8 encoded (key, value) pairs and their size."""
    pairs: list[tuple[bytes, bytes]] = []
    size = 0
    try:
        for header_key, header_value in headers:
            if not isinstance(header_key, str):
                raise InvalidTypeError(
                    f"a header key must be a str, not {type(header_key).__name__}"
                )
            value = _bytes(header_value, "a header value")
            if value is None:
                raise InvalidTypeError("a header value must be bytes, not None")
            try:
                encoded_key = header_key.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidArgumentError(f"header key {header_key!r} is not UTF-8") from None
            pairs.append((encoded_key, value))
            size += len(encoded_key) + len(value)
    except (TypeError, ValueError) as error:
        if isinstance(error, (InvalidTypeError, InvalidArgumentError)):
            raise
        raise InvalidTypeError(f"headers must be (str, bytes) pairs: {error}") from None
    return pairs, size
