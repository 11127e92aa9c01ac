"""A producer's record batch v2 as a broker receives it: check, number, stamp.

The batch layout is declared once, in mqstore/segmented/record_batch.py (61-byte
header, big-endian); this module reads it with those structs. What a broker must do
with a batch on Produce, whichever way it is stored (docs/BROKER.md):

1. check it (``check_produced``): it lies whole inside the request, magic 2, CRC-32C
   over attributes..end matches, records_count == last_offset_delta + 1 (a producer
   numbers its records 0..n-1), a known codec, not a control batch. Kafka's
   LogValidator does the same and answers CORRUPT_MESSAGE (2) or INVALID_RECORD (87);
2. give it its base offset under the partition's append lock (``set_base_offset``):
   the CRC leaves base_offset out, so this costs 8 bytes and no CRC;
3. on a LogAppendTime topic, set attribute bit 3 and max_timestamp to the append time
   (``stamp_log_append_time``): both are under the CRC, so it is recomputed (Kafka's
   ``setMaxTimestamp`` does the same).

Errors: bytes from the network are the world's input, so every check raises
``InvalidBatchError`` (an InvalidArgumentError) with the Kafka error code to answer;
nothing here asserts on them.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from crc32c import crc32c

# The broker's own (mqstore/broker/batch.py), which grew out of this prototype.
from mqstore.broker.batch import CODEC_NAMES, CORRUPT_MESSAGE, INVALID_RECORD, InvalidBatchError
from mqstore.segmented.record_batch import (
    ATTRIBUTES_POSITION,
    BASE_OFFSET,
    COMPRESSION_MASK,
    CONTROL_MASK,
    CRC_POSITION,
    HEADER,
    HEADER_SIZE,
    LENGTH,
    LENGTH_POSITION,
    LOG_OVERHEAD,
    MAGIC,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
)

__all__ = [
    "CODEC_NAMES",
    "CORRUPT_MESSAGE",
    "INVALID_RECORD",
    "InvalidBatchError",
    "ProducedBatch",
    "check_produced",
    "set_base_offset",
    "split_batches",
    "stamp_log_append_time",
]

BATCHES_PER_PARTITION_MAX: Final = 1  # Kafka accepts exactly one v2 batch per partition
MAX_TIMESTAMP_POSITION: Final = 35  # attributes(21) + 2 + last_offset_delta 4 + base ts 8
_CRC: Final = struct.Struct(">I")  # the CRC-32C field, unsigned
_ATTRIBUTES: Final = struct.Struct(">h")
_TIMESTAMP: Final = struct.Struct(">q")
assert MAX_TIMESTAMP_POSITION == ATTRIBUTES_POSITION + 2 + 4 + 8


class ProducedBatch(NamedTuple):
    """The header fields a broker acts on, by name (positions relative to the buffer)."""

    position: int
    size: int
    attributes: int
    records_count: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int

    @property
    def codec(self) -> str:
        return CODEC_NAMES[self.attributes & COMPRESSION_MASK]

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)


def check_produced(buffer: bytes | bytearray | memoryview, position: int = 0) -> ProducedBatch:
    """Check the batch at ``position`` as a broker must before storing it.

    Raises:
        InvalidBatchError: cut short, bad magic or size, CRC-32C mismatch, a count
            that does not match its offset deltas, an unknown codec, or a control
            batch (only a transaction coordinator writes those).
    """
    view = memoryview(buffer)
    if len(view) - position < HEADER_SIZE:
        raise InvalidBatchError(f"batch at {position} is shorter than its 61-byte header")
    (length,) = LENGTH.unpack_from(view, position + LENGTH_POSITION)
    size = length + LOG_OVERHEAD
    if size < HEADER_SIZE or size > len(view) - position:
        raise InvalidBatchError(f"batch at {position} claims {size} bytes")
    (_, _, _, magic, crc, attributes, last_delta, base_ts, max_ts, producer_id, epoch,
     base_sequence, count) = HEADER.unpack_from(view, position)  # fmt: skip
    if magic != MAGIC:
        raise InvalidBatchError(f"magic {magic}: only record batch v2 is served")
    actual = crc32c(view[position + ATTRIBUTES_POSITION : position + size])
    if actual != crc:
        raise InvalidBatchError(f"CRC-32C {actual:#010x} does not match {crc:#010x}")
    if count < 1 or count != last_delta + 1:
        raise InvalidBatchError(
            f"records_count {count} does not match last_offset_delta {last_delta}",
            INVALID_RECORD,
        )
    if attributes & COMPRESSION_MASK >= len(CODEC_NAMES):
        raise InvalidBatchError(f"unknown codec {attributes & COMPRESSION_MASK}", INVALID_RECORD)
    if attributes & CONTROL_MASK:
        raise InvalidBatchError("a producer may not send a control batch", INVALID_RECORD)
    return ProducedBatch(
        position, size, attributes, count, base_ts, max_ts, producer_id, epoch, base_sequence
    )


def split_batches(records: bytes | bytearray | memoryview) -> list[ProducedBatch]:
    """Check the ``records`` field of one partition of a ProduceRequest.

    Raises:
        InvalidBatchError: a batch fails ``check_produced``, bytes are left over, or
            there is not exactly one batch (Kafka's rule for magic 2).
    """
    batches: list[ProducedBatch] = []
    position = 0
    total = len(memoryview(records))
    while position < total:
        if len(batches) == BATCHES_PER_PARTITION_MAX:
            raise InvalidBatchError("more than one record batch for a partition", INVALID_RECORD)
        batch = check_produced(records, position)
        batches.append(batch)
        position += batch.size
    if not batches:
        raise InvalidBatchError("no record batch for a partition", INVALID_RECORD)
    return batches


def set_base_offset(batch: bytearray | memoryview, base_offset: int) -> None:
    """Write the base offset in place; the CRC does not cover it."""
    BASE_OFFSET.pack_into(batch, 0, base_offset)


def stamp_log_append_time(batch: bytearray | memoryview, now_ms: int) -> None:
    """Mark a batch LogAppendTime with ``now_ms`` and recompute its CRC-32C."""
    view = memoryview(batch)
    (attributes,) = _ATTRIBUTES.unpack_from(view, ATTRIBUTES_POSITION)
    _ATTRIBUTES.pack_into(view, ATTRIBUTES_POSITION, attributes | TIMESTAMP_TYPE_MASK)
    _TIMESTAMP.pack_into(view, MAX_TIMESTAMP_POSITION, now_ms)
    _CRC.pack_into(view, CRC_POSITION, crc32c(view[ATTRIBUTES_POSITION:]))
