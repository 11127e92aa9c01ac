from __future__ import annotations

import os

import pytest

from mqstore import (
    DiskFullError,
    KafkaConsumer,
    KafkaProducer,
    MessageStore,
    OffsetOutOfRangeError,
    StoreConfig,
    TopicPartition,
)
from tests.mqstore.conftest import SMALL

HOUR_MS = 3_600_000


class World:
    """A fake clock and an injected disk-usage probe."""

    def __init__(self) -> None:
        self.now_ms = 10 * HOUR_MS
        self.disk_percent = 10.0

    def clock(self) -> int:
        return self.now_ms

    def disk(self) -> float:
        return self.disk_percent


@pytest.fixture
def world():
    return World()


@pytest.fixture
def store(tmp_path, world):
    config = StoreConfig(**{**SMALL, "commitlog_file_size_bytes": 64 * 1024, "retention_hours": 1.0,
                            "retention_check_interval_ms": 3_600_000})  # fmt: skip
    store = MessageStore.open(
        tmp_path / "s", config, clock_ms=world.clock, disk_usage_percent=world.disk
    )
    yield store
    store.close()


def _fill(store, world, count, tick_ms=0, queue_id=0):
    results = []
    for i in range(count):
        world.now_ms += tick_ms
        results.append(store.put("t", queue_id, b"%06d" % i + b"." * 400, keys=[f"k{i}"]))
    return results


def test_time_retention_moves_the_log_start_and_consumequeue_minimum(store, world):
    old = _fill(store, world, 1000)  # ~480 B each: 7 files of 64 KiB at t0
    world.now_ms += 2 * HOUR_MS
    new = _fill(store, world, 200, queue_id=0)
    files_before = store.commitlog.file_count
    report = store.run_retention()
    assert report.deleted_files >= 5
    assert store.commitlog.file_count == files_before - report.deleted_files
    first_kept = store.min_offset("t", 0)
    assert first_kept > 0
    survivors = [r for r in old + new if r.physical_offset >= store.commitlog.min_position]
    # Nothing beyond the deleted files is lost: every surviving message reads back.
    assert survivors[0].queue_offset == first_kept
    got = store.get("t", 0, first_kept, 1000)
    assert [m.queue_offset for m in got] == [r.queue_offset for r in survivors]
    with pytest.raises(OffsetOutOfRangeError):
        store.get("t", 0, first_kept - 1, 1)
    # Index files wholly before the log start are gone; keys of survivors still resolve.
    hits = store.query_by_key("t", "k199", 0, 2**62, 5)  # offset 199 is gone, 1199 is not
    assert [m.queue_offset for m in hits] == [1199]
    # Data newer than the retention is never deleted.
    assert store.run_retention().deleted_files == 0


def test_size_retention(tmp_path, world):
    config = StoreConfig(**{**SMALL, "commitlog_file_size_bytes": 64 * 1024,
                            "retention_bytes": 3 * 64 * 1024})  # fmt: skip
    with MessageStore.open(
        tmp_path / "s", config, clock_ms=world.clock, disk_usage_percent=world.disk
    ) as store:
        _fill(store, world, 800)
        store.run_retention()
        assert store.commitlog.file_count <= 3
        assert store.max_offset("t", 0) == 800


def test_consumer_below_the_log_start_is_reset_or_errors(store, world):
    store.create_topic("k", 1)
    producer = KafkaProducer(store)
    for i in range(600):
        producer.send("k", b"%d" % i + b"." * 400)
    tp = TopicPartition("k", 0)
    earliest = KafkaConsumer(store=store, auto_offset_reset="earliest")
    earliest.assign([tp])
    earliest.seek(tp, 0)
    strict = KafkaConsumer(store=store, auto_offset_reset="none")
    strict.assign([tp])
    strict.seek(tp, 0)
    world.now_ms += 2 * HOUR_MS
    producer.send("k", b"fresh")
    store.run_retention()
    start = store.min_offset("k", 0)
    assert start > 0
    records = earliest.poll(timeout_ms=500)[tp]
    assert records[0].offset == start
    with pytest.raises(OffsetOutOfRangeError):
        strict.poll(timeout_ms=0)
    assert KafkaConsumer(store=store).beginning_offsets([tp]) == {tp: start}


def test_disk_watermarks_reject_and_resume(store, world):
    _fill(store, world, 300)
    world.disk_percent = 91.0
    report = store.run_retention()
    assert report.rejecting_writes
    with pytest.raises(DiskFullError, match=r"91\.0%"):
        store.put("t", 0, b"refused")
    count = store.max_offset("t", 0)
    world.disk_percent = 60.0
    assert not store.run_retention().rejecting_writes
    assert store.put("t", 0, b"accepted").queue_offset == count


def test_force_watermark_deletes_unexpired_files_but_never_the_newest(store, world):
    _fill(store, world, 600)
    files = store.commitlog.file_count
    world.disk_percent = 88.0  # above force, below reject: probe never drops
    report = store.run_retention()
    assert report.deleted_files == min(10, files - 1)
    assert store.commitlog.file_count >= 1
    assert store.put("t", 0, b"still writable").queue_offset == 600


