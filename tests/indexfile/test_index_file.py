"""One index file: creation, validation, appends, chain walks, truncation, repair."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import CorruptDataError
from mqstore.indexfile import format as fmt
from mqstore.indexfile.index_file import TEMP_SUFFIX, IndexFile

NAME = "20231114221320123"
TS = 1_700_000_000_000
EVERYTHING = (0, 2**62)  # a time range that holds every entry


@pytest.fixture
def make_file(tmp_path) -> Iterator:
    opened: list[IndexFile] = []

    def factory(slot_count: int = 4, entry_count: int = 64, name: str = NAME) -> IndexFile:
        file = IndexFile.create(str(tmp_path), name, slot_count, entry_count)
        opened.append(file)
        return file

    yield factory
    for file in opened:
        file.close()


def poke(path: str, position: int, data: bytes) -> None:
    """Overwrite bytes of a file on disk (through the page cache, as a mapping sees)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, position)
    finally:
        os.close(fd)


def entry_position(slot_count: int, number: int) -> int:
    return fmt.entries_position(slot_count) + number * fmt.ENTRY_SIZE


def all_of(file: IndexFile, key_hash: int, span: tuple[int, int] = EVERYTHING) -> list[int]:
    return list(file.candidates(key_hash, *span))


# ----------------------------------------------------------------- create, open


def test_create_reserves_every_block_and_leaves_no_temporary_file(tmp_path) -> None:
    file = IndexFile.create(str(tmp_path), NAME, 100_000, 1_000_000)
    try:
        stat = os.stat(file.path)
        assert stat.st_size == fmt.file_size_bytes(100_000, 1_000_000)  # about 20 MB
        # posix_fallocate: a full disk fails here, never as SIGBUS through the mapping
        assert stat.st_blocks * 512 >= stat.st_size
        assert os.listdir(tmp_path) == [NAME]
        assert not any(name.endswith(TEMP_SUFFIX) for name in os.listdir(tmp_path))
    finally:
        file.close()


def test_a_new_file_is_empty_and_reopens_with_its_own_sizes(make_file, tmp_path) -> None:
    file = make_file(slot_count=3, entry_count=10)
    assert (file.slot_count, file.entry_count, file.capacity) == (3, 10, 9)
    assert file.index_count == 0
    assert file.end_offset == -1
    assert all_of(file, 7) == []
    reopened = IndexFile.open(file.path, read_only=True)
    try:
        assert (reopened.slot_count, reopened.entry_count) == (3, 10)
        assert reopened.header().index_count == 0
    finally:
        reopened.close()


CORRUPTIONS = [
    # (position, bytes written, position reported)
    pytest.param(0, b"XXXX", 0, id="magic"),
    pytest.param(4, fmt.SLOT.pack(2), 4, id="version"),
    pytest.param(40, fmt.SLOT.pack(0), 40, id="slot-count-zero"),
    pytest.param(40, fmt.SLOT.pack(5), 40, id="slot-count-does-not-fit-size"),
    pytest.param(40, fmt.SLOT.pack(2**31 - 1), 40, id="slot-count-huge"),
    pytest.param(44, fmt.SLOT.pack(64), 44, id="index-count-over-capacity"),
    pytest.param(44, fmt.SLOT.pack(-1), 44, id="index-count-negative"),
]


@pytest.mark.parametrize(("position", "data", "reported"), CORRUPTIONS)
def test_open_rejects_a_corrupt_prefix_or_header(
    make_file, position: int, data: bytes, reported: int
) -> None:
    file = make_file(slot_count=4, entry_count=64)
    path = file.path
    file.close()
    poke(path, position, data)
    with pytest.raises(CorruptDataError) as caught:
        IndexFile.open(path, read_only=True)
    assert caught.value.path == path
    assert caught.value.position == reported


def test_open_rejects_inverted_ranges_of_a_non_empty_file(make_file) -> None:
    file = make_file()
    file.append([5], 1000, TS)
    file.append([6], 2000, TS + 5000)
    path = file.path
    file.close()
    poke(path, fmt.HEADER_FIELD_POSITION["end_offset"], fmt.HEADER.pack(0, 0, 0, 0, 0, 0)[:8])
    with pytest.raises(CorruptDataError) as caught:
        IndexFile.open(path, read_only=False)
    assert caught.value.position == fmt.HEADER_FIELD_POSITION["end_offset"]


