"""Record batches as the broker receives and sends them (Kafka's record batch v2).

The batch layout is declared once, in mqstore/segmented/record_batch.py (a 61-byte
big-endian header, then the records); this module reads it with those structs.

Produce (``check_produced``, ``decode_produced``): what Kafka's LogValidator checks
before a batch is stored, whichever way it is stored:

- it lies whole inside the request, magic 2, exactly one batch per partition;
- the CRC-32C over attributes..end matches (the ``crc32c`` package);
- records_count == last_offset_delta + 1 (a producer numbers its records 0..n-1);
- a known codec; not a control batch, not transactional (no transactions here);
- the records decode and fill the batch (``decode_produced``); compressed batches
  are inflated by mqstore.segmented.compression (the maintained libraries, each
  bounded to ``INFLATED_BYTES_MAX`` before it is inflated past it).

Fetch (``build_fetch_batch``): records read back from an engine become one v2 batch
(uncompressed, CRC-32C set, base offset = the first record's offset).

Errors: bytes from the network are the world's input. Every check raises
``InvalidBatchError`` (an InvalidArgumentError) carrying the Kafka error code to
answer; nothing here asserts on them, and nothing is stored when one is raised.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

from crc32c import crc32c

from mqstore.commitlog.errors import InvalidArgumentError
from mqstore.engine import TIMESTAMP_LOG_APPEND_TIME, EngineBatch, ProducerRecord
from mqstore.segmented.compression import (
    CODEC_NAMES,
    INFLATED_BYTES_MAX,
    CodecUnavailableError,
    InflateError,
    InflateLimitError,
    inflate,
)
from mqstore.segmented.record_batch import (
    ATTRIBUTES_POSITION,
    COMPRESSION_MASK,
    CONTROL_MASK,
    CRC_POSITION,
    HEADER,
    HEADER_SIZE,
    LENGTH,
    LENGTH_POSITION,
    LOG_OVERHEAD,
    MAGIC,
    TRANSACTIONAL_MASK,
    BatchHeader,
    MalformedBatchError,
    build_batch,
    decode_records,
    set_base_offset,
    zigzag_varint,
)

__all__ = [
    "CODEC_NAMES",
    "INFLATED_BYTES_MAX",
    "InvalidBatchError",
    "ProducedBatch",
    "build_fetch_batch",
    "check_produced",
    "decode_produced",
    "inflated",
]

CORRUPT_MESSAGE: Final = 2  # Kafka's error code for a CRC or size failure
INVALID_RECORD: Final = 87  # ... for a batch that is well-formed but not acceptable
_LENGTH: Final = LENGTH


class InvalidBatchError(InvalidArgumentError):
    """A produced batch the broker refuses; ``error_code`` is Kafka's answer."""

    def __init__(self, message: str, error_code: int = CORRUPT_MESSAGE) -> None:
        super().__init__(message)
        self.error_code = error_code


class ProducedBatch(NamedTuple):
    """The checked batch of one partition of a ProduceRequest, by name."""

    header: BatchHeader
    data: bytes  # the whole batch

    @property
    def codec(self) -> str:
        return CODEC_NAMES[self.header.attributes & COMPRESSION_MASK]

    @property
    def records_count(self) -> int:
        return self.header.records_count

    @property
    def producer_id(self) -> int:
        return self.header.producer_id


def check_produced(records: bytes | bytearray | memoryview | None) -> ProducedBatch:
    """Check the ``records`` field of one partition of a ProduceRequest.

    Raises:
        InvalidBatchError: no batch, more than one, cut short, bad magic or size,
            CRC-32C mismatch, a count that does not match its offset deltas, an
            unknown codec, a control or transactional batch.
    """
    if records is None:
        raise InvalidBatchError("no record batch for a partition", INVALID_RECORD)
    data = bytes(records)
    if len(data) < HEADER_SIZE:
        raise InvalidBatchError(f"{len(data)} bytes: shorter than a 61-byte batch header")
    (length,) = _LENGTH.unpack_from(data, LENGTH_POSITION)
    size = length + LOG_OVERHEAD
    if size < HEADER_SIZE or size > len(data):
        raise InvalidBatchError(f"the batch claims {size} bytes of {len(data)}")
    if size != len(data):
        raise InvalidBatchError("more than one record batch for a partition", INVALID_RECORD)
    header = BatchHeader._make(HEADER.unpack_from(data, 0))
    if header.magic != MAGIC:
        raise InvalidBatchError(f"magic {header.magic}: only record batch v2 is served")
    actual = crc32c(memoryview(data)[ATTRIBUTES_POSITION:])
    if actual != header.crc:
        raise InvalidBatchError(f"CRC-32C {actual:#010x} does not match {header.crc:#010x}")
    count = header.records_count
    if count < 1 or count != header.last_offset_delta + 1:
        raise InvalidBatchError(
            f"records_count {count} does not match last_offset_delta {header.last_offset_delta}",
            INVALID_RECORD,
        )
    if header.attributes & COMPRESSION_MASK >= len(CODEC_NAMES):
        raise InvalidBatchError(
            f"unknown codec {header.attributes & COMPRESSION_MASK}", INVALID_RECORD
        )
    if header.attributes & (CONTROL_MASK | TRANSACTIONAL_MASK):
        raise InvalidBatchError("transactional and control batches are not served", INVALID_RECORD)
    return ProducedBatch(header, data)


