"""The ConsumeQueue on-disk format: sizes, field offsets, names, headers, round trips."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import CorruptDataError
from mqstore.consumequeue import ConsumeQueueConfig, ConsumeQueueStore
from mqstore.consumequeue.format import (
    TIME_FILE_MAGIC,
    TIME_HEADER,
    TIME_HEADER_SIZE_BYTES,
    TIMESTAMP,
    UNIT,
    block_max_position_bytes,
    blocks_per_file,
    check_time_header,
    encode_time_header,
    parse_unit_file_name,
    time_file_name,
    time_file_size_bytes,
    times_position_bytes,
    unit_file_name,
    unit_file_size_bytes,
)
from tests import strategies

INT64 = st.integers(-(2**63), 2**63 - 1)
UNITS = st.lists(
    st.tuples(st.integers(1, 50), st.integers(1, 2**31 - 1), INT64, strategies.timestamps_ms),
    min_size=1,
    max_size=40,
)  # (commitlog offset step, size, tag hash, timestamp)


def test_unit_is_20_packed_little_endian_bytes() -> None:
    assert UNIT.itemsize == 20
    assert UNIT.fields is not None
    assert {name: field[1] for name, field in UNIT.fields.items()} == {
        "commitlog_offset": 0,
        "size": 8,
        "tag_hash": 12,
    }
    unit = np.array([(0x0102030405060708, 0x0A0B0C0D, -2)], dtype=UNIT)
    assert unit.tobytes() == struct.pack("<qiq", 0x0102030405060708, 0x0A0B0C0D, -2)


def test_timestamp_and_header_layout() -> None:
    assert TIMESTAMP.itemsize == 8
    assert TIMESTAMP.byteorder in ("<", "=")
    assert TIME_HEADER.itemsize == TIME_HEADER_SIZE_BYTES == 32
    header = encode_time_header(300_000, 1024, 17)
    assert header[:4] == struct.pack("<I", TIME_FILE_MAGIC)
    assert struct.unpack_from("<HHIII", header, 4) == (1, 32, 300_000, 1024, 17)
    assert header[20:] == bytes(12)


def test_file_sizes_and_positions() -> None:
    assert unit_file_size_bytes(300_000) == 6_000_000
    assert blocks_per_file(300_000, 1024) == 293  # the last block is short
    assert blocks_per_file(8, 4) == 2
    assert times_position_bytes() == 32
    assert block_max_position_bytes(8) == 32 + 64
    assert time_file_size_bytes(8, 3) == 32 + 64 + 3 * 8


def test_file_names_are_20_digit_byte_offsets() -> None:
    assert unit_file_name(0, 300_000) == "0" * 20
    assert unit_file_name(3, 300_000) == "00000000000018000000"
    assert time_file_name("00000000000018000000") == "00000000000018000000.time"
    assert parse_unit_file_name("00000000000018000000", 300_000, "d") == 3
    for other in ["00000000000018000000.time", "x", "123", "0000000000001800000a"]:
        assert parse_unit_file_name(other, 300_000, "d") is None
    with pytest.raises(CorruptDataError) as caught:
        parse_unit_file_name("00000000000000000020", 300_000, "d")
    assert caught.value.path == os.path.join("d", "00000000000000000020")


@given(st.integers(0, 10**6), st.integers(1, 10**6))
def test_file_name_round_trip(file_index: int, units_per_file: int) -> None:
    name = unit_file_name(file_index, units_per_file)
    assert len(name) == 20
    assert parse_unit_file_name(name, units_per_file, "d") == file_index


@pytest.mark.parametrize(
    ("field", "value"),
    [("magic", 0xDEADBEEF), ("version", 2), ("units_per_file", 9), ("first_unit_in_file", 8)],
)
def test_check_time_header_rejects(field: str, value: int) -> None:
    header = np.frombuffer(bytearray(encode_time_header(8, 3, 0)), dtype=TIME_HEADER)
    assert check_time_header("p", header, 8, 3) == 0
    header[field] = value
    with pytest.raises(CorruptDataError) as caught:
        check_time_header("p", header, 8, 3)
    assert caught.value.path == "p"
    assert TIME_HEADER.fields is not None
    assert caught.value.position == TIME_HEADER.fields[field][1]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(units=UNITS, start=st.integers(0, 20))
def test_units_round_trip_through_files(
    tmp_path_factory: pytest.TempPathFactory, units: list[tuple[int, int, int, int]], start: int
) -> None:
    """Units written by the store decode from the raw files with UNIT and TIMESTAMP."""
    directory = str(tmp_path_factory.mktemp("format"))
    upf = 8
    config = ConsumeQueueConfig(units_per_file=upf, time_index_interval_units=3)
    commitlog_offsets = np.cumsum([step for step, _, _, _ in units])
    with ConsumeQueueStore.open(directory, config) as store:
        queue = store.queue("t", 0)
        for index, (_, size, tag_hash, timestamp_ms) in enumerate(units):
            queue.put(start + index, int(commitlog_offsets[index]), size, tag_hash, timestamp_ms)
    raw_units = []
    raw_times = []
    for file_index in range(start // upf, (start + len(units) - 1) // upf + 1):
        path = os.path.join(directory, "t", "0", unit_file_name(file_index, upf))
        assert os.path.getsize(path) == unit_file_size_bytes(upf)
        raw_units.append(np.fromfile(path, dtype=UNIT))
        times = np.fromfile(time_file_name(path), dtype=TIMESTAMP, offset=times_position_bytes())
        raw_times.append(times[:upf])
    decoded = np.concatenate(raw_units)[start % upf :][: len(units)]
    assert [tuple(int(value) for value in unit.item()) for unit in decoded] == [
        (int(commitlog_offsets[index]), size, tag_hash)
        for index, (_, size, tag_hash, _) in enumerate(units)
    ]
    stamps = np.concatenate(raw_times)[start % upf :][: len(units)]
    assert list(stamps) == [timestamp_ms for _, _, _, timestamp_ms in units]
    assert not np.concatenate(raw_units)[: start % upf]["size"].any()