@pytest.mark.parametrize("size", [0, 47, fmt.file_size_bytes(4, 64) - 1])
def test_open_rejects_a_truncated_file(make_file, size: int) -> None:
    file = make_file()
    path = file.path
    file.close()
    os.truncate(path, size)
    with pytest.raises(CorruptDataError) as caught:
        IndexFile.open(path, read_only=True)
    assert caught.value.path == path


# --------------------------------------------------------------- append, walk


def test_chains_walk_newest_first_and_filter_by_hash(make_file) -> None:
    file = make_file(slot_count=1)  # every key shares the one slot
    for offset, key_hash in enumerate([7, 8, 7, 9, 7]):
        file.append([key_hash], offset * 100, TS + offset)
    assert all_of(file, 7) == [400, 200, 0]
    assert all_of(file, 8) == [100]
    assert all_of(file, 10) == []
    header = file.header()
    assert (header.index_count, header.begin_offset, header.end_offset) == (5, 0, 400)
    assert (header.begin_ts_ms, header.end_ts_ms) == (TS, TS + 4)


def test_one_message_with_several_keys(make_file) -> None:
    file = make_file(slot_count=2)
    file.append([1, 2, 3], 500, TS)
    assert file.index_count == 3
    assert [all_of(file, h) for h in (1, 2, 3)] == [[500], [500], [500]]


def test_time_filter_is_conservative_to_the_second(make_file) -> None:
    file = make_file(slot_count=1)
    file.append([7], 0, TS)  # delta 0 s
    file.append([7], 100, TS + 1_500)  # delta 1 s: known as [TS + 1000, TS + 1999]
    file.append([7], 200, TS + 4_200)  # delta 4 s
    assert all_of(file, 7, (TS + 1_600, TS + 1_700)) == [100]  # same second: a candidate
    assert all_of(file, 7, (TS + 1_000, TS + 1_000)) == [100]
    assert all_of(file, 7, (TS + 2_000, TS + 3_999)) == []  # 100 lies wholly before
    assert all_of(file, 7, (TS + 1_999, TS + 4_000)) == [200, 100]
    assert all_of(file, 7, (0, TS - 1)) == []  # 0 is wholly after the range


def test_walk_stops_at_the_first_entry_older_than_the_range(make_file, monkeypatch) -> None:
    file = make_file(slot_count=1)
    for i in range(10):
        file.append([7], i, TS + i * 1000)
    visited = []
    original = fmt.ENTRY.unpack_from

    class CountingEntry:
        @staticmethod
        def unpack_from(buffer, position):  # type: ignore[no-untyped-def]
            visited.append(position)
            return original(buffer, position)

    monkeypatch.setattr("mqstore.indexfile.index_file.ENTRY", CountingEntry)
    assert all_of(file, 7, (TS + 7000, TS + 8000)) == [8, 7]
    assert len(visited) == 4  # entries 10, 9, 8, then 7 (older than the range): stop


def test_a_chain_loop_ends_the_walk(make_file, caplog) -> None:
    file = make_file(slot_count=1)
    for i in range(5):
        file.append([7], i * 10, TS)
    # entry 3 now links forward to entry 5: 5 -> 4 -> 3 -> 5 -> ... if trusted
    poke(file.path, entry_position(1, 3) + 16, fmt.SLOT.pack(5))
    assert all_of(file, 7) == [40, 30, 20]
    assert "chain cut" in caplog.text


def test_a_self_link_and_a_slot_outside_the_file_end_the_walk(make_file, caplog) -> None:
    file = make_file(slot_count=2, entry_count=8)
    file.append([0], 10, TS)
    file.append([0], 20, TS)
    poke(file.path, entry_position(2, 2) + 16, fmt.SLOT.pack(2))  # entry 2 -> itself
    assert all_of(file, 0) == [20]
    poke(file.path, fmt.SLOTS_POSITION, fmt.SLOT.pack(1000))  # slot 0 -> past the file
    assert all_of(file, 0) == []
    poke(file.path, fmt.SLOTS_POSITION, fmt.SLOT.pack(-3))
    assert all_of(file, 0) == []
    assert "outside the file" in caplog.text


def test_a_corrupt_count_read_by_a_reader_is_clamped(make_file, caplog) -> None:
    file = make_file(slot_count=1, entry_count=8)
    file.append([7], 10, TS)
    reader = IndexFile.open(file.path, read_only=True)
    try:
        poke(file.path, fmt.INDEX_COUNT_POSITION, fmt.SLOT.pack(10**6))
        assert reader.published_count() == reader.capacity
        assert list(reader.candidates(7, *EVERYTHING)) == [10]  # no read past the file
        assert "outside" in caplog.text
    finally:
        reader.close()


