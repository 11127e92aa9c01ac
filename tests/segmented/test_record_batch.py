"""The record batch v2 codec: round trips, kafka-python's reader, corruption."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords
from kafka.record.util import decode_varint, encode_varint

from mqstore.engine import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME
from mqstore.segmented import batch_builder
from mqstore.segmented.record_batch import (
    HEADER,
    HEADER_SIZE,
    MalformedBatchError,
    build_batch,
    check_batch,
    decode_batches,
    decode_records,
    encode_record,
    read_varint,
    set_base_offset,
    zigzag_varint,
)

from .strategies import producer_records


def _batch(records, base_offset=0, now_ms=5_000, log_append_time=False) -> bytearray:
    built = batch_builder.build(records, now_ms, log_append_time, 1 << 30)
    set_base_offset(built.batch, base_offset)
    return built.batch


def _kafka_records(data: bytes) -> list:
    """Every record kafka-python's own reader finds in ``data``, CRCs validated."""
    found = []
    batches = MemoryRecords(bytes(data))
    while (batch := batches.next_batch()) is not None:
        assert batch.validate_crc()
        assert batch.magic == 2
        found += [(batch, r) for r in batch]
    return found


@settings(deadline=None)
@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_zigzag_varint_round_trips_and_matches_kafka_python(value):
    encoded = zigzag_varint(value)
    assert read_varint(encoded, 0) == (value, len(encoded))
    out = bytearray()
    encode_varint(value, out.append)
    assert bytes(out) == encoded
    assert decode_varint(encoded, 0) == (value, len(encoded))


def test_varint_longer_than_ten_bytes_is_malformed():
    with pytest.raises(MalformedBatchError):
        read_varint(b"\xff" * 11, 0)


@settings(max_examples=150, deadline=None)
@given(
    records=st.lists(producer_records, min_size=1, max_size=8),
    base_offset=st.integers(min_value=0, max_value=2**62),
    log_append_time=st.booleans(),
    first=st.integers(min_value=0, max_value=8),
)
def test_batch_round_trips_through_our_decoder_and_kafka_python(
    records, base_offset, log_append_time, first
):
    now_ms = 1_700_000_000_000
    data = _batch(records, base_offset, now_ms, log_append_time)
    header = check_batch(bytes(data), 0)
    assert header.base_offset == base_offset
    assert header.records_count == len(records)
    assert header.size == len(data)
    expected_ts = [now_ms if r.timestamp_ms is None else r.timestamp_ms for r in records]
    if log_append_time:
        expected_ts = [now_ms] * len(records)
    assert header.max_timestamp == max(expected_ts)

    decoded = decode_records(bytes(data), 0, header, base_offset, len(records))
    kafka = _kafka_records(data)
    assert len(decoded) == len(kafka) == len(records)
    for i, (mine, (kbatch, theirs), sent) in enumerate(zip(decoded, kafka, records, strict=True)):
        headers = [(k, v) for k, v in sent.headers]
        assert mine.offset == theirs.offset == base_offset + i
        assert mine.timestamp_ms == theirs.timestamp == expected_ts[i]
        assert mine.timestamp_type == theirs.timestamp_type == kbatch.timestamp_type
        assert mine.timestamp_type == (
            TIMESTAMP_LOG_APPEND_TIME if log_append_time else TIMESTAMP_CREATE_TIME
        )
        assert mine.key == theirs.key == sent.key
        assert mine.value == theirs.value == sent.value
        assert mine.headers == theirs.headers == headers
        assert mine.checksum == header.crc
        assert mine.serialized_key_size == (-1 if sent.key is None else len(sent.key))
        assert mine.serialized_value_size == (-1 if sent.value is None else len(sent.value))

    # From inside the batch, and through the fused reader, the same records.
    start = base_offset + min(first, len(records))
    tail = decode_records(bytes(data), 0, header, start, len(records))
    assert tail == decoded[min(first, len(records)) :]
    fused = decode_batches(bytes(data), 0, start, 1000, 1 << 30)
    assert fused.records == tail


def test_fused_reader_steps_over_earlier_batches_and_waits_for_whole_ones():
    data = b"".join(
        bytes(_batch([batch_builder_record(i)], base_offset=i)) for i in range(5)
    )  # five one-record batches, offsets 0..4
    sizes = [check_batch(data, 0).size] * 5
    got = decode_batches(data, 0, 3, 10, 1 << 30)
    assert [r.offset for r in got.records] == [3, 4]
    assert got.advance_bytes == len(data)
    assert got.decoded_bytes == 2 * sizes[0]
    assert got.needed_bytes == HEADER_SIZE  # at the end: wants at least a header

    cut = data[: 3 * sizes[0] + 70]  # the fourth batch (75 bytes) is cut short
    got = decode_batches(cut, 0, 0, 10, 1 << 30)
    assert [r.offset for r in got.records] == [0, 1, 2]
    assert got.needed_bytes == sizes[0]

    got = decode_batches(data, 0, 0, 2, 1 << 30)  # count limit
    assert [r.offset for r in got.records] == [0, 1] and got.needed_bytes == 0
    got = decode_batches(data, 0, 0, 10, 1)  # byte limit: still one batch
    assert [r.offset for r in got.records] == [0] and got.needed_bytes == 0


