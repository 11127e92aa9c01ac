"""``mqstore serve --follow`` as real processes on real sockets: a leader and a follower
broker, confluent-kafka producing to the leader and consuming from the follower, the
follower SIGKILLed mid-stream and the leader restarted under it; the follower's
CommitLog ends byte-identical to the leader's."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from mqstore.commitlog.errors import StoreError  # noqa: E402

FILE_BYTES = 1 << 20  # 1 MiB CommitLog files: the copy crosses many rolls
START_S = 60.0
CATCH_UP_S = 60.0
TOPIC = "replicated"
PARTITIONS = 3


class Node:
    """One ``mqstore serve`` process over a store directory."""

    def __init__(self, store: Any, *extra: str, listen: str = "127.0.0.1:0") -> None:
        self.store = store
        command = [
            sys.executable, "-m", "mqstore", "--store", str(store),
            "--config", f"commitlog_file_size_bytes={FILE_BYTES}",
            "serve", "--listen", listen, *extra,
        ]  # fmt: skip
        errors = open(f"{store}.stderr", "a")  # noqa: SIM115 - the child writes it
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        errors.close()
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        found = re.search(r" on (\S+:\d+)$", line.strip())
        if found is None:
            self.process.kill()
            raise AssertionError(f"serve did not start: {line!r} {self.log()}")
        self.bootstrap = found.group(1)

    def log(self) -> str:
        with open(f"{self.store}.stderr") as logged:
            return logged.read()[-4000:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=60)


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    started: list[Node] = []
    yield started
    for node in started:
        if node.process.poll() is None:
            node.process.kill()
            node.process.wait()


def _produce(bootstrap: str, first: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    failed: list[Any] = []
    for i in range(first, first + count):
        producer.produce(
            TOPIC, value=b"value-%d-" % i + bytes(200), key=b"key-%d" % i,
            partition=i % PARTITIONS, on_delivery=lambda error, _: error and failed.append(error),
        )  # fmt: skip
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert failed == []


def _watermarks(bootstrap: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
            for p in range(PARTITIONS)
        ]
    finally:
        consumer.close()


def _store_marks(store: Any) -> list[int]:
    """The end offset of each partition, read from the store's own files (a client
    bootstrapped at a follower is sent to the leader for everything)."""
    from mqstore import MessageStore

    try:
        with MessageStore.open(store, read_only=True) as reader:
            if reader.topics.get(TOPIC) is None:
                return []
            return [reader.max_offset(TOPIC, p) for p in range(PARTITIONS)]
    except StoreError:
        return []  # a file changed under the reader: ask again


def _wait_caught_up(leader: Node, follower: Node, expected: int) -> None:
    deadline = time.monotonic() + CATCH_UP_S
    marks: list[int] = []
    while time.monotonic() < deadline:
        marks = _store_marks(follower.store)
        if sum(marks) == expected:
            assert marks == _watermarks(leader.bootstrap)
            return
        time.sleep(0.2)
    raise AssertionError(f"follower at {marks}, want {expected} records: {follower.log()}")


def _consume_all(bootstrap: str, expected: int) -> dict[int, list[tuple[int, bytes, bytes]]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    records: dict[int, list[tuple[int, bytes, bytes]]] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + CATCH_UP_S
    got = 0
    while got < expected and time.monotonic() < deadline:
        for message in consumer.consume(1000, 1.0):
            assert message.error() is None, message.error()
            records[message.partition()].append((message.offset(), message.key(), message.value()))
            got += 1
    consumer.close()
    assert got == expected
    return records


def _create_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)


def _commitlog_files(store: Any) -> dict[str, bytes]:
    directory = os.path.join(store, "commitlog")
    return {
        name: open(os.path.join(directory, name), "rb").read() for name in os.listdir(directory)
    }


def _log_end(store: Any) -> int:
    from mqstore import MessageStore

    with MessageStore.open(store, read_only=True) as reader:
        return int(reader.commitlog.write_position)


def _assert_identical(leader: Node, follower: Node) -> None:
    mine, theirs = _commitlog_files(leader.store), _commitlog_files(follower.store)
    assert sorted(mine) == sorted(theirs)
    assert len(mine) >= 2  # rolled at least once
    for name in mine:
        assert mine[name] == theirs[name], name


def _read_store(store: Any) -> dict[int, list[tuple[int, bytes, bytes]]]:
    """Every record of TOPIC through the embedded read-only API."""
    from mqstore import MessageStore

    records: dict[int, list[tuple[int, bytes, bytes]]] = {}
    with MessageStore.open(store, read_only=True) as reader:
        for partition in range(PARTITIONS):
            records[partition] = []
            while got := reader.get(TOPIC, partition, len(records[partition]), 10_000):
                records[partition] += [
                    (m.queue_offset, m.keys[0].encode(), bytes(m.value)) for m in got
                ]
    return records


def test_a_follower_serves_what_the_leader_took_and_sends_writers_to_it(tmp_path, nodes):
    leader = Node(tmp_path / "leader")
    nodes.append(leader)
    follower = Node(tmp_path / "follower", "--follow", leader.bootstrap)
    nodes.append(follower)
    _create_topic(leader.bootstrap)
    _produce(leader.bootstrap, 0, 12_000)  # ~3 MiB: several 1 MiB files
    _wait_caught_up(leader, follower, 12_000)
    by_wire = _consume_all(leader.bootstrap, 12_000)
    assert _read_store(follower.store) == by_wire  # the follower's own reads

    from kafka import KafkaAdminClient, KafkaProducer

    # The follower's Metadata names the leader (node 0 at its address): a client that
    # only knows the follower finds the leader and writes there.
    admin = KafkaAdminClient(bootstrap_servers=follower.bootstrap)
    try:
        cluster = admin.describe_cluster()
        topic = admin.describe_topics([TOPIC])[0]
    finally:
        admin.close()
    leader_port = int(leader.bootstrap.rpartition(":")[2])
    assert {(b["broker_id"], b["port"]) for b in cluster["brokers"]} >= {(0, leader_port)}
    assert {p["leader_id"] for p in topic["partitions"]} == {0}
    producer = KafkaProducer(bootstrap_servers=follower.bootstrap)
    sent = producer.send(TOPIC, b"via the follower", key=b"via", partition=0).get(timeout=30)
    producer.close(timeout=5)
    assert sent.offset == len(by_wire[0])
    _wait_caught_up(leader, follower, 12_001)
    assert _read_store(follower.store)[0][-1] == (sent.offset, b"via", b"via the follower")
    assert _store_marks(follower.store) == _watermarks(leader.bootstrap)
    follower.stop()
    leader.stop()
    assert follower.process.returncode == 0
    _assert_identical(leader, follower)


def test_a_killed_follower_resumes_from_its_end(tmp_path, nodes):
    leader = Node(tmp_path / "leader")
    nodes.append(leader)
    _create_topic(leader.bootstrap)
    follower = Node(tmp_path / "follower", "--follow", leader.bootstrap)
    nodes.append(follower)
    writer = threading.Thread(target=_produce, args=(leader.bootstrap, 0, 30_000))
    writer.start()
    deadline = time.monotonic() + 60
    while _log_end(tmp_path / "follower") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # kill it as soon as it copied something, the writer still going
    follower.stop(signal.SIGKILL)  # mid-stream: a torn tail, an unflushed page cache
    copied_at_kill = _log_end(tmp_path / "follower")
    writer_was_running = writer.is_alive()
    writer.join()
    assert writer_was_running  # the leader went on writing past the killed follower
    assert 0 < copied_at_kill < _log_end(tmp_path / "leader")  # it did die mid-stream
    follower = Node(tmp_path / "follower", "--follow", leader.bootstrap)
    nodes.append(follower)
    _wait_caught_up(leader, follower, 30_000)
    assert _consume_all(follower.bootstrap, 30_000) == _consume_all(leader.bootstrap, 30_000)
    follower.stop()
    leader.stop()
    _assert_identical(leader, follower)


def test_a_follower_reconnects_when_its_leader_comes_back(tmp_path, nodes):
    leader = Node(tmp_path / "leader")
    nodes.append(leader)
    _create_topic(leader.bootstrap)
    follower = Node(tmp_path / "follower", "--follow", leader.bootstrap)
    nodes.append(follower)
    _produce(leader.bootstrap, 0, 3_000)
    _wait_caught_up(leader, follower, 3_000)
    leader.stop(signal.SIGKILL)
    time.sleep(1.0)  # the follower backs off and retries meanwhile
    leader = Node(tmp_path / "leader", listen=leader.bootstrap)
    nodes.append(leader)
    _produce(leader.bootstrap, 3_000, 3_000)
    _wait_caught_up(leader, follower, 6_000)
    follower.stop()
    leader.stop()
    assert "again in" in follower.log()  # it did lose the leader and back off
    _assert_identical(leader, follower)


def test_acks_all_through_the_cli_waits_for_the_in_sync_follower(tmp_path, nodes):
    from kafka import KafkaProducer
    from kafka.errors import NotEnoughReplicasError

    leader = Node(
        tmp_path / "leader", "--replica-ids", "1", "--min-insync-replicas", "2",
        "--replica-lag-time-max-ms", "1000",
    )  # fmt: skip
    nodes.append(leader)
    _create_topic(leader.bootstrap)

    def acks_all() -> Any:
        producer = KafkaProducer(bootstrap_servers=leader.bootstrap, acks="all", retries=0)
        try:
            return producer.send(TOPIC, b"one", partition=0).get(timeout=30)
        finally:
            producer.close(timeout=5)

    with pytest.raises(NotEnoughReplicasError):
        acks_all()  # follower 1 is not in sync: refused before the append
    follower = Node(tmp_path / "follower", "--follow", leader.bootstrap, "--replica-id", "1")
    nodes.append(follower)
    deadline = time.monotonic() + CATCH_UP_S
    while True:
        try:
            acks_all()
            break
        except NotEnoughReplicasError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    _produce(leader.bootstrap, 0, 3_000)  # librdkafka, acks=all: every ack is on both
    _wait_caught_up(leader, follower, 3_001)
    follower.stop(signal.SIGKILL)
    time.sleep(1.5)  # replica.lag.time.max.ms: 1 leaves the in-sync set
    with pytest.raises(NotEnoughReplicasError):
        acks_all()