def test_unpublished_entries_are_invisible_and_repaired(make_file) -> None:
    file = make_file(slot_count=1, entry_count=16)
    for i in range(6):
        file.append([7 + i % 2], i * 10, TS)
    # A killed writer: entries 5 and 6 and the slot written, the count still 4.
    poke(file.path, fmt.INDEX_COUNT_POSITION, fmt.SLOT.pack(4))
    reader = IndexFile.open(file.path, read_only=True)
    try:
        assert list(reader.candidates(7, *EVERYTHING)) == [20, 0]
        assert list(reader.candidates(8, *EVERYTHING)) == [30, 10]
    finally:
        reader.close()
    path = file.path
    file.close()
    writer = IndexFile.open(path, read_only=False)
    try:
        assert writer.repair_slots() == 1
        assert int(writer._slots[0]) == 4
        assert writer.repair_slots() == 0
        writer.append([8], 40, TS)  # entry 5 again, linked to 4
        assert all_of(writer, 8) == [40, 30, 10]
    finally:
        writer.close()


# ------------------------------------------------------ batch, truncation, search


def region(file: IndexFile) -> bytes:
    """Slots and entries (the header's end time may legitimately differ)."""
    return bytes(file._raw[fmt.SLOTS_POSITION :])


hash_lists = st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(first=hash_lists, second=hash_lists, slot_count=st.integers(1, 5))
def test_append_batch_writes_the_same_bytes_as_append(
    tmp_path_factory, first: list[int], second: list[int], slot_count: int
) -> None:
    directory = str(tmp_path_factory.mktemp("batch"))
    one = IndexFile.create(directory, "20231114221320001", slot_count, 128)
    batch = IndexFile.create(directory, "20231114221320002", slot_count, 128)
    try:
        for i, key_hash in enumerate(first + second):
            one.append([key_hash], 100 + i, TS + i * 300)
        for part, start in ((first, 0), (second, len(first))):
            numbers = np.arange(start, start + len(part), dtype=np.int64)
            batch.append_batch(np.array(part, dtype=np.int64), 100 + numbers, TS + numbers * 300)
        assert bytes(one._raw) == bytes(batch._raw)
    finally:
        one.close()
        batch.close()


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.integers(0, 3), min_size=1, max_size=50),
    cut=st.integers(0, 160),
    slot_count=st.integers(1, 4),
)
def test_truncate_leaves_the_file_as_if_only_the_survivors_were_appended(
    tmp_path_factory, gaps: list[int], cut: int, slot_count: int
) -> None:
    directory = str(tmp_path_factory.mktemp("truncate"))
    offsets = np.cumsum(gaps).tolist()  # non-decreasing, repeats = keys of one message
    full = IndexFile.create(directory, "20231114221320001", slot_count, 64)
    survivors = IndexFile.create(directory, "20231114221320002", slot_count, 64)
    try:
        for i, offset in enumerate(offsets):
            full.append([i * 7919 % 97], offset, TS + i * 700)
            if offset < cut:
                survivors.append([i * 7919 % 97], offset, TS + i * 700)
        first = full.first_entry_at_or_beyond(cut)
        assert first == 1 + sum(1 for offset in offsets if offset < cut)  # binary search
        if first < 2 or first > full.index_count:
            return  # the service deletes a wholly removed file; nothing to cut
        full.truncate_from(first)
        assert region(full) == region(survivors)
        assert full.header().index_count == survivors.header().index_count
        assert full.end_offset == survivors.end_offset
        assert full.header().end_ts_ms >= survivors.header().end_ts_ms  # still an upper bound
        assert full.header().end_ts_ms < survivors.header().end_ts_ms + 1000
    finally:
        full.close()
        survivors.close()


def test_delta_fits_rolls_before_an_i32_overflow(make_file) -> None:
    file = make_file()
    assert file.delta_fits(TS)  # empty, no base yet
    file.append([1], 0, TS)
    assert file.delta_fits(TS + fmt.TIME_DELTA_MAX_S * 1000 + 999)
    assert not file.delta_fits(TS + (fmt.TIME_DELTA_MAX_S + 1) * 1000)


def test_close_while_a_walk_holds_a_view_is_not_an_error(make_file) -> None:
    """Regression: close() raised BufferError when a concurrent query still held a
    view of the mapping (a walk racing retention or the store's close)."""
    file = make_file()
    view = memoryview(file._mm)  # what a running walk holds
    file.close()  # the mapping is released with the view, not by force
    file.close()  # and a second close is harmless
    assert len(view) > 0
    view.release()
