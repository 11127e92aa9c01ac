"""The C hot loops (commitlog/_native.c) against their pure-Python versions in
commitlog/record.py: same bytes written, same verdicts, same hash as the xxhash
package. Skipped where the C module did not build, unless MQSTORE_REQUIRE_NATIVE=1
(make test), where a missing module already fails the import."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog import record
from mqstore.commitlog.header_scan import (
    DISPATCH_PHYSICAL,
    DISPATCH_QUEUE_ID,
    DISPATCH_QUEUE_OFFSET,
    DISPATCH_ROWS,
    DISPATCH_SIZE,
    DISPATCH_STORE_TS,
    DISPATCH_TOPIC_HASH,
    DISPATCH_TOPIC_LEN,
    new_columns,
)
from mqstore.commitlog.native import NATIVE
from tests import strategies as s

native = pytest.mark.skipif(NATIVE is None, reason="mqstore.commitlog._native is not built")

_records = st.tuples(
    s.bodies | st.none(), s.keys, s.tags, s.property_pairs, s.timestamps_ms | st.none()
)


def _encoded(topic: str, items: list) -> list:
    """record.py's per-record tuples (as CommitLog.append_batch builds them)."""
    topic_b = record.validate_topic(topic)
    out = []
    for body, keys, tag, props, born in items:
        tag_b, keys_b = record.encode_tag(tag), record.encode_keys(keys)
        props_b = record.encode_properties(props)
        flags = record.FLAG_NULL_BODY if body is None else 0
        body_b = b"" if body is None else body
        size = record.HEADER_SIZE + len(topic_b) + len(tag_b) + len(keys_b) + len(props_b)
        out.append((size + len(body_b), flags, tag_b, keys_b, props_b, body_b, born))
    return out


@native
@settings(max_examples=300)
@given(st.binary(max_size=300), st.integers(min_value=0, max_value=2**64 - 1))
def test_xxh64_is_the_xxhash_packages(data: bytes, seed: int) -> None:
    assert NATIVE is not None
    assert NATIVE.xxh64(data, seed) == xxhash.xxh64_intdigest(data, seed)
    assert NATIVE.xxh64(bytearray(data), seed) == xxhash.xxh64_intdigest(data, seed)


@native
def test_xxh64_long_inputs_release_the_gil_path() -> None:
    assert NATIVE is not None
    data = os.urandom(1 << 20)
    assert NATIVE.xxh64(data, 7) == xxhash.xxh64_intdigest(data, 7)


@native
@settings(max_examples=150)
@given(s.topics, s.queue_ids, st.lists(_records, min_size=1, max_size=8),
       st.integers(min_value=0, max_value=2**40), st.integers(min_value=0, max_value=2**62),
       st.integers(min_value=0, max_value=3000))  # fmt: skip
def test_encode_run_writes_what_python_writes(
    topic: str, queue_id: int, items: list, first_offset: int, stamp: int, room: int
) -> None:
    """The same bytes, positions and stop index, including a file end mid-run."""
    assert NATIVE is not None
    encoded = _encoded(topic, items)
    topic_b = record.validate_topic(topic)
    file_size = 100 + room
    results = []
    for run in (NATIVE.encode_run, record.encode_run_py):
        buffer = bytearray(file_size)
        positions = np.full(len(encoded), -1, dtype=np.int64)
        stop = run(buffer, 100, file_size, 5000, first_offset, stamp, queue_id, topic_b,
                   encoded, 0, positions)  # fmt: skip
        results.append((bytes(buffer), positions.tolist(), stop))
    assert results[0] == results[1]
    buffer_bytes, positions_list, stop = results[0]
    # Each written record decodes to what was given.
    for index in range(stop):
        got = record.decode(buffer_bytes, positions_list[index] - 4900, file_size, "f", 4900)
        assert got is not None
        size, flags, _, _, _, body_b, born = encoded[index]
        assert (got.size, got.queue_offset, got.store_ts_ms) == (size, first_offset + index, stamp)
        assert got.born_ts_ms == (stamp if born is None else born)
        assert (got.body is None) == bool(flags) and bytes(got.body or b"") == body_b


