"""The storage adapter: what goes in over the wire is the store's, and what the
embedded API wrote goes out over the wire."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from mqstore.broker import Broker, BrokerConfig, RecordLog
from mqstore.broker.batch import check_produced
from mqstore.commitlog.errors import OffsetOutOfRangeError
from mqstore.engine import ProducerRecord
from mqstore.segmented.record_batch import HEADER, BatchHeader, decode_records

WAIT_S = 20.0


def fetch_all(broker: Broker, topic: str, count: int) -> list[Any]:
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
        enable_auto_commit=False,
    )  # fmt: skip
    got: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + WAIT_S
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=300).values():
                got.extend(records)
    finally:
        consumer.close()
    return got


def test_wire_records_are_readable_by_get_query_by_key_and_offset_for_time(
    commitlog_broker: Broker,
) -> None:
    store: Any = commitlog_broker.engine
    producer = KafkaProducer(bootstrap_servers=commitlog_broker.bootstrap)
    try:
        stamps = [1_700_000_000_000 + 1000 * i for i in range(20)]
        for i, stamp in enumerate(stamps):
            producer.send("wire", key=b"user-%d" % i, value=b"body-%d" % i, timestamp_ms=stamp)
        producer.flush(timeout=WAIT_S)
    finally:
        producer.close(timeout=5)
    assert store.wait_for("wire", 0, 19, 5_000)
    message = store.get("wire", 0, 4, 1)[0]
    assert bytes(message.body) == b"body-4"
    assert message.born_timestamp_ms == stamps[4]
    found = store.query_by_key("wire", "user-11")
    assert [bytes(m.body) for m in found] == [b"body-11"]
    assert store.offset_for_time("wire", 0, stamps[7] - 1) == 7
    assert store.offset_for_time("wire", 0, stamps[-1] + 1) is None


def test_wire_records_are_read_by_spark_and_the_cli(tmp_path: Any, spark: Any) -> None:
    """librdkafka produces keyed records with headers and timestamps; once the broker
    has stopped, the Spark source and ``mqstore consume`` read them from the store."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from mqstore import MessageStore

    path = tmp_path / "store"
    stamps = [1_700_000_000_000 + 1000 * i for i in range(12)]
    with MessageStore.open(path) as store, Broker(store, BrokerConfig(port=0)) as running:
        producer = confluent_kafka.Producer({"bootstrap.servers": running.bootstrap})
        for i, stamp in enumerate(stamps):
            producer.produce(
                "wire", key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"%d" % i)],
                timestamp=stamp, partition=0,
            )  # fmt: skip
        assert producer.flush(WAIT_S) == 0
    rows = (
        spark.read.format("mqstore").option("path", str(path)).option("subscribe", "wire")
        .option("includeHeaders", "true").load().orderBy("offset").collect()
    )  # fmt: skip
    assert [(r.key, r.value, r.offset) for r in rows] == [
        (b"k%d" % i, b"v%d" % i, i) for i in range(12)
    ]
    assert [int(r.timestamp.timestamp() * 1000) for r in rows] == stamps
    assert [[(h.key, h.value) for h in r.headers] for r in rows] == [
        [("h", b"%d" % i)] for i in range(12)
    ]
    consumed = subprocess.run(
        [sys.executable, "-m", "mqstore", "--store", str(path), "consume", "wire",
         "--print-key", "--key-separator", ":"],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    assert consumed.stdout.decode().splitlines() == [f"k{i}:v{i}" for i in range(12)]


def test_embedded_writes_are_fetchable(broker: Broker) -> None:
    engine = broker.engine
    engine.create_topic("local", 1)
    engine.append_records(
        "local", 0,
        [ProducerRecord(b"k%d" % i, b"v%d" % i, [("h", b"x")], 1_000 + i) for i in range(30)]
        + [ProducerRecord(None, None, [], None)],  # a tombstone without a key
    )  # fmt: skip
    if hasattr(engine, "put"):  # the CommitLog engine's own API too
        engine.put("local", 0, b"from-put")
    expected = engine.latest_offset("local", 0)
    records = fetch_all(broker, "local", expected)
    assert [r.offset for r in records] == list(range(expected))
    assert (records[3].key, records[3].value, records[3].timestamp) == (b"k3", b"v3", 1_003)
    assert records[3].headers == [("h", b"x")]
    assert (records[30].key, records[30].value) == (None, None)
    if hasattr(engine, "put"):
        assert records[31].value == b"from-put"


def test_fetch_sizes_and_ranges(engine: Any) -> None:
    engine.create_topic("sized", 1)
    engine.append_records(
        "sized", 0, [ProducerRecord(None, b"x" * 1000, [], 5) for _ in range(100)]
    )
    log = RecordLog(engine)
    small = log.fetch("sized", 0, 10, 4_000)
    assert len(small) == 1
    header = BatchHeader._make(HEADER.unpack_from(small[0]))
    assert header.base_offset == 10
    assert 1 <= header.records_count <= 4
    records = decode_records(small[0], 0, check_produced(small[0]).header, 10, 100)
    assert [r.offset for r in records] == list(range(10, 10 + header.records_count))
    one = log.fetch("sized", 0, 0, 10)  # smaller than one record: still one (KIP-74)
    assert BatchHeader._make(HEADER.unpack_from(one[0])).records_count == 1
    whole = b"".join(log.fetch("sized", 0, 0, 1 << 20))
    assert len(whole) > 100_000
    assert log.fetch("sized", 0, 100, 1 << 20) == []
    with pytest.raises(OffsetOutOfRangeError):
        log.fetch("sized", 0, 101, 1 << 20)
