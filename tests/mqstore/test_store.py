from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import attrs
import numpy as np
import pytest

from mqstore import (
    CorruptDataError,
    FlushFailedError,
    InvalidArgumentError,
    InvalidTypeError,
    LimitExceededError,
    MessageStore,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreConfig,
    StoreError,
    StoreLockedError,
)
from mqstore.commitlog import lock
from mqstore.commitlog.checkpoint import CheckpointFile
from mqstore.consumequeue import file_cache, mapped_file
from mqstore.consumequeue.format import TIME_HEADER_SIZE_BYTES
from mqstore.indexfile import IndexService
from tests.mqstore.conftest import SMALL


def test_put_get_round_trip_with_fields(open_store):
    store = open_store()
    result = store.put(
        "orders", 1, b"payload", keys=["o-1", "c-9"], tag="Created",
        properties={"trace": "abc"}, born_timestamp_ms=1000,
    )  # fmt: skip
    assert result.queue_offset == 0
    assert result.store_timestamp_ms > 0
    store.put("orders", 1, b"second")
    assert store.wait_for("orders", 1, 1, 2000)
    messages = store.get("orders", 1, 0, 10)
    assert [m.queue_offset for m in messages] == [0, 1]
    first = messages[0]
    assert isinstance(first.body, memoryview)  # zero-copy
    assert bytes(first.body) == b"payload"
    assert first.keys == ("o-1", "c-9")
    assert first.tag == "Created"
    assert first.properties == (("trace", b"abc"),)
    assert first.born_timestamp_ms == 1000
    assert first.store_timestamp_ms == result.store_timestamp_ms
    assert first.physical_offset == result.physical_offset
    assert store.min_offset("orders", 1) == 0
    assert store.max_offset("orders", 1) == 2
    assert store.get("orders", 1, 2, 10) == []


def test_put_batch_and_get_across_consumequeue_files(open_store):
    store = open_store()
    results = store.put_batch(
        "t", 0, [b"m%d" % i for i in range(300)], keys=[[f"k{i}"] for i in range(300)]
    )
    assert [r.queue_offset for r in results] == list(range(300))
    assert store.wait_for("t", 0, 299, 2000)
    got = []
    offset = 0
    while offset < 300:
        batch = store.get("t", 0, offset, 500)
        got.extend(batch)
        offset += len(batch)
    assert [bytes(m.body) for m in got] == [b"m%d" % i for i in range(300)]


def test_query_by_key_newest_first_and_time_range(open_store):
    clock = {"now": 1_000_000}
    store = open_store(clock_ms=lambda: clock["now"])
    for i in range(10):
        clock["now"] += 1000
        store.put("t", i % 3, b"v%d" % i, keys=["shared", f"only-{i}"])
    store.put("other", 0, b"x", keys=["shared"])
    assert store.wait_for("other", 0, 0, 2000)
    hits = store.query_by_key("t", "shared", 0, 2**62, 64)
    assert [bytes(m.body) for m in hits] == [b"v%d" % i for i in reversed(range(10))]
    assert all(m.topic == "t" for m in hits)
    assert [bytes(m.body) for m in store.query_by_key("t", "shared", 0, 2**62, 3)] == [
        b"v9",
        b"v8",
        b"v7",
    ]
    window = store.query_by_key("t", "shared", 1_003_000, 1_005_000, 64)
    assert [bytes(m.body) for m in window] == [b"v4", b"v3", b"v2"]
    assert [bytes(m.body) for m in store.query_by_key("t", "only-4", 0, 2**62, 64)] == [b"v4"]
    assert store.query_by_key("t", "missing", 0, 2**62, 64) == []


def test_forced_hash_collisions_return_only_true_matches(open_store):
    config = StoreConfig(**{**SMALL, "index_slot_count": 1})
    store = open_store(config)
    for i in range(200):
        store.put("t", 0, b"%d" % i, keys=[f"key-{i % 20}"])
    assert store.wait_for("t", 0, 199, 2000)
    hits = store.query_by_key("t", "key-7", 0, 2**62, 64)
    assert [int(bytes(m.body)) for m in hits] == [i for i in reversed(range(200)) if i % 20 == 7]
    assert all("key-7" in m.keys for m in hits)


def test_offset_for_time_boundaries(open_store):
    store = open_store()
    born = [100, 200, 200, 200, 300, 150, 400]  # CreateTime, one out of order
    for i, ts in enumerate(born):
        store.put("t", 0, b"%d" % i, born_timestamp_ms=ts)
    assert store.wait_for("t", 0, len(born) - 1, 2000)
    assert store.offset_for_time("t", 0, 0) == 0  # before the first
    assert store.offset_for_time("t", 0, 100) == 0
    assert store.offset_for_time("t", 0, 101) == 1
    assert store.offset_for_time("t", 0, 200) == 1  # the first of equal timestamps
    assert store.offset_for_time("t", 0, 250) == 4
    assert store.offset_for_time("t", 0, 150) == 1  # offset order, not time order
    assert store.offset_for_time("t", 0, 301) == 6
    assert store.offset_for_time("t", 0, 401) is None  # after the last