@native
@settings(max_examples=100)
@given(s.topics, st.lists(_records, min_size=1, max_size=6), st.data())
def test_verify_records_agrees_with_python(topic: str, items: list, data: st.DataObject) -> None:
    """Intact runs verify; one flipped bit anywhere is found at the same record."""
    assert NATIVE is not None
    encoded = _encoded(topic, items)
    total = sum(item[0] for item in encoded)
    buffer = bytearray(total + 16)
    positions = np.zeros(len(encoded), dtype=np.int64)
    topic_b = record.validate_topic(topic)
    written = record.encode_run_py(buffer, 0, len(buffer), 0, 0, 1, 0, topic_b, encoded, 0,
                                   positions)  # fmt: skip
    assert written == len(encoded)
    sizes = np.array([item[0] for item in encoded], dtype=np.int64)
    assert NATIVE.verify_records(buffer, positions, sizes) == -1
    assert record.verify_records_py(buffer, positions, sizes) == -1
    bit = data.draw(st.integers(min_value=0, max_value=total * 8 - 1))
    buffer[bit // 8] ^= 1 << (bit % 8)
    found = NATIVE.verify_records(buffer, positions, sizes)
    assert found == record.verify_records_py(buffer, positions, sizes)
    assert found == int(np.searchsorted(positions, bit // 8, side="right")) - 1


@native
def test_verify_records_rejects_slices_outside_the_buffer() -> None:
    assert NATIVE is not None
    buffer = bytearray(200)
    for positions, sizes in (([-1], [68]), ([150], [68]), ([0], [10])):
        p, z = np.array(positions, dtype=np.int64), np.array(sizes, dtype=np.int64)
        assert NATIVE.verify_records(buffer, p, z) == 0 == record.verify_records_py(buffer, p, z)


@native
@settings(max_examples=100)
@given(st.binary(min_size=1, max_size=500), st.data())
def test_gather_agrees_with_python(source: bytes, data: st.DataObject) -> None:
    assert NATIVE is not None
    slices = data.draw(st.lists(st.tuples(st.integers(0, len(source)), st.integers(0, 50)),
                                max_size=10))  # fmt: skip
    slices = [(start, min(length, len(source) - start)) for start, length in slices]
    starts = np.array([a for a, _ in slices], dtype=np.int64)
    lengths = np.array([n for _, n in slices], dtype=np.int64)
    outs = []
    for run in (NATIVE.gather, record.gather_py):
        out = bytearray(int(lengths.sum()))
        run(source, starts, lengths, out)
        outs.append(bytes(out))
    assert outs[0] == outs[1] == b"".join(source[a : a + n] for a, n in slices)
    with pytest.raises(ValueError):
        NATIVE.gather(source, np.array([len(source)], np.int64), np.array([1], np.int64),
                      bytearray(1))  # fmt: skip


@native
def test_encode_into_refuses_inconsistent_lengths() -> None:
    """A caller bug (a size that does not add up, or no room) is a ValueError, and the
    buffer is untouched."""
    assert NATIVE is not None
    buffer = bytearray(200)
    with pytest.raises(ValueError):
        NATIVE.encode_into(buffer, 0, 0, 99, 0, 0, 0, 0, 0, b"t", b"", b"", b"", b"abc")
    with pytest.raises(ValueError):
        NATIVE.encode_into(buffer, 150, 0, 72, 0, 0, 0, 0, 0, b"t", b"", b"", b"", b"abc")
    assert buffer == bytearray(200)


_ROUND_TRIP = """
import sys
from mqstore.commitlog.native import NATIVE
from mqstore import MessageStore, StoreConfig
assert (NATIVE is None) == (sys.argv[2] == "pure"), NATIVE
with MessageStore.open(sys.argv[1], StoreConfig(prewarm=False)) as store:
    if "t" not in store.list_topics():
        store.create_topic("t", partitions=1)
    before = store.max_offset("t", 0)
    got = [bytes(m.body) for m in store.get("t", 0, 0, 10_000)]
    assert got == [b"m%d" % i for i in range(before)], got[-3:]
    store.put("t", 0, b"m%d" % before)
    store.put_batch("t", 0, [b"m%d" % (before + 1 + i) for i in range(50)])
"""


@native
def test_files_written_by_c_read_by_python_and_back(tmp_path) -> None:
    """The two implementations write one format: alternate writers on one store."""
    env_pure = {**os.environ, "MQSTORE_PURE_PYTHON": "1"}
    env_pure.pop("MQSTORE_REQUIRE_NATIVE", None)
    env_c = {k: v for k, v in os.environ.items() if k != "MQSTORE_PURE_PYTHON"}
    for env, mode in ((env_c, "c"), (env_pure, "pure"), (env_c, "c"), (env_pure, "pure")):
        subprocess.run([sys.executable, "-c", _ROUND_TRIP, str(tmp_path), mode], env=env,
                       check=True, timeout=120)  # fmt: skip


@native
@settings(max_examples=150)
@given(s.topics, s.tags, st.lists(s.bodies | st.none(), min_size=1, max_size=8),
       st.integers(0, 2**62), st.integers(0, 3000))  # fmt: skip
def test_plain_batches_encode_as_python_does(
    topic: str, tag: str | None, bodies: list, born: int, room: int
) -> None:
    """check_bodies and encode_bodies (bodies sharing topic, tag and born time) write
    the bytes encode_run_py writes for the same records."""
    assert NATIVE is not None
    topic_b, tag_b = record.validate_topic(topic), record.encode_tag(tag)
    fixed = record.HEADER_SIZE + len(topic_b) + len(tag_b)
    sizes = [np.zeros(len(bodies), np.int32) for _ in range(2)]
    assert NATIVE.check_bodies(bodies, fixed, 1 << 20, sizes[0]) == -1
    assert record.check_bodies_py(bodies, fixed, 1 << 20, sizes[1]) == -1
    assert sizes[0].tolist() == sizes[1].tolist()
    encoded = [
        (int(size), record.FLAG_NULL_BODY if body is None else 0, tag_b, b"", b"",
         b"" if body is None else body, born)
        for size, body in zip(sizes[0], bodies, strict=True)
    ]  # fmt: skip
    file_size = 50 + room
    outputs = []
    for run in (NATIVE.encode_bodies, record.encode_bodies_py):
        buffer, positions = bytearray(file_size), np.full(len(bodies), -1, np.int64)
        stop = run(buffer, 50, file_size, 700, 3, 9, born, 4, topic_b, tag_b, bodies, 0,
                   positions)  # fmt: skip
        outputs.append((bytes(buffer), positions.tolist(), stop))
    buffer, positions = bytearray(file_size), np.full(len(bodies), -1, np.int64)
    stop = record.encode_run_py(buffer, 50, file_size, 700, 3, 9, 4, topic_b, encoded, 0,
                                positions)  # fmt: skip
    assert outputs[0] == outputs[1] == (bytes(buffer), positions.tolist(), stop)


@native
def test_check_bodies_finds_the_bad_body() -> None:
    assert NATIVE is not None
    sizes = np.zeros(4, np.int32)
    for bodies, limit, bad in (
        ([b"a", "text", b"c"], 100, 1),
        ([b"a", b"b" * 50, b"c"], 110, 1),
        ([None, bytearray(b"xy"), memoryview(b"z")], 100, -1),
        ([b"a", 7], 100, 1),
    ):
        assert NATIVE.check_bodies(bodies, 68, limit, sizes) == bad
        assert record.check_bodies_py(bodies, 68, limit, sizes) == bad


@native
@settings(max_examples=120)
@given(s.topics, s.tags, st.lists(s.bodies | st.none(), min_size=1, max_size=8),
       st.booleans(), st.integers(0, 3000),
       st.sampled_from([0, record.FLAG_GROUP_OPEN]))  # fmt: skip
def test_slices_encode_as_python_does(
    topic: str, tag: str | None, bodies: list, per_record_born: bool, room: int, flags: int
) -> None:
    """encode_slices (bodies as Arrow offsets + data, nulls, per-record born times, the
    group flag) writes the bytes of encode_slices_py and of encode_bodies_py for the
    same bodies."""
    assert NATIVE is not None
    topic_b, tag_b = record.validate_topic(topic), record.encode_tag(tag)
    data = b"".join(body or b"" for body in bodies)
    offsets = np.zeros(len(bodies) + 1, np.int64)
    np.cumsum([len(body or b"") for body in bodies], out=offsets[1:])
    nulls = np.array([body is None for body in bodies], np.uint8)
    borns = np.arange(len(bodies), dtype=np.int64) * 7 + 11 if per_record_born else None
    file_size = 50 + room
    outputs = []
    for run in (NATIVE.encode_slices, record.encode_slices_py):
        buffer, positions = bytearray(file_size), np.full(len(bodies), -1, np.int64)
        stop = run(buffer, 50, file_size, 700, 3, 9, 5, 4, topic_b, tag_b, offsets, data,
                   nulls, borns, 0, positions, flags)  # fmt: skip
        outputs.append((bytes(buffer), positions.tolist(), stop))
    assert outputs[0] == outputs[1]
    if borns is None:
        buffer, positions = bytearray(file_size), np.full(len(bodies), -1, np.int64)
        stop = record.encode_bodies_py(buffer, 50, file_size, 700, 3, 9, 5, 4, topic_b, tag_b,
                                       bodies, 0, positions, None, flags)  # fmt: skip
        assert outputs[0] == (bytes(buffer), positions.tolist(), stop)


#: The dispatch rows that hold scan_records' outputs, in the outputs' order.
_SCAN_FIELDS = (DISPATCH_PHYSICAL, DISPATCH_SIZE, DISPATCH_QUEUE_OFFSET, DISPATCH_QUEUE_ID,
                DISPATCH_STORE_TS, DISPATCH_TOPIC_LEN, DISPATCH_TOPIC_HASH)  # fmt: skip


def _scan_both(buffer: bytearray, start: int, limit: int, file_start: int, capacity: int):
    """C's and the twin's scan_records answers. Each is also asked for the dispatch
    columns instead (an array wider than the outputs): the answer is the same, the
    outputs are left alone, and the columns hold the outputs' fields and are those
    dispatch_columns gives for the records scanned (as far as it takes them)."""
    assert NATIVE is not None
    outputs = []
    for run in (NATIVE.scan_records, record.scan_records_py):
        dtypes = (np.int64, np.int32, np.int64, np.int32, np.int64, np.uint8, np.uint64)
        columns = [np.zeros(capacity, dtype) for dtype in dtypes]
        end, count, status, closed = run(buffer, start, limit, file_start, *columns)
        outputs.append((end, count, status, closed, [c[:count].tolist() for c in columns]))
        plain_columns = outputs[-1][4]
        dispatch = new_columns(capacity + 3)
        columns = [np.zeros(capacity, dtype) for dtype in dtypes]
        answer = run(buffer, start, limit, file_start, *columns, dispatch)
        assert answer == (end, count, status, closed)
        assert not any(c.any() for c in columns)
        assert not dispatch[:, count:].any()
        positions, sizes, offsets, queue_ids, stamps, topic_lens, hashes = plain_columns
        assert [dispatch[row, :count].tolist() for row in _SCAN_FIELDS] == [
            [file_start + at for at in positions],
            sizes,
            offsets,
            queue_ids,
            stamps,
            topic_lens,
            np.array(hashes, np.uint64).view(np.int64).tolist(),
        ]
        if count:
            stop = positions[-1] + sizes[-1]
            parsed = new_columns(capacity)
            _, taken, _ = NATIVE.dispatch_columns(buffer, start, int(stop), limit, int(stop),
                                                  file_start, True, parsed)  # fmt: skip
            assert taken <= count
            assert dispatch[:, :taken].tolist() == parsed[:, :taken].tolist()
        outputs[-1][4].append(dispatch[:, :count].tolist())
    return outputs


@native
def test_scan_records_refuses_a_short_dispatch_array() -> None:
    """The dispatch columns must be DISPATCH_ROWS rows at least as wide as the
    outputs, of 8-byte integers, in C as in the twin."""
    assert NATIVE is not None
    buffer = bytearray(1024)
    dtypes = (np.int64, np.int32, np.int64, np.int32, np.int64, np.uint8, np.uint64)
    columns = [np.zeros(4, dtype) for dtype in dtypes]
    for run in (NATIVE.scan_records, record.scan_records_py):
        with pytest.raises(ValueError):
            run(buffer, 0, len(buffer), 0, *columns, new_columns(3))
    with pytest.raises(TypeError):
        NATIVE.scan_records(buffer, 0, len(buffer), 0, *columns,
                            np.zeros((DISPATCH_ROWS, 4), np.int32))  # fmt: skip
    with pytest.raises(ValueError):
        NATIVE.scan_records(buffer, 0, len(buffer), 0, *columns,
                            np.zeros(DISPATCH_ROWS * 4 + 1, np.int64))  # fmt: skip


@native
@settings(max_examples=150)
@given(s.topics, st.lists(_records, min_size=1, max_size=6), st.data())
def test_scan_records_agrees_with_python(topic: str, items: list, data: st.DataObject) -> None:
    """Same rows, end and status, on intact runs, after a flipped bit, a cut, a blank
    record at the end, or a small output capacity."""
    encoded = _encoded(topic, items)
    total = sum(item[0] for item in encoded)
    file_start = 4096
    buffer = bytearray(total + 64)
    positions = np.zeros(len(encoded), np.int64)
    record.encode_run_py(buffer, 0, len(buffer), file_start, 0, 1, 0,
                         record.validate_topic(topic), encoded, 0, positions)  # fmt: skip
    damage = data.draw(st.sampled_from(["none", "flip", "cut", "blank"]))
    limit = len(buffer)
    if damage == "flip":
        bit = data.draw(st.integers(0, total * 8 - 1))
        buffer[bit // 8] ^= 1 << (bit % 8)
    elif damage == "cut":
        limit = data.draw(st.integers(0, total))
    elif damage == "blank":
        record.encode_blank_into(buffer, total, len(buffer) - total)
    capacity = data.draw(st.integers(1, 8))
    c_out, py_out = _scan_both(buffer, 0, limit, file_start, capacity)
    assert c_out == py_out
    end, count, status, closed, _ = c_out
    assert closed == count  # no record is flagged open here
    if damage == "none" and capacity > len(encoded):
        assert (count, end, status) == (len(encoded), total, record.SCAN_ZEROS)
    if damage == "blank" and capacity > len(encoded):
        assert (end, status) == (len(buffer), record.SCAN_BLANK)


@native
def test_scan_records_refuses_bad_text() -> None:
    """A record whose checksum verifies but whose tag is not UTF-8 (or topic not
    ASCII) stops the scan in C as decode refuses it in Python."""
    for topic_b, tag_b in ((b"t", b"\xff"), (b"t", b"\xed\xa0\x80"), (b"\xc3\xa9", b"")):
        size = record.HEADER_SIZE + len(topic_b) + len(tag_b) + 1
        buffer = bytearray(size + 32)
        record.encode_into_py(buffer, 0, 0, size, 0, 1, 1, 0, 0, topic_b, tag_b, b"", b"", b"x")
        c_out, py_out = _scan_both(buffer, 0, len(buffer), 0, 4)
        assert c_out == py_out
        assert c_out[:3] == (0, 0, record.SCAN_INVALID)


@native
@settings(max_examples=100)
@given(st.lists(st.sampled_from(["ab", "ba", "abc", "a", "x" * 127]), min_size=1, max_size=12))
def test_scan_records_hashes_each_records_topic(topics: list[str]) -> None:
    """The scan remembers the last topic's hash (a run mostly holds one topic): a
    different topic, of the same length or not, next to it or after it, still gets its
    own XXH64, in C as in Python."""
    buffer = bytearray(64 * 1024)
    at = 0
    for index, topic in enumerate(topics):
        encoded = _encoded(topic, [(b"body", [], None, None, None)])
        topic_b, positions = record.validate_topic(topic), np.zeros(1, np.int64)
        record.encode_run_py(buffer, at, len(buffer), at, index, 1, 0, topic_b, encoded, 0,
                             positions)  # fmt: skip
        at += encoded[0][0]
    c_out, py_out = _scan_both(buffer, 0, len(buffer), 0, len(topics) + 1)
    assert c_out == py_out
    assert c_out[4][6] == [xxhash.xxh64_intdigest(topic.encode()) for topic in topics]


# ---------------------------------------------------------------- memory safety (issue 13)
# Each test below failed (most by killing the process) against the C module as it was
# before the checks: see docs/RELIABILITY.md. Wrapping values are the point: an int64
# ``at + size`` past 2**63 goes negative and passed the old ``at + size > len`` checks.

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _one_record(body: bytes = b"x") -> tuple[bytearray, int]:
    size = record.HEADER_SIZE + 1 + len(body)
    buffer = bytearray(size + 32)
    record.encode_into_py(buffer, 0, 0, size, 0, 1, 1, 0, 0, b"t", b"", b"", b"", body)
    return buffer, size


@native
@pytest.mark.parametrize(
    ("position", "size"),
    [(INT64_MAX - 100, 200), (INT64_MAX, INT64_MAX), (INT64_MAX - 67, 68), (INT64_MIN, 100),
     (100, INT64_MAX), (-1, 68), (0, INT64_MIN)],
)  # fmt: skip
def test_verify_records_refuses_slices_whose_end_wraps(position: int, size: int) -> None:
    """Was: ``at + size > len`` wrapped negative, passed, and read far outside (SIGSEGV
    from MessageStore.get on crafted ConsumeQueue units)."""
    assert NATIVE is not None
    buffer, _ = _one_record()
    p, z = np.array([0, position], np.int64), np.array([len(buffer) - 32, size], np.int64)
    assert NATIVE.verify_records(buffer, p, z) == 1 == record.verify_records_py(buffer, p, z)


@native
@pytest.mark.parametrize(
    ("starts", "lengths"),
    [([INT64_MAX - 5], [10]), ([1], [INT64_MAX]), ([0, 0], [INT64_MAX, INT64_MAX]),
     ([0, 0, 0], [8, INT64_MAX - 3, 8]), ([INT64_MIN], [1])],
)  # fmt: skip
def test_gather_refuses_slices_and_totals_that_wrap(starts: list, lengths: list) -> None:
    """Was: ``st + ln > len`` wrapped and so did the sum of lengths checked against
    ``out`` (a copy far past both buffers)."""
    assert NATIVE is not None
    source, out = bytes(64), bytearray(16)
    args = (np.array(starts, np.int64), np.array(lengths, np.int64))
    for gather in (NATIVE.gather, record.gather_py):
        with pytest.raises(ValueError):
            gather(source, *args, out)


@native
@pytest.mark.parametrize(
    ("in_file", "file_size", "start", "physical", "first_offset"),
    [(-4096, 200, 0, 0, 0), (INT64_MAX, 200, 0, 0, 0), (0, 200, -1, 0, 0),
     (0, 200, 5, 0, 0), (0, 200, INT64_MIN, 0, 0), (0, 200, 0, INT64_MAX - 10, 0),
     (0, 200, 0, 0, INT64_MAX), (0, 200, 0, -1, 0), (0, INT64_MAX, 0, 0, 0)],
)  # fmt: skip
def test_encoders_refuse_places_outside_the_file(
    in_file: int, file_size: int, start: int, physical: int, first_offset: int
) -> None:
    """Was: encode_run trusted ``start`` (PyList_GET_ITEM(list, -1)) and ``in_file``
    (writes before the buffer), and physical/queue offsets overflowed; the same for
    encode_bodies and encode_slices. Now a ValueError, the buffer untouched, in C and
    in the Python twins alike."""
    assert NATIVE is not None
    encoded = _encoded("t", [(b"ab", [], None, [], None)])
    offsets, data = np.array([0, 2], np.int64), b"ab"
    calls = [
        (run, (in_file, file_size, physical, first_offset, 1, 0, b"t", encoded, start))
        for run in (NATIVE.encode_run, record.encode_run_py)
    ] + [
        (run, (in_file, file_size, physical, first_offset, 1, 1, 0, b"t", b"", [b"ab"], start))
        for run in (NATIVE.encode_bodies, record.encode_bodies_py)
    ] + [
        (run, (in_file, file_size, physical, first_offset, 1, 1, 0, b"t", b"", offsets, data,
               None, None, start))
        for run in (NATIVE.encode_slices, record.encode_slices_py)
    ]  # fmt: skip
    for run, args in calls:
        buffer, positions = bytearray(200), np.zeros(1, np.int64)
        with pytest.raises(ValueError):
            if len(args) == 14:  # encode_slices: the flags follow the positions
                run(buffer, *args, positions, 0)
            else:
                run(buffer, *args, positions)
        assert buffer == bytearray(200), run


@native
def test_encode_into_refuses_a_position_whose_end_wraps() -> None:
    """Was: ``position + total > len`` wrapped for a position near 2**63: a write far
    outside the buffer."""
    assert NATIVE is not None
    buffer = bytearray(200)
    for position in (INT64_MAX - 10, INT64_MAX, INT64_MIN, -1):
        with pytest.raises(ValueError):
            NATIVE.encode_into(buffer, position, 0, 72, 0, 0, 0, 0, 0, b"t", b"", b"", b"", b"abc")
    with pytest.raises(ValueError):  # queue_id and flags no longer truncated silently
        NATIVE.encode_into(buffer, 0, 0, 72, 0, 0, 0, 1 << 31, 0, b"t", b"", b"", b"", b"abc")
    assert buffer == bytearray(200)


@native
def test_encode_run_survives_an_item_that_empties_the_list() -> None:
    """Was: a size whose ``__index__`` cleared the list freed the tuple being read and
    left the loop reading past the list (use after free)."""
    assert NATIVE is not None
    encoded: list = []

    class Evil:
        def __index__(self) -> int:
            encoded.clear()
            return 72

    encoded += [(Evil(), 0, b"", b"", b"", b"abc", None), (72, 0, b"", b"", b"", b"abc", None)]
    positions = np.zeros(2, np.int64)
    written = NATIVE.encode_run(bytearray(400), 0, 400, 0, 0, 1, 0, b"t", encoded, 0, positions)
    assert written in (0, 1)


@native
def test_check_bodies_fixed_size_that_wraps_is_too_large() -> None:
    """Was: ``fixed + len`` overflowed (undefined behaviour) to a small size."""
    assert NATIVE is not None
    sizes = np.zeros(1, np.int32)
    assert NATIVE.check_bodies([b"abc"], INT64_MAX - 1, 1 << 20, sizes) == 0
    assert record.check_bodies_py([b"abc"], INT64_MAX - 1, 1 << 20, sizes) == 0


@native
def test_scan_records_refuses_a_file_start_that_wraps() -> None:
    """Was: ``file_start + at`` overflowed (undefined behaviour) when comparing a
    record's physical offset; now the range is checked first, in C and Python."""
    assert NATIVE is not None
    buffer, _ = _one_record()
    columns = [np.zeros(4, dtype) for dtype in
               (np.int64, np.int32, np.int64, np.int32, np.int64, np.uint8, np.uint64)]  # fmt: skip
    end = len(buffer)
    ranges = ((0, end, INT64_MAX), (0, end, -1), (-1, 10, 0), (5, 4, 0), (0, end + 1, 0))
    for run in (NATIVE.scan_records, record.scan_records_py):
        for start, limit, file_start in ranges:
            with pytest.raises(ValueError):
                run(buffer, start, limit, file_start, *columns)


@native
def test_arrays_of_the_wrong_item_size_or_alignment_are_refused() -> None:
    """int32 where int64 is meant (read as half as many wrong values before), and a
    misaligned view (undefined behaviour for an int64 load), are TypeErrors."""
    assert NATIVE is not None
    buffer, size = _one_record()
    with pytest.raises(TypeError):
        NATIVE.verify_records(buffer, np.zeros(2, np.int32), np.full(2, size, np.int32))
    raw = np.zeros(17, np.uint8)
    misaligned = raw[1:].view(np.int64)
    with pytest.raises((TypeError, ValueError)):
        NATIVE.gather(buffer, misaligned, misaligned, bytearray(8))


def _tail_row(units: np.ndarray, times: np.ndarray, blocks: np.ndarray, **values: int):
    """One row of the tail writer's table (columns as consumequeue/tail_writer.py)."""
    from mqstore.consumequeue import tail_writer as tw

    row = np.zeros(tw._COLUMNS, np.int64)
    row[tw._UNITS_ADDR] = units.ctypes.data
    row[tw._TIMES_ADDR] = times.ctypes.data
    row[tw._BLOCKS_ADDR] = blocks.ctypes.data
    columns = {"interval": tw._INTERVAL, "file_first": tw._FILE_FIRST, "next": tw._NEXT,
               "limit": tw._LIMIT, "last_clog": tw._LAST_CLOG}  # fmt: skip
    for name, value in values.items():
        row[columns[name]] = value
    return row


@native
@pytest.mark.parametrize(
    "row",
    [{"interval": 0}, {"interval": -1}, {"file_first": 5}, {"file_first": INT64_MAX},
     {"next": INT64_MIN, "file_first": INT64_MIN, "limit": INT64_MIN + 4, "interval": 0}],
)  # fmt: skip
def test_write_units_refuses_a_row_it_cannot_write(row: dict) -> None:
    """Was: interval 0 trapped (SIGFPE) and a unit below FILE_FIRST was written before
    the mapping. Now such a unit is left to the slow path (index 0 returned)."""
    assert NATIVE is not None
    units, times, blocks = np.zeros(80, np.uint8), np.zeros(4, np.int64), np.zeros(4, np.int64)
    values = {"interval": 2, "file_first": 0, "next": 0, "limit": 4, "last_clog": -1, **row}
    table = _tail_row(units, times, blocks, **values)[None, :].copy()
    offset = np.array([values["next"]], np.int64)
    stop = NATIVE.write_units(
        table, np.zeros(1, np.int32), offset, np.array([10], np.int64),
        np.array([100], np.int32), np.zeros(1, np.int64), np.ones(1, np.int64), 0,
    )  # fmt: skip
    assert stop == 0
    assert not units.any() and not times.any() and not blocks.any()


# -------------------------------------------------------------- the C copy of the layout


def test_layout_mismatch_is_an_import_error_naming_the_field() -> None:
    """commitlog/native.py compares the C module's LAYOUT with record.py at import; a
    module built from another layout is refused, naming what differs."""
    from types import SimpleNamespace

    from mqstore.commitlog.native import LayoutMismatchError, check_layout

    good = dict(record.LAYOUT)
    check_layout(SimpleNamespace(__name__="fake", LAYOUT=good), record.LAYOUT, "record.py")
    stale = SimpleNamespace(__name__="fake", LAYOUT={**good, "AT_FLAGS": 53})
    with pytest.raises(LayoutMismatchError, match="AT_FLAGS: C 53 != Python 52"):
        check_layout(stale, record.LAYOUT, "record.py")
    with pytest.raises(ImportError, match=r"older _native\.c"):
        check_layout(SimpleNamespace(__name__="fake"), record.LAYOUT, "record.py")


@native
def test_c_layout_is_record_py_layout() -> None:
    assert NATIVE is not None
    assert {name: NATIVE.LAYOUT[name] for name in record.LAYOUT} == record.LAYOUT
    assert record.LAYOUT["AT_TAG_LEN"] == record.HEADER_SIZE - 1


# ---------------------------------------------- crafted ConsumeQueue units through get()

_CRAFTED_UNITS = """
import random, struct, sys
from pathlib import Path
from mqstore.commitlog.errors import CorruptDataError
from mqstore import MessageStore, StoreConfig

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
FILE = 64 * 1024
config = StoreConfig(prewarm=False, commitlog_file_size_bytes=FILE, consumequeue_shared_units_max=0)
root, extra = Path(sys.argv[1]), int(sys.argv[2])
body = lambda i: bytes([i % 256]) * 1000
with MessageStore.open(root, config) as store:
    store.create_topic("t", partitions=1)
    store.put_batch("t", 0, [body(i) for i in range(100)])
unit_file = root / "consumequeue" / "t" / "0" / ("0" * 20)
pristine = unit_file.read_bytes()
units = [struct.unpack_from("<qi", pristine, i * 20) for i in range(100)]
second = next(i for i, (p, _) in enumerate(units) if p >= FILE)  # first unit of file 2
end = units[-1][0] + units[-1][1]
cases = [(2, p, s) for p, s in [
    (INT64_MAX - 100, 200), (INT64_MAX, 2**31 - 1), (INT64_MAX - 67, 68), (INT64_MIN, 100),
    (INT64_MIN + 5, 1071), (-1, 1071), (end + 10, 1071), (units[2][0], 2**31 - 1),
    (units[2][0], 68), (FILE - 100, 1071), (units[3][0], 1071), (units[2][0] + 1, 1071),
    (units[2][0], -5), (units[2][0], 0),
]] + [(second + 1, p, s) for p, s in [
    (INT64_MIN + 5, 1071), (INT64_MIN + FILE, 1071), (INT64_MAX - 5, 1071), (-1, 1071),
    (FILE - 10, 1071),
]]
rng = random.Random(13)
for _ in range(extra):
    near = rng.choice([INT64_MIN, INT64_MAX, -1, 0, end, FILE])
    position = min(INT64_MAX, max(INT64_MIN, near + rng.randrange(-2**32, 2**32)))
    cases.append((rng.randrange(100), position, rng.randrange(-2**31, 2**31)))
outcomes = {"corrupt": 0, "right": 0}
for index, position, size in cases:
    data = bytearray(pristine)
    struct.pack_into("<qi", data, index * 20, position, size)
    unit_file.write_bytes(bytes(data))
    print("case", index, position, size, flush=True)  # the last line names a crash
    try:
        store = MessageStore.open(root, config)
    except CorruptDataError:
        outcomes["corrupt"] += 1
        continue
    with store:
        for start in (0, max(0, index - 1), index):
            try:
                got = store.get("t", 0, start, 100)
            except CorruptDataError:
                outcomes["corrupt"] += 1
                continue
            # No error: then only right answers (the unit was dropped as a torn tail).
            assert [bytes(m.body) for m in got] == [body(start + i) for i in range(len(got))]
            outcomes["right"] += 1
print("outcomes", outcomes, len(cases), flush=True)
"""


@pytest.mark.parametrize("pure", [False, True])
def test_get_over_crafted_consumequeue_units_is_corrupt_data_not_a_crash(tmp_path, pure) -> None:
    """Units whose positions and sizes lie past the CommitLog, are huge, or negative as
    int64 (and wrap when the file's start is subtracted) make get() raise
    CorruptDataError; before the C checks, the first one killed the process (SIGSEGV
    in verify_records). In a subprocess, so that a crash fails this test instead of
    killing the runner."""
    if not pure and NATIVE is None:
        pytest.skip("mqstore.commitlog._native is not built")
    env = dict(os.environ)
    if pure:
        env["MQSTORE_PURE_PYTHON"] = "1"
        env.pop("MQSTORE_REQUIRE_NATIVE", None)
    else:
        env.pop("MQSTORE_PURE_PYTHON", None)
    done = subprocess.run(
        [sys.executable, "-c", _CRAFTED_UNITS, str(tmp_path / "s"), "40"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    tail = (done.stdout[-600:], done.stderr[-2000:])
    assert done.returncode == 0, f"exit {done.returncode} (a negative one is a signal): {tail}"
    assert "outcomes" in done.stdout, tail


@native
@settings(max_examples=100)
@given(st.lists(st.booleans(), min_size=1, max_size=10), st.integers(1, 12))
def test_scan_records_counts_the_records_up_to_the_last_group_end(
    opens: list[bool], capacity: int
) -> None:
    """``closed`` is how many scanned records end with the last one that closes its
    append group (no FLAG_GROUP_OPEN), in C as in Python; flags of any other value
    stop the scan as unknown."""
    buffer = bytearray(8 * 1024)
    at = 0
    for index, is_open in enumerate(opens):
        size = record.HEADER_SIZE + 1 + 1
        flags = record.FLAG_GROUP_OPEN if is_open else 0
        record.encode_into_py(buffer, at, at, size, index, 1, 1, 0, flags, b"t", b"", b"", b"",
                              b"x")  # fmt: skip
        at += size
    c_out, py_out = _scan_both(buffer, 0, len(buffer), 0, capacity)
    assert c_out == py_out
    _, count, _, closed, _ = c_out
    assert count == min(capacity, len(opens))
    scanned = opens[:count]
    want = max((i + 1 for i, is_open in enumerate(scanned) if not is_open), default=0)
    assert closed == want
    record.encode_into_py(buffer, 0, 0, record.HEADER_SIZE + 2, 0, 1, 1, 0, 0x4, b"t", b"",
                          b"", b"", b"x")  # fmt: skip
    c_out, py_out = _scan_both(buffer, 0, len(buffer), 0, capacity)
    assert c_out == py_out
    assert c_out[:4] == (0, 0, record.SCAN_INVALID, 0)
