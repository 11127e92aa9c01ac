"""Kafka record batch v2 (magic 2): the bytes of every ``.log`` file.

Batch layout (big-endian; a 61-byte header, then the records)::

    position size field
           0    8 base_offset             offset of the first record
           8    4 length                  bytes after this field (batch size - 12)
          12    4 partition_leader_epoch  0: one writer, never re-elected
          16    1 magic                   2
          17    4 crc                     CRC-32C (Castagnoli) of bytes 21 to the end
          21    2 attributes              bits 0-2 compression (0 none), bit 3 LogAppendTime,
                                          bit 6 delete horizon set (KIP-534)
          23    4 last_offset_delta       records_count - 1, until compaction removes records
          27    8 base_timestamp          the first record's timestamp; the delete horizon
                                          when bit 6 is set (record deltas rebased on it)
          35    8 max_timestamp           the largest record timestamp, or the append
                                          time when bit 3 is set
          43    8 producer_id             -1: no idempotent producer
          51    2 producer_epoch          -1
          53    4 base_sequence           -1
          57    4 records_count
          61      records

Record (varints are zig-zag, as protobuf's sint)::

    length varint | attributes int8 (0) | timestamp_delta varlong | offset_delta varint
    | key_length varint (-1 null) | key | value_length varint (-1 null) | value
    | headers_count varint | per header: key_length varint, utf-8 key,
                                          value_length varint (-1 null), value

The CRC leaves out base_offset, length, epoch and magic: the writer fills in
base_offset under the append lock without recomputing it. Recovery therefore also
checks that base offsets never go back (``check_batch`` does not).

Compaction (``segmented.cleaner``) rewrites a batch keeping its base offset and its
last_offset_delta (Kafka keeps both for magic 2), so a cleaned batch holds fewer
records than its offset span, its offset deltas leave gaps, and it may hold none
(records_count 0: an empty batch kept for its last offset). Offsets between batches
may leave gaps too. A batch whose records_count equals last_offset_delta + 1 is dense.

Compressed batches (a producer's, stored as it sent them) are inflated by
``compression`` when their records are decoded; a cleaned batch is rewritten
uncompressed (Kafka would recompress it with the topic's codec).

Decoding errors never escape as IndexError or struct.error: they become
``MalformedBatchError`` here, and the segment that read the bytes turns that into
``CorruptDataError`` with its file and position.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import numpy as np
from crc32c import crc32c

from mqstore.commitlog.native import NATIVE
from mqstore.engine import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    EngineRecord,
    no_headers,
)
from mqstore.segmented.compression import CODEC_NAMES, InflateError, inflate

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "BatchHeader",
    "MalformedBatchError",
    "batch_size_at",
    "build_batch",
    "check_batch",
    "check_crc",
    "DELETE_HORIZON_MASK",
    "Decoded",
    "decode_batches",
    "decode_records",
    "record_span_rows",
    "encode_record",
    "read_varint",
    "rebuild_batch",
    "set_base_offset",
    "zigzag_varint",
]

HEADER: Final = struct.Struct(
    ">q"  # base_offset
    "i"  # length: bytes after this field
    "i"  # partition_leader_epoch
    "b"  # magic
    "I"  # crc: CRC-32C from attributes to the end
    "h"  # attributes
    "i"  # last_offset_delta
    "q"  # base_timestamp
    "q"  # max_timestamp
    "q"  # producer_id
    "h"  # producer_epoch
    "i"  # base_sequence
    "i"  # records_count
)
HEADER_SIZE: Final = HEADER.size
assert HEADER_SIZE == 61
# The same header in two parts: what the CRC leaves out (through the CRC itself), and
# what it covers. The writer packs the covered part, runs the CRC on it and on the
# records, then packs the prefix with the CRC in it.
PREFIX: Final = struct.Struct(">qiibI")  # base_offset, length, epoch, magic, crc
COVERED: Final = struct.Struct(">hiqqqhii")  # attributes ... records_count
assert PREFIX.size + COVERED.size == HEADER_SIZE
# What a scan needs to step over a batch without decoding it: through last_offset_delta.
SKIP: Final = struct.Struct(">qiibIhi")
BASE_OFFSET: Final = struct.Struct(">q")
LENGTH: Final = struct.Struct(">i")
LENGTH_POSITION: Final = struct.calcsize(">q")
LOG_OVERHEAD: Final = struct.calcsize(">qi")  # base_offset + length: what length leaves out
CRC_POSITION: Final = struct.calcsize(">qiib")
ATTRIBUTES_POSITION: Final = PREFIX.size
assert (LENGTH_POSITION, LOG_OVERHEAD, CRC_POSITION, ATTRIBUTES_POSITION) == (8, 12, 17, 21)

MAGIC: Final = 2
COMPRESSION_MASK: Final = 0x07
TIMESTAMP_TYPE_MASK: Final = 0x08  # set: LogAppendTime
TRANSACTIONAL_MASK: Final = 0x10
CONTROL_MASK: Final = 0x20
DELETE_HORIZON_MASK: Final = 0x40  # KIP-534: base_timestamp holds the delete horizon
UNSUPPORTED_MASK: Final = TRANSACTIONAL_MASK | CONTROL_MASK  # no transactions here
CODEC_MAX: Final = len(CODEC_NAMES) - 1  # zstd; 5 to 7 are unknown
NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1
LEADER_EPOCH: Final = 0
VARINT_BYTES_MAX: Final = 10  # a zig-zag int64 takes at most 10 bytes
NULL_LENGTH: Final = b"\x01"  # zig-zag varint of -1: a null key, value or header value
_ONE_BYTE: Final = tuple(bytes((i,)) for i in range(0x80))
#: Two-byte varints, by zig-zag value (0x80 to 0x3FFF): lengths and deltas up to 8 KiB
#: take one look-up instead of a loop (the first 0x80 entries are never used).
_TWO_BYTES: Final = tuple(bytes(((i & 0x7F) | 0x80, i >> 7)) for i in range(0x4000))


class MalformedBatchError(ValueError):
    """Bytes that are not a valid batch; ``position`` is relative to the buffer."""

    def __init__(self, position: int, reason: str, truncated: bool = False) -> None:
        super().__init__(reason)
        self.position = position
        self.reason = reason
        self.truncated = truncated  # the bytes end inside the batch (a torn tail)


class BatchHeader(NamedTuple):
    """The 61-byte header, by name."""

    base_offset: int
    length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included."""
        return self.length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def timestamp_type(self) -> int:
        if self.attributes & TIMESTAMP_TYPE_MASK:
            return TIMESTAMP_LOG_APPEND_TIME
        return TIMESTAMP_CREATE_TIME


