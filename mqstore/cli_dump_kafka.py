"""``mqstore dump`` and ``verify`` for the segmented engine's files: Kafka record batches
v2 in the .log, and the .index and .timeindex entries.
"""

from __future__ import annotations

import importlib
import os
import struct
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple

from mqstore.cli_files import Line, mapped, read_bytes

# ---------------------------------------------------------------- Kafka record batch v2
#
# The segmented engine's .log holds Kafka record batches v2, declared here from
# Kafka's documented layout rather than imported, so dump reads files whatever state
# the engine's code is in. Big-endian; a 61-byte header, then the records.
BATCH_HEADER: Final = struct.Struct(
    ">"
    "q"  # base_offset: offset of the first record
    "i"  # length: bytes after this field
    "i"  # partition_leader_epoch
    "b"  # magic: 2
    "I"  # crc: CRC-32C of bytes [21, end of batch)
    "h"  # attributes: bits 0-2 compression, bit 3 LogAppendTime, 4 transactional, 5 control
    "i"  # last_offset_delta
    "q"  # base_timestamp
    "q"  # max_timestamp
    "q"  # producer_id
    "h"  # producer_epoch
    "i"  # base_sequence
    "i"  # records_count
)
assert BATCH_HEADER.size == 61
LOG_OVERHEAD: Final = struct.Struct(">qi")  # base_offset, length: what length leaves out
assert LOG_OVERHEAD.size == 12
CRC_FROM: Final = 21  # the CRC covers the batch from the attributes on
BATCH_MAGIC: Final = 2
COMPRESSION_MASK: Final = 0x07
LOG_APPEND_TIME_MASK: Final = 0x08
TRANSACTIONAL_MASK: Final = 0x10
CONTROL_MASK: Final = 0x20
VARINT_BYTES_MAX: Final = 10  # a zig-zag int64 takes at most 10 bytes
OFFSET_ENTRY: Final = struct.Struct(">ii")  # .index: relative offset, position in the .log
TIME_ENTRY: Final = struct.Struct(">qi")  # .timeindex: timestamp ms, relative offset
assert OFFSET_ENTRY.size == 8
assert TIME_ENTRY.size == 12
_CRC32C_POLY_REVERSED: Final = 0x82F63B78  # Castagnoli


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC32C_POLY_REVERSED if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE: Final = _crc32c_table()


def _crc32c_python(data: bytes | memoryview) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _load_crc32c() -> Callable[[bytes | memoryview], int]:
    """The C implementation when the ``crc32c`` package is there (the segmented
    engine needs it), else the table one (slow, but dump and verify still work)."""
    try:
        fast: Callable[[bytes | memoryview], int] = importlib.import_module("crc32c").crc32c
    except ImportError:
        return _crc32c_python
    return fast


crc32c: Final = _load_crc32c()
assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C


class Batch(NamedTuple):
    position: int
    size: int
    header: tuple[int, ...]  # BATCH_HEADER fields, or () when cut off
    reason: str  # "" when the batch verifies


def walk_batches(buffer: Any) -> Iterator[Batch]:
    """Every record batch of a .log, CRC checked, up to zeros or the end of the file."""
    limit = len(buffer)
    position = 0
    while position + LOG_OVERHEAD.size <= limit:
        base_offset, length = LOG_OVERHEAD.unpack_from(buffer, position)
        if base_offset == 0 and length == 0:
            return  # zeros: a preallocated tail
        size = LOG_OVERHEAD.size + length
        if size < BATCH_HEADER.size or position + size > limit:
            yield Batch(position, 0, (), f"batch length {length} runs past the end of the file")
            return
        assert size >= BATCH_HEADER.size  # checked just above: the walk always advances
        header = BATCH_HEADER.unpack_from(buffer, position)
        reason = ""
        if header[3] != BATCH_MAGIC:
            reason = f"magic {header[3]} is not 2"
        elif crc32c(memoryview(buffer)[position + CRC_FROM : position + size]) != header[4]:
            reason = "CRC-32C mismatch"
        yield Batch(position, size, header, reason)
        position += size
    if position < limit:
        yield Batch(position, 0, (), f"{limit - position} trailing bytes, less than a batch")


def _varint(buffer: Any, position: int) -> tuple[int, int]:
    """A zig-zag varint at ``position``: (value, position after it)."""
    result = shift = 0
    for count in range(VARINT_BYTES_MAX):
        byte = buffer[position + count]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position + count + 1
        shift += 7
    raise ValueError(f"varint longer than {VARINT_BYTES_MAX} bytes")