@pytest.mark.parametrize("shared_units", [0, 64])
def test_offset_for_time_spot_checks_the_answer_against_its_record(
    tmp_path, small_config, shared_units
):
    """A stored timestamp that its record contradicts, at the answer (or the unit before
    it): CorruptDataError, never the answer it led to. With the queue's first units in
    the shared unit log or in its own files; answers elsewhere are unaffected."""
    config = attrs.evolve(small_config, consumequeue_shared_units_max=shared_units)
    path = tmp_path / "store"
    with MessageStore.open(path, config) as store:
        for i in range(100):  # the first 64 shared, or all in own files
            store.put("t", 0, b"%d" % i, born_timestamp_ms=1_000 + 10 * i)
        assert store.offset_for_time("t", 0, 1_395) == 40
        assert store.offset_for_time("t", 0, 1_000 + 10 * 99 + 1) is None
    # unit 80 (own files in both cases, file 1 of 64-unit files) now says 1_795, not 1_800
    time_file = path / "consumequeue" / "t" / "0" / f"{64 * 20:020d}.time"
    data = bytearray(time_file.read_bytes())
    position = TIME_HEADER_SIZE_BYTES + 8 * (80 - 64)
    assert int.from_bytes(data[position : position + 8], "little") == 1_800
    data[position : position + 8] = (1_795).to_bytes(8, "little")
    time_file.write_bytes(bytes(data))
    with MessageStore.open(path, config) as store:
        with pytest.raises(CorruptDataError, match="says 1795 ms, the record says 1800 ms"):
            store.offset_for_time("t", 0, 1_795)  # the search lands on unit 80
        with pytest.raises(CorruptDataError):
            store.offset_for_time("t", 0, 1_805)  # 81: its previous unit is 80
        assert store.offset_for_time("t", 0, 1_395) == 40
        assert store.offset_for_time("t", 0, 0) == 0


def test_log_append_time_topic_uses_store_time(open_store):
    clock = {"now": 50_000}
    store = open_store(clock_ms=lambda: clock["now"])
    store.create_topic("lat", 1, timestamp_type="LogAppendTime")
    for _ in range(5):
        clock["now"] += 10
        store.put("lat", 0, b"x", born_timestamp_ms=1)  # born time is ignored
    assert store.wait_for("lat", 0, 4, 2000)
    assert store.offset_for_time("lat", 0, 50_030) == 2


def test_reopen_keeps_everything(tmp_path, small_config):
    path = tmp_path / "s"
    with MessageStore.open(path, small_config) as store:
        for i in range(500):
            store.put(f"t{i % 3}", i % 4, b"x" * (i % 50), keys=[f"k{i}"])
    with MessageStore.open(path, small_config) as store:
        assert not store.recovered_from_crash
        total = sum(store.max_offset(f"t{t}", q) for t in range(3) for q in range(4))
        assert total == 500
        before = store.max_offset("t0", 0)
        assert store.put("t0", 0, b"more").queue_offset == before
        assert [bytes(m.body) for m in store.query_by_key("t1", "k1", 0, 2**62, 5)] == [b"x"]


def test_crash_and_reopen_rebuilds_from_the_checkpoint(tmp_path, small_config):
    path = tmp_path / "s"
    store = MessageStore.open(path, small_config)
    for i in range(400):
        store.put("t", i % 2, b"%d" % i, keys=[f"k{i}"])
    store._crash()
    assert os.path.exists(path / "abort")
    with MessageStore.open(path, small_config) as store:
        assert store.recovered_from_crash
        assert store.max_offset("t", 0) == 200
        assert store.max_offset("t", 1) == 200
        assert [bytes(m.body) for m in store.get("t", 1, 199, 5)] == [b"399"]
        assert store.put("t", 1, b"next").queue_offset == 200
        assert len(store.query_by_key("t", "k123", 0, 2**62, 5)) == 1


def test_a_crash_reopen_syncs_nothing_it_cannot_claim(tmp_path, small_config, monkeypatch):
    """After an unclean stop the open re-dispatches but leaves the checkpoint's claim
    where it was (the dead process's writes are unsynced): it fdatasyncs none of the
    re-dispatched ConsumeQueue files. The first checkpoint
    after open syncs the whole tree and only then moves the claim."""
    path = tmp_path / "s"
    store = MessageStore.open(path, small_config)
    for i in range(400):
        store.put("t", i % 2, b"%d" % i)
        if i == 99:
            assert len(store.get("t", 1, 0, 100)) == 50  # dispatched
            store._write_checkpoint(derived=True)
            dispatcher = store._dispatcher  # stopped: the open re-dispatches the rest
            dispatcher._stop.set()
            dispatcher._wake.set()
            dispatcher._thread.join()
    store._crash()
    before = CheckpointFile(str(path), read_only=True).load()
    assert before is not None
    synced: list[str] = []
    real_sync = file_cache.sync_path

    def counting(target, *args, **kwargs):
        synced.append(str(target))
        return real_sync(target, *args, **kwargs)

    monkeypatch.setattr(file_cache, "sync_path", counting)
    monkeypatch.setattr(mapped_file, "sync_path", counting)  # the shared logs' (sync_paths)
    with MessageStore.open(path, small_config) as store:
        assert store.recovered_from_crash
        assert store.max_offset("t", 1) == 200
        assert synced == []
        at_open = CheckpointFile(str(path), read_only=True).load()
        assert at_open is not None
        assert at_open.dispatched_position == before.dispatched_position
        store._write_checkpoint()  # the first one after open: syncs all, then claims
        assert synced
        after = CheckpointFile(str(path), read_only=True).load()
        assert after is not None
        assert after.dispatched_position > before.dispatched_position
        assert after.dispatched_position == store._dispatcher.position