# ---------------------------------------------------------------------- varints


def zigzag_varint(value: int) -> bytes:
    """The zig-zag varint of a signed int64 (Kafka's ByteUtils.writeVarlong)."""
    encoded = value << 1 if value >= 0 else ((-value) << 1) - 1
    if encoded < 0x80:
        return _ONE_BYTE[encoded]
    if encoded < 0x4000:
        return _TWO_BYTES[encoded]
    out = bytearray()
    while encoded >= 0x80:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def read_varint(buffer: bytes, position: int) -> tuple[int, int]:
    """Decode a zig-zag varint at ``position``; return (value, next position).

    Raises:
        MalformedBatchError: longer than 10 bytes, or past 64 bits (a 10th byte
            above 1: record_spans refuses it alike).
        IndexError: the buffer ends inside the varint (callers map it).
    """
    byte = buffer[position]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), position + 1
    result = byte & 0x7F
    shift = 7
    end = position + VARINT_BYTES_MAX
    position += 1
    while True:
        byte = buffer[position]
        position += 1
        if shift == 63 and byte > 1:
            raise MalformedBatchError(position, "varint past 64 bits")
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
        if position >= end:
            raise MalformedBatchError(position, "varint longer than 10 bytes")


# ---------------------------------------------------------------------- encode


