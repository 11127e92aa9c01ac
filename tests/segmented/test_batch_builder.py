"""From ProducerRecords to one batch: timestamps, sizes, validation."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import InvalidArgumentError, InvalidTypeError, LimitExceededError
from mqstore.engine import ProducerRecord
from mqstore.segmented.batch_builder import RECORDS_PER_BATCH_MAX, adopt, build
from mqstore.segmented.record_batch import (
    ATTRIBUTES_POSITION,
    CRC_POSITION,
    HEADER_SIZE,
    MalformedBatchError,
    check_batch,
    decode_records,
    zigzag_varint,
)

from .strategies import producer_records


def _decode(built):
    header = check_batch(bytes(built.batch), 0)
    return header, decode_records(bytes(built.batch), 0, header, 0, built.record_count)


def test_create_time_takes_the_record_timestamp_or_now():
    built = build(
        [ProducerRecord(None, b"a", [], 50), ProducerRecord(None, b"b", [], None)],
        70,
        False,
        1 << 20,
    )
    header, records = _decode(built)
    assert [r.timestamp_ms for r in records] == [50, 70]
    assert header.base_timestamp == 50 and header.max_timestamp == built.max_timestamp_ms == 70
    assert [s[0] for s in built.sizes] == [50, 70]


def test_log_append_time_reports_the_append_time_for_every_record():
    built = build(
        [ProducerRecord(None, b"a", [], 50), ProducerRecord(None, b"b", [], 90)], 70, True, 1 << 20
    )
    header, records = _decode(built)
    assert header.timestamp_type == 1 and header.max_timestamp == 70
    assert [r.timestamp_ms for r in records] == [70, 70]
    assert [s[0] for s in built.sizes] == [70, 70]


def test_serialized_sizes_follow_kafka_python():
    built = build(
        [
            ProducerRecord(b"key", bytearray(b"value"), [("é", b"12")], 1),
            ProducerRecord(None, None, (), 1),
        ],
        0,
        False,
        1 << 20,
    )
    assert built.sizes == [(1, 3, 5, 4), (1, -1, -1, -1)]  # "é" is 2 bytes of UTF-8


def test_size_limit_counts_the_whole_batch():
    record = ProducerRecord(None, b"x" * 100, [], 1)
    size = len(build([record], 0, False, 1 << 20).batch)
    assert len(build([record], 0, False, size).batch) == size
    with pytest.raises(LimitExceededError):
        build([record], 0, False, size - 1)


@pytest.mark.parametrize(
    ("records", "error"),
    [
        ([], InvalidArgumentError),
        ("abc", InvalidTypeError),
        (b"abc", InvalidTypeError),
        ([object()], InvalidTypeError),
        ([ProducerRecord(None, b"v", [], True)], InvalidTypeError),
        ([ProducerRecord(None, b"v", [], 2**63)], InvalidArgumentError),
        ([ProducerRecord(None, b"v", "h", None)], InvalidTypeError),
        ([ProducerRecord(None, b"v", [("k",)], None)], InvalidTypeError),
        ([ProducerRecord(None, b"v", [("k", None)], None)], InvalidTypeError),
        ([ProducerRecord(None, b"v", [("\udcff", b"")], None)], InvalidArgumentError),
    ],
)
def test_bad_records_are_refused(records, error):
    with pytest.raises(error):
        build(records, 0, False, 1 << 20)


def test_record_count_is_bounded():
    records = [ProducerRecord(None, None, [], 1)] * (RECORDS_PER_BATCH_MAX + 1)
    with pytest.raises(LimitExceededError):
        build(records, 0, False, 1 << 40)


def _recrc(data: bytearray) -> bytes:
    """``data`` with its CRC-32C set again (a damaged record the CRC does not catch:
    what a buggy producer sends)."""
    struct.pack_into(">I", data, CRC_POSITION, crc32c(bytes(data[ATTRIBUTES_POSITION:])))
    return bytes(data)


@settings(max_examples=300)
@given(
    records=st.lists(producer_records, min_size=1, max_size=5),
    position=st.integers(min_value=0, max_value=10_000),
    value=st.integers(0, 255),
)
def test_adopt_takes_only_what_the_full_decode_reads_back(records, position, value):
    """A byte of the records rewritten, CRC and all: a batch adopt accepts (records
    walked in C, decoded in full only with headers) is one the readers' full decode
    reads back whole, with the max timestamp adopt set."""
    data = bytearray(build(records, 7, False, 1 << 30).batch)
    data[HEADER_SIZE + position % (len(data) - HEADER_SIZE)] = value
    raw = _recrc(data)
    try:
        adopted = adopt(raw, 9, False, 1 << 30)
    except InvalidArgumentError:
        return
    header = check_batch(bytes(adopted.batch), 0)
    decoded = decode_records(bytes(adopted.batch), 0, header, 0, len(records))
    assert len(decoded) == len(records)
    assert header.max_timestamp == adopted.max_timestamp_ms == max(r.timestamp_ms for r in decoded)
    assert [len(r.key) if r.key is not None else -1 for r in decoded] == list(adopted.key_sizes)


def test_adopt_refuses_a_header_key_that_is_not_utf8():
    data = bytearray(build([ProducerRecord(b"k", b"v", [("h", b"x")], 5)], 7, False, 99).batch)
    at = bytes(data).rindex(b"h")  # the header key (the value is "x", after it)
    data[at] = 0xFF  # the header key "h" becomes a lone 0xff byte
    with pytest.raises(InvalidArgumentError, match="not a valid record batch"):
        adopt(_recrc(data), 9, False, 1 << 30)


def test_adopt_refuses_a_negative_record_timestamp():
    data = bytearray(build([ProducerRecord(None, b"v", [], 0)], 7, False, 99).batch)
    struct.pack_into(">q", data, 27, -5)  # the base timestamp: record 0 at -5
    with pytest.raises(InvalidArgumentError, match="negative"):
        adopt(_recrc(data), 9, False, 1 << 30)


_PAST_64_BITS = b"\x80" * 9 + b"\x02"  # a 10-byte varint whose bit 64 is set


@pytest.mark.parametrize("field", ["timestamp delta", "offset delta"])
def test_a_varint_past_64_bits_is_refused_by_adopt_and_the_reader(field):
    """A 10-byte varint with bits past the 64th: the C walk used to drop them (offset
    delta 0, accepted) where the reader keeps them (2**63, refused), so an accepted
    batch could not be read back. Both refuse it now."""
    stamp, delta = (
        (_PAST_64_BITS, b"\x00") if field == "timestamp delta" else (b"\x00", _PAST_64_BITS)
    )
    body = b"\x00" + stamp + delta + b"\x01" + b"\x02v" + b"\x00"  # no key, value "v"
    valid = build([ProducerRecord(None, b"v", [], 5)], 7, False, 99).batch
    data = bytearray(valid[:HEADER_SIZE]) + zigzag_varint(len(body)) + body
    struct.pack_into(">i", data, 8, len(data) - 12)  # the batch length field
    raw = _recrc(data)
    with pytest.raises(InvalidArgumentError, match="not a valid record batch"):
        adopt(raw, 9, False, 1 << 30)
    with pytest.raises(MalformedBatchError):
        decode_records(raw, 0, check_batch(raw, 0), 0, 1)


def test_a_producers_log_append_time_bit_without_a_max_timestamp_reads_as_create_time():
    """The reader takes a batch's max timestamp for its records only when it is set
    (>= 0); adopt judges the timestamps the reader would report, so this batch passes,
    and is stored with the CreateTime topic's timestamp type."""
    data = bytearray(build([ProducerRecord(None, b"v", [], 40)], 7, False, 99).batch)
    struct.pack_into(">h", data, ATTRIBUTES_POSITION, 0x08)  # LogAppendTime, no codec
    struct.pack_into(">q", data, 35, -1)  # max timestamp unset
    adopted = adopt(_recrc(data), 9, False, 1 << 30)
    assert adopted.max_timestamp_ms == 40
    header = check_batch(bytes(adopted.batch), 0)
    assert not header.attributes & 0x08  # the CreateTime topic's type, as Kafka writes it
    assert [r.timestamp_ms for r in decode_records(bytes(adopted.batch), 0, header, 0, 1)] == [40]