def _sized(buffer: Any, position: int, end: int) -> tuple[bytes | None, int]:
    length, position = _varint(buffer, position)
    if length < 0:
        return None, position
    if position + length > end:
        raise ValueError("a field runs past its record")
    return bytes(buffer[position : position + length]), position + length


def _batch_records(buffer: Any, batch: Batch, print_data: bool) -> Iterator[Line]:
    base_offset, base_timestamp, count = batch.header[0], batch.header[7], batch.header[12]
    stamp_name = "LogAppendTime" if batch.header[5] & LOG_APPEND_TIME_MASK else "CreateTime"
    position = batch.position + BATCH_HEADER.size
    batch_end = batch.position + batch.size
    for _ in range(count):
        record_position = position
        length, position = _varint(buffer, position)
        end = position + length
        if length < 0 or end > batch_end:
            raise ValueError(f"record of {length} bytes at {record_position} runs past the batch")
        position += 1  # attributes, unused
        timestamp_delta, position = _varint(buffer, position)
        offset_delta, position = _varint(buffer, position)
        key, position = _sized(buffer, position, end)
        value, position = _sized(buffer, position, end)
        header_count, position = _varint(buffer, position)
        headers = []
        for _ in range(header_count):
            name, position = _sized(buffer, position, end)
            data, position = _sized(buffer, position, end)
            headers.append({"key": name, "value": data})
        if position != end:
            raise ValueError(f"record at {record_position}: {end - position} bytes left over")
        line: Line = {
            "offset": base_offset + offset_delta,
            "position": record_position,
            stamp_name: base_timestamp + timestamp_delta,
            "keySize": -1 if key is None else len(key),
            "valueSize": -1 if value is None else len(value),
            "headerKeys": [header["key"] for header in headers],
        }
        if print_data:
            line.update(key=key, payload=value, headers=headers)
        yield line
    if position != batch_end:
        raise ValueError(f"{batch_end - position} bytes after the last record of the batch")


def dump_batches(path: str, print_data: bool) -> Iterator[Line]:
    with mapped(path) as buffer:
        for batch in walk_batches(buffer):
            if not batch.header:
                yield {"position": batch.position, "corrupt": batch.reason}
                return
            h = batch.header
            line: Line = {
                "baseOffset": h[0],
                "lastOffset": h[0] + h[6],
                "count": h[12],
                "position": batch.position,
                "size": batch.size,
                "magic": h[3],
                "CreateTime" if not h[5] & LOG_APPEND_TIME_MASK else "LogAppendTime": h[8],
                "compresscodec": h[5] & COMPRESSION_MASK,
                "isTransactional": bool(h[5] & TRANSACTIONAL_MASK),
                "isControl": bool(h[5] & CONTROL_MASK),
                "producerId": h[9],
                "partitionLeaderEpoch": h[2],
                "crc": h[4],
                "isvalid": not batch.reason,
            }
            if batch.reason:
                line["corrupt"] = batch.reason
            yield line
            if batch.reason or h[5] & COMPRESSION_MASK:
                continue  # a bad CRC or compressed records: records are not decoded
            try:
                for record in _batch_records(buffer, batch, print_data):
                    yield {"in_batch": h[0], **record}
            except (ValueError, IndexError) as error:
                yield {"position": batch.position, "corrupt": f"records do not decode: {error}"}


def _dump_entries(path: str, entry: struct.Struct, render: Callable[..., Line]) -> Iterator[Line]:
    base_offset = _base_offset(path)
    data = read_bytes(path, 0, os.path.getsize(path))
    entries = len(data) // entry.size
    for number in range(entries):
        fields = entry.unpack_from(data, number * entry.size)
        if not any(fields):
            yield {"entries": number, "position": number * entry.size, "end": "zeros"}
            return
        yield {"position": number * entry.size, **render(base_offset, *fields)}
    if len(data) % entry.size:
        yield {"position": entries * entry.size, "corrupt": "a partial entry at the end"}


def _base_offset(path: str) -> int:
    stem = os.path.basename(path).split(".", 1)[0]
    return int(stem) if stem.isdigit() else 0


def dump_offset_index(path: str, print_data: bool) -> Iterator[Line]:
    yield from _dump_entries(
        path, OFFSET_ENTRY, lambda base, relative, where: {"offset": base + relative, "pos": where}
    )


def dump_time_index(path: str, print_data: bool) -> Iterator[Line]:
    yield from _dump_entries(
        path,
        TIME_ENTRY,
        lambda base, stamp, relative: {"timestamp": stamp, "offset": base + relative},
    )