def encode_record(
    offset_delta: int,
    timestamp_delta_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[bytes, bytes]],
) -> bytes:
    """One record, length prefix included. Header keys come already UTF-8 encoded."""
    varint = zigzag_varint
    if headers:
        parts = [varint(len(headers))]
        for header_key, header_value in headers:
            parts += (varint(len(header_key)), header_key, varint(len(header_value)), header_value)
        header_bytes = b"".join(parts)
    else:
        header_bytes = b"\x00"  # zero headers
    body = b"".join(
        (
            b"\x00",  # attributes
            varint(timestamp_delta_ms),
            varint(offset_delta),
            NULL_LENGTH if key is None else varint(len(key)),
            b"" if key is None else key,
            NULL_LENGTH if value is None else varint(len(value)),
            b"" if value is None else value,
            header_bytes,
        )
    )
    return varint(len(body)) + body


def build_batch(
    records: Sequence[bytes],
    base_timestamp_ms: int,
    max_timestamp_ms: int,
    log_append_time: bool,
) -> bytearray:
    """A whole batch around encoded records, CRC set, base_offset 0 (see
    ``set_base_offset``: the offset is assigned under the append lock)."""
    count = len(records)
    assert count >= 1
    body = records[0] if count == 1 else b"".join(records)
    attributes = TIMESTAMP_TYPE_MASK if log_append_time else 0
    covered = COVERED.pack(
        attributes, count - 1, base_timestamp_ms, max_timestamp_ms, NO_PRODUCER_ID,
        NO_PRODUCER_EPOCH, NO_SEQUENCE, count,
    )  # fmt: skip
    crc = crc32c(body, crc32c(covered))
    size = HEADER_SIZE + len(body)
    batch = bytearray(PREFIX.pack(0, size - LOG_OVERHEAD, LEADER_EPOCH, MAGIC, crc))
    batch += covered
    batch += body
    return batch


def rebuild_batch(
    header: BatchHeader, records: Sequence[bytes], attributes: int, base_timestamp_ms: int
) -> bytearray:
    """A batch holding ``records`` (encoded against ``base_timestamp_ms``) in place of
    the batch ``header`` describes: the same base offset, last_offset_delta and max
    timestamp, as Kafka's cleaner keeps them (magic 2), so the offsets of the batch
    and of the segment never move. ``records`` may be empty (an empty batch)."""
    body = b"".join(records)
    covered = COVERED.pack(
        attributes, header.last_offset_delta, base_timestamp_ms, header.max_timestamp,
        header.producer_id, header.producer_epoch, header.base_sequence, len(records),
    )  # fmt: skip
    crc = crc32c(body, crc32c(covered))
    size = HEADER_SIZE + len(body)
    batch = bytearray(
        PREFIX.pack(header.base_offset, size - LOG_OVERHEAD, header.partition_leader_epoch,
                    MAGIC, crc)
    )  # fmt: skip
    batch += covered
    batch += body
    return batch


def set_base_offset(batch: bytearray, base_offset: int) -> None:
    """Fill in base_offset (outside the CRC, so the CRC stays valid)."""
    BASE_OFFSET.pack_into(batch, 0, base_offset)


# ---------------------------------------------------------------------- decode


def batch_size_at(buffer: bytes, position: int) -> int:
    """The size of the batch starting at ``position``, from its length field.

    Raises:
        MalformedBatchError: fewer than 12 bytes left (truncated), or a length
            smaller than a header.
    """
    if len(buffer) - position < LOG_OVERHEAD:
        raise MalformedBatchError(position, "batch header cut short", truncated=True)
    size: int = LENGTH.unpack_from(buffer, position + LENGTH_POSITION)[0] + LOG_OVERHEAD
    if size < HEADER_SIZE:
        raise MalformedBatchError(position, f"batch size {size} is below the 61-byte header")
    return size