def batch_builder_record(i: int):
    from mqstore.engine import ProducerRecord

    return ProducerRecord(None, b"value-%d" % i, [], 1000 + i)


@settings(deadline=None)
@given(position=st.integers(min_value=21, max_value=10_000), bit=st.integers(0, 7))
def test_any_flipped_bit_under_the_crc_is_caught(position, bit):
    data = _batch([batch_builder_record(i) for i in range(3)])
    position = position % len(data)
    if position < 21:
        position += 21
    data[position] ^= 1 << bit
    with pytest.raises(MalformedBatchError):
        check_batch(bytes(data), 0)
    with pytest.raises(MalformedBatchError):
        decode_batches(bytes(data), 0, 0, 10, 1 << 30)


def test_cut_batch_is_reported_as_truncated():
    data = bytes(_batch([batch_builder_record(1)]))
    for cut in (5, 30, len(data) - 1):
        with pytest.raises(MalformedBatchError) as caught:
            check_batch(data[:cut], 0)
        assert caught.value.truncated


@pytest.mark.parametrize(
    ("field_position", "fmt", "value", "reason"),
    [
        (16, ">b", 1, "magic"),  # magic 1: not a v2 batch
        (8, ">i", 10, "below the 61-byte header"),  # length smaller than a header
    ],
)
def test_bad_magic_and_sizes_are_malformed(field_position, fmt, value, reason):
    data = _batch([batch_builder_record(1)])
    struct.pack_into(fmt, data, field_position, value)
    with pytest.raises(MalformedBatchError, match=reason):
        check_batch(bytes(data), 0, verify_crc=False)


def test_leftover_bytes_inside_a_batch_are_rejected():
    record = encode_record(0, 0, None, b"abc", [])
    batch = build_batch([record + b"\x00"], 1, 1, False)  # one stray byte, CRC still valid
    header = check_batch(bytes(batch), 0)
    with pytest.raises(MalformedBatchError, match="left over"):
        decode_records(bytes(batch), 0, header, 0, 1)


def test_header_layout_matches_kafka():
    data = _batch([batch_builder_record(1)], base_offset=42, log_append_time=True)
    fields = HEADER.unpack_from(data)
    assert HEADER.format == ">qiibIhiqqqhii" and HEADER_SIZE == 61
    assert fields[0] == 42 and fields[1] == len(data) - 12 and fields[3] == 2
    assert fields[5] & 0x08  # attributes bit 3: LogAppendTime
    assert fields[9:12] == (-1, -1, -1)  # no producer id, epoch, sequence


# ---------------------------------------------------------------- compacted batches


def test_a_compacted_batch_keeps_its_offsets_and_reads_across_the_gaps():
    """Compaction keeps a batch's base offset and last offset delta; the records
    left keep their offset deltas, and a read at a removed offset returns the next."""
    from mqstore.segmented.record_batch import rebuild_batch

    original = _batch([batch_builder_record(i) for i in range(5)], base_offset=100)
    header = check_batch(original, 0)
    records = decode_records(original, 0, header, 0, 5)
    kept = [r for r in records if r.offset in (101, 103)]
    encoded = [
        encode_record(r.offset - 100, r.timestamp_ms - header.base_timestamp, r.key, r.value, [])
        for r in kept
    ]
    cleaned = rebuild_batch(header, encoded, header.attributes, header.base_timestamp)
    empty = rebuild_batch(
        check_batch(_batch([batch_builder_record(9)], base_offset=105), 0),
        [], 0, header.base_timestamp,
    )  # fmt: skip
    after = _batch([batch_builder_record(7)], base_offset=110)  # a gap of 4 offsets
    data = bytes(cleaned + empty + after)
    cleaned_header = check_batch(data, 0)
    assert (cleaned_header.base_offset, cleaned_header.last_offset) == (100, 104)
    assert cleaned_header.records_count == 2
    assert check_batch(data, len(cleaned)).records_count == 0
    got = decode_batches(data, 0, 100, 100, 1 << 20).records
    assert [r.offset for r in got] == [101, 103, 110]
    assert [r.value for r in got[:2]] == [r.value for r in kept]
    assert [r.offset for r in decode_batches(data, 0, 102, 100, 1 << 20).records] == [103, 110]
    assert [r.offset for r in decode_batches(data, 0, 104, 100, 1 << 20).records] == [110]
    assert [r.offset for r in decode_batches(data, 0, 100, 1, 1 << 20).records] == [101]
    assert [r.offset for _, r in _kafka_records(data)] == [101, 103, 110]  # Kafka agrees