def test_a_crash_reopen_that_rewrites_below_the_claim_syncs_it(tmp_path, small_config, monkeypatch):
    """A crash reopen that re-dispatches from below the checkpoint's claim (here the
    index was lost, so the whole log is dispatched again) syncs what it wrote before
    the checkpoint vouches for it; one that starts at the claim syncs nothing
    (test_a_crash_reopen_syncs_nothing_it_cannot_claim)."""
    path = tmp_path / "s"
    store = MessageStore.open(path, small_config)
    for i in range(400):
        store.put("t", i % 2, b"%d" % i, keys=[f"k{i}"])
    _wait_max_offset(store, "t", 1, 200)
    store._write_checkpoint(derived=True)
    store._crash()
    before = CheckpointFile(str(path), read_only=True).load()
    assert before is not None and before.dispatched_position > 0
    shutil.rmtree(path / "index")
    flushes: list[str] = []
    real_flush = IndexService.flush

    def counting(self, *args, **kwargs):
        flushes.append("index")
        return real_flush(self, *args, **kwargs)

    monkeypatch.setattr(IndexService, "flush", counting)
    with MessageStore.open(path, small_config) as store:
        assert store.recovered_from_crash
        assert store._redispatched_from < before.dispatched_position
        assert flushes  # at open: the rebuilt index was synced
        at_open = CheckpointFile(str(path), read_only=True).load()
        assert at_open is not None
        assert at_open.dispatched_position <= store._dispatcher.position
        assert [bytes(m.body) for m in store.query_by_key("t", "k77", 0, 2**62, 5)] == [b"77"]


def _wait_max_offset(store: MessageStore, topic: str, queue_id: int, count: int) -> None:
    deadline = time.monotonic() + 10
    while store.max_offset(topic, queue_id) < count:
        assert time.monotonic() < deadline, "not dispatched"
        time.sleep(0.005)


def test_a_crash_reopen_lowers_a_claim_above_the_recovered_log(tmp_path, monkeypatch):
    """Async flush lets the dispatcher run ahead of the CommitLog's flush, so a
    checkpoint may claim units of records a power cut then takes. The reopen lowers
    the claim to the recovered log's end on disk: left above it, the claim would
    vouch for the units of records appended there after the reopen, never synced,
    and a second power cut would lose acknowledged, flushed messages."""
    config = StoreConfig(
        commitlog_file_size_bytes=256 * 1024, consumequeue_units_per_file=64,
        index_slot_count=64, index_entry_count=512, prewarm=False,
        checkpoint_interval_ms=600_000, consumequeue_shared_units_max=0,
        flush_mode="async", flush_interval_ms=60_000,
    )  # fmt: skip
    path = str(tmp_path / "s")
    store = MessageStore.open(path, config)
    for i in range(50):
        store.put("t", 0, b"a%03d" % i)
    store.commitlog.flush_to(store.commitlog.write_position)
    durable_end = store.commitlog.write_position
    for i in range(50, 100):
        store.put("t", 0, b"a%03d" % i)
    _wait_max_offset(store, "t", 0, 100)
    store._write_checkpoint(derived=True)
    first = CheckpointFile(path, read_only=True).load()
    assert first is not None and first.dispatched_position > durable_end
    store._crash()
    # A power cut: the CommitLog's unsynced tail is lost.
    (log_file,) = os.listdir(os.path.join(path, "commitlog"))
    with open(os.path.join(path, "commitlog", log_file), "r+b") as file:
        file.seek(durable_end)
        file.write(bytes(first.dispatched_position - durable_end + 4096))
    monkeypatch.setattr(lock, "boot_id", lambda: "after-a-reboot")

    store = MessageStore.open(path, config)
    end = store.commitlog.write_position
    assert store.max_offset("t", 0) == 50
    on_disk = CheckpointFile(path, read_only=True).load()
    assert on_disk is not None and on_disk.dispatched_position <= end
    for i in range(30):  # acknowledged and flushed, below the old claim
        store.put("t", 0, b"b%03d" % i)
    store.commitlog.flush_to(store.commitlog.write_position)
    assert store.commitlog.flushed_position <= first.dispatched_position
    _wait_max_offset(store, "t", 0, 80)
    store._crash()
    # A second power cut: the queue's units written since the reopen were never synced.
    queue_dir = os.path.join(path, "consumequeue", "t", "0")
    units = sorted(name for name in os.listdir(queue_dir) if "." not in name)
    with open(os.path.join(queue_dir, units[0]), "r+b") as file:
        file.seek(50 * 20)
        file.write(bytes(14 * 20))
    for name in units[1:]:
        os.remove(os.path.join(queue_dir, name))
    monkeypatch.setattr(lock, "boot_id", lambda: "after-another-reboot")
    with MessageStore.open(path, config) as store:
        assert store.max_offset("t", 0) == 80
        assert [bytes(m.body) for m in store.get("t", 0, 50, 30)] == [
            b"b%03d" % i for i in range(30)
        ]