def check_batch(buffer: bytes, position: int, verify_crc: bool = True) -> BatchHeader:
    """Validate the batch at ``position`` and return its header.

    Checks the size (it must lie inside ``buffer``), the magic, the CRC-32C, that it
    has a known codec and is not transactional or control, and that records_count is in
    [0, last_offset_delta + 1] (fewer after compaction).

    Raises:
        MalformedBatchError: any of those fails (``truncated`` when the buffer ends
            inside the batch).
    """
    size = batch_size_at(buffer, position)
    if len(buffer) - position < size:
        raise MalformedBatchError(position, f"batch of {size} bytes cut short", truncated=True)
    header = BatchHeader._make(HEADER.unpack_from(buffer, position))
    if header.magic != MAGIC:
        raise MalformedBatchError(position, f"magic {header.magic}, expected {MAGIC}")
    if verify_crc:
        check_crc(buffer, position, header)
    if header.attributes & UNSUPPORTED_MASK or header.attributes & COMPRESSION_MASK > CODEC_MAX:
        raise MalformedBatchError(position, f"unsupported attributes {header.attributes:#06x}")
    if not 0 <= header.records_count <= header.last_offset_delta + 1:
        raise MalformedBatchError(
            position,
            f"records_count {header.records_count} does not fit "
            f"last_offset_delta {header.last_offset_delta}",
        )
    return header


def check_crc(buffer: bytes, position: int, header: BatchHeader) -> None:
    """Raise MalformedBatchError unless the CRC-32C of attributes..end matches."""
    with memoryview(buffer) as view:
        actual = crc32c(view[position + ATTRIBUTES_POSITION : position + header.size])
    if actual != header.crc:
        raise MalformedBatchError(
            position, f"CRC-32C {actual:#010x} does not match {header.crc:#010x}"
        )


def decode_records(
    buffer: bytes, position: int, header: BatchHeader, first_offset: int, count_max: int
) -> list[EngineRecord]:
    """Records of a checked batch from ``first_offset`` on, at most ``count_max``.

    Raises:
        MalformedBatchError: a record does not decode, or does not fill the batch.
    """
    records: list[EngineRecord] = []
    _decode_batch(
        buffer, position, header.base_offset, header.attributes, header.base_timestamp,
        header.max_timestamp, header.crc, header.records_count, header.last_offset_delta,
        first_offset, count_max, records,
    )  # fmt: skip
    return records


class Decoded(NamedTuple):
    """What ``decode_batches`` got from one buffer."""

    records: list[EngineRecord]
    advance_bytes: int  # from the start position to the first batch not consumed
    decoded_bytes: int  # bytes of the batches records were taken from
    needed_bytes: int  # 0: a limit was reached; else bytes the next batch needs


def decode_batches(
    buffer: bytes, position: int, first_offset: int, count_max: int, bytes_max: int
) -> Decoded:
    """Decode the records of whole batches in ``buffer[position:]``, starting at
    ``first_offset`` (possibly inside a batch): the read path in one loop.

    Batches that end before ``first_offset`` are stepped over on their first 27
    bytes; every batch records are taken from is checked in full (size, magic,
    attributes, count, CRC-32C) first. A batch that starts past the next offset
    wanted is a gap compaction left (offsets only grow). Stops when ``count_max``
    records or ``bytes_max`` bytes of batches were decoded (needed_bytes 0), or at a batch the
    buffer does not hold whole (needed_bytes: its size, or a header's).

    Raises:
        MalformedBatchError: a batch or record does not validate (``position`` is
            relative to ``buffer``).
    """
    records: list[EngineRecord] = []
    start = position
    decoded_bytes = 0
    buffer_size = len(buffer)
    wanted = first_offset
    with memoryview(buffer) as view:
        while True:
            if buffer_size - position < HEADER_SIZE:
                return Decoded(records, position - start, decoded_bytes, HEADER_SIZE)
            base_offset, length, _, magic, crc, attributes, last_delta = SKIP.unpack_from(
                buffer, position
            )
            size = length + LOG_OVERHEAD
            if size < HEADER_SIZE or magic != MAGIC or last_delta < 0:
                raise MalformedBatchError(
                    position, f"batch size {size}, magic {magic}, last delta {last_delta}"
                )
            if size > buffer_size - position:
                return Decoded(records, position - start, decoded_bytes, size)
            if base_offset + last_delta >= wanted:
                (*_, base_timestamp, max_timestamp, _, _, _, count) = HEADER.unpack_from(
                    buffer, position
                )
                _check_whole(view, position, size, crc, attributes, last_delta, count)
                _decode_batch(
                    buffer, position, base_offset, attributes, base_timestamp, max_timestamp,
                    crc, count, last_delta, wanted, count_max - len(records), records,
                )  # fmt: skip
                decoded_bytes += size
                if len(records) >= count_max or decoded_bytes >= bytes_max:
                    return Decoded(records, position + size - start, decoded_bytes, 0)
                wanted = base_offset + last_delta + 1  # the batch was taken whole
            position += size


