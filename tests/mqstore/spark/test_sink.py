"""The sink while a service process holds the store open: Spark's rows go through
the inbox (spool files the service appends), batch and streaming."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from mqstore import MessageStore, StoreConfig, StoreLockedError
from mqstore.engine import ProducerRecord
from mqstore.inbox import INBOX_DIR, LEDGER_NAME, QUARANTINE_DIR
from mqstore.spark.sink import committed_batch_id
from tests.mqstore.conftest import SMALL

ROOT = Path(__file__).resolve().parents[3]
SERVICE = """
import sys, time
from mqstore import MessageStore, StoreConfig
store = MessageStore.open(sys.argv[1], StoreConfig(**CONFIG))
for name, partitions in (("events", 1), ("out", 3), ("copy", 2)):
    if name not in store.list_topics():
        store.create_topic(name, partitions)
print("open", flush=True)
i = 0
while True:  # a live service: it produces until it is killed
    store.put("events", 0, b"event-%d" % i)
    i += 1
    time.sleep(0.001)  # about a thousand events a second, not a busy loop
""".replace("CONFIG", repr({**SMALL, "inbox_interval_ms": 50}))


@pytest.fixture
def service(tmp_path):
    """A service process that holds the store at tmp_path/s open for writing."""
    path = tmp_path / "s"
    child = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "open"
        with pytest.raises(StoreLockedError):
            MessageStore.open(path, StoreConfig(**SMALL))
        yield path
        assert child.poll() is None, "the service kept running through the Spark job"
    finally:
        child.kill()
        child.wait(10)


def _inbox(path):
    return sorted(os.listdir(os.path.join(path, INBOX_DIR)))


def _read(spark, path, topic):
    return spark.read.format("mqstore").option("path", str(path)).option("subscribe", topic).load()


def test_batch_write_while_a_service_process_holds_the_store(spark, service):
    data = [(b"k%d" % (i % 7), b"v%d" % i) for i in range(300)] + [(None, b"nokey")]
    df = spark.createDataFrame(data, "key binary, value binary").repartition(2)
    df.write.format("mqstore").option("path", str(service)).option("topic", "out").mode(
        "append"
    ).save()
    back = _read(spark, service, "out").collect()  # readable when save() returns
    assert Counter((r.key, r.value) for r in back) == Counter(data)
    by_key = {}
    for r in back:
        if r.key is not None:
            by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(parts) == 1 for parts in by_key.values())  # a key keeps its partition
    assert _inbox(service) == [LEDGER_NAME, QUARANTINE_DIR]  # every spool file ingested
    with open(os.path.join(service, INBOX_DIR, LEDGER_NAME), encoding="utf-8") as handle:
        done = json.load(handle)["body"]["done"]
    assert sum(entry["rows"] for entry in done.values()) == len(data)


def test_streaming_write_while_a_service_holds_the_store_is_idempotent(spark, tmp_path):
    path = tmp_path / "s"
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:
        store.create_topic("src", 2)
        for p in range(2):
            store.append_records(
                "src", p, [ProducerRecord(None, b"s%d-%d" % (p, i), (), None) for i in range(15)]
            )
    checkpoint = str(tmp_path / "checkpoint")

    def run():
        stream = (
            spark.readStream.format("mqstore").option("path", str(path))
            .option("subscribe", "src").option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "10").load()
        )  # fmt: skip
        query = (
            stream.select("value").writeStream.format("mqstore").option("path", str(path))
            .option("topic", "copy").option("sinkId", "copy")
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination()
        return query

    child = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "open"
        query = run()
        copied = Counter(r.value for r in _read(spark, path, "copy").collect())
        assert copied == Counter(b"s%d-%d" % (p, i) for p in range(2) for i in range(15))
        assert committed_batch_id(str(path), "copy") == 2  # 30 rows, 10 per trigger
        with open(os.path.join(path, INBOX_DIR, LEDGER_NAME), encoding="utf-8") as handle:
            names = list(json.load(handle)["body"]["done"])
        assert names
        assert all(name.startswith(f"copy.q{query.id}.b") for name in names)
        run()  # a restart from the checkpoint: nothing new, nothing written again
        assert _read(spark, path, "copy").count() == 30
        assert child.poll() is None
    finally:
        child.kill()
        child.wait(10)
