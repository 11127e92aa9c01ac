"""LogSegment: append, read, look-ups, roll conditions, recovery, deletion."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from mqstore.commitlog.errors import CorruptDataError
from mqstore.engine import ProducerRecord
from mqstore.segmented import batch_builder
from mqstore.segmented.index_file import MappedIndexCache
from mqstore.segmented.record_batch import set_base_offset
from mqstore.segmented.segment import LogSegment, SegmentSettings
from mqstore.segmented.time_index import NO_TIMESTAMP

SETTINGS = SegmentSettings(index_interval_bytes=300, index_max_bytes=4096)


def _segment(tmp_path, base=0, settings=SETTINGS) -> LogSegment:
    return LogSegment.create(str(tmp_path), base, settings, MappedIndexCache(16))


def _append(segment: LogSegment, next_offset: int, timestamps: list[int], size=80) -> int:
    records = [ProducerRecord(None, bytes([t % 256]) * size, [], t) for t in timestamps]
    built = batch_builder.build(records, 0, False, 1 << 20)
    set_base_offset(built.batch, next_offset)
    segment.append(built.batch, next_offset + len(records) - 1, built.max_timestamp_ms)
    return next_offset + len(records)


def _fill(segment: LogSegment, batches: list[list[int]]) -> list[tuple[int, int]]:
    """Append batches of the given timestamps; return every (offset, timestamp)."""
    model, offset = [], segment.base_offset
    for timestamps in batches:
        model += [(offset + i, t) for i, t in enumerate(timestamps)]
        offset = _append(segment, offset, timestamps)
    return model


BATCHES = [[5, 3], [9], [9, 2, 11], [1], [20, 20], [15], [30, 4, 8], [31]] * 4


def test_read_from_any_offset_including_mid_batch(tmp_path):
    segment = _segment(tmp_path, base=100)
    model = _fill(segment, BATCHES)
    assert segment.offset_index.entries > 2  # the scans start from index entries
    for start in range(100, 100 + len(model)):
        records, _ = segment.read(start, 3, 1 << 20, segment.size_bytes)
        assert [(r.offset, r.timestamp_ms) for r in records] == model[start - 100 : start - 97]
    records, decoded = segment.read(100, 1000, 1, segment.size_bytes)  # byte limit
    assert [r.offset for r in records] == [100, 101] and decoded > 0  # one whole batch
    segment.close_files()


def test_find_offset_by_timestamp_matches_a_scan(tmp_path):
    segment = _segment(tmp_path)
    model = _fill(segment, BATCHES)
    for target in range(-1, 35):
        for start in (0, 7, 20):
            expected = next(((o, t) for o, t in model if t >= target and o >= start), None)
            assert segment.find_offset_by_timestamp(target, start, segment.size_bytes) == expected
    segment.close_files()


def test_recovery_rebuilds_the_very_same_indexes(tmp_path):
    segment = _segment(tmp_path)
    _fill(segment, BATCHES)
    segment.become_inactive()
    index_bytes = Path(segment.offset_index.path).read_bytes()
    time_bytes = Path(segment.time_index.path).read_bytes()
    assert index_bytes and time_bytes
    result = segment.recover()
    segment.become_inactive()
    assert result.truncated_bytes == 0
    assert result.next_offset == sum(len(b) for b in BATCHES)
    assert Path(segment.offset_index.path).read_bytes() == index_bytes
    assert Path(segment.time_index.path).read_bytes() == time_bytes
    assert segment.max_timestamp_ms == 31
    segment.close_files()


def test_recovery_truncates_at_a_torn_batch_and_at_an_offset_going_back(tmp_path):
    segment = _segment(tmp_path)
    _fill(segment, BATCHES[:6])
    size = segment.size_bytes
    with open(segment.log_path, "r+b") as handle:
        handle.truncate(size - 7)  # the last batch is torn
    result = segment.recover()
    assert result.next_offset == sum(len(b) for b in BATCHES[:5])
    assert result.truncated_bytes == (size - 7) - segment.size_bytes > 0
    assert os.path.getsize(segment.log_path) == segment.size_bytes

    # base_offset is outside the CRC: recovery checks that offsets never go back
    # (a gap is legal: compaction leaves them).
    positions = []
    for position, header, _, _ in segment._batches(0, segment.size_bytes):
        positions.append((position, header.base_offset))
    gap_position, gap_offset = positions[2]
    with open(segment.log_path, "r+b") as handle:
        handle.seek(gap_position)
        handle.write(struct.pack(">q", gap_offset - 1))
    result = segment.recover()
    assert result.next_offset == gap_offset
    assert segment.size_bytes == gap_position
    segment.close_files()


def test_reads_refuse_corrupt_batches(tmp_path):
    segment = _segment(tmp_path)
    _fill(segment, BATCHES[:4])
    with open(segment.log_path, "r+b") as handle:
        handle.seek(segment.size_bytes - 3)
        handle.write(b"\xff")
    with pytest.raises(CorruptDataError) as caught:
        segment.read(0, 100, 1 << 20, segment.size_bytes)
    assert caught.value.path == segment.log_path and caught.value.position > 0
    segment.close_files()


def test_should_roll_on_size_time_full_indexes_and_offset_overflow(tmp_path):
    segment = _segment(tmp_path, base=10)
    assert not segment.should_roll(10**6, 10**12, 2**40, 1024, 1)  # an empty segment never does
    _append(segment, 10, [1_000])
    size = segment.size_bytes
    assert not segment.should_roll(100, 1_000, 11, size + 100, 500)
    assert segment.should_roll(101, 1_000, 11, size + 100, 500)  # size + batch > segment_bytes
    assert not segment.should_roll(100, 1_500, 11, 1 << 30, 500)
    assert segment.should_roll(100, 1_501, 11, 1 << 30, 500)  # 501 ms after the first batch
    assert not segment.should_roll(100, 1_000, 10 + 2**31 - 1, 1 << 30, 500)
    assert segment.should_roll(100, 1_000, 10 + 2**31, 1 << 30, 500)  # relative offset > int32
    segment.close_files()

    tiny = SegmentSettings(index_interval_bytes=0, index_max_bytes=24)  # 3 + 2 entries
    os.makedirs(tmp_path / "full")
    full = LogSegment.create(str(tmp_path / "full"), 0, tiny, MappedIndexCache(4))
    _append(full, 0, [1])
    assert not full.should_roll(10, 1, 1, 1 << 30, 1 << 40)
    _append(full, 1, [2])  # indexed: the time index holds 1 of 2 and keeps 1 for the roll
    assert full.time_index.is_full and full.should_roll(10, 1, 2, 1 << 30, 1 << 40)
    full.close_files()


def test_become_inactive_records_the_final_timestamp_and_trims(tmp_path):
    segment = _segment(tmp_path)
    _fill(segment, [[7], [3], [40], [2]])
    assert os.path.getsize(segment.offset_index.path) == 4096  # preallocated
    segment.become_inactive()
    assert os.path.getsize(segment.offset_index.path) == 8 * segment.offset_index.entries
    assert segment.time_index.last_entry() == (40, 2)  # the largest timestamp, its batch
    assert not segment.offset_index.is_mapped and not segment.time_index.is_mapped
    segment.close_files()


def test_deletion_waits_for_pinned_readers(tmp_path):
    segment = _segment(tmp_path)
    _fill(segment, [[1], [2]])
    assert segment.pin()
    segment.mark_deleted()
    assert segment.log_path.endswith(".log.deleted") and os.path.exists(segment.log_path)
    assert not segment.pin()  # no new readers
    records, _ = segment.read(0, 10, 1 << 20, segment.size_bytes)  # the pinned one reads on
    assert [r.offset for r in records] == [0, 1]
    assert not segment.destroy()
    segment.unpin()
    assert segment.destroy()
    assert os.listdir(tmp_path) == []


def test_empty_segment_has_no_timestamp(tmp_path):
    segment = _segment(tmp_path)
    assert segment.max_timestamp_ms == NO_TIMESTAMP
    assert segment.find_offset_by_timestamp(0, 0, 0) is None
    assert segment.read_next_offset() == 0
    segment.close_files()