def _check_whole(
    view: memoryview,
    position: int,
    size: int,
    crc: int,
    attributes: int,
    last_delta: int,
    count: int,
) -> None:
    """``check_batch``'s checks, on fields already unpacked."""
    if attributes & UNSUPPORTED_MASK or attributes & COMPRESSION_MASK > CODEC_MAX:
        raise MalformedBatchError(position, f"unsupported attributes {attributes:#06x}")
    if not 0 <= count <= last_delta + 1:
        raise MalformedBatchError(
            position, f"records_count {count} does not fit last_offset_delta {last_delta}"
        )
    actual = crc32c(view[position + ATTRIBUTES_POSITION : position + size])
    if actual != crc:
        raise MalformedBatchError(position, f"CRC-32C {actual:#010x} does not match {crc:#010x}")


def _decode_batch(
    buffer: bytes,
    position: int,
    base_offset: int,
    attributes: int,
    base_timestamp: int,
    max_timestamp: int,
    crc: int,
    count: int,
    last_delta: int,
    first_offset: int,
    count_max: int,
    out: list[EngineRecord],
) -> None:
    """Append the records of the checked batch at ``position`` from ``first_offset``
    on, at most ``count_max``, to ``out``. In a dense batch (record i at offset delta
    i) earlier records are skipped by their length; in a compacted one, offset deltas
    only have to grow, and records below ``first_offset`` are decoded and dropped.

    Zig-zag varints are decoded inline when they fit in one byte (lengths below 64,
    small deltas): a function call per field would cost more than the decoding.
    A compressed batch is inflated (``compression``) and its records decoded alike.
    """
    if attributes & COMPRESSION_MASK:
        try:
            inflated = inflated_batch(buffer, position, attributes & COMPRESSION_MASK)
            _decode_batch(
                inflated, 0, base_offset, attributes & ~COMPRESSION_MASK, base_timestamp,
                max_timestamp, crc, count, last_delta, first_offset, count_max, out,
            )  # fmt: skip
        except (MalformedBatchError, InflateError) as error:
            raise MalformedBatchError(position, f"compressed batch: {error}") from None
        return
    (length,) = LENGTH.unpack_from(buffer, position + LENGTH_POSITION)
    end = position + length + LOG_OVERHEAD
    if attributes & TIMESTAMP_TYPE_MASK:
        timestamp_type, append_time = TIMESTAMP_LOG_APPEND_TIME, max_timestamp
    else:
        timestamp_type, append_time = TIMESTAMP_CREATE_TIME, -1
    dense = count == last_delta + 1
    skip = max(0, first_offset - base_offset) if dense else 0
    taken = 0
    previous_delta = -1
    index = skip - 1
    varint = read_varint
    none = no_headers()  # the records without headers share it
    cursor = position + HEADER_SIZE
    try:
        for _ in range(skip):
            length, cursor = varint(buffer, cursor)
            cursor += length
        for index in range(skip, count):
            if taken >= count_max:
                index -= 1
                break
            length, cursor = varint(buffer, cursor)
            record_end = cursor + length
            byte = buffer[cursor + 1]  # after the attributes byte: timestamp delta
            if byte < 0x80:
                timestamp_delta, cursor = (byte >> 1) ^ -(byte & 1), cursor + 2
            else:
                timestamp_delta, cursor = varint(buffer, cursor + 1)
            offset_delta, cursor = varint(buffer, cursor)
            if offset_delta != index if dense else not previous_delta < offset_delta <= last_delta:
                raise MalformedBatchError(cursor, f"offset delta {offset_delta} at record {index}")
            previous_delta = offset_delta
            byte = buffer[cursor]
            if byte < 0x80:
                key_size, cursor = (byte >> 1) ^ -(byte & 1), cursor + 1
            else:
                key_size, cursor = varint(buffer, cursor)
            if key_size < 0:
                key = None
            else:
                key = buffer[cursor : cursor + key_size]
                cursor += key_size
            byte = buffer[cursor]
            if byte < 0x80:
                value_size, cursor = (byte >> 1) ^ -(byte & 1), cursor + 1
            else:
                value_size, cursor = varint(buffer, cursor)
            if value_size < 0:
                value = None
            else:
                value = buffer[cursor : cursor + value_size]
                cursor += value_size
            if buffer[cursor] == 0:  # no headers, the usual case
                headers: list[tuple[str, bytes]] = none
                header_size, cursor = -1, cursor + 1
            else:
                header_count, cursor = varint(buffer, cursor)
                headers, header_size, cursor = _decode_headers(buffer, cursor, header_count)
            if cursor != record_end or record_end > end:
                raise MalformedBatchError(cursor, f"record {index} does not fill its length")
            if base_offset + offset_delta < first_offset:
                continue
            taken += 1
            out.append(
                EngineRecord(
                    base_offset + offset_delta,
                    append_time if append_time >= 0 else base_timestamp + timestamp_delta,
                    timestamp_type, key, value, headers, crc,
                    -1 if key is None else key_size, -1 if value is None else value_size,
                    header_size,
                )
            )  # fmt: skip
    except (IndexError, UnicodeDecodeError, struct.error) as error:
        raise MalformedBatchError(position, f"record does not decode: {error}") from None
    if index == count - 1 and cursor != end:
        raise MalformedBatchError(cursor, f"{end - cursor} bytes left over after the records")


