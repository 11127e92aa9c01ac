"""Mapped unit and time files: creation, size and header checks, searches, maxima."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.commitlog.errors import CorruptDataError
from mqstore.consumequeue.format import UNIT, time_file_size_bytes, unit_file_size_bytes
from mqstore.consumequeue.mapped_file import (
    MappedTimeFile,
    MappedUnitFile,
    block_maxima,
    create_file,
    make_directories,
    remove_file,
    sync_filesystem,
    sync_path,
)

UPF = 8


def units_of(commitlog_offsets: list[int]) -> np.ndarray:
    units = np.zeros(len(commitlog_offsets), dtype=UNIT)
    units["commitlog_offset"] = commitlog_offsets
    units["size"] = 10
    return units


def test_unit_file_created_at_full_size_with_its_units(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "u")
    MappedUnitFile.create(path, UPF, 2, units_of([5, 6]))
    assert os.path.getsize(path) == unit_file_size_bytes(UPF)
    assert os.listdir(str(tmp_path)) == ["u"]  # no temporary left
    mapped = MappedUnitFile.open(path, UPF, read_only=True)
    assert list(mapped.commitlog_offsets[:4]) == [0, 0, 5, 6]
    assert not mapped.units.flags.writeable


def test_wrong_size_is_corrupt(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "u")
    MappedUnitFile.create(path, UPF, 0, units_of([1]))
    with pytest.raises(CorruptDataError) as caught:
        MappedUnitFile.open(path, UPF * 2, read_only=False)
    assert caught.value.path == path
    assert caught.value.position == unit_file_size_bytes(UPF)


def test_time_file_holds_header_timestamps_and_maxima(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "t")
    MappedTimeFile.create(path, UPF, 3, 2, 2, np.array([7, 9, 4, 1]))
    assert os.path.getsize(path) == time_file_size_bytes(UPF, 3)
    mapped = MappedTimeFile.open(path, UPF, 3, read_only=False)
    assert mapped.first_unit_in_file == 2
    assert list(mapped.times) == [0, 0, 7, 9, 4, 1, 0, 0]
    assert list(mapped.block_max) == [7, 9, 0]  # blocks [0,3) [3,6) [6,8)
    mapped.times[6] = 30
    mapped.raise_block_maxima(6, 7)
    assert list(mapped.block_max) == [7, 9, 30]
    mapped.times[3] = 1
    mapped.recompute_block_maxima(3, 4, 2, 5)  # unit 5 no longer written
    assert list(mapped.block_max) == [7, 4, 30]
    with pytest.raises(CorruptDataError):
        MappedTimeFile.open(path, UPF, 4, read_only=True)


def test_stale_time_file_is_replaced_not_truncated(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "t")
    MappedTimeFile.create(path, UPF, 3, 0, 0, np.array([5]))
    held = MappedTimeFile.open(path, UPF, 3, read_only=True)
    MappedTimeFile.create(path, UPF, 3, 0, 0, np.array([6]))
    assert int(held.times[0]) == 5  # the old inode, still mapped, is intact
    assert int(MappedTimeFile.open(path, UPF, 3, read_only=True).times[0]) == 6


@pytest.mark.parametrize("written", [0, 1, 2, 5, UPF])
def test_written_end_finds_the_run_end(tmp_path: object, written: int) -> None:
    path = os.path.join(str(tmp_path), "u")
    MappedUnitFile.create(path, UPF, 0, np.zeros(1, dtype=UNIT))
    mapped = MappedUnitFile.open(path, UPF, read_only=False)
    mapped.units[:written] = units_of(list(range(10, 10 + written)))
    assert mapped.written_end(0, -1) == written
    assert mapped.written_end(min(written, 1), 9) == max(written, min(written, 1))


@pytest.mark.parametrize("written", [0, 1, 2, 30, 63, 64, 65, 199, 200])
@pytest.mark.parametrize("start", [0, 1, 17])
def test_followed_end_finds_the_run_end(tmp_path: object, written: int, start: int) -> None:
    """The window of FOLLOW_WINDOW_UNITS (64) units, a run past it (the search), and a
    window that would reach the file's end (the search) agree with written_end."""
    upf = 200
    path = os.path.join(str(tmp_path), "u")
    MappedUnitFile.create(path, upf, 0, np.zeros(1, dtype=UNIT))
    mapped = MappedUnitFile.open(path, upf, read_only=False)
    mapped.units[:written] = units_of(list(range(10, 10 + written)))
    start = min(start, written)
    floor = 9 + start
    assert mapped.followed_end(start, floor) == mapped.written_end(start, floor) == written