def test_every_consumequeue_file_deleted_is_rebuilt(tmp_path, small_config):
    path = tmp_path / "s"
    with MessageStore.open(path, small_config) as store:
        for i in range(1000):
            store.put("t", i % 5, b"%d" % i, keys=[f"k{i}"])
    shutil.rmtree(path / "consumequeue")
    shutil.rmtree(path / "index")
    with MessageStore.open(path, small_config) as store:
        for q in range(5):
            assert store.max_offset("t", q) == 200
            assert [int(bytes(m.body)) for m in store.get("t", q, 0, 500)] == list(
                range(q, 1000, 5)
            )
        assert [bytes(m.body) for m in store.query_by_key("t", "k777", 0, 2**62, 5)] == [b"777"]


def test_second_writer_refused_and_read_only_reader_follows(tmp_path, small_config):
    path = tmp_path / "s"
    with MessageStore.open(path, small_config) as writer:
        with pytest.raises(StoreLockedError):
            MessageStore.open(path, small_config)
        writer.put("t", 0, b"one", keys=["a"])
        assert writer.wait_for("t", 0, 0, 2000)
        with MessageStore.open(path, small_config, read_only=True) as reader:
            assert reader.max_offset("t", 0) == 1
            with pytest.raises(ReadOnlyStoreError):
                reader.put("t", 0, b"no")
            writer.put("t", 0, b"two")
            assert reader.wait_for("t", 0, 1, 2000)
            assert [bytes(m.body) for m in reader.get("t", 0, 0, 10)] == [b"one", b"two"]


def test_long_poll_wakes_on_a_put_from_another_thread(open_store):
    store = open_store()
    woke = []

    def consumer() -> None:
        started = time.monotonic()
        woke.append((store.wait_for("t", 0, 0, 5000), time.monotonic() - started))

    thread = threading.Thread(target=consumer)
    thread.start()
    time.sleep(0.05)
    store.put("t", 0, b"x")
    thread.join(5)
    assert woke[0][0] is True
    assert woke[0][1] < 1.0
    assert store.wait_for("t", 0, 1, 20) is False  # nothing more: times out


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.put("a/b", 0, b"x"), InvalidArgumentError),
        (lambda s: s.put("..", 0, b"x"), InvalidArgumentError),
        (lambda s: s.put("t", -1, b"x"), InvalidArgumentError),
        (lambda s: s.put("t", 0, "str"), InvalidTypeError),
        (lambda s: s.put("t", 0, b"x" * (300 * 1024)), LimitExceededError),
        (lambda s: s.get("t", 0, -1, 10), OffsetOutOfRangeError),
        (lambda s: s.get("t", 0, 5, 10), OffsetOutOfRangeError),
        (lambda s: s.get("t", 0, 0, 0), InvalidArgumentError),
        (lambda s: s.get("t", 0, "0", 10), InvalidTypeError),
        (lambda s: s.get("../x", 0, 0, 10), InvalidArgumentError),
        (lambda s: s.offset_for_time("t", 0, -5), InvalidArgumentError),
        (lambda s: s.query_by_key("t", 5, 0, 1, 10), InvalidTypeError),
        (lambda s: s.query_by_key("t", "k", 0, 1, 0), InvalidArgumentError),
        (lambda s: s.wait_for("t", 0, -1, 10), OffsetOutOfRangeError),
    ],
)
def test_bad_input_gets_typed_errors_and_changes_nothing(open_store, call, error):
    store = open_store()
    store.put("t", 0, b"keep")
    assert store.wait_for("t", 0, 0, 2000)
    with pytest.raises(error):
        call(store)
    assert store.max_offset("t", 0) == 1
    assert [bytes(m.body) for m in store.get("t", 0, 0, 10)] == [b"keep"]


def test_closed_store_refuses_everything(tmp_path, small_config):
    store = MessageStore.open(tmp_path / "s", small_config)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreClosedError):
        store.put("t", 0, b"x")
    with pytest.raises(StoreClosedError):
        store.get("t", 0, 0, 1)


def test_config_must_be_a_store_config(tmp_path):
    with pytest.raises(InvalidTypeError):
        MessageStore.open(tmp_path / "s", {"flush_mode": "sync"})  # type: ignore[arg-type]


def test_corrupt_consumequeue_unit_is_never_returned(tmp_path, small_config):
    path = tmp_path / "s"
    with MessageStore.open(path, small_config) as store:
        for i in range(10):
            store.put("t", 0, b"%d" % i)
    # Point unit 3 at unit 4's record: the reader must notice the mismatch.
    unit_file = next((path / "consumequeue" / "t" / "0").glob("0" * 20))
    data = bytearray(unit_file.read_bytes())
    data[3 * 20 : 4 * 20] = data[4 * 20 : 5 * 20]
    unit_file.write_bytes(bytes(data))
    with MessageStore.open(path, small_config) as store:
        assert [bytes(m.body) for m in store.get("t", 0, 0, 3)] == [b"0", b"1", b"2"]
        with pytest.raises(CorruptDataError) as caught:
            store.get("t", 0, 3, 1)
        assert "not the record of t/0@3" in str(caught.value)