def inflated_batch(buffer: bytes, position: int, codec: int) -> bytes:
    """The compressed batch at ``position`` as an uncompressed one (the same header,
    its length set to the inflated records').

    Raises:
        InflateError: the records do not inflate, or inflate past the bound.
    """
    (length,) = LENGTH.unpack_from(buffer, position + LENGTH_POSITION)
    with memoryview(buffer) as view:
        body = inflate(codec, view[position + HEADER_SIZE : position + length + LOG_OVERHEAD])
    prefix = bytearray(buffer[position : position + HEADER_SIZE])
    LENGTH.pack_into(prefix, LENGTH_POSITION, HEADER_SIZE + len(body) - LOG_OVERHEAD)
    return bytes(prefix) + body


# ---------------------------------------------------------------------- spans

#: Fields per record of ``record_spans``: offset delta, key start, key size (-1:
#: null), value start, value size (-1: null), record start, timestamp delta.
SPAN_FIELDS: Final = 7
_MASK64: Final = (1 << 64) - 1
_record_spans_c: Any = None if NATIVE is None else NATIVE.record_spans


def record_spans_py(buffer: Any, start: int, end: int, count: int, last_delta: int) -> bytes:
    """The pure-Python twin of the C ``record_spans`` (segmented/_records.c, which
    states the contract): the records of a checked batch in ``buffer[start:end]``,
    ``SPAN_FIELDS`` native int64 per record, each field checked as Kafka checks it.

    Raises:
        ValueError: ``(position, reason)`` for a record that does not decode, or a
            plain message for arguments out of range.
    """
    if not 0 <= start <= end <= len(buffer):
        raise ValueError("record_spans: need 0 <= start <= end <= len(buffer)")
    if count < 0 or count > (end - start) // 7 + 1 or last_delta < -1:
        raise ValueError((start, "impossible record count or last offset delta"))
    view = memoryview(buffer).cast("B") if not isinstance(buffer, bytes) else buffer
    rows = array("q")
    dense = count == last_delta + 1
    previous = -1
    cursor = start

    def zigzag(limit: int) -> int:
        nonlocal cursor
        result = 0
        for shift in range(0, 70, 7):
            if cursor >= limit:
                raise ValueError((cursor, "cut off"))
            byte = view[cursor]
            cursor += 1
            if shift == 63 and byte > 1:  # past 64 bits: the C walk refuses it too
                raise ValueError((cursor, "varint past 64 bits"))
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                result &= _MASK64
                signed = result >> 1
                return -signed - 1 if result & 1 else signed
        raise ValueError((cursor, "varint longer than 10 bytes"))

    def sized(what: str, least: int, limit: int) -> int:
        """A size field: reported where it starts if it does not read, where its span
        would start if out of [least, bytes left] (as the C walk reports them)."""
        at = cursor
        try:
            size = zigzag(limit)
        except ValueError:
            raise ValueError((at, what)) from None
        if size < least or size > limit - cursor:
            raise ValueError((cursor, what))
        return size

    for index in range(count):
        record_start = cursor
        try:
            length = zigzag(end)
        except ValueError:
            raise ValueError((record_start, "record length")) from None
        if length < 0 or length > end - cursor:
            raise ValueError((record_start, "record length"))
        record_end = cursor + length
        cursor += 1  # attributes
        try:
            if cursor > record_end:
                raise ValueError
            stamp_delta = zigzag(record_end)
            delta = zigzag(record_end)
        except ValueError:
            raise ValueError((record_start, "record does not decode")) from None
        if delta != index if dense else not previous < delta <= last_delta:
            raise ValueError((cursor, "offset delta out of order"))
        previous = delta
        fields = [delta]
        for what in ("key size", "value size"):
            size = sized(what, -1, record_end)
            fields += (cursor, size)
            cursor += max(size, 0)
        for _ in range(sized("header count", 0, record_end)):
            for what, least in (("header key", 0), ("header value", -1)):
                size = sized(what, least, record_end)  # it moves the cursor: read it first
                cursor += max(size, 0)
        if cursor != record_end:
            raise ValueError((cursor, "record does not fill its length"))
        fields += (record_start, stamp_delta)
        rows.extend(fields)
    if cursor != end:
        raise ValueError((cursor, "bytes left over after the records"))
    return rows.tobytes()


