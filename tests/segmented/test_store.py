"""SegmentedStore through the engine interface: kafka-python reads what it writes,
bad input, sync flush and group commit, a SIGKILLed writer, retention, long polls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kafka.record import MemoryRecords

from mqstore.commitlog.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    LimitExceededError,
    OffsetOutOfRangeError,
    StoreClosedError,
    StoreLockedError,
    UnknownTopicError,
)
from mqstore.engine import Engine, ProducerRecord
from mqstore.segmented import SegmentedConfig, SegmentedStore
from mqstore.segmented.files import CLEAN_SHUTDOWN_NAME, RECOVERY_POINT_CHECKPOINT_NAME

from .conftest import SMALL, record, segment_files, tree

DAY_MS = 24 * 3600 * 1000


def test_it_is_an_engine(open_store):
    assert isinstance(open_store(), Engine)


def test_kafka_python_decodes_every_batch_written(open_store, tmp_path, clock):
    store = open_store()
    store.create_topic("create", partitions=2)
    store.create_topic("append", timestamp_type="LogAppendTime")
    sent: dict[tuple[str, int], list] = {}
    for i in range(120):
        topic, partition = [("create", 0), ("create", 1), ("append", 0)][i % 3]
        count = 1 + i % 4
        batch = [
            ProducerRecord(
                None if (i + j) % 5 == 0 else b"key-%d-%d" % (i, j),
                None if (i + j) % 7 == 0 else b"value-%d-%d" % (i, j) * (1 + i % 9),
                [("trace", b"%d" % i), ("ü", b"")] if j % 2 else [],
                None if i % 2 else 1_600_000_000_000 - i * 1000 + j,  # CreateTime going back
            )
            for j in range(count)
        ]
        clock.advance(7)
        appended = store.append_records(topic, partition, batch)
        for sent_record, result in zip(batch, appended, strict=True):
            sent.setdefault((topic, partition), []).append((result, sent_record))
    store.close()

    for (topic, partition), expected in sent.items():
        decoded = []
        for path in segment_files(str(tmp_path / "store" / f"{topic}-{partition}")):
            batches = MemoryRecords(Path(path).read_bytes())
            while (batch := batches.next_batch()) is not None:
                assert batch.validate_crc() and batch.magic == 2
                decoded += [(batch, r) for r in batch]
        assert len(decoded) == len(expected) > 30
        for (batch, theirs), (result, mine) in zip(decoded, expected, strict=True):
            assert theirs.offset == result.offset
            assert theirs.timestamp == result.timestamp_ms
            assert batch.timestamp_type == (1 if topic == "append" else 0)
            if topic == "create" and mine.timestamp_ms is not None:
                assert theirs.timestamp == mine.timestamp_ms
            assert theirs.key == mine.key and theirs.value == mine.value
            assert theirs.headers == list(mine.headers)


def test_append_and_read_round_trip_through_the_interface(open_store, clock):
    store = open_store()
    store.create_topic("t", partitions=3)
    results = store.append_records(
        "t", 2, [record(b"a", key=b"k", headers=[("h", b"1")], timestamp_ms=5), record(None)]
    )
    assert [(r.offset, r.timestamp_ms) for r in results] == [(0, 5), (1, clock.now_ms)]
    assert (results[0].serialized_key_size, results[0].serialized_header_size) == (1, 2)
    assert (results[1].serialized_key_size, results[1].serialized_value_size) == (-1, -1)
    first, second = store.read_records("t", 2, 0, 10)
    assert (first.key, first.value, first.headers, first.timestamp_type) == (
        b"k",
        b"a",
        [("h", b"1")],
        0,
    )
    assert first.checksum == second.checksum and first.checksum is not None  # one batch
    assert store.read_records("t", 2, 1, 10) == [second]  # from inside the batch
    assert store.read_records("t", 2, 2, 10) == []  # at the end
    assert store.latest_offset("t", 2) == 2 and store.earliest_offset("t", 2) == 0
    assert store.offset_for_timestamp("t", 2, 6) == (1, clock.now_ms)
    assert store.offset_for_timestamp("t", 2, clock.now_ms + 1) is None


def test_topics_are_listed_described_grown_and_persisted(open_store):
    store = open_store()
    created = store.create_topic("orders", 2, retention_ms=1000)
    assert store.describe_topic("orders") == created and created.partitions == 2
    grown = store.add_partitions("orders", 5)
    assert grown.partitions == 5 and store.latest_offset("orders", 4) == 0
    store.append_records("orders", 4, [record()])
    store.offsets.commit("group", {("orders", 4): (1, "meta")})
    store.close()
    store = open_store()
    assert list(store.list_topics()) == ["orders"]
    assert store.list_topics()["orders"].retention_ms == 1000
    assert store.latest_offset("orders", 4) == 1
    assert store.offsets.load("group") == {("orders", 4): (1, "meta")}


BAD_CALLS = [
    (UnknownTopicError, lambda s: s.append_records("nope", 0, [record()])),
    (UnknownTopicError, lambda s: s.append_records("t", 2, [record()])),
    (UnknownTopicError, lambda s: s.read_records("t", -1, 0, 1)),
    (UnknownTopicError, lambda s: s.latest_offset("nope", 0)),
    (UnknownTopicError, lambda s: s.describe_topic("nope")),
    (UnknownTopicError, lambda s: s.add_partitions("nope", 3)),
    (InvalidTypeError, lambda s: s.append_records("t", True, [record()])),
    (InvalidTypeError, lambda s: s.append_records("t", "0", [record()])),
    (InvalidArgumentError, lambda s: s.append_records("", 0, [record()])),
    (InvalidArgumentError, lambda s: s.append_records("../t", 0, [record()])),
    (InvalidArgumentError, lambda s: s.create_topic("..")),
    (InvalidArgumentError, lambda s: s.create_topic("a/b")),
    (InvalidTypeError, lambda s: s.create_topic(7)),
    (InvalidArgumentError, lambda s: s.create_topic("t")),  # exists
    (InvalidArgumentError, lambda s: s.create_topic("u", 0)),
    (InvalidArgumentError, lambda s: s.create_topic("u", timestamp_type="Later")),
    (InvalidArgumentError, lambda s: s.add_partitions("t", 2)),  # does not grow
    (LimitExceededError, lambda s: s.append_records("t", 0, [record(b"x" * 5000)])),
    (LimitExceededError, lambda s: s.append_records("t", 0, [record(b"x" * 900)] * 5)),
    (InvalidArgumentError, lambda s: s.append_records("t", 0, [])),
    (InvalidTypeError, lambda s: s.append_records("t", 0, [record("text")])),
    (InvalidTypeError, lambda s: s.append_records("t", 0, [record(key=5)])),
    (InvalidTypeError, lambda s: s.append_records("t", 0, [record(headers=[(b"k", b"v")])])),
    (InvalidTypeError, lambda s: s.append_records("t", 0, [record(headers=[("k", "v")])])),
    (InvalidTypeError, lambda s: s.append_records("t", 0, [record(), (None, b"v", [], None)])),
    (InvalidArgumentError, lambda s: s.append_records("t", 0, [record(timestamp_ms=-1)])),
    (InvalidTypeError, lambda s: s.append_records("t", 0, [record(timestamp_ms=1.5)])),
    (OffsetOutOfRangeError, lambda s: s.read_records("t", 0, -1, 1)),
    (OffsetOutOfRangeError, lambda s: s.read_records("t", 0, 4, 1)),  # past the end (3)
    (OffsetOutOfRangeError, lambda s: s.delete_records("t", 0, 4)),
    (OffsetOutOfRangeError, lambda s: s.delete_records("t", 0, -2)),
    (InvalidArgumentError, lambda s: s.read_records("t", 0, 0, 0)),
    (InvalidArgumentError, lambda s: s.read_records("t", 0, 0, 10**9)),
    (InvalidTypeError, lambda s: s.read_records("t", 0, 1.0, 1)),
    (InvalidArgumentError, lambda s: s.offset_for_timestamp("t", 0, -5)),
    (InvalidArgumentError, lambda s: s.wait_for_data([("t", 0, 0)], -1)),
    (UnknownTopicError, lambda s: s.wait_for_data([("t", 9, 0)], 0)),
]


@pytest.mark.parametrize(("error", "call"), BAD_CALLS)
def test_bad_input_raises_a_typed_error_and_changes_nothing(open_store, tmp_path, error, call):
    # auto_create_topics off: a write to "nope" is refused (tests/mqstore/test_topics.py)
    config = {**SMALL, "max_message_size_bytes": 4096, "auto_create_topics": False}
    store = open_store(SegmentedConfig(**config))
    store.create_topic("t", 2)
    store.append_records("t", 0, [record(b"a"), record(b"b"), record(b"c")])
    before = tree(str(tmp_path / "store"))
    with pytest.raises(error):
        call(store)
    assert tree(str(tmp_path / "store")) == before
    assert store.latest_offset("t", 0) == 3 and store.earliest_offset("t", 0) == 0
    assert [r.value for r in store.read_records("t", 0, 0, 10)] == [b"a", b"b", b"c"]


def test_config_must_be_a_segmented_config(tmp_path):
    with pytest.raises(InvalidTypeError):
        SegmentedStore.open(tmp_path, {"segment_bytes": 1})  # type: ignore[arg-type]


def test_a_second_writer_is_refused_and_a_closed_store_refuses_calls(open_store):
    store = open_store()
    with pytest.raises(StoreLockedError):
        open_store()
    store.create_topic("t")
    store.close()
    for call in (
        lambda: store.append_records("t", 0, [record()]),
        lambda: store.read_records("t", 0, 0, 1),
        lambda: store.create_topic("u"),
    ):
        with pytest.raises(StoreClosedError):
            call()
    store.close()  # twice is fine


def test_clean_close_writes_the_marker_and_recovery_points(open_store, tmp_path):
    store = open_store()
    store.create_topic("t", 2)
    store.append_records("t", 1, [record()] * 3)
    assert not (tmp_path / "store" / CLEAN_SHUTDOWN_NAME).exists()
    store.close()
    assert (tmp_path / "store" / CLEAN_SHUTDOWN_NAME).exists()
    assert (tmp_path / "store" / RECOVERY_POINT_CHECKPOINT_NAME).read_text() == (
        "0\n2\nt 0 0\nt 1 3\n"
    )
    store = open_store()
    assert not (tmp_path / "store" / CLEAN_SHUTDOWN_NAME).exists()  # a crash from now on
    assert not store.recovered_from_crash


# ---------------------------------------------------------------------- sync flush


@pytest.fixture
def synced(monkeypatch):
    """Records, per fd, the file size each fdatasync covered; optionally slow."""
    real = os.fdatasync
    calls: list[tuple[int, int]] = []
    delay = {"s": 0.0}

    def fdatasync(fd: int) -> None:
        size = os.fstat(fd).st_size
        if delay["s"]:
            time.sleep(delay["s"])  # a slow disk: lets appenders queue up behind a flush
        real(fd)
        calls.append((fd, size))

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return calls, delay


def test_sync_mode_acknowledges_only_after_the_log_is_synced(open_store, synced):
    calls, _ = synced
    store = open_store(SegmentedConfig(**{**SMALL, "flush_mode": "sync"}))
    store.create_topic("t")
    partition_log = store._logs[("t", 0)]
    for _ in range(30):  # rolls several times
        store.append_records("t", 0, [record(b"x" * 200)])
        active = partition_log.segments[-1]
        synced_sizes = [size for fd, size in calls if fd == active._fd]
        assert synced_sizes and synced_sizes[-1] == active.size_bytes
    assert len(partition_log.segments) > 1


def test_a_producer_pays_one_sync_per_partition_touched(open_store, synced):
    calls, _ = synced
    store = open_store(SegmentedConfig(**{**SMALL, "flush_mode": "sync"}))
    store.create_topic("t", 4)
    calls.clear()
    for partition in range(4):
        store.append_records("t", partition, [record()])
    fds = {store._logs[("t", p)].segments[-1]._fd for p in range(4)}
    assert len(calls) == 4 and {fd for fd, _ in calls} == fds


def test_concurrent_appenders_to_one_partition_share_syncs(open_store, synced):
    calls, delay = synced
    delay["s"] = 0.003
    store = open_store(SegmentedConfig(**{**SMALL, "flush_mode": "sync", "segment_bytes": 1 << 20}))
    store.create_topic("t")
    calls.clear()
    threads_count, per_thread = 8, 10
    start = threading.Barrier(threads_count)
    offsets: list[int] = []

    def produce(n: int) -> None:
        start.wait()
        for i in range(per_thread):
            offsets.append(store.append_records("t", 0, [record(b"%d-%d" % (n, i))])[0].offset)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(offsets) == list(range(threads_count * per_thread))
    assert len(calls) < threads_count * per_thread // 2  # grouped
    assert store._logs[("t", 0)].durable_offset == threads_count * per_thread


CHILD = """
import sys
from mqstore.engine import ProducerRecord
from mqstore.segmented import SegmentedConfig, SegmentedStore
store = SegmentedStore.open(sys.argv[1], SegmentedConfig(
    flush_mode="sync", segment_bytes=8192, index_interval_bytes=512, index_max_bytes=4096))