@pytest.mark.slow
def test_100k_queues_in_one_store(tmp_path):
    """100,000 queues under this machine's 20,000 open-file cap: ConsumeQueue files
    are mapped lazily behind a bounded cache (tmpfs when there is one: creating
    200,000 files on the disk would dominate the test's time)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    root = tempfile.mkdtemp(prefix="mqstore-100k-", dir=base)
    queues = 100_000
    config = StoreConfig(**{**SMALL, "commitlog_file_size_bytes": 64 << 20,
                            "consumequeue_units_per_file": 16, "consumequeue_max_open_files": 512,
                            "checkpoint_interval_ms": 600_000})  # fmt: skip
    try:
        with MessageStore.open(root, config) as store:
            store.create_topic("wide", queues)  # not grown one put (and one write) at a time
            fds_before = len(os.listdir("/proc/self/fd"))
            for start in range(0, queues, 1000):
                for queue_id in range(start, start + 1000):
                    store.put("wide", queue_id, b"%d" % queue_id)
                store._dispatcher.dispatch_available()
            fds_peak = len(os.listdir("/proc/self/fd"))
            assert fds_peak - fds_before <= 512 + 16
            for queue_id in range(0, queues, 997):
                (message,) = store.get("wide", queue_id, 0, 5)
                assert bytes(message.body) == b"%d" % queue_id
        with MessageStore.open(root, config) as store:
            assert store.max_offset("wide", queues - 1) == 1
            assert store.max_offset("wide", 54_321) == 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_consumequeue_flush_interval_spaces_the_dispatched_claim(tmp_path):
    """Between derived flushes a checkpoint saves the flushed position but keeps the
    last dispatched claim; close makes the claim whole; a crash in between loses
    nothing (recovery re-dispatches from the older claim)."""

    config = StoreConfig(**{**SMALL, "consumequeue_flush_interval_ms": 3_600_000})
    path = tmp_path / "s"
    store = MessageStore.open(path, config)
    opened_claim = store._checkpoint.dispatched_position
    for i in range(300):
        store.put("t", i % 3, b"m%d" % i, keys=[f"k{i}"])
    store.commitlog.flush_to(store.commitlog.write_position)
    store._write_checkpoint()
    saved = CheckpointFile(str(path), read_only=True).load()
    assert saved is not None
    assert saved.flushed_position == store.commitlog.write_position > opened_claim
    assert saved.dispatched_position == opened_claim
    store._crash()
    with MessageStore.open(path, config) as store:
        assert [store.max_offset("t", q) for q in range(3)] == [100, 100, 100]
        assert len(store.query_by_key("t", "k250", 0, 2**62, 5)) == 1
        end = store.commitlog.write_position
    saved = CheckpointFile(str(path), read_only=True).load()
    assert saved is not None and saved.dispatched_position == end


def test_put_batch_arrays_reports_where_the_batch_landed(open_store):
    store = open_store()
    store.put("t", 0, b"first")
    bodies = [b"a" * i for i in range(1, 40)] + [None]
    result = store.put_batch_arrays("t", 0, bodies, tags="tg", born_timestamp_ms=123)
    assert result.first_queue_offset == 1
    messages = store.get("t", 0, 1, 100)
    assert [m.physical_offset for m in messages] == result.physical_offsets.tolist()
    assert [m.size for m in messages] == result.sizes.tolist()
    assert [None if m.body is None else bytes(m.body) for m in messages] == bodies
    assert {(m.tag, m.born_ts_ms, m.store_ts_ms) for m in messages} == {
        ("tg", 123, result.store_timestamp_ms)
    }
    with pytest.raises(InvalidTypeError):
        store.put_batch_arrays("t", 0, [b"ok", "not bytes"])
    assert store.max_offset("t", 0) == 41


def test_put_batch_buffers_takes_an_arrow_like_column(open_store):
    store = open_store()
    bodies = [b"one", b"", None, b"four!"]
    data = b"one" + b"" + b"zz" + b"four!"  # a null's slot may hold bytes: they are ignored
    offsets = np.array([0, 3, 3, 5, 10])
    nulls = np.array([0, 0, 1, 0], np.uint8)
    borns = np.array([10, 20, 30, 40])
    result = store.put_batch_buffers("t", 1, offsets, data, nulls=nulls, tag="x",
                                     born_timestamp_ms=borns)  # fmt: skip
    got = store.get("t", 1, 0, 10)
    assert [None if m.body is None else bytes(m.body) for m in got] == bodies
    assert [m.born_ts_ms for m in got] == [10, 20, 30, 40]
    assert [m.physical_offset for m in got] == result.physical_offsets.tolist()
    assert store.offset_for_time("t", 1, 25) == 2  # the ConsumeQueue took the born times
    with pytest.raises(InvalidArgumentError):
        store.put_batch_buffers("t", 1, np.array([0, 5, 3]), data)
    with pytest.raises(InvalidArgumentError):
        store.put_batch_buffers("t", 1, np.array([0, 3, 99]), data)
    with pytest.raises(InvalidArgumentError):
        store.put_batch_buffers("t", 1, offsets, data, nulls=np.zeros(2, np.uint8))
    assert store.max_offset("t", 1) == 4


# ---------------------------------------------------------------- durability (issue 13)


def test_a_failed_sync_poisons_the_store_until_reopen(tmp_path, small_config):
    """fsyncgate: the failed sync is not retried; writes are refused with a typed
    error; close leaves ``abort`` so the reopen recovers as after a crash."""
    config = attrs.evolve(small_config, flush_mode="sync")
    store = MessageStore.open(tmp_path / "s", config)
    store.put("t", 0, b"durable")

    def failing(mapped):
        raise OSError(5, "Input/output error")

    store.commitlog._syncer = failing
    with pytest.raises(FlushFailedError):
        store.put("t", 0, b"never acknowledged")
    with pytest.raises(FlushFailedError):
        store.put_batch("t", 0, [b"a", b"b"])
    assert store.stats()["sync_failure"].startswith("FlushFailedError")
    with pytest.raises(FlushFailedError):
        store.close()
    assert os.path.exists(tmp_path / "s" / "abort")
    with MessageStore.open(tmp_path / "s", config) as again:
        assert again.recovered_from_crash
        bodies = [bytes(m.body) for m in again.get("t", 0, 0, 10)]
        assert bodies[0] == b"durable"
        again.put("t", 0, b"writable again")


def test_a_failed_consumequeue_sync_freezes_the_checkpoint_claim(open_store, monkeypatch):
    store = open_store()
    store.put("t", 0, b"before")
    assert len(store.get("t", 0, 0, 10)) == 1  # dispatched
    store._write_checkpoint(derived=True)
    claimed = store._checkpoint.dispatched_position
    assert claimed > 0

    def failing(*args, **kwargs):
        raise StoreError("injected ConsumeQueue sync failure")

    monkeypatch.setattr(file_cache, "sync_path", failing)
    monkeypatch.setattr(file_cache, "_sync_filesystem_of", lambda candidates: False)
    store.put("t", 0, b"after")
    assert len(store.get("t", 0, 0, 10)) == 2
    store._write_checkpoint(derived=True)
    assert store.derived_sync_failure is not None
    monkeypatch.undo()  # a later sync would "succeed": it must not be trusted
    store.put("t", 0, b"later")
    store._write_checkpoint(derived=True)
    assert store._checkpoint.dispatched_position == claimed
    assert store._checkpoint.flushed_position == store.commitlog.flushed_position
    assert store.stats()["derived_sync_failure"] is not None


def test_store_timestamps_never_go_back_across_a_clean_restart(tmp_path, small_config):
    """Regression: after a clean close the recovery scan reads nothing, so the
    timestamp floor was lost and a clock stepped back gave earlier store times."""
    now = [2_000_000_000_000]
    store = MessageStore.open(tmp_path / "s", small_config, clock_ms=lambda: now[0])
    first = store.put("t", 0, b"a")
    store.close()
    now[0] -= 3_600_000  # the clock steps back an hour across the restart
    with MessageStore.open(tmp_path / "s", small_config, clock_ms=lambda: now[0]) as again:
        second = again.put("t", 0, b"b")
        assert second.store_timestamp_ms >= first.store_timestamp_ms
        stamps = [m.store_timestamp_ms for m in again.get("t", 0, 0, 10)]
        assert stamps == sorted(stamps)
    checkpoint = CheckpointFile(str(tmp_path / "s"), read_only=True).load()
    assert checkpoint is not None
    assert checkpoint.flushed_ts_ms == second.store_timestamp_ms


def test_checkpoint_flushed_ts_is_the_last_flushed_record(open_store):
    """Regression: flushed_ts_ms held the newest appended record's time, flushed
    or not."""
    now = [1_000_000]
    store = open_store(clock_ms=lambda: now[0])
    flushed = store.put("t", 0, b"flushed")
    store.commitlog.flush_to(store.commitlog.write_position)
    position, stamp = store.commitlog.flushed_mark
    assert stamp == flushed.store_timestamp_ms == 1_000_000
    now[0] += 5_000
    store.put("t", 0, b"not flushed yet")
    assert store.commitlog.flushed_mark == (position, stamp)


def test_get_racing_retention_raises_offset_out_of_range(open_store, monkeypatch):
    """Regression: a reader whose CommitLog file was unmapped by retention between
    finding and reading it got a bare ``ValueError: mmap closed or invalid``."""
    store = open_store()
    store.put("t", 0, b"x")
    commitlog = store.commitlog
    real_file_for = commitlog.file_for

    def file_for_then_retention(position):
        mapped = real_file_for(position)
        mapped.mapping.close()  # retention unmapped it right after the look-up
        return mapped

    monkeypatch.setattr(commitlog, "file_for", file_for_then_retention)
    with pytest.raises(OffsetOutOfRangeError, match="retention"):
        store.get("t", 0, 0, 10)


def test_committing_through_a_read_only_store_is_a_typed_error(open_store, tmp_path):
    writer = open_store()
    writer.create_topic("t", partitions=1)
    writer.put("t", 0, b"x")
    reader = open_store(path=tmp_path / "store", read_only=True)
    with pytest.raises(ReadOnlyStoreError):
        reader.offsets.commit("g", {("t", 0): (1, "")})
    with pytest.raises(ReadOnlyStoreError):
        reader.topics.put(writer.topics.get("t"))


def test_a_new_store_makes_its_directories_durable(tmp_path, syscalls):
    """Regression: the store root, commitlog/, consumequeue/, index/ and offsets/
    were made with os.makedirs and never fsynced into their parents, so a power cut
    could drop a whole directory of committed offsets or CommitLog files."""
    root = tmp_path / "store"
    config = StoreConfig(commitlog_file_size_bytes=64 * 1024, prewarm=False)
    MessageStore.open(root, config).close()
    synced = {path for kind, path in syscalls.events if kind == "fsync"}
    assert str(tmp_path) in synced  # the root's own entry
    assert str(root) in synced  # commitlog/, consumequeue/, index/ entries
    for name in ("commitlog", "consumequeue", "index"):
        assert (root / name).is_dir()


def test_open_after_a_power_cut_repairs_what_the_checkpoint_did_not_claim(tmp_path, monkeypatch):
    """Regression (power-loss harness): ConsumeQueue units and an index header written
    after the checkpoint's claim were torn by a power cut, and open refused ("unit ...
    breaks the order", "end offset 0 before begin offset"). Derived data past the claim
    is never trusted after a crash: it is cut back and rebuilt from the CommitLog."""
    from mqstore.indexfile import format as index_format

    config = StoreConfig(**{**SMALL, "consumequeue_flush_interval_ms": 3_600_000})
    path = tmp_path / "s"
    store = MessageStore.open(path, config)
    store.put("t", 0, b"no key")  # so the index begins past physical offset 0
    bodies = [b"no key"] + [b"m%d" % i for i in range(1, 200)]
    for i in range(1, 100):
        store.put("t", 0, bodies[i], keys=[f"k{i}"])
    assert len(store.get("t", 0, 0, 100)) == 100
    store._write_checkpoint(derived=True)  # the claim covers the first 100
    for i in range(100, 200):
        store.put("t", 0, bodies[i], keys=[f"k{i}"])
    assert len(store.get("t", 0, 100, 100)) == 100
    store.commitlog.flush_to(store.commitlog.write_position)  # the log itself is durable
    queue = store.consume_queues.queue("t", 0)
    units_per_file = SMALL["consumequeue_units_per_file"]
    paths = {offset: queue._files.unit_path(offset // units_per_file) for offset in (110, 150)}
    store._crash()
    monkeypatch.setattr(lock, "trust_same_boot", False)  # a power cut, on this boot
    # What a power cut leaves of pages written after the claim: zeros, a torn unit.
    with open(paths[110], "r+b") as handle:
        handle.seek(20 * (110 % units_per_file))
        handle.write(b"\0" * 20 * 10)
    with open(paths[150], "r+b") as handle:
        handle.seek(20 * (150 % units_per_file))
        handle.write((0).to_bytes(8, "little") + (77).to_bytes(4, "little"))
    index_dir = path / "index"
    index_file = index_dir / sorted(os.listdir(index_dir))[-1]
    with open(index_file, "r+b") as handle:
        handle.seek(index_format.HEADER_FIELD_POSITION["end_offset"])
        handle.write(b"\0" * 8)
    with MessageStore.open(path, config) as again:
        assert again.recovered_from_crash and again.power_loss_possible
        assert [bytes(m.body) for m in again.get("t", 0, 0, 200)] == bodies
        for i in (3, 99, 150, 199):
            hits = again.query_by_key("t", f"k{i}", 0, 2**62, 10)
            assert [bytes(m.body) for m in hits] == [bodies[i]]


def test_a_process_kill_on_the_same_boot_skips_the_power_cut_repair(tmp_path, monkeypatch):
    """Review finding: recovery walked and rebuilt derived data after every unclean
    stop. A process kill leaves the page cache whole: with the same boot id in
    ``abort`` nothing is torn, and recovery trusts what the kill left."""
    config = StoreConfig(**SMALL)
    store = MessageStore.open(tmp_path / "s", config)
    store.put("t", 0, b"x")
    store._crash()
    with MessageStore.open(tmp_path / "s", config) as again:
        assert again.recovered_from_crash
        assert again.power_loss_possible is (lock.boot_id() == "")
    monkeypatch.setattr(lock, "boot_id", lambda: "another-boot")
    store = MessageStore.open(tmp_path / "s", config)
    store._crash()
    monkeypatch.setattr(lock, "boot_id", lambda: "after-a-reboot")
    with MessageStore.open(tmp_path / "s", config) as again:
        assert again.recovered_from_crash and again.power_loss_possible
        assert [bytes(m.body) for m in again.get("t", 0, 0, 10)] == [b"x"]


def test_a_put_is_never_failed_by_the_dispatch_it_helps_with(open_store, monkeypatch):
    """Regression (found by a flaky disk-full test): past the dispatch backlog a put
    dispatches before it returns; when that dispatch failed (a full disk for a new
    ConsumeQueue file), the put raised DiskFullError although its record was already
    in the log, so the caller counted an unwritten record that was there."""
    from mqstore import store_write as store_module
    from mqstore.commitlog.errors import DiskFullError

    store = open_store()
    store.put("t", 0, b"first")
    monkeypatch.setattr(store_module, "DISPATCH_BACKLOG_MAX_BYTES", -1)  # every put helps
    dispatcher = store._dispatcher

    def full(*args, **kwargs):
        raise DiskFullError(28, "No space left on device (injected)")

    monkeypatch.setattr(dispatcher, "dispatch_available", full)
    results = [store.put("t", 0, b"m%d" % i) for i in range(5)]  # none raises
    store.put_batch("t", 0, [b"b0", b"b1"])
    monkeypatch.undo()
    assert [r.queue_offset for r in results] == [1, 2, 3, 4, 5]
    bodies = [bytes(m.body) for m in store.get("t", 0, 0, 20)]
    assert bodies == [b"first", b"m0", b"m1", b"m2", b"m3", b"m4", b"b0", b"b1"]


def test_put_checks_a_queue_once_and_still_refuses_what_it_must(tmp_path, open_store):
    """put remembers the queues it checked (put's one-lookup path), and still
    refuses: a bool queue id, a partition that does not exist, a failed dispatcher,
    a closed store, a read-only one."""
    from mqstore import DispatchFailedError, UnknownTopicError

    store = open_store(StoreConfig(**SMALL, auto_create_topics=False))
    store.create_topic("orders", 2)
    store.put("orders", 1, b"checked")
    assert store._put_topics == {"orders": 2}  # every partition of the topic, at once
    with pytest.raises(InvalidTypeError, match="queue_id must be an int, not bool"):
        store.put("orders", True, b"x")  # hashes as 1: the CommitLog still checks it
    for _ in range(2):  # refused every time, never remembered
        with pytest.raises(UnknownTopicError):
            store.put("orders", 2, b"x")
    assert store._put_topics == {"orders": 2}
    with pytest.raises(InvalidTypeError):
        store.put(["not", "hashable"], 0, b"x")  # type: ignore[arg-type]
    dispatcher = store._dispatcher
    assert dispatcher is not None
    dispatcher.failure = DispatchFailedError(0, "injected")
    with pytest.raises(DispatchFailedError):
        store.put("orders", 1, b"x")
    dispatcher.failure = None
    store.close()
    with pytest.raises(StoreClosedError):
        store.put("orders", 1, b"x")
    reader = MessageStore.open(tmp_path / "store", StoreConfig(**SMALL), read_only=True)
    try:
        with pytest.raises(ReadOnlyStoreError):
            reader.put("orders", 1, b"x")
    finally:
        reader.close()


def test_put_helps_dispatch_past_the_backlog(open_store, monkeypatch):
    """Backpressure still holds with put's threshold: a producer far ahead of the
    dispatcher dispatches before its put returns."""
    from mqstore import store_write as store_module

    monkeypatch.setattr(store_module, "DISPATCH_BACKLOG_MAX_BYTES", 1_000)
    store = open_store(StoreConfig(**{**SMALL, "dispatch_interval_ms": 1_000}))
    store.commitlog.set_append_listener(None)  # the dispatcher thread sleeps on
    results = [store.put("orders", 0, b"x" * 100) for _ in range(50)]
    dispatcher = store._dispatcher
    assert dispatcher is not None
    assert results[-1].physical_offset - dispatcher.position <= 1_000


def test_a_long_poll_on_one_queue_ignores_a_hammered_other_queue(open_store):
    """A reader of queue 0 sleeps through a writer hammering queue 1: its wait times
    out (False) at its timeout, and then a put to queue 0 wakes it."""
    store = open_store()
    store.put("t", 0, b"zero")
    store.put("t", 1, b"one")
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            store.put("t", 1, b"x" * 100)

    writer = threading.Thread(target=hammer)
    writer.start()
    try:
        started = time.monotonic()
        assert store.wait_for("t", 0, 1, 150) is False
        assert time.monotonic() - started >= 0.15
        dispatcher = store._dispatcher
        assert dispatcher is not None
        released_before = dispatcher._waiters.released
        woke: list[bool] = []
        reader = threading.Thread(target=lambda: woke.append(store.wait_for("t", 0, 1, 30_000)))
        reader.start()
        deadline = time.monotonic() + 10
        while dispatcher.waiting < 1:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        time.sleep(0.05)  # rounds of queue 1 go by
        assert woke == []
        assert dispatcher._waiters.released == released_before
        store.put("t", 0, b"zero again")
        reader.join(10)
        assert woke == [True]
    finally:
        stop.set()
        writer.join(10)
    assert store.max_offset("t", 1) > 1


def test_wait_for_data_wakes_on_any_of_its_queues(open_store):
    store = open_store()
    for queue_id in range(3):
        store.put("t", queue_id, b"first")
    woke: list[bool] = []
    positions = [("t", 0, 1), ("t", 1, 1), ("t", 2, 1)]
    reader = threading.Thread(target=lambda: woke.append(store.wait_for_data(positions, 30_000)))
    reader.start()
    dispatcher = store._dispatcher
    assert dispatcher is not None
    deadline = time.monotonic() + 10
    while dispatcher.waiting < 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    store.put("t", 2, b"second")
    reader.join(10)
    assert woke == [True]


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
def test_a_reader_keeps_up_with_a_hammering_writer_without_a_lost_wake_up(tmp_path, flush_mode):
    """Every message is read back in order through wait_for + get; a lost wake-up
    would leave a wait asleep until its 30 s timeout (and return False)."""
    total = 3_000
    config = StoreConfig(**{**SMALL, "flush_mode": flush_mode})
    with MessageStore.open(tmp_path / "s", config) as store:
        store.put("t", 0, b"start")
        got: list[bytes] = []
        waits: list[float] = []

        def reader() -> None:
            offset = 1
            while offset <= total:
                started = time.monotonic()
                if not store.wait_for("t", 0, offset, 30_000):
                    return
                waits.append(time.monotonic() - started)
                messages = store.get("t", 0, offset, 64)
                got.extend(bytes(m.body) for m in messages)
                offset += len(messages)

        thread = threading.Thread(target=reader)
        thread.start()
        for i in range(total):
            store.put("t", 0, b"m%d" % i)
            if i % 100 == 0:
                time.sleep(0.001)  # now and then, let the reader catch up and sleep
        thread.join(60)
        assert not thread.is_alive()
    assert got == [b"m%d" % i for i in range(total)]
    assert max(waits) < 10.0
