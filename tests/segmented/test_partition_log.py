"""PartitionLog: rolling, offset and time look-ups across segments (against a
brute-force model), retention predicates, reads racing retention."""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.engine import ProducerRecord
from mqstore.segmented import SegmentedConfig, SegmentedStore
from mqstore.segmented.record_batch import check_batch

from .conftest import SMALL, FakeClock, record, segment_files
from .strategies import timed_batches

TOPIC = "t"


def _log(store: SegmentedStore, partition: int = 0):
    return store._logs[(TOPIC, partition)]


def _segment_batches(path: str) -> list[int]:
    """Sizes of the batches in a .log file."""
    data, sizes, position = Path(path).read_bytes(), [], 0
    while position < len(data):
        sizes.append(check_batch(data, position).size)
        position += sizes[-1]
    return sizes


def test_rolls_when_the_next_batch_would_pass_segment_bytes(open_store, tmp_path):
    config = SegmentedConfig(**{**SMALL, "segment_bytes": 1024})
    store = open_store(config)
    store.create_topic(TOPIC)
    for i in range(40):
        store.append_records(TOPIC, 0, [record(b"x" * (60 + i))])
    files = segment_files(str(tmp_path / "store" / "t-0"))
    assert len(files) > 5
    for path, following in itertools.pairwise(files):
        sizes = _segment_batches(path)
        assert sum(sizes) <= 1024  # never past segment_bytes...
        first_of_next = _segment_batches(following)[0]
        assert sum(sizes) + first_of_next > 1024  # ...and rolled only when it had to
        base = int(os.path.basename(following)[:20])
        assert base == int(os.path.basename(path)[:20]) + len(sizes)


def test_rolls_when_an_index_is_full(open_store, tmp_path):
    # 48 bytes: the offset index holds 6 entries, the time index 4 (3 + the roll's).
    config = SegmentedConfig(**{**SMALL, "index_interval_bytes": 0, "index_max_bytes": 48})
    store = open_store(config)
    store.create_topic("t", partitions=2)
    for i in range(24):
        store.append_records(TOPIC, 0, [record(timestamp_ms=1000 + i)])  # growing times
        store.append_records(TOPIC, 1, [record(timestamp_ms=1000)])  # one timestamp
    growing = segment_files(str(tmp_path / "store" / "t-0"))
    flat = segment_files(str(tmp_path / "store" / "t-1"))
    # Every batch after the first is indexed. Growing times fill the time index after
    # 3 entries (4 batches); a flat time keeps 1 time entry, and the offset index fills
    # after 6 entries (7 batches).
    assert [int(os.path.basename(p)[:20]) for p in growing] == [0, 4, 8, 12, 16, 20]
    assert [int(os.path.basename(p)[:20]) for p in flat] == [0, 7, 14, 21]
    assert os.path.getsize(flat[0].replace(".log", ".index")) == 48


def test_rolls_on_segment_ms_from_the_first_batch_timestamp(open_store):
    store = open_store(SegmentedConfig(**{**SMALL, "segment_ms": 1000}))
    store.create_topic(TOPIC)
    for timestamp in (5_000, 5_600, 6_000, 6_001, 6_500, 7_002):
        store.append_records(TOPIC, 0, [record(timestamp_ms=timestamp)])
    assert [s.base_offset for s in _log(store).segments] == [0, 3, 5]