def test_a_compacted_batch_with_offset_deltas_out_of_order_is_malformed():
    from mqstore.segmented.record_batch import rebuild_batch

    original = _batch([batch_builder_record(i) for i in range(3)])
    header = check_batch(original, 0)
    encoded = [encode_record(d, 0, b"k", b"v", []) for d in (2, 1)]
    bad = rebuild_batch(header, encoded, header.attributes, header.base_timestamp)
    with pytest.raises(MalformedBatchError, match="offset delta"):
        decode_batches(bytes(bad), 0, 0, 10, 1 << 20)
    too_many = rebuild_batch(header, [encode_record(0, 0, b"k", b"v", [])] * 4, 0, 0)
    with pytest.raises(MalformedBatchError, match="does not fit"):
        check_batch(bytes(too_many), 0)


# ---------------------------------------------------------------------- record spans


def _spans_both(data: bytes, header) -> tuple:
    """(C, twin) outcomes of record_spans over one batch: the packed rows, or the
    error's (position, reason)."""
    from mqstore.commitlog.native import NATIVE
    from mqstore.segmented.record_batch import record_spans_py

    args = (data, HEADER_SIZE, header.size, header.records_count, header.last_offset_delta)
    outcomes = []
    functions = [record_spans_py] + ([NATIVE.record_spans] if NATIVE is not None else [])
    for function in functions:
        try:
            outcomes.append(("ok", function(*args)))
        except ValueError as error:
            outcomes.append(("raised", error.args[0]))
    return tuple(outcomes)


@given(records=st.lists(producer_records, min_size=1, max_size=8))
def test_record_spans_point_at_each_records_key_and_value_in_c_and_python(records) -> None:
    from mqstore.segmented.record_batch import record_spans

    data = bytes(_batch(records))
    header = check_batch(data, 0)
    outcomes = _spans_both(data, header)
    assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
    deltas, key_starts, key_sizes, value_starts, value_sizes, starts, stamps = record_spans(
        data, HEADER_SIZE, header.size, header.records_count, header.last_offset_delta
    )
    decoded = decode_records(data, 0, header, 0, len(records))
    assert deltas == list(range(len(records)))
    assert [header.base_timestamp + d for d in stamps] == [r.timestamp_ms for r in decoded]
    for i, record in enumerate(decoded):
        key = None if key_sizes[i] < 0 else data[key_starts[i] : key_starts[i] + key_sizes[i]]
        value = (
            None if value_sizes[i] < 0 else data[value_starts[i] : value_starts[i] + value_sizes[i]]
        )
        assert (key, value) == (record.key, record.value)
    ends = [*starts[1:], len(data)]
    rebuilt = b"".join(data[s:e] for s, e in zip(starts, ends, strict=True))
    assert rebuilt == data[HEADER_SIZE:]  # the records tile the batch


@settings(max_examples=300)
@given(
    records=st.lists(producer_records, min_size=1, max_size=4),
    position=st.integers(min_value=0, max_value=10_000),
    value=st.integers(0, 255),
)
def test_record_spans_agree_on_damaged_records_and_never_read_outside(
    records, position, value
) -> None:
    """A byte of the records section replaced (the header is taken as it was, as
    after the CRC check): C and the twin return the same spans or both raise, with
    the same position and reason, and every span lies inside the batch."""
    data = bytearray(_batch(records))
    header = check_batch(bytes(data), 0)
    at = HEADER_SIZE + position % (len(data) - HEADER_SIZE)
    data[at] = value
    outcomes = _spans_both(bytes(data), header)
    assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
    if outcomes[0][0] == "ok":
        import numpy as np

        rows = np.frombuffer(outcomes[0][1], dtype=np.int64).reshape(-1, 7)
        for _, key_start, key_size, value_start, value_size, start, _ in rows.tolist():
            assert HEADER_SIZE <= start < len(data)
            assert key_start + max(key_size, 0) <= len(data)
            assert value_start + max(value_size, 0) <= len(data)


@pytest.mark.parametrize("count", [0, 1])
def test_record_spans_takes_the_largest_last_delta_without_overflow(count) -> None:
    """last_offset_delta = 2**63 - 1 comes from the wire; "dense" was computed as
    ``count == last_delta + 1``, a signed overflow in C that UBSan flagged in a
    fuzz run (through kafka_values). C and the twin now agree without it."""
    from mqstore.commitlog.native import NATIVE
    from mqstore.segmented.record_batch import record_spans_py

    data = bytes(16)
    outcomes = []
    for function in [record_spans_py] + ([NATIVE.record_spans] if NATIVE is not None else []):
        try:
            outcomes.append(("ok", function(data, 0, count * 7, count, 2**63 - 1)))
        except ValueError as error:
            outcomes.append(("raised", error.args[0]))
    assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