def decode_produced(batch: ProducedBatch) -> list[ProducerRecord]:
    """The records of a checked batch, inflated if compressed, with their CreateTime.

    Raises:
        InvalidBatchError: the records do not decode or do not fill the batch, or
            they inflate past ``INFLATED_BYTES_MAX``, or the codec's library is
            missing.
    """
    header, data = inflated(batch)
    try:
        decoded = decode_records(data, 0, header, header.base_offset, header.records_count)
    except MalformedBatchError as error:
        raise InvalidBatchError(f"records do not decode: {error}", CORRUPT_MESSAGE) from None
    if len(decoded) != header.records_count:
        raise InvalidBatchError(
            f"{len(decoded)} records decoded of {header.records_count}", CORRUPT_MESSAGE
        )
    return [ProducerRecord(r.key, r.value, r.headers, r.timestamp_ms) for r in decoded]


def inflated(batch: ProducedBatch) -> ProducedBatch:
    """A checked batch with its records uncompressed (itself when they are): the
    header's length and codec bits match the new records, its CRC is the producer's.

    Raises:
        InvalidBatchError: they inflate past ``INFLATED_BYTES_MAX``, do not inflate,
            or the codec's library is missing.
    """
    header, data = batch
    codec = header.attributes & COMPRESSION_MASK
    if not codec:
        return batch
    body = _inflate(CODEC_NAMES[codec], memoryview(data)[HEADER_SIZE:])
    prefix = bytearray(data[:HEADER_SIZE])
    _LENGTH.pack_into(prefix, LENGTH_POSITION, HEADER_SIZE + len(body) - LOG_OVERHEAD)
    header = header._replace(attributes=header.attributes & ~COMPRESSION_MASK)
    return ProducedBatch(header, bytes(prefix) + body)


def _inflate(codec: str, body: memoryview) -> bytes:
    """The records of a compressed batch (mqstore.segmented.compression), at most
    INFLATED_BYTES_MAX bytes, its failures as Kafka's answers."""
    try:
        return inflate(CODEC_NAMES.index(codec), body, INFLATED_BYTES_MAX)
    except (InflateLimitError, CodecUnavailableError) as error:
        raise InvalidBatchError(str(error), INVALID_RECORD) from None
    except InflateError as error:
        raise InvalidBatchError(str(error)) from None


def build_fetch_batch(batch: EngineBatch, first: int, count: int) -> bytearray:
    """One uncompressed batch v2 of records ``first .. first + count - 1`` of
    ``batch`` (rows, not offsets), its base offset the first record's offset.

    The record layout is segmented.record_batch's ``encode_record``, inlined: the
    varints of small non-negative values (offset deltas, lengths, close timestamps)
    come from a table, so a record costs one ``join`` and no call per field.
    """
    assert first >= 0
    assert count > 0
    assert first + count <= len(batch)
    stamps = batch.timestamps_ms[first : first + count]
    offsets = batch.offsets
    base_offset = offsets[first]
    base_ts = stamps[0]
    keys, values, headers = batch.keys, batch.values, batch.headers
    varints, cached, varint = _VARINTS, len(_VARINTS), zigzag_varint
    encoded: list[bytes] = []
    for index in range(count):
        row = first + index
        key, value, pairs = keys[row], values[row], headers[row]
        delta = stamps[index] - base_ts
        offset_delta = offsets[row] - base_offset  # gaps kept (a compacted read)
        parts: list[bytes | bytearray | memoryview] = [
            b"\x00",  # attributes
            varints[delta] if 0 <= delta < cached else varint(delta),
            varints[offset_delta] if offset_delta < cached else varint(offset_delta),
        ]
        if key is None:
            parts.append(NULL_LENGTH)
        else:
            size = len(key)
            parts += (varints[size] if size < cached else varint(size), key)
        if value is None:
            parts.append(NULL_LENGTH)
        else:
            size = len(value)
            parts += (varints[size] if size < cached else varint(size), value)
        parts.append(_encoded_headers(pairs) if pairs else b"\x00")
        body = b"".join(parts)
        size = len(body)
        encoded.append((varints[size] if size < cached else varint(size)) + body)
    log_append = batch.timestamp_types[first] == TIMESTAMP_LOG_APPEND_TIME
    built = build_batch(encoded, base_ts, max(stamps), log_append)
    last_delta = offsets[first + count - 1] - base_offset
    if last_delta != count - 1:  # offsets with gaps: the header says so, CRC again
        _LAST_DELTA.pack_into(built, LAST_DELTA_POSITION, last_delta)
        _CRC.pack_into(built, CRC_POSITION, crc32c(memoryview(built)[ATTRIBUTES_POSITION:]))
    set_base_offset(built, base_offset)
    return built


def _encoded_headers(pairs: Sequence[tuple[str, bytes]]) -> bytes:
    """A record's header count and headers (names UTF-8)."""
    parts = [zigzag_varint(len(pairs))]
    for name, value in pairs:
        raw = name.encode("utf-8")
        parts += (zigzag_varint(len(raw)), raw, zigzag_varint(len(value)), bytes(value))
    return b"".join(parts)


#: Zig-zag varints of 0 .. 16,383, the values most fields of a record take.
_VARINTS: Final = [zigzag_varint(value) for value in range(1 << 14)]
NULL_LENGTH: Final = zigzag_varint(-1)
_LAST_DELTA: Final = struct.Struct(">i")
LAST_DELTA_POSITION: Final = ATTRIBUTES_POSITION + 2  # after the attributes (int16)
_CRC: Final = struct.Struct(">I")


assert struct.calcsize(">q") + 4 == LOG_OVERHEAD  # base_offset and length precede the rest