if "t" not in store.list_topics():
    store.create_topic("t", 2)
i = 0
while True:
    partition = i % 2
    value = b"record-%d" % i
    [appended] = store.append_records("t", partition, [ProducerRecord(None, value, [], None)])
    print(partition, appended.offset, i, flush=True)
    i += 1
"""


def test_sigkilled_sync_writer_loses_no_acknowledged_record(tmp_path):
    root = str(tmp_path / "store")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, root], stdout=subprocess.PIPE, text=True, env=env
    )
    acked: list[tuple[int, int, int]] = []
    assert child.stdout is not None
    for line in child.stdout:
        acked.append(tuple(int(field) for field in line.split()))  # type: ignore[misc]
        if len(acked) == 400:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    with SegmentedStore.open(root, SegmentedConfig(**SMALL)) as store:
        assert store.recovered_from_crash
        for partition in (0, 1):
            records = store.read_records("t", partition, 0, 10_000)
            values = {r.offset: r.value for r in records}
            mine = [(offset, i) for p, offset, i in acked if p == partition]
            assert all(values[offset] == b"record-%d" % i for offset, i in mine)
            assert [r.offset for r in records] == list(range(len(records)))


# ---------------------------------------------------------------------- retention


def _deleted_files(tmp_path, partition_dir: str = "t-0") -> list[str]:
    return [n for n in os.listdir(tmp_path / "store" / partition_dir) if n.endswith(".deleted")]


def test_retention_by_time_uses_each_segment_largest_timestamp(open_store, clock):
    store = open_store(SegmentedConfig(**{**SMALL, "retention_ms": DAY_MS}))
    store.create_topic("t")
    store.create_topic("keep", retention_ms=-1)
    for i in range(80):  # about 4 segments; one old record sits in the third
        old = i < 40 or i == 50
        timestamp = clock.now_ms - 2 * DAY_MS if old else clock.now_ms
        store.append_records("t", 0, [record(b"x" * 150, timestamp_ms=timestamp)])
        store.append_records("keep", 0, [record(b"x" * 150, timestamp_ms=timestamp)])
    segments = store._logs[("t", 0)].segments
    old_segments = [s for s in segments if s.max_timestamp_ms < clock.now_ms - DAY_MS]
    assert 0 < len(old_segments) < len(segments) - 1
    assert store.enforce_retention() == len(old_segments)
    assert store.earliest_offset("t", 0) == store._logs[("t", 0)].segments[0].base_offset
    assert store.earliest_offset("keep", 0) == 0
    clock.advance(DAY_MS + 1)  # now the newer records are old too: everything goes
    store.enforce_retention()
    assert store.earliest_offset("t", 0) == store.latest_offset("t", 0) == 80
    assert store.read_records("t", 0, 80, 1) == []
    with pytest.raises(OffsetOutOfRangeError):
        store.read_records("t", 0, 79, 1)


def test_retention_by_size_keeps_retention_bytes_and_less_than_a_segment_more(open_store):
    # Kafka deletes the oldest segment while what stays is still >= retention.bytes.
    store = open_store(SegmentedConfig(**{**SMALL, "retention_bytes": 10_000}))
    store.create_topic("t")
    for _ in range(200):
        store.append_records("t", 0, [record(b"x" * 150)])
    partition_log = store._logs[("t", 0)]
    assert partition_log.size_bytes > 2 * 10_000
    assert store.enforce_retention() > 0
    kept = partition_log.size_bytes
    assert 10_000 <= kept < 10_000 + partition_log.segments[0].size_bytes
    assert store.earliest_offset("t", 0) == partition_log.segments[0].base_offset > 0
    assert store.enforce_retention() == 0


def test_retention_by_log_start_offset(open_store):
    store = open_store()
    store.create_topic("t")
    for i in range(100):
        store.append_records("t", 0, [record(b"%03d" % i + b"x" * 150)])
    assert store.delete_records("t", 0, 55) == 55
    assert store.read_records("t", 0, 55, 1)[0].value[:3] == b"055"
    with pytest.raises(OffsetOutOfRangeError):
        store.read_records("t", 0, 54, 1)
    deleted = store.enforce_retention()
    partition_log = store._logs[("t", 0)]
    assert deleted > 0 and partition_log.segments[0].base_offset <= 55
    assert len(partition_log.segments) == 1 or partition_log.segments[1].base_offset > 55
    assert store.earliest_offset("t", 0) == 55  # inside the first segment left
    assert store.offset_for_timestamp("t", 0, 0)[0] == 55


def test_deleted_files_are_removed_after_the_delay(open_store, clock, tmp_path):
    store = open_store(SegmentedConfig(**{**SMALL, "file_delete_delay_ms": 60_000}))
    store.create_topic("t")
    for _ in range(60):
        store.append_records("t", 0, [record(b"x" * 150)])
    store.delete_records("t", 0, 50)
    deleted = store.enforce_retention()
    assert deleted and len(_deleted_files(tmp_path)) == 3 * deleted  # renamed at once
    clock.advance(59_999)
    assert store.delete_expired_files() == 0 and len(_deleted_files(tmp_path)) == 3 * deleted
    clock.advance(1)
    store.delete_expired_files()
    assert _deleted_files(tmp_path) == []


def test_leftover_deleted_files_go_at_the_next_open(open_store, clock, tmp_path):
    store = open_store(SegmentedConfig(**{**SMALL, "file_delete_delay_ms": 60_000}))
    store.create_topic("t")
    for _ in range(60):
        store.append_records("t", 0, [record(b"x" * 150)])
    store.delete_records("t", 0, 50)
    assert store.enforce_retention()
    store.close()
    assert _deleted_files(tmp_path)
    open_store()
    assert _deleted_files(tmp_path) == []


# ---------------------------------------------------------------------- long polls


def test_wait_for_data_wakes_on_an_append(open_store):
    store = open_store()
    store.create_topic("t", 2)
    assert not store.wait_for_data([("t", 0, 0)], 20)  # times out
    result: list[bool] = []
    waiter = threading.Thread(
        target=lambda: result.append(store.wait_for_data([("t", 0, 5), ("t", 1, 0)], 10_000))
    )
    waiter.start()
    while not store._waiters:  # until the waiter sleeps on the condition
        threading.Event().wait(0.001)
    started = time.monotonic()
    store.append_records("t", 1, [record()])
    waiter.join(10)
    assert result == [True] and time.monotonic() - started < 5
    assert store.wait_for_data([("t", 1, 0)], 0)  # already there


def test_close_wakes_waiters(open_store):
    store = open_store()
    store.create_topic("t")
    result: list[bool] = []
    waiter = threading.Thread(
        target=lambda: result.append(store.wait_for_data([("t", 0, 0)], 60_000))
    )
    waiter.start()
    while not store._waiters:
        threading.Event().wait(0.001)
    store.close()
    waiter.join(10)
    assert result == [False]


# ---------------------------------------------------------------------- open files


def test_fd_cost_per_partition_is_three_and_old_indexes_map_lazily(open_store):
    store = open_store()
    before = store.stats()["open_fds"]
    store.create_topic("many", 50)
    assert store.stats()["open_fds"] - before == 50 * 3  # .log + two mapped indexes
    store.create_topic("t")
    for _ in range(100):
        store.append_records("t", 0, [record(b"x" * 150)])
    segments = len(store._logs[("t", 0)].segments)
    stats = store.stats()
    # each older segment keeps its .log open; its indexes are not mapped
    assert stats["open_fds"] - before == 50 * 3 + 2 + segments
    assert stats["mapped_inactive_indexes"] == 0
    store.read_records("t", 0, 7, 1)  # a look-up in the first segment maps its .index
    assert store.stats()["mapped_inactive_indexes"] == 1
    assert stats["partitions"] == 51 and stats["segments"] == 50 + segments


def test_a_read_spanning_several_chunks_of_single_record_batches(tmp_path):
    """Regression: a read crossing the first pread chunk kept asking the next chunk
    for the first wanted offset and reported a sound log as corrupt."""
    from mqstore.engine import ProducerRecord
    from mqstore.segmented import SegmentedConfig, SegmentedStore

    with SegmentedStore.open(tmp_path / "s", SegmentedConfig(segment_bytes=64 << 20)) as store:
        store.create_topic("t", 1)
        for i in range(3000):
            store.append_records("t", 0, [ProducerRecord(None, b"%04d" % i + b"." * 96, [], None)])
        records = store.read_records("t", 0, 0, 500)
        assert [r.offset for r in records] == list(range(500))
        assert records[-1].value.startswith(b"0499")
        middle = store.read_records("t", 0, 1234, 700)
        assert [r.offset for r in middle] == list(range(1234, 1934))
