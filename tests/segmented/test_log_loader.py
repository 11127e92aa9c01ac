"""Opening a partition: clean shutdown trusts the files, a crash recovers from the
recovery point; torn tails, flipped bits, broken indexes and leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mqstore.commitlog.errors import CorruptDataError
from mqstore.segmented import SegmentedConfig
from mqstore.segmented.files import LOG_START_OFFSET_CHECKPOINT_NAME
from mqstore.segmented.record_batch import check_batch

from .conftest import SMALL, record, segment_files

TOPIC = "orders"


def _fill(store, count: int, partition: int = 0) -> None:
    for i in range(count):
        store.append_records(TOPIC, partition, [record(b"value-%04d" % i + b"." * 90)])


def _batches(path: str) -> list[tuple[int, int]]:
    """(position, size) of every batch in a .log file."""
    data, found, position = Path(path).read_bytes(), [], 0
    while position < len(data):
        size = check_batch(data, position).size
        found.append((position, size))
        position += size
    return found


def _flip(path: str, position: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([byte ^ 0x10]))


def _values(store, partition: int = 0) -> list[bytes]:
    records = store.read_records(TOPIC, partition, store.earliest_offset(TOPIC, partition), 10_000)
    return [r.value[:10] for r in records]


@pytest.fixture
def crashed(open_store, tmp_path):
    """A store with 60 records in several segments, then crashed (no marker)."""
    store = open_store()
    store.create_topic(TOPIC)
    _fill(store, 60)
    store._crash()
    directory = str(tmp_path / "store" / f"{TOPIC}-0")
    assert len(segment_files(directory)) >= 3
    return directory


@pytest.mark.parametrize("damage", ["cut mid-batch", "flipped bit"])
def test_torn_tail_is_truncated_after_a_crash(open_store, crashed, damage):
    last = segment_files(crashed)[-1]
    position, size = _batches(last)[-1]
    if damage == "cut mid-batch":
        os.truncate(last, position + size // 2)
    else:
        _flip(last, position + size - 5)  # inside the value, under the CRC
    store = open_store()
    assert store.recovered_from_crash
    assert store.latest_offset(TOPIC, 0) == 59
    assert os.path.getsize(last) == position
    assert _values(store)[-1] == b"value-0058"
    assert store.append_records(TOPIC, 0, [record(b"again")])[0].offset == 59
    assert store.read_records(TOPIC, 0, 59, 1)[0].value == b"again"


def test_a_bad_batch_in_a_middle_segment_drops_every_later_segment(open_store, crashed):
    files = segment_files(crashed)
    middle = files[1]
    position, _ = _batches(middle)[1]
    _flip(middle, position + 30)  # a timestamp byte, under the CRC
    first_offset = int(os.path.basename(middle)[:20])
    store = open_store()
    assert store.latest_offset(TOPIC, 0) == first_offset + 1
    assert segment_files(crashed) == files[:2]
    assert not [n for n in os.listdir(crashed) if n.endswith(".deleted")]
    assert len(_values(store)) == first_offset + 1


def test_clean_shutdown_trusts_the_files(open_store, tmp_path):
    store = open_store()
    store.create_topic(TOPIC)
    _fill(store, 60)
    store.close()
    directory = str(tmp_path / "store" / f"{TOPIC}-0")
    first = segment_files(directory)[0]
    position, size = _batches(first)[-1]
    _flip(first, position + size - 5)  # a bad batch in an old segment
    store = open_store()
    assert not store.recovered_from_crash
    assert store.latest_offset(TOPIC, 0) == 60  # not scanned, not truncated
    with pytest.raises(CorruptDataError) as caught:  # ...but never served either
        store.read_records(TOPIC, 0, 0, 10_000)
    assert caught.value.path == first and caught.value.position == position


def test_recovery_starts_at_the_recovery_point(open_store, tmp_path):
    store = open_store()
    store.create_topic(TOPIC)
    _fill(store, 60)
    store.flush()
    store.checkpoint_recovery_points()
    _fill(store, 30)
    store._crash()
    directory = str(tmp_path / "store" / f"{TOPIC}-0")
    files = segment_files(directory)
    position, _ = _batches(files[0])[1]
    _flip(files[0], position + 30)  # below the recovery point: not scanned
    os.unlink(files[-1].replace(".log", ".index"))  # in the recovered part: rebuilt
    store = open_store()
    assert store.recovered_from_crash
    assert store.latest_offset(TOPIC, 0) == 90
    assert segment_files(directory) == files
    assert os.path.exists(files[-1].replace(".log", ".index"))
    assert [r.offset for r in store.read_records(TOPIC, 0, 85, 10)] == list(range(85, 90))


@pytest.mark.parametrize(
    ("suffix", "damage"),
    [
        (".index", "missing"),
        (".timeindex", "missing"),
        (".index", "cut"),
        (".timeindex", "cut"),
        (".index", "ones"),
        (".timeindex", "ones"),
    ],
)
@pytest.mark.parametrize("which", [0, -1])  # an old segment, the active one
def test_broken_index_is_rebuilt_at_open(open_store, tmp_path, suffix, damage, which):
    store = open_store()
    store.create_topic(TOPIC)
    _fill(store, 60)
    store.close()
    directory = str(tmp_path / "store" / f"{TOPIC}-0")
    path = segment_files(directory, suffix)[which]
    original = Path(path).read_bytes()
    assert original
    if damage == "missing":
        os.unlink(path)
    elif damage == "cut":
        os.truncate(path, len(original) - 3)
    else:
        Path(path).write_bytes(b"\xff" * len(original))
    store = open_store()
    assert store.latest_offset(TOPIC, 0) == 60
    for start in (0, 17, 33, 59):
        assert store.read_records(TOPIC, 0, start, 1)[0].value[:10] == b"value-%04d" % start
    store.close()
    assert Path(path).read_bytes() == original


def test_leftovers_are_removed_at_open(open_store, tmp_path):
    store = open_store()
    store.create_topic(TOPIC)
    _fill(store, 5)
    store.close()
    directory = tmp_path / "store" / f"{TOPIC}-0"
    (directory / "00000000000000000003.log.deleted").write_bytes(b"old")
    (directory / "00000000000000099999.index").write_bytes(b"")
    (directory / "00000000000000099999.timeindex").write_bytes(b"")
    open_store().close()
    assert sorted(os.listdir(directory)) == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
    ]


def test_log_start_past_the_recovered_end_empties_the_log(open_store, tmp_path):
    store = open_store()
    store.create_topic(TOPIC)
    _fill(store, 10)
    store.delete_records(TOPIC, 0, 10)
    store._crash()
    directory = str(tmp_path / "store" / f"{TOPIC}-0")
    assert "orders 0 10" in (tmp_path / "store" / LOG_START_OFFSET_CHECKPOINT_NAME).read_text()
    os.truncate(segment_files(directory)[-1], _batches(segment_files(directory)[-1])[7][0])
    store = open_store()
    assert store.earliest_offset(TOPIC, 0) == store.latest_offset(TOPIC, 0) == 10
    assert store.read_records(TOPIC, 0, 10, 5) == []
    assert store.append_records(TOPIC, 0, [record()])[0].offset == 10
    assert segment_files(directory)[0].endswith("00000000000000000010.log")


def test_indexes_stay_sparse_through_crash_recovery(open_store, tmp_path):
    config = SegmentedConfig(**{**SMALL, "index_max_bytes": 1 << 20, "segment_bytes": 1 << 20})
    store = open_store(config)
    store.create_topic(TOPIC)
    _fill(store, 200)
    store._crash()  # the active indexes stay preallocated, 1 MiB each
    directory = tmp_path / "store" / f"{TOPIC}-0"
    index = directory / "00000000000000000000.index"
    assert index.stat().st_size == 1 << 20
    store = open_store(config)
    assert store.latest_offset(TOPIC, 0) == 200
    assert index.stat().st_size == 1 << 20
    assert index.stat().st_blocks * 512 < 64 * 1024  # only the pages entries landed in


def test_an_unfinished_cleaning_is_dropped_and_an_orphan_swap_index_too(open_store, tmp_path):
    store = open_store()
    store.create_topic(TOPIC)
    _fill(store, 5)
    store.close()
    directory = tmp_path / "store" / f"{TOPIC}-0"
    before = sorted(os.listdir(directory))
    (directory / "00000000000000000000.log.cleaned").write_bytes(b"partial")
    (directory / "00000000000000000000.index.cleaned").write_bytes(b"")
    (directory / "00000000000000000000.index.swap").write_bytes(b"")  # its .log never got there
    store = open_store()
    assert _values(store) == [b"value-%04d" % i for i in range(5)]
    store.close()
    assert sorted(os.listdir(directory)) == before
