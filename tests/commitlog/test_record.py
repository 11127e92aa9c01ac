from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog import record
from mqstore.commitlog.errors import CorruptDataError, InvalidArgumentError, InvalidTypeError
from tests import strategies as s


def _encode(
    topic,
    queue_id,
    body,
    keys=(),
    tag=None,
    properties=None,
    born=1,
    store=2,
    q=0,
    at=0,
    physical=0,
):
    topic_b = record.validate_topic(topic)
    tag_b = record.encode_tag(tag)
    keys_b = record.encode_keys(keys)
    props_b = record.encode_properties(properties)
    flags = record.FLAG_NULL_BODY if body is None else 0
    body_b = b"" if body is None else body
    size = record.HEADER_SIZE + len(topic_b) + len(tag_b) + len(keys_b) + len(props_b) + len(body_b)
    buffer = bytearray(at + size + 16)
    record.encode_into(
        buffer,
        at,
        physical,
        size,
        q,
        born,
        store,
        queue_id,
        flags,
        topic_b,
        tag_b,
        keys_b,
        props_b,
        body_b,
    )
    return buffer, size


@settings(max_examples=200)
@given(
    s.topics,
    s.queue_ids,
    s.bodies | st.none(),
    s.keys,
    s.tags,
    s.property_pairs,
    s.timestamps_ms,
    s.timestamps_ms,
    st.integers(0, 2**62),
    st.integers(0, 64),
)
def test_round_trip(topic, queue_id, body, keys, tag, props, born, store, queue_offset, at):
    buffer, size = _encode(
        topic, queue_id, body, keys, tag, props, born, store, queue_offset, at, physical=1000 + at
    )
    decoded = record.decode(buffer, at, len(buffer), "f", file_start=1000)
    assert decoded is not None
    assert decoded.size == size
    assert decoded.topic == topic
    assert decoded.queue_id == queue_id
    assert decoded.queue_offset == queue_offset
    assert decoded.physical_offset == 1000 + at
    assert decoded.born_ts_ms == born
    assert decoded.store_ts_ms == store
    assert decoded.keys == tuple(keys)
    assert decoded.tag == (tag or None)
    assert decoded.properties == tuple((k, v) for k, v in props)
    if body is None:
        assert decoded.body is None
    else:
        assert bytes(decoded.body) == body


@settings(max_examples=200)
@given(s.bodies, st.data())
def test_any_flipped_bit_is_detected(body, data):
    buffer, size = _encode("topic", 3, body, keys=["k"], tag="t", properties={"a": "b"})
    bit = data.draw(st.integers(0, size * 8 - 1))
    buffer[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CorruptDataError) as caught:
        record.decode(buffer, 0, len(buffer), "the-file", file_start=0)
    assert caught.value.path == "the-file"
    assert caught.value.position == 0


@settings(max_examples=300)
@given(st.binary(min_size=0, max_size=300), st.integers(0, 50))
def test_decoder_fuzz_raises_only_corrupt_data(garbage, at):
    buffer = bytearray(at) + garbage
    try:
        result = record.decode(buffer, at, len(buffer), "fuzz", file_start=0)
    except CorruptDataError as error:
        assert error.position == at
    else:  # only a valid blank record can come out of random bytes
        assert result is None


def test_truncated_record_is_corrupt():
    buffer, size = _encode("topic", 0, b"x" * 100)
    with pytest.raises(CorruptDataError, match="impossible total size"):
        record.decode(buffer, 0, size - 1, "f", file_start=0)


def test_stale_physical_offset_is_corrupt():
    buffer, _ = _encode("topic", 0, b"body", physical=4096)
    with pytest.raises(CorruptDataError, match="physical offset"):
        record.decode(buffer, 0, len(buffer), "f", file_start=0)


