"""Conformance with more clients nobody here wrote, on both engines: aiokafka
(idempotent producer, group consumer, commit and resume), kcat (Debian's; produce,
consume, list), and a rebalance across two confluent-kafka consumer processes.

These exercise the whole broker (handlers, groups, server) rather than one module,
the way issue 16's conformance suite asks.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest

from mqstore.broker import Broker

confluent_kafka = pytest.importorskip("confluent_kafka")
aiokafka = pytest.importorskip("aiokafka")

WAIT_S = 60.0


# ---------------------------------------------------------------- aiokafka


async def _aiokafka_round(bootstrap: str) -> tuple[list[Any], list[Any], int | None]:
    producer = aiokafka.AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, compression_type="gzip"
    )
    await producer.start()
    try:
        sent = [await producer.send_and_wait("aio", b"v%d" % i, partition=0) for i in range(20)]
    finally:
        await producer.stop()
    got = await _aiokafka_consume(bootstrap, 12, commit=True)
    rest = await _aiokafka_consume(bootstrap, 8, commit=False)  # resumes after the commit
    committed = await _aiokafka_committed(bootstrap)
    return sent, got + rest, committed


async def _aiokafka_consume(bootstrap: str, count: int, *, commit: bool) -> list[Any]:
    consumer = aiokafka.AIOKafkaConsumer(
        "aio", bootstrap_servers=bootstrap, group_id="aio-group",
        auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=count,
    )  # fmt: skip
    await consumer.start()
    got: list[Any] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while len(got) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500, max_records=count - len(got))
            for records in batches.values():
                got += records
        if commit:
            last = got[-1]
            tp = aiokafka.TopicPartition("aio", last.partition)
            await consumer.commit({tp: last.offset + 1})
    finally:
        await consumer.stop()
    return got


async def _aiokafka_committed(bootstrap: str) -> int | None:
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id="aio-group", enable_auto_commit=False
    )
    await consumer.start()
    try:
        committed: int | None = await consumer.committed(aiokafka.TopicPartition("aio", 0))
        return committed
    finally:
        await consumer.stop()


def test_aiokafka_produce_consume_commit_resume(broker: Broker) -> None:
    broker.engine.create_topic("aio", 1)
    sent, got, committed = asyncio.run(_aiokafka_round(broker.bootstrap))
    assert [m.offset for m in sent] == list(range(20))
    assert [m.value for m in got] == [b"v%d" % i for i in range(20)]
    assert [m.offset for m in got] == list(range(20))  # the second group run resumed at 12
    assert committed == 12
    assert broker.engine.offsets.load("aio-group")[("aio", 0)][0] == 12


# ---------------------------------------------------------------- kcat


def _kcat() -> str | None:
    found = shutil.which("kcat") or shutil.which("kafkacat")
    if found is None and not os.environ.get("MQSTORE_REQUIRE_KCAT"):
        pytest.skip("kcat is not installed (make kcat-deps installs it)")
    assert found is not None, "MQSTORE_REQUIRE_KCAT is set and kcat is absent"
    return found


def test_kcat_produce_consume_and_list(broker: Broker) -> None:
    kcat = _kcat()
    assert kcat is not None
    broker.engine.create_topic("kc", 1)
    lines = "".join(f"k{i}:value {i}\n" for i in range(10))
    produced = subprocess.run(
        [kcat, "-b", broker.bootstrap, "-P", "-t", "kc", "-p", "0", "-K", ":", "-z", "snappy"],
        input=lines, text=True, capture_output=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert broker.engine.latest_offset("kc", 0) == 10
    consumed = subprocess.run(
        [kcat, "-b", broker.bootstrap, "-C", "-t", "kc", "-o", "beginning", "-e",
         "-f", "%k=%s@%o\n"],
        text=True, capture_output=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == [f"k{i}=value {i}@{i}" for i in range(10)]
    listed = subprocess.run(
        [kcat, "-b", broker.bootstrap, "-L", "-J"],
        text=True, capture_output=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    topics = {t["topic"]: len(t["partitions"]) for t in json.loads(listed.stdout)["topics"]}
    assert topics["kc"] == 1
    record = broker.engine.read_records("kc", 0, 3, 1)[0]
    assert (record.key, record.value) == (b"k3", b"value 3")


# ---------------------------------------------------------------- two processes

_CONSUMER = """
import json, select, sys
import confluent_kafka
consumer = confluent_kafka.Consumer({
    "bootstrap.servers": sys.argv[1], "group.id": "two-procs", "auto.offset.reset": "earliest",
    "session.timeout.ms": 6000, "heartbeat.interval.ms": 300, "client.id": sys.argv[2],
})
consumer.subscribe(["rebal"])
last = None
while not select.select([sys.stdin], [], [], 0)[0]:
    consumer.poll(0.2)
    now = sorted(p.partition for p in consumer.assignment())
    if now != last:
        print(json.dumps(now), flush=True)
        last = now
consumer.close()  # LeaveGroup: the other member gets everything
print("closed", flush=True)
"""


class _ConsumerProcess:
    """A confluent-kafka group consumer in its own process; it prints its
    assignment on every change and leaves the group when its stdin gets a line."""

    def __init__(self, bootstrap: str, name: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _CONSUMER, bootstrap, name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.assignment: list[int] | None = None

    def read_until(self, wanted: Any) -> None:
        """Read assignment lines until ``wanted(assignment)`` holds."""
        stdout = self.process.stdout
        assert stdout is not None
        deadline = time.monotonic() + WAIT_S
        while not (self.assignment is not None and wanted(self.assignment)):
            left = deadline - time.monotonic()
            assert left > 0, f"assignment {self.assignment} never matched"
            if select.select([stdout], [], [], left)[0]:
                line = stdout.readline()
                assert line, "the consumer process ended"
                self.assignment = json.loads(line)

    def leave(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("leave\n")
        self.process.stdin.flush()
        assert self.process.wait(WAIT_S) == 0

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(WAIT_S)


def test_rebalance_across_two_consumer_processes(broker: Broker) -> None:
    broker.engine.create_topic("rebal", 4)
    first = _ConsumerProcess(broker.bootstrap, "first")
    second: _ConsumerProcess | None = None
    try:
        first.read_until(lambda parts: parts == [0, 1, 2, 3])
        second = _ConsumerProcess(broker.bootstrap, "second")
        second.read_until(lambda parts: len(parts) > 0)
        first.read_until(lambda parts: len(parts) > 0 and len(parts) < 4)
        assert first.assignment is not None and second.assignment is not None
        assert sorted(first.assignment + second.assignment) == [0, 1, 2, 3]
        second.leave()
        first.read_until(lambda parts: parts == [0, 1, 2, 3])
    finally:
        first.kill()
        if second is not None:
            second.kill()
