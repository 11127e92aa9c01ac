"""Fetch on the CommitLog engine: one Kafka record batch v2 from a read's columns.

A Fetch reads a partition as columns (``MessageStore.get_batch``, a
``mqstore.batch.MessageBatch``: records verified by XXH64, gathered in C) and turns a
run of rows into ONE uncompressed batch v2 (layout: mqstore.segmented.record_batch)
in one call, with no Python object per record:

- ``kafka_batch`` is ``commitlog._native.kafka_batch`` (mqstore/broker/_kafka_codec.c)
  when the C module is built, else ``kafka_batch_py``, its pure-Python twin (also
  under ``MQSTORE_PURE_PYTHON=1``). Both take the same 17 arguments and return
  ``(batch, taken)``: the batch (a bytearray, CRC field 0) of the leading ``taken``
  rows that fit the byte budget, or ``(None, 0)``. Their contract is the C file's
  comment; tests/mqstore/broker/test_fetch_batch.py holds them to it, byte for byte.
- ``build_batch`` feeds them a MessageBatch's columns and sets the CRC-32C (the
  ``crc32c`` package, hardware-accelerated: one call per batch).

A record's fields: offset delta = its queue offset - the first's (a compacted queue
has gaps, which the deltas keep), timestamp = CreateTime (born) or LogAppendTime
(store) per the topic, key = the ``KEY_PROPERTY`` property (mqstore.commitlog_engine),
headers = the other properties in stored order, value = the body (null for a
tombstone). Bad columns (offsets out of order or out of their data, properties that do
not parse) are a ValueError from both, never a read outside the buffers.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import numpy as np
from crc32c import crc32c

from mqstore.batch import KEY_NAME, MessageBatch
from mqstore.commitlog.native import NATIVE
from mqstore.segmented.record_batch import (
    ATTRIBUTES_POSITION,
    COVERED,
    CRC_POSITION,
    HEADER_SIZE,
    LEADER_EPOCH,
    LOG_OVERHEAD,
    MAGIC,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    PREFIX,
    TIMESTAMP_TYPE_MASK,
    zigzag_varint,
)

__all__ = ["build_batch", "kafka_batch", "kafka_batch_py"]

INT32_MAX: Final = 2**31 - 1
RECORD_SIZE_MIN: Final = 7  # length, attributes, 2 deltas, key, value, header count
_CRC: Final = struct.Struct(">I")
_PROPERTY_NAME: Final = struct.Struct("<H")  # a property: u16 name length, name,
_PROPERTY_VALUE: Final = struct.Struct("<I")  # u32 value length, value


def _headers(section: bytes, key_name: bytes) -> list[tuple[bytes, bytes]]:
    """The pairs of a properties section but the first named ``key_name``.

    Raises:
        ValueError: the section does not parse.
    """
    pairs: list[tuple[bytes, bytes]] = []
    skipped = False
    at, end = 0, len(section)
    while at < end:
        if end - at < 2:
            raise ValueError("kafka_batch: malformed properties")
        (name_len,) = _PROPERTY_NAME.unpack_from(section, at)
        at += 2
        if end - at < name_len + 4:
            raise ValueError("kafka_batch: malformed properties")
        name = section[at : at + name_len]
        (size,) = _PROPERTY_VALUE.unpack_from(section, at + name_len)
        at += name_len + 4
        if end - at < size:
            raise ValueError("kafka_batch: malformed properties")
        value = section[at : at + size]
        at += size
        if not skipped and name == key_name:
            skipped = True
            continue
        pairs.append((name, value))
    return pairs


def _span(offsets: Any, row: int, data_len: int) -> tuple[int, int]:
    start, stop = int(offsets[row]), int(offsets[row + 1])
    if start < 0 or stop < start or stop > data_len:
        raise ValueError("kafka_batch: offsets must be non-decreasing and inside their data")
    return start, stop


def _record(
    delta: int, stamp_delta: int, key: bytes | None, value: bytes | None, headers: list[Any]
) -> bytes:
    """One record of a batch v2, its length varint first."""
    parts = [b"\x00", zigzag_varint(stamp_delta), zigzag_varint(delta)]
    for field in (key, value):
        parts += (zigzag_varint(-1),) if field is None else (zigzag_varint(len(field)), field)
    parts.append(zigzag_varint(len(headers)))
    for name, data in headers:
        parts += (zigzag_varint(len(name)), name, zigzag_varint(len(data)), data)
    body = b"".join(parts)
    if len(body) > INT32_MAX:
        raise ValueError("kafka_batch: a record past 2**31 - 1 bytes")
    return zigzag_varint(len(body)) + body


def _wrap64(value: int) -> int:
    """``value`` as a two's-complement int64 (the C's wrapped timestamp delta)."""
    return (value + 2**63) % 2**64 - 2**63


def kafka_batch_py(
    first: int, count: int, budget: int, must_take_one: bool, log_append: bool,
    offsets: Any, stamps: Any, bodies: bytes, body_offsets: Any, body_valid: Any,
    keys: bytes, key_offsets: Any, key_valid: Any, extras: bytes, props_starts: Any,
    extra_offsets: Any, key_name: bytes,
) -> tuple[bytearray | None, int]:  # fmt: skip
    """The pure-Python twin of the C ``kafka_batch`` (contract: _kafka_codec.c)."""
    n = len(offsets)
    if (len(stamps), len(props_starts)) != (n, n) or len(key_valid) < n or (
        len(body_offsets), len(key_offsets), len(extra_offsets)) != (n + 1,) * 3 or (
        body_valid is not None and len(body_valid) < n
    ):  # fmt: skip
        raise ValueError("kafka_batch: columns of n rows (offsets n + 1, valid n)")
    if first < 0 or count < 1 or first > n or count > n - first or budget < 0:
        raise ValueError(
            "kafka_batch: need 0 <= first, 1 <= count, first + count <= n, budget >= 0"
        )
    base, base_stamp = int(offsets[first]), int(stamps[first])
    records: list[bytes] = []
    total, previous = HEADER_SIZE, -1
    room = (budget - HEADER_SIZE) // RECORD_SIZE_MIN if budget > HEADER_SIZE else 0
    for row in range(first, first + min(count, room + 1)):
        delta = int(offsets[row]) - base
        if not 0 <= delta <= INT32_MAX:
            raise ValueError("kafka_batch: offsets must increase from the first, by < 2**31")
        value_at, value_end = _span(body_offsets, row, len(bodies))
        key_at, key_end = _span(key_offsets, row, len(keys))
        props_at, props_end = int(props_starts[row]), int(extra_offsets[row + 1])
        if props_at < 0 or props_end < props_at or props_end > len(extras):
            raise ValueError("kafka_batch: a properties section lies outside extras")
        headers = _headers(bytes(extras[props_at:props_end]), key_name)
        null_value = body_valid is not None and not body_valid[row]
        value = None if null_value else bodies[value_at:value_end]
        key = keys[key_at:key_end] if key_valid[row] else None
        record = _record(delta, _wrap64(int(stamps[row]) - base_stamp), key, value, headers)
        if len(record) > budget - total or total + len(record) - LOG_OVERHEAD > INT32_MAX:
            if not records and must_take_one and total + len(record) - LOG_OVERHEAD <= INT32_MAX:
                records.append(record)
                total += len(record)
            break
        if records and delta <= previous:
            raise ValueError("kafka_batch: offsets must increase from the first, by < 2**31")
        previous = delta
        records.append(record)
        total += len(record)
    if not records:
        return None, 0
    taken = len(records)
    max_stamp = max(int(stamp) for stamp in stamps[first : first + taken])
    last_delta = int(offsets[first + taken - 1]) - base
    attributes = TIMESTAMP_TYPE_MASK if log_append else 0
    batch = bytearray(PREFIX.pack(base, total - LOG_OVERHEAD, LEADER_EPOCH, MAGIC, 0))
    batch += COVERED.pack(
        attributes, last_delta, base_stamp, max_stamp, NO_PRODUCER_ID, NO_PRODUCER_EPOCH,
        NO_SEQUENCE, taken,
    )  # fmt: skip
    for record in records:
        batch += record
    return batch, taken


kafka_batch: Any = kafka_batch_py if NATIVE is None else NATIVE.kafka_batch


def build_batch(
    batch: MessageBatch, first: int, budget: int, *, must_take_one: bool, log_append: bool
) -> tuple[bytearray | None, int]:
    """The leading rows of ``batch`` from ``first`` that fit ``budget`` bytes as one
    batch v2 with its CRC-32C set, and how many rows it holds; ``(None, 0)`` when none
    fits and ``must_take_one`` is false (KIP-74: the first record of a Fetch goes
    even when larger than its budget).

    Raises:
        ValueError: the columns are not a MessageBatch's (see the module docstring).
    """
    assert 0 <= first < len(batch)
    stamps = batch.store_timestamps_ms if log_append else batch.born_timestamps_ms
    extra_offsets = batch.extra_offsets
    props_starts = extra_offsets[:-1] + batch.tag_lengths + batch.keys_lengths
    built, taken = kafka_batch(
        first, len(batch) - first, budget, must_take_one, log_append, batch.queue_offsets,
        stamps, batch.body_data, batch.body_offsets, batch.body_valid.view(np.uint8),
        batch.kafka_key_data, batch.kafka_key_offsets, batch.kafka_key_valid.view(np.uint8),
        batch.extra_data, props_starts, extra_offsets, KEY_NAME,
    )  # fmt: skip
    if built is None:
        return None, 0
    assert 1 <= taken <= len(batch) - first
    _CRC.pack_into(built, CRC_POSITION, crc32c(memoryview(built)[ATTRIBUTES_POSITION:]))
    return built, int(taken)