def record_span_rows(buffer: Any, start: int, end: int, count: int, last_delta: int) -> Any:
    """``record_spans`` (C when built) as a (count, SPAN_FIELDS) int64 array.

    Raises:
        MalformedBatchError: a record does not decode (its position in ``buffer``).
    """
    function = _record_spans_c if _record_spans_c is not None else record_spans_py
    try:
        packed = function(buffer, start, end, count, last_delta)
    except ValueError as error:
        if error.args and isinstance(error.args[0], tuple):
            position, reason = error.args[0]
            raise MalformedBatchError(position, reason) from None
        raise
    return np.frombuffer(packed, dtype=np.int64).reshape(-1, SPAN_FIELDS)


def record_spans(buffer: Any, start: int, end: int, count: int, last_delta: int) -> list[list[int]]:
    """``record_spans`` (C when built) as SPAN_FIELDS lists: offset deltas, key
    starts, key sizes, value starts, value sizes, record starts, timestamp deltas.

    Raises:
        MalformedBatchError: a record does not decode (its position in ``buffer``).
    """
    columns: list[list[int]] = record_span_rows(buffer, start, end, count, last_delta).T.tolist()
    return columns


def _decode_headers(
    buffer: bytes, cursor: int, header_count: int
) -> tuple[list[tuple[str, bytes]], int, int]:
    if header_count < 0:
        raise MalformedBatchError(cursor, f"negative header count {header_count}")
    headers: list[tuple[str, bytes]] = []
    header_size = 0
    for _ in range(header_count):
        key_size, cursor = read_varint(buffer, cursor)
        if key_size < 0:
            raise MalformedBatchError(cursor, "null header key")
        key = buffer[cursor : cursor + key_size].decode("utf-8")
        cursor += key_size
        value_size, cursor = read_varint(buffer, cursor)
        value = b"" if value_size < 0 else buffer[cursor : cursor + value_size]
        cursor += max(value_size, 0)
        header_size += key_size + max(value_size, 0)
        headers.append((key, value))
    return headers, header_size, cursor
