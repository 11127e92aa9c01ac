"""The on-disk format: sizes, positions, codecs, hashing and file names."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from mqstore.commitlog.errors import InvalidArgumentError, InvalidTypeError
from mqstore.indexfile import format as fmt
from mqstore.indexfile.format import IndexHeader
from tests.strategies import topics

i32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# epoch ms from 1970 to 9999-12-31 (the last time a 17-digit name can hold)
name_ms = st.integers(min_value=0, max_value=253_402_300_799_999)


def test_sizes_and_positions_match_the_layout() -> None:
    assert fmt.PREFIX.size == 8
    assert fmt.HEADER.size == 40
    assert fmt.FILE_HEADER_SIZE == 48
    assert fmt.ENTRY.size == fmt.ENTRY_DTYPE.itemsize == 20
    assert fmt.SLOT.size == 4
    assert fmt.HEADER_FIELD_POSITION == {
        "begin_ts_ms": 8,
        "end_ts_ms": 16,
        "begin_offset": 24,
        "end_offset": 32,
        "slot_count": 40,
        "index_count": 44,
    }
    assert fmt.INDEX_COUNT_POSITION == 44
    assert fmt.entries_position(4) == 48 + 16
    # RocketMQ's default: 40 + 5M*4 + 20M*20, plus our 8-byte prefix
    assert fmt.file_size_bytes(5_000_000, 20_000_000) == 420_000_048


def test_magic_reads_as_text_little_endian() -> None:
    head = fmt.PREFIX.pack(fmt.INDEX_MAGIC, fmt.FORMAT_VERSION)
    assert head == b"MIX1" + b"\x01\x00\x00\x00"


@given(begin_ts=i64, end_ts=i64, begin_offset=i64, end_offset=i64, slot_count=i32, index_count=i32)
def test_header_round_trip(
    begin_ts: int,
    end_ts: int,
    begin_offset: int,
    end_offset: int,
    slot_count: int,
    index_count: int,
) -> None:
    header = IndexHeader(
        begin_ts_ms=begin_ts,
        end_ts_ms=end_ts,
        begin_offset=begin_offset,
        end_offset=end_offset,
        slot_count=slot_count,
        index_count=index_count,
    )
    buffer = bytearray(fmt.FILE_HEADER_SIZE)
    header.pack_into(buffer)
    assert IndexHeader.unpack_from(buffer) == header
    assert buffer[:8] == bytes(8)  # the prefix is not the header's
    count_bytes = buffer[fmt.INDEX_COUNT_POSITION : fmt.INDEX_COUNT_POSITION + 4]
    assert fmt.INDEX_COUNT.unpack(count_bytes)[0] == index_count


@given(key_hash=i32, physical_offset=i64, delta_s=i32, prev=i32)
def test_entry_struct_and_dtype_agree(
    key_hash: int, physical_offset: int, delta_s: int, prev: int
) -> None:
    raw = fmt.ENTRY.pack(key_hash, physical_offset, delta_s, prev)
    entry = np.frombuffer(raw, dtype=fmt.ENTRY_DTYPE)[0]
    assert int(entry["key_hash"]) == key_hash
    assert int(entry["physical_offset"]) == physical_offset
    assert int(entry["time_delta_s"]) == delta_s
    assert int(entry["prev"]) == prev
    assert fmt.ENTRY.unpack(entry.tobytes()) == (key_hash, physical_offset, delta_s, prev)


@given(slot_count=st.integers(1, 10**6), entry_count=st.integers(2, 10**6))
def test_entry_count_is_recovered_from_the_size(slot_count: int, entry_count: int) -> None:
    size = fmt.file_size_bytes(slot_count, entry_count)
    assert fmt.entry_count_for_size(slot_count, size) == entry_count
    assert fmt.entry_count_for_size(slot_count, size + 1) is None  # not whole entries
    assert fmt.entry_count_for_size(slot_count + 1, size) is None  # 4 bytes short


def test_entry_count_for_a_size_with_room_for_one_entry_only() -> None:
    size = fmt.entries_position(4) + fmt.ENTRY_SIZE  # only the unused entry 0
    assert fmt.entry_count_for_size(4, size) is None


@given(topic=topics, key=st.text(max_size=40))
def test_key_hash_is_xxh3_of_topic_hash_key_folded_to_int32(topic: str, key: str) -> None:
    full = xxhash.xxh3_64_intdigest(f"{topic}#{key}".encode("utf-8", "surrogatepass"))
    expected = ((full >> 32) ^ (full & 0xFFFFFFFF)) & 0x7FFFFFFF
    assert fmt.key_hash(topic, key) == expected
    assert 0 <= expected < 2**31


def test_key_hash_depends_on_topic_and_key() -> None:
    assert fmt.key_hash("orders", "k1") != fmt.key_hash("orders", "k2")
    assert fmt.key_hash("orders", "k1") != fmt.key_hash("payments", "k1")
    assert fmt.key_hash("orders", "k1") == fmt.key_hash("orders", "k1")


@pytest.mark.parametrize("topic", ["", "a#b", "..", "x" * 128, "sp ace"])
def test_key_hash_rejects_bad_topics(topic: str) -> None:
    with pytest.raises(InvalidArgumentError):
        fmt.key_hash(topic, "k")


def test_key_hash_rejects_non_str_keys() -> None:
    with pytest.raises(InvalidTypeError):
        fmt.key_hash("t", b"k")  # type: ignore[arg-type]


def test_file_names_are_utc_creation_times() -> None:
    assert fmt.file_name_for_ms(0) == "19700101000000000"
    assert fmt.file_name_for_ms(1_700_000_000_123) == "20231114221320123"
    assert len(fmt.file_name_for_ms(253_402_300_799_999)) == fmt.FILE_NAME_DIGITS


@given(ms=name_ms)
def test_file_name_round_trip(ms: int) -> None:
    name = fmt.file_name_for_ms(ms)
    assert len(name) == fmt.FILE_NAME_DIGITS
    assert fmt.parse_file_name(name) == ms


@given(a=name_ms, b=name_ms)
def test_file_names_sort_as_their_times(a: int, b: int) -> None:
    assert (fmt.file_name_for_ms(a) < fmt.file_name_for_ms(b)) == (a < b)


@pytest.mark.parametrize(
    "name",
    ["", "2023111422132012", "202311142213201234", "2023111422132012x", "20231314221320123",
     "20231114221320123.creating", "00000000000000000000"],
)  # fmt: skip
def test_parse_file_name_rejects_strangers(name: str) -> None:
    assert fmt.parse_file_name(name) is None


def test_next_file_name_bumps_clashes_and_a_clock_gone_back() -> None:
    newest = fmt.file_name_for_ms(1_700_000_000_999)
    assert fmt.next_file_name(1_700_000_001_500, None) == fmt.file_name_for_ms(1_700_000_001_500)
    assert fmt.next_file_name(1_700_000_000_999, newest) == "20231114221321000"  # next second
    assert fmt.next_file_name(1_600_000_000_000, newest) == "20231114221321000"  # clock back
    assert fmt.next_file_name(1_700_000_005_000, newest) == fmt.file_name_for_ms(1_700_000_005_000)


@given(now=name_ms, newest=name_ms)
def test_next_file_name_always_sorts_after_the_newest(now: int, newest: int) -> None:
    newest_name = fmt.file_name_for_ms(min(newest, 253_402_300_799_998))
    assert fmt.next_file_name(now, newest_name) > newest_name
