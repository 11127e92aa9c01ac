"""The dispatcher's header scan (commitlog/header_scan.py): the C ``dispatch_columns``
and its pure-Python twin give the columns the records hold, stop where the contract
says, and agree with each other on random logs. (Hostile arguments: the fuzz in
test_native_fuzz.py.)"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.commitlog import header_scan
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.config import CommitLogConfig
from mqstore.commitlog.header_scan import (
    DISPATCH_BLANK,
    DISPATCH_FULL,
    DISPATCH_INVALID,
    DISPATCH_ROWS,
    DISPATCH_STOP,
    dispatch_columns_py,
    new_columns,
)
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.record import HEADER_SIZE, Record

FILE_BYTES = 64 * 1024
IMPLEMENTATIONS = [
    pytest.param(dispatch_columns_py, id="python"),
    pytest.param(
        getattr(NATIVE, "dispatch_columns", None),
        id="c",
        marks=pytest.mark.skipif(NATIVE is None, reason="the C module is not built"),
    ),
]


def _expected(record: Record) -> list[int]:
    """The column a record should get, from its decoded fields."""
    topic = record.topic.encode("ascii")
    topic_hash = xxhash.xxh64_intdigest(topic)
    keys = b"\0".join(key.encode() for key in record.keys)
    return [
        record.physical_offset, record.size, record.queue_offset, record.queue_id,
        record.born_ts_ms, record.store_ts_ms,
        topic_hash - (1 << 64) if topic_hash >= 1 << 63 else topic_hash,
        len(topic), len(record.tag.encode()) if record.tag else 0, len(keys), record.flags,
    ]  # fmt: skip


def _scan_all(scan: Any, log: CommitLog, capacity: int, verify: bool) -> list[list[int]]:
    """Every column of the log, file by file, ``capacity`` records per call."""
    out = new_columns(capacity)
    rows: list[list[int]] = []
    position, end = log.min_position, log.write_position
    while position < end:
        mapped = log.file_for(position)
        in_file = position - mapped.start_offset
        stop = min(mapped.size_bytes, end - mapped.start_offset)
        hard_end = end - mapped.start_offset
        at, count, status = scan(
            mapped.mapping, in_file, stop, mapped.size_bytes, hard_end, mapped.start_offset,
            verify, out,
        )  # fmt: skip
        rows.extend(out[:, :count].T.tolist())
        assert status != DISPATCH_INVALID
        if status == DISPATCH_FULL:
            assert count == capacity
        if status == DISPATCH_BLANK:
            assert at == mapped.size_bytes
        position = mapped.start_offset + at
    return rows


@pytest.fixture
def log(tmp_path):
    opened = CommitLog.open(str(tmp_path / "cl"), CommitLogConfig(file_size_bytes=FILE_BYTES,
                                                                   prewarm=False))  # fmt: skip
    yield opened
    opened.close()


def _fill(log: CommitLog, count: int) -> None:
    for i in range(count):
        log.append(("orders", "a.b-c_9")[i % 2], i % 3, b"x" * (i * 37 % 700),
                   keys=[f"k{i}", "other"] if i % 5 == 0 else (),
                   tag="é-tag" if i % 4 == 0 else None,
                   properties={"p": "v"} if i % 6 == 0 else None,
                   born_ts_ms=1_000 + i)  # fmt: skip
    log.append("nulls", 0, None)


@pytest.mark.parametrize("scan", IMPLEMENTATIONS)
@pytest.mark.parametrize("verify", [False, True])
def test_columns_are_the_records_fields(log, scan, verify):
    _fill(log, 400)  # about 150 KiB: blank records end the first files
    assert log.file_count > 2
    want = [_expected(record) for record in log.iter_records(log.min_position)]
    assert _scan_all(scan, log, 7, verify) == want
    assert _scan_all(scan, log, 1 << 12, verify) == want


@pytest.mark.parametrize("scan", IMPLEMENTATIONS)
def test_stop_inside_a_record_takes_it_whole(log, scan):
    results = [log.append("t", 0, b"y" * 100) for _ in range(5)]
    mapped = log.file_for(0)
    out = new_columns(16)
    stop = results[2].physical_offset + 1  # one byte into the third record
    at, count, status = scan(mapped.mapping, 0, stop, mapped.size_bytes, log.write_position, 0,
                             False, out)  # fmt: skip
    assert (at, count, status) == (results[3].physical_offset, 3, DISPATCH_STOP)
    # The written end cuts the fourth record: it is not a record yet.
    hard_end = results[3].physical_offset + 50
    at, count, status = scan(mapped.mapping, 0, hard_end, mapped.size_bytes, hard_end, 0, False,
                             out)  # fmt: skip
    assert (at, count, status) == (results[3].physical_offset, 3, DISPATCH_INVALID)


@pytest.mark.parametrize("scan", IMPLEMENTATIONS)
def test_a_flipped_body_byte_is_seen_only_with_verify(log, scan):
    results = [log.append("t", 0, b"z" * 100) for _ in range(4)]
    mapped = log.file_for(0)
    mapped.mapping[results[2].physical_offset + results[2].size - 1] ^= 1
    out = new_columns(16)
    end = log.write_position
    args = (mapped.mapping, 0, end, mapped.size_bytes, end, 0)
    assert scan(*args, False, out)[1:] == (4, DISPATCH_STOP)
    assert scan(*args, True, out) == (results[2].physical_offset, 2, DISPATCH_INVALID)


@pytest.mark.parametrize("scan", IMPLEMENTATIONS)
@pytest.mark.parametrize(
    ("field_at", "value"),
    [(0, 40), (4, 0xDEAD), (24, 7), (52, 0x80), (66, 0), (HEADER_SIZE, 0xC3)],
    ids=["size-below-header", "magic", "physical", "flags", "no-topic", "non-ascii-topic"],
)
def test_a_header_that_does_not_parse_stops_the_scan_at_it(log, scan, field_at, value):
    results = [log.append("t", 0, b"w" * 60) for _ in range(4)]
    mapped = log.file_for(0)
    at = results[1].physical_offset + field_at
    mapped.mapping[at] = value & 0xFF
    if field_at in (0, 4):  # whole little-endian fields
        mapped.mapping[at + 1 : at + 4] = (value >> 8).to_bytes(3, "little")
    end = log.write_position
    out = new_columns(16)
    assert scan(mapped.mapping, 0, end, mapped.size_bytes, end, 0, False, out) == (
        results[1].physical_offset, 1, DISPATCH_INVALID,
    )  # fmt: skip


def test_out_must_have_the_rows():
    with pytest.raises(ValueError):
        dispatch_columns_py(
            bytearray(64), 0, 0, 64, 64, 0, False, np.zeros(DISPATCH_ROWS + 1, np.int64)
        )
    with pytest.raises(TypeError):
        dispatch_columns_py(bytearray(64), 0, 0, 64, 64, 0, False, np.zeros((DISPATCH_ROWS, 2)))
    assert header_scan.dispatch_columns is (
        dispatch_columns_py if NATIVE is None else NATIVE.dispatch_columns
    )


@pytest.mark.skipif(NATIVE is None, reason="the C module is not built")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "orders", "x" * 127]), st.integers(0, 5),
            st.binary(max_size=900) | st.none(), st.sampled_from([None, "t", "ü" * 30]),
            st.lists(st.text("kq☃", min_size=1, max_size=5), max_size=3),
        ),
        min_size=1, max_size=120,
    ),
    st.integers(1, 50),
)  # fmt: skip
def test_c_and_python_agree_on_random_logs(messages, capacity):
    directory = tempfile.mkdtemp()
    try:
        log = CommitLog.open(directory, CommitLogConfig(file_size_bytes=FILE_BYTES,
                                                        prewarm=False))  # fmt: skip
        try:
            for topic, queue_id, body, tag, keys in messages:
                log.append(topic, queue_id, body, tag=tag, keys=keys)
            assert NATIVE is not None
            for verify in (False, True):
                got = _scan_all(NATIVE.dispatch_columns, log, capacity, verify)
                assert got == _scan_all(dispatch_columns_py, log, capacity, verify)
                assert len(got) == len(messages)
        finally:
            log.close()
    finally:
        shutil.rmtree(directory)