def test_retention_survives_reopen(tmp_path, world):
    config = StoreConfig(
        **{**SMALL, "commitlog_file_size_bytes": 64 * 1024, "retention_hours": 1.0}
    )
    path = tmp_path / "s"
    with MessageStore.open(
        path, config, clock_ms=world.clock, disk_usage_percent=world.disk
    ) as store:
        _fill(store, world, 400)
        world.now_ms += 2 * HOUR_MS
        _fill(store, world, 10)
        store.run_retention()
        start = store.min_offset("t", 0)
    with MessageStore.open(
        path, config, clock_ms=world.clock, disk_usage_percent=world.disk
    ) as store:
        assert store.min_offset("t", 0) == start
        assert store.max_offset("t", 0) == 410
        assert len(os.listdir(path / "commitlog")) >= 1


def test_topic_retention_by_time_moves_the_log_start(store, world):
    store.create_topic("short", 2, retention_ms=60_000)
    store.create_topic("keep", 1)
    producer = KafkaProducer(store)
    for i in range(10):
        producer.send("short", b"old%d" % i, partition=i % 2)
        producer.send("keep", b"k%d" % i)
    world.now_ms += 120_000
    for i in range(4):
        producer.send("short", b"new%d" % i, partition=i % 2)
    store.run_retention()
    tp0 = TopicPartition("short", 0)
    consumer = KafkaConsumer(store=store, auto_offset_reset="earliest")
    assert consumer.beginning_offsets([tp0]) == {tp0: 5}
    consumer.assign([tp0])
    assert [r.value for r in consumer.poll(timeout_ms=500)[tp0]] == [b"new0", b"new2"]
    assert store.min_offset("keep", 0) == 0  # other topics keep everything


def test_topic_retention_by_bytes(store, world):
    store.create_topic("capped", 1, retention_bytes=5 * 100)
    producer = KafkaProducer(store)
    for i in range(20):
        producer.send("capped", b"%03d" % i + b"." * 60)  # records of ~100 bytes in the log
    store.run_retention()
    start = store.min_offset("capped", 0)
    kept = store.get("capped", 0, start, 100)
    assert 1 <= len(kept) <= 5
    assert sum(m.size for m in kept) <= 500
    assert bytes(kept[-1].body).startswith(b"019")


def test_read_only_store_follows_the_writers_retention(tmp_path, world):
    config = StoreConfig(
        **{**SMALL, "commitlog_file_size_bytes": 64 * 1024, "retention_hours": 1.0}
    )
    path = tmp_path / "s"
    writer = MessageStore.open(path, config, clock_ms=world.clock, disk_usage_percent=world.disk)
    try:
        _fill(writer, world, 1000)
        world.now_ms += 2 * HOUR_MS
        _fill(writer, world, 10)
        with MessageStore.open(path, config, read_only=True) as reader:
            assert reader.min_offset("t", 0) == 0
            writer.run_retention()
            start = writer.min_offset("t", 0)
            assert start > 0
            assert reader.min_offset("t", 0) == start
            assert reader.get("t", 0, start, 1)[0].queue_offset == start
    finally:
        writer.close()


def test_a_topic_kept_forever_survives_retention_and_the_others_keep_the_default(store, world):
    store.create_topic("forever", 1, retention_ms=-1)
    store.create_topic("usual", 1)  # left out: the store's retention_hours (1 h here)
    for i in range(300):  # ~480 B each, two topics: several 64 KiB files
        store.put("forever", 0, b"f%05d" % i + b"." * 400)
        store.put("usual", 0, b"u%05d" % i + b"." * 400)
    world.now_ms += 2 * HOUR_MS
    store.put("forever", 0, b"new")
    store.put("usual", 0, b"new")
    assert store.commitlog.file_count >= 4
    store.run_retention()
    assert store.min_offset("forever", 0) == 0
    assert len(store.get("forever", 0, 0, 1000)) == 301
    assert store.min_offset("usual", 0) == 300  # past the store default: unreadable
    assert [bytes(m.body) for m in store.get("usual", 0, 300, 5)] == [b"new"]


def test_describe_topic_shows_the_retention_in_force(store):
    store.create_topic("forever", 1, retention_ms=-1)
    store.create_topic("usual", 1)
    store.create_topic("capped", 1, retention_ms=60_000, retention_bytes=4096)
    usual = store.describe_topic("usual")
    assert usual.retention_ms is None  # as created: left out
    assert (usual.effective_retention_ms, usual.effective_retention_ms_source) == (
        HOUR_MS,
        "store default, retention_hours=1.0",
    )
    forever = store.describe_topic("forever")
    assert (forever.effective_retention_ms, forever.effective_retention_ms_source) == (-1, "topic")
    capped = store.describe_topic("capped")
    assert (capped.effective_retention_ms, capped.effective_retention_bytes) == (60_000, 4096)
    assert (usual.effective_retention_bytes, usual.effective_retention_bytes_source) == (
        -1,
        "default",
    )
    assert store.list_topics()["usual"] == usual  # the effective fields are not compared
