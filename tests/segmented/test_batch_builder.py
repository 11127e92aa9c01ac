"""From ProducerRecords to one batch: timestamps, sizes, validation."""

from __future__ import annotations

import pytest

from mqstore.commitlog.errors import InvalidArgumentError, InvalidTypeError, LimitExceededError
from mqstore.engine import ProducerRecord
from mqstore.segmented.batch_builder import RECORDS_PER_BATCH_MAX, build
from mqstore.segmented.record_batch import check_batch, decode_records


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