def _check_against_model(store: SegmentedStore, model: list[tuple[int, bytes]], start: int):
    """Every look-up of partition 0 answers as a scan of ``model`` would."""
    end = len(model)
    assert store.earliest_offset(TOPIC, 0) == start and store.latest_offset(TOPIC, 0) == end
    for offset in range(start, end + 1):
        for count in (1, 3):
            got = store.read_records(TOPIC, 0, offset, count)
            assert [(r.offset, r.timestamp_ms, r.value) for r in got] == [
                (o, *model[o]) for o in range(offset, min(offset + count, end))
            ]
    timestamps = [t for t, _ in model[start:]] or [0]
    # Before the first timestamp, on every one, between, and after the last.
    for target in range(max(0, min(timestamps) - 2), max(timestamps) + 3):
        expected = next(
            ((o, model[o][0]) for o in range(start, end) if model[o][0] >= target), None
        )
        assert store.offset_for_timestamp(TOPIC, 0, target) == expected


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(timed_batches, min_size=1, max_size=30),
    index_interval_bytes=st.sampled_from([0, 150, 4096]),
    index_max_bytes=st.sampled_from([24, 64, 4096]),
    log_start_fraction=st.floats(0, 1),
)
def test_lookups_across_segments_match_a_brute_force_model(
    batches, index_interval_bytes, index_max_bytes, log_start_fraction
):
    config = SegmentedConfig(
        **{
            **SMALL,
            "segment_bytes": 1024,
            "index_interval_bytes": index_interval_bytes,
            "index_max_bytes": index_max_bytes,
        }
    )
    model: list[tuple[int, bytes]] = []
    with tempfile.TemporaryDirectory() as root:
        store = SegmentedStore.open(root, config, clock_ms=FakeClock())
        try:
            store.create_topic(TOPIC)
            for batch in batches:
                store.append_records(TOPIC, 0, batch)
                model += [(r.timestamp_ms, r.value) for r in batch]
            _check_against_model(store, model, 0)
            start = int(log_start_fraction * len(model))
            store.delete_records(TOPIC, 0, start)  # the log start inside a segment
            _check_against_model(store, model, start)
            store.close()
            store = SegmentedStore.open(root, config, clock_ms=FakeClock())  # clean: trusted
            _check_against_model(store, model, start)
            store._crash()
            os.unlink(os.path.join(root, "recovery-point-offset-checkpoint"))
            store = SegmentedStore.open(root, config, clock_ms=FakeClock())  # indexes rebuilt
            assert store.recovered_from_crash
            _check_against_model(store, model, start)
        finally:
            store.close()


def test_retention_deletes_only_a_prefix_and_rolls_before_taking_everything(open_store, clock):
    store = open_store()
    store.create_topic(TOPIC)
    partition_log = _log(store)
    for i in range(60):
        store.append_records(TOPIC, 0, [record(b"x" * 100, timestamp_ms=1_000 + i)])
    segments = list(partition_log.segments)
    assert len(segments) >= 3
    # Only segments before the first one that must stay go, even if later ones qualify.
    keep = segments[1]
    deleted = partition_log._delete_prefix(lambda s, following: s is not keep)
    assert deleted == segments[:1]
    # When every segment qualifies, the active one is rolled first and an empty
    # active segment remains.
    deleted = partition_log._delete_prefix(lambda s, following: True)
    assert deleted == segments[1:]
    assert [s.size_bytes for s in partition_log.segments] == [0]
    assert store.earliest_offset(TOPIC, 0) == store.latest_offset(TOPIC, 0) == 60
    assert partition_log._delete_prefix(lambda s, following: True) == []


def test_reads_racing_retention_see_records_or_out_of_range(open_store):
    store = open_store()
    store.create_topic(TOPIC)
    for i in range(300):
        store.append_records(TOPIC, 0, [ProducerRecord(None, b"%06d" % i, [], None)])
    stop = threading.Event()
    failures: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            start = store.earliest_offset(TOPIC, 0)
            try:
                got = store.read_records(TOPIC, 0, start, 50)
            except IndexError:  # OffsetOutOfRangeError: retention passed us
                continue
            except BaseException as error:
                failures.append(error)
                return
            if any(r.value != b"%06d" % r.offset for r in got):
                failures.append(AssertionError("wrong record"))
                return

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    for offset in range(0, 300, 20):
        store.delete_records(TOPIC, 0, offset)
        store.enforce_retention()
    stop.set()
    for thread in threads:
        thread.join()
    assert not failures
    store.delete_expired_files()  # segments a reader still pinned went afterwards
    assert store.stats()["pending_deletes"] == 0
    assert not [n for n in os.listdir(_log(store).directory) if n.endswith(".deleted")]
    assert store.earliest_offset(TOPIC, 0) == 280