def test_blank_record_round_trip():
    buffer = bytearray(100)
    record.encode_blank_into(buffer, 10, 90)
    assert record.decode(buffer, 10, 100, "f", file_start=0) is None
    buffer[14] ^= 0xFF  # the blank magic (bytes 14..17)
    with pytest.raises(CorruptDataError, match="bad magic"):
        record.decode(buffer, 10, 100, "f", file_start=0)


def test_layout_is_pinned():
    assert record.HEADER.size == record.HEADER_SIZE == 68
    buffer, size = _encode("ab", 7, b"xyz", q=9, born=5, store=6, physical=0)
    total, magic = struct.unpack_from("<II", buffer, 0)
    assert (total, magic) == (size, record.MESSAGE_MAGIC)
    assert struct.unpack_from("<qqqqi", buffer, 16) == (9, 0, 5, 6, 7)
    assert bytes(buffer[68:70]) == b"ab"
    assert bytes(buffer[size - 3 : size]) == b"xyz"


@pytest.mark.parametrize(
    "topic", ["", ".", "..", "a/b", "../etc", "a\x00b", "x" * 128, "sp ace", "naïve"]
)
def test_invalid_topics(topic):
    with pytest.raises(InvalidArgumentError):
        record.validate_topic(topic)


@pytest.mark.parametrize("topic", [None, b"topic", 7])
def test_topic_wrong_type(topic):
    with pytest.raises(InvalidTypeError):
        record.validate_topic(topic)


def test_valid_topic_edges():
    assert record.validate_topic("x" * 127) == b"x" * 127
    assert record.validate_topic("a.b-c_D9") == b"a.b-c_D9"


def test_bad_keys_and_properties():
    with pytest.raises(InvalidArgumentError):
        record.encode_keys(["ok", ""])
    with pytest.raises(InvalidArgumentError):
        record.encode_keys(["a\x00b"])
    with pytest.raises(InvalidTypeError):
        record.encode_keys([b"bytes"])
    with pytest.raises(InvalidTypeError):
        record.encode_properties({"k": 3})
    with pytest.raises(InvalidTypeError):
        record.encode_properties([1, 2])
    assert record.encode_keys("single") == b"single"


def test_tag_hash_is_signed_64_bit_and_zero_for_none():
    assert record.tag_hash(b"") == 0
    value = record.tag_hash(b"TagA")
    assert -(2**63) <= value < 2**63
    assert value == record.tag_hash(b"TagA")


def test_decode_run_checks_each_record_against_its_unit():
    buffer = bytearray(4096)
    physicals, sizes = [], []
    position = 0
    for i in range(5):
        body = b"body-%d" % i
        size = record.HEADER_SIZE + 1 + len(body)
        record.encode_into(buffer, position, 1000 + position, size, 10 + i, 1, 2, 3, 0, b"t",
                           b"", b"", b"", body)  # fmt: skip
        physicals.append(1000 + position)
        sizes.append(size)
        position += size
    decoded = record.decode_run(buffer, "f", 1000, physicals, sizes, "t", 3, 10, record.Record)
    assert [bytes(r.body) for r in decoded] == [b"body-%d" % i for i in range(5)]
    assert [r.queue_offset for r in decoded] == list(range(10, 15))
    for wrong in (
        dict(topic="u"),  # another topic's record
        dict(queue_id=4),
        dict(first_queue_offset=11),  # a unit pointing at its neighbour's record
    ):
        args = dict(topic="t", queue_id=3, first_queue_offset=10) | wrong
        with pytest.raises(CorruptDataError, match="position 0"):
            record.decode_run(
                buffer, "f", 1000, physicals, sizes, args["topic"], args["queue_id"],
                args["first_queue_offset"], record.Record,
            )  # fmt: skip
    buffer[physicals[2] - 1000 + 70] ^= 1  # a flipped bit in the third body
    with pytest.raises(CorruptDataError, match="checksum") as caught:
        record.decode_run(buffer, "f", 1000, physicals, sizes, "t", 3, 10, record.Record)
    assert caught.value.position == physicals[2] - 1000
