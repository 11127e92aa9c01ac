"""File ranges for a zero-copy fetch (SegmentedStore.read_slices, LogSegment.slice,
segmented.file_records): whole batches from the one holding the offset, bounded by
max_bytes and the published log end, pinned against retention until released."""

from __future__ import annotations

import os

import pytest

from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
)
from mqstore.segmented import SegmentedConfig
from mqstore.segmented.file_records import FileSlices
from mqstore.segmented.record_batch import decode_batches

from .conftest import SMALL, record

BIG = 1 << 30


def _bytes(slices: FileSlices) -> bytes:
    return b"".join(os.pread(s.fileno(), s.size_bytes, s.position) for s in slices.slices)


def _offsets(data: bytes, first_offset: int = 0) -> list[int]:
    decoded = decode_batches(data, 0, first_offset, BIG, BIG)
    assert decoded.advance_bytes == len(data)  # whole batches, nothing left over
    return [r.offset for r in decoded.records]


def _fill(store, batches: int, per_batch: int = 3, size: int = 100) -> None:
    for b in range(batches):
        store.append_records(
            "t", 0, [record(b"%04d" % (b * per_batch + i) * (size // 4)) for i in range(per_batch)]
        )


def test_slices_are_the_stored_batches_from_the_one_holding_the_offset(open_store):
    store = open_store()
    store.create_topic("t")
    _fill(store, 40)  # 120 records, several 4 KiB segments
    partition_log = store._logs[("t", 0)]
    assert len(partition_log.segments) > 2
    with store.read_slices("t", 0, 4, BIG) as slices:  # inside the second batch
        data = _bytes(slices)
        assert _offsets(data, 4) == list(range(4, 120))  # the batch's first record skipped
        assert _offsets(data)[:2] == [3, 4]  # ... but its bytes are whole, from offset 3
        assert len(slices.slices) == len(partition_log.segments)  # one per segment
        assert slices.records_count == 117 and slices.next_offset == 120
        # everything but the first batch (segment 0 starts at position 0)
        assert slices.size_bytes == partition_log.size_bytes - slices.slices[0].position > 0
    assert slices.released


def test_max_bytes_takes_whole_batches_and_always_the_first(open_store):
    store = open_store()
    store.create_topic("t")
    _fill(store, 6)
    first = store.read_slices("t", 0, 0, BIG)
    batch_bytes = first.slices[0].size_bytes // 6  # all batches are the same size
    first.release()
    for max_bytes, batches in ((0, 1), (1, 1), (batch_bytes - 1, 1), (batch_bytes, 1),
                               (2 * batch_bytes - 1, 1), (2 * batch_bytes, 2)):  # fmt: skip
        with store.read_slices("t", 0, 1, max_bytes) as slices:
            assert slices.size_bytes == batches * batch_bytes, max_bytes
            assert _offsets(_bytes(slices)) == list(range(3 * batches))


def test_at_the_log_end_nothing_and_outside_the_log_a_typed_error(open_store):
    store = open_store()
    store.create_topic("t")
    _fill(store, 2)
    with store.read_slices("t", 0, 6, BIG) as slices:
        assert slices.slices == () and slices.next_offset == 6
    with pytest.raises(OffsetOutOfRangeError):
        store.read_slices("t", 0, 7, BIG)
    with pytest.raises(OffsetOutOfRangeError):
        store.read_slices("t", 0, -1, BIG)
    for bad in (-1, 2**31, True, 1.5):
        with pytest.raises(InvalidArgumentError):
            store.read_slices("t", 0, 0, bad)


def test_a_batch_written_but_not_published_is_left_out(open_store):
    store = open_store()
    store.create_topic("t")
    _fill(store, 3)
    partition_log = store._logs[("t", 0)]
    partition_log.next_offset = 6  # as between the write and the publish of batch 3
    with store.read_slices("t", 0, 0, BIG) as slices:
        assert _offsets(_bytes(slices)) == list(range(6))
    with store.read_slices("t", 0, 6, BIG) as slices:  # the published end: nothing yet
        assert slices.slices == ()


def test_a_compaction_gap_yields_the_batch_after_it(open_store):
    config = SegmentedConfig(**{**SMALL, "segment_bytes": 1024, "index_interval_bytes": 64})
    store = open_store(config)
    store.create_topic("c", topic_configs={"cleanup.policy": "compact"})
    for i in range(60):
        store.append_records("c", 0, [record(b"value-%04d" % i, b"k%d" % (i % 3))])
    store._logs[("c", 0)].roll()
    assert store.compact("c")
    kept = [r.offset for r in store.read_records("c", 0, 0, 100)]
    assert kept[:3] == [57, 58, 59]  # every older record was superseded: a gap from 0
    for offset in (0, 30, 57):
        with store.read_slices("c", 0, offset, BIG) as slices:
            assert _offsets(_bytes(slices), offset) == [o for o in kept if o >= offset]


def test_a_pinned_slice_outlives_retention_until_released(open_store, tmp_path):
    store = open_store()
    store.create_topic("t")
    _fill(store, 40)
    slices = store.read_slices("t", 0, 0, BIG)
    expected = _bytes(slices)
    store.delete_records("t", 0, 110)
    assert store.enforce_retention() >= 2
    assert store.delete_expired_files() == 0  # pinned: renamed, not removed
    directory = os.path.join(tmp_path, "store", "t-0")
    assert any(name.endswith(".deleted") for name in os.listdir(directory))
    assert _bytes(slices) == expected  # the descriptors still read the same bytes
    slices.release()
    slices.release()  # idempotent
    assert store.delete_expired_files() >= 2
    assert not any(name.endswith(".deleted") for name in os.listdir(directory))


def test_a_corrupt_header_raises_and_pins_nothing(open_store, tmp_path):
    store = open_store()
    store.create_topic("t")
    _fill(store, 2)
    segment = store._logs[("t", 0)].segments[0]
    with open(segment.log_path, "r+b") as f:
        f.seek(segment.size_bytes // 2 + 16)  # the second batch's magic
        f.write(b"\x07")
    with pytest.raises(CorruptDataError) as caught:
        store.read_slices("t", 0, 3, BIG)
    assert caught.value.path == segment.log_path
    assert segment._pins == 0
