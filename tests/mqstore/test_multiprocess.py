"""Several processes: a read-only reader follows a live writer process (woken by the
writer's ``notify`` file, polling without it, never hanging on a dead writer); a second
writer is refused; a SIGKILLed writer's lock is taken over (the kernel drops flock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mqstore import KafkaConsumer, MessageStore, StoreConfig, StoreLockedError, TopicPartition
from tests.mqstore.conftest import SMALL

ROOT = Path(__file__).resolve().parents[2]
TOTAL = 3_000  # messages the writer process puts, spread over many CommitLog files
DEADLINE_S = 30.0
CONFIG_EXPR = f"StoreConfig(**{SMALL!r})"
WRITER = f"""
import sys, time
from mqstore import MessageStore, StoreConfig
store = MessageStore.open(sys.argv[1], {CONFIG_EXPR})
store.create_topic("k", partitions=1)
print("open", flush=True)
sys.stdin.readline()  # the parent is ready to follow
for i in range(int(sys.argv[2])):
    store.put("k", 0, b"value-%06d" % i, keys=["key-%d" % i], born_timestamp_ms=1_000_000 + i)
print("done", flush=True)
sys.stdin.readline()  # stay open (holding the lock) until told, or killed
store.close()
"""


def _writer(path: Path, count: int) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(count)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "open"
    return child


def _stop(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        child.kill()
    child.wait(10)


def test_reader_process_follows_a_writer_process(tmp_path):
    path = tmp_path / "s"
    writer = _writer(path, TOTAL)
    try:
        with pytest.raises(StoreLockedError):
            MessageStore.open(path, StoreConfig(**SMALL))
        reader = MessageStore.open(path, StoreConfig(**SMALL), read_only=True)
        consumer = KafkaConsumer(store=reader, auto_offset_reset="earliest")
        consumer.assign([TopicPartition("k", 0)])
        assert writer.stdin is not None
        writer.stdin.write("go\n")
        writer.stdin.flush()
        seen: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(seen) < TOTAL:  # follow new data through the writer's ConsumeQueues
            assert time.monotonic() < deadline, f"followed {len(seen)} of {TOTAL}"
            for records in consumer.poll(timeout_ms=200).values():
                seen.extend(record.value for record in records)
        assert seen == [b"value-%06d" % i for i in range(TOTAL)]
        assert reader.wait_for("k", 0, TOTAL - 1, 1000)
        assert reader.wait_for("k", 0, TOTAL, 50) is False  # nothing more: times out
        hits = reader.query_by_key("k", "key-1234", 0, 2**62, 4)
        assert [bytes(m.body) for m in hits] == [b"value-001234"]
        assert reader.offset_for_time("k", 0, 1_000_000 + 2_500) == 2_500
        consumer.close()
        reader.close()
    finally:
        _stop(writer)


def test_stale_lock_of_a_killed_writer_is_taken_over(tmp_path):
    path = tmp_path / "s"
    writer = _writer(path, 200)
    try:
        assert writer.stdin is not None
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "done"
        with pytest.raises(StoreLockedError):
            MessageStore.open(path, StoreConfig(**SMALL))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(10)
        assert (path / "abort").exists()  # it died with the store open
        assert (path / "lock").exists()  # the stale lock file is still there
        with MessageStore.open(path, StoreConfig(**SMALL)) as store:
            assert store.recovered_from_crash
            assert store.max_offset("k", 0) == 200
            assert bytes(store.get("k", 0, 199, 1)[0].body) == b"value-000199"
            with pytest.raises(StoreLockedError):  # and it holds the lock itself now
                MessageStore.open(path, StoreConfig(**SMALL))
    finally:
        _stop(writer)


FOLLOWER = f"""
import sys, time
import mqstore.store
from mqstore import MessageStore, StoreConfig
mqstore.store.FOLLOW_SLICE_S = 120.0  # no slice ends the sleep: only the writer's notice
store = MessageStore.open(sys.argv[1], {CONFIG_EXPR}, read_only=True)
print("ready", flush=True)
started = time.monotonic()
woke = store.wait_for("k", 0, 1, 120_000)
print(woke, store._follower is not None, time.monotonic() - started, flush=True)
store.close()
"""


def test_a_follower_process_is_woken_by_the_writers_notice(tmp_path):
    path = tmp_path / "s"
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:
        store.put("k", 0, b"first")
        child = subprocess.Popen(
            [sys.executable, "-c", FOLLOWER, str(path)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
            time.sleep(0.2)  # the follower sleeps in its wait by now
            store.put("k", 0, b"second")
            woke, followed, took_s = child.stdout.readline().split()
            assert child.wait(DEADLINE_S) == 0
        finally:
            _stop(child)
    assert woke == "True"
    assert followed == "True"  # it slept on ``notify``, not polling
    assert float(took_s) < 60.0  # far less than its 120 s slice: the notice woke it


def test_a_follower_of_a_killed_writer_times_out_instead_of_hanging(tmp_path):
    path = tmp_path / "s"
    writer = _writer(path, 0)
    try:
        reader = MessageStore.open(path, StoreConfig(**SMALL), read_only=True)
        started = time.monotonic()
        assert reader.wait_for("k", 0, 0, 200) is False  # a live writer, nothing put
        assert reader._follower is not None
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(10)
        started = time.monotonic()
        assert reader.wait_for("k", 0, 0, 300) is False  # nobody will ever bump now
        took_s = time.monotonic() - started
        assert 0.3 <= took_s < 5.0
        reader.close()
    finally:
        _stop(writer)


def test_a_follower_of_a_store_without_a_notice_file_polls(tmp_path):
    """A store whose writer is older than ``notify`` (no such file): the follower
    polls as before and still sees every put."""
    path = tmp_path / "s"
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:
        store.put("k", 0, b"first")
        os.remove(path / "notify")
        with MessageStore.open(path, StoreConfig(**SMALL), read_only=True) as reader:
            timer = threading.Timer(0.05, lambda: store.put("k", 0, b"second"))
            timer.start()
            assert reader.wait_for("k", 0, 1, 10_000)
            timer.join()
            assert reader._follower is None
            assert [bytes(m.body) for m in reader.get("k", 0, 0, 10)] == [b"first", b"second"]