@pytest.mark.parametrize(
    ("offsets", "bad"),
    [
        ([10, 20, 15, 40], 2),  # written_end's search never probes unit 2
        ([10, 20, 20], 2),  # not above the one before
        ([5, 20], 0),  # not above the floor (9)
    ],
)
def test_followed_end_checks_every_unit_of_the_run(
    tmp_path: object, offsets: list[int], bad: int
) -> None:
    path = os.path.join(str(tmp_path), "u")
    MappedUnitFile.create(path, 200, 0, units_of(offsets))
    mapped = MappedUnitFile.open(path, 200, read_only=True)
    with pytest.raises(CorruptDataError) as caught:
        mapped.followed_end(0, 9)
    assert caught.value.path == path
    assert caught.value.position == bad * UNIT.itemsize


def test_followed_end_refuses_a_negative_size(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "u")
    units = units_of([10, 20, 30])
    units["size"][1] = -1
    MappedUnitFile.create(path, 200, 0, units)
    mapped = MappedUnitFile.open(path, 200, read_only=True)
    with pytest.raises(CorruptDataError) as caught:
        mapped.followed_end(0, 9)
    assert caught.value.position == UNIT.itemsize


def test_written_end_detects_disorder(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "u")
    MappedUnitFile.create(path, UPF, 0, units_of([10, 20, 30, 40, 50, 60, 6]))
    mapped = MappedUnitFile.open(path, UPF, read_only=True)
    with pytest.raises(CorruptDataError) as caught:
        mapped.written_end(0, -1)
    assert caught.value.path == path
    assert caught.value.position == 6 * UNIT.itemsize  # probed after unit 4 (50)


@given(
    start=st.integers(0, 30),
    stamps=st.lists(st.integers(0, 10**6), min_size=1, max_size=40),
    interval=st.integers(1, 9),
)
def test_block_maxima_matches_brute_force(start: int, stamps: list[int], interval: int) -> None:
    first_block, maxima = block_maxima(start, np.array(stamps, dtype=np.int64), interval)
    expected: dict[int, int] = {}
    for index, stamp in enumerate(stamps):
        block = (start + index) // interval
        expected[block] = max(expected.get(block, stamp), stamp)
    assert first_block == min(expected)
    assert list(maxima) == [expected[block] for block in sorted(expected)]


def test_create_file_merges_near_writes(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "f")
    create_file(path, 10_000, [(9_000, b"z"), (0, b"ab"), (10, b"c")])
    with open(path, "rb") as file:
        data = file.read()
    assert len(data) == 10_000
    assert data[:2] == b"ab"
    assert data[10:11] == b"c"
    assert data[9_000:9_001] == b"z"
    assert data.count(0) == 10_000 - 4


def test_directories_and_removal(tmp_path: object) -> None:
    changed: list[str] = []
    path = os.path.join(str(tmp_path), "a", "b", "c")
    make_directories(path, changed.append)
    assert os.path.isdir(path)
    assert changed == [str(tmp_path), os.path.dirname(os.path.dirname(path)), os.path.dirname(path)]
    make_directories(path, changed.append)
    assert len(changed) == 3
    remove_file(os.path.join(path, "missing"))  # already gone: fine
    sync_path(os.path.join(path, "missing"))
    sync_path(path, directory=True)
    assert sync_filesystem(path)
    assert not sync_filesystem(os.path.join(path, "missing"))
