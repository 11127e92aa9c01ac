"""The shared unit log through the store: graduation, retention, a read-only follower.

Queues start in their topic's shared unit log and graduate to files of their own at
``consumequeue_shared_units_max`` units (docs/QUEUES.md); SMALL turns that off for
the file-level tests, these turn it on.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from mqstore import MessageStore, StoreConfig
from tests.mqstore.conftest import SMALL

SHARED_UNITS = 16
CONFIG = StoreConfig(**{**SMALL, "consumequeue_shared_units_max": SHARED_UNITS})
HOUR_MS = 3_600_000


def _bodies(store: MessageStore, topic: str, queue_id: int, start: int = 0) -> list[bytes]:
    bodies: list[bytes] = []
    offset = start
    while offset < store.max_offset(topic, queue_id):
        messages = store.get(topic, queue_id, offset, 7)  # batches straddle the boundary
        assert messages, f"no message at {offset}"
        for message in messages:
            assert message.queue_offset == offset
            bodies.append(bytes(message.body))
            offset += 1
    return bodies


def test_queue_graduates_and_reads_across_the_boundary(tmp_path):
    path = tmp_path / "s"
    with MessageStore.open(path, CONFIG) as store:
        for i in range(100):
            store.put("t", 0, b"zero-%d" % i, born_timestamp_ms=1_000 + i)
            if i % 20 == 0:
                store.put("t", 1, b"one-%d" % i)
        assert _bodies(store, "t", 0) == [b"zero-%d" % i for i in range(100)]
        assert _bodies(store, "t", 1) == [b"one-%d" % i for i in range(0, 100, 20)]
        queue = store.consume_queues.queue("t", 0)
        assert queue._first_offset == SHARED_UNITS  # own files from the threshold on
        assert queue.get(SHARED_UNITS - 1)["size"] > 0
        assert len(queue.timestamps(10, 20)) == 20  # across the boundary
    topic_dir = path / "consumequeue" / "t"
    assert (topic_dir / ".shared").is_dir()
    assert (topic_dir / "0").is_dir()
    assert not (topic_dir / "1").exists()  # 5 units: never graduated, no files of its own
    with MessageStore.open(path, CONFIG) as store:
        assert store.min_offset("t", 0) == 0
        assert store.max_offset("t", 0) == 100
        assert store.max_offset("t", 1) == 5
        assert _bodies(store, "t", 0) == [b"zero-%d" % i for i in range(100)]
        assert _bodies(store, "t", 1) == [b"one-%d" % i for i in range(0, 100, 20)]
        store.put("t", 1, b"one-more")
        assert store.max_offset("t", 1) == 6
    with MessageStore.open(path, read_only=True) as reader:
        assert _bodies(reader, "t", 1)[-1] == b"one-more"
        assert len(_bodies(reader, "t", 0)) == 100


def test_queue_whose_records_retention_deleted_keeps_its_offsets(tmp_path):
    now = [10 * HOUR_MS]
    config = StoreConfig(
        **{**SMALL, "consumequeue_shared_units_max": SHARED_UNITS,
           "commitlog_file_size_bytes": 64 * 1024, "retention_hours": 1.0,
           "retention_check_interval_ms": 3_600_000}
    )  # fmt: skip
    path = tmp_path / "s"
    queues = 300  # one unit each: 300 records, five shared files of 64
    with MessageStore.open(path, config, clock_ms=lambda: now[0]) as store:
        for queue_id in range(queues):
            store.put("t", queue_id, b"." * 400)
        now[0] += 2 * HOUR_MS
        for _ in range(200):  # a new CommitLog file; queue 0 graduates
            store.put("t", 0, b"+" * 400)
        store.run_retention()
        assert store.commitlog.min_position > 0
        assert store.min_offset("t", 7) == 1 == store.max_offset("t", 7)
    shared = path / "consumequeue" / "t" / ".shared"
    assert (shared / "ends").is_file()
    assert "0" * 20 not in os.listdir(shared)  # the oldest shared file was deleted
    with MessageStore.open(path, config, clock_ms=lambda: now[0]) as store:
        for queue_id in (1, 7, 200):  # records in the deleted CommitLog files
            assert store.max_offset("t", queue_id) == 1
            assert store.min_offset("t", queue_id) == 1
        assert store.put("t", 7, b"again").queue_offset == 1
        assert [bytes(m.body) for m in store.get("t", 7, 1)] == [b"again"]
        assert store.max_offset("t", 0) == 201
    with MessageStore.open(path, config, clock_ms=lambda: now[0]) as store:
        assert store.max_offset("t", 7) == 2
        assert store.max_offset("t", 8) == 1


def _wait_for(reader: MessageStore, queue_id: int, count: int) -> None:
    deadline = time.monotonic() + 10
    while reader.max_offset("t", queue_id) < count:
        assert time.monotonic() < deadline, reader.max_offset("t", queue_id)
        time.sleep(0.005)


def test_read_only_follower_sees_shared_units_and_graduation(tmp_path):
    path = tmp_path / "s"
    with MessageStore.open(path, CONFIG) as writer:
        writer.put("t", 0, b"first")
        writer.put("t", 1, b"other")
        with MessageStore.open(path, read_only=True) as reader:
            _wait_for(reader, 0, 1)
            assert _bodies(reader, "t", 0) == [b"first"]
            for i in range(1, 10):  # still shared
                writer.put("t", 0, b"m%d" % i)
            _wait_for(reader, 0, 10)
            assert _bodies(reader, "t", 0)[1:] == [b"m%d" % i for i in range(1, 10)]
            for i in range(10, 40):  # graduates at SHARED_UNITS
                writer.put("t", 0, b"m%d" % i)
            _wait_for(reader, 0, 40)
            assert _bodies(reader, "t", 0)[1:] == [b"m%d" % i for i in range(1, 40)]
            assert _bodies(reader, "t", 1) == [b"other"]
            assert reader.offset_for_time("t", 0, 0) == 0


@pytest.mark.parametrize("units_max", [0, 4])
def test_changing_the_threshold_keeps_every_unit(tmp_path, units_max):
    path = tmp_path / "s"
    with MessageStore.open(path, CONFIG) as store:
        for i in range(10):
            store.put("t", 0, b"%d" % i)
    config = StoreConfig(**{**SMALL, "consumequeue_shared_units_max": units_max})
    with MessageStore.open(path, config) as store:
        for i in range(10, 30):
            store.put("t", 0, b"%d" % i)
        assert _bodies(store, "t", 0) == [b"%d" % i for i in range(30)]
        assert store.consume_queues.queue("t", 0)._first_offset == 10


def test_many_queues_put_and_dispatch_without_a_queue_object(tmp_path):
    """Issue 15: putting to a created topic's queues builds no ConsumeQueue object
    (the CommitLog's offsets come from one seed per topic, the dispatcher's slots from
    the shared log) until a queue graduates; offsets continue across a reopen, for
    shared and graduated queues alike."""
    path = tmp_path / "s"
    counts = dict.fromkeys(range(50), 0)
    with MessageStore.open(path, CONFIG) as store:
        store.create_topic("t", 50)
        for round_ in range(3):
            for queue_id in range(50):
                assert (
                    store.put("t", queue_id, b"%d-%d" % (queue_id, round_)).queue_offset
                    == (counts[queue_id])
                )
                counts[queue_id] += 1
        for _ in range(SHARED_UNITS):  # queue 7 graduates
            store.put("t", 7, b"7-more")
            counts[7] += 1
        dispatcher = store._dispatcher
        assert dispatcher is not None
        dispatcher.dispatch_available()
        assert set(store.consume_queues._queues) == {("t", 7)}
        assert store.consume_queues._queues[("t", 7)].append_limit() == -1
        assert _bodies(store, "t", 3) == [b"3-0", b"3-1", b"3-2"]
    with MessageStore.open(path, CONFIG) as store:
        for queue_id in (7, 3, 49, 0):
            assert store.put("t", queue_id, b"again").queue_offset == counts[queue_id]
            counts[queue_id] += 1
        for queue_id, count in counts.items():
            assert store.max_offset("t", queue_id) == count
        assert _bodies(store, "t", 3) == [b"3-0", b"3-1", b"3-2", b"again"]


def test_the_shared_logs_sync_outside_the_store_lock(tmp_path, monkeypatch):
    """The checkpoint's flush takes the shared logs' unsynced files under the
    ConsumeQueue store lock and syncs them after: dispatch and reads, which take that
    lock, never wait for the disk (they did, for every shared log's fdatasync)."""
    from mqstore.consumequeue import queue_store

    store = MessageStore.open(tmp_path / "s", CONFIG)
    try:
        store.create_topic("t", 8)
        for queue_id in range(8):
            store.put("t", queue_id, b"x")
        assert store.get("t", 7, 0, 1)  # dispatched: the units are in the shared log
        lock = store.consume_queues._ctx.lock
        synced: list[tuple[list[str], bool]] = []
        real = queue_store.sync_paths

        def try_lock(taken: list[bool]) -> None:  # in another thread: dispatch's place
            taken.append(lock.acquire(timeout=2))
            if taken[0]:
                lock.release()

        def sync_paths(files, directories):
            taken: list[bool] = []
            other = threading.Thread(target=try_lock, args=(taken,))
            other.start()
            other.join()
            synced.append((files, taken[0]))
            real(files, directories)

        monkeypatch.setattr(queue_store, "sync_paths", sync_paths)
        store.consume_queues.flush()
        assert synced and synced[0][0]  # a shared log file was synced...
        assert all(free for _, free in synced)  # ...with the lock free
    finally:
        store.close()
