"""The mqstore Spark source and sink end to end, on one local[2] session."""

from __future__ import annotations

import json

import pytest

from mqstore import MessageStore, StoreConfig
from mqstore.engine import ProducerRecord
from mqstore.spark.sink import committed_batch_id
from tests.mqstore.conftest import SMALL

BASE_MS = 1_700_000_000_000


def _store(path, **overrides):
    return MessageStore.open(path, StoreConfig(**{**SMALL, **overrides}))


def _fill(path, partitions=2, per_partition=20):
    with _store(path) as store:
        store.create_topic("t", partitions)
        for p in range(partitions):
            store.append_records(
                "t",
                p,
                [
                    ProducerRecord(
                        b"k%d" % i, b"p%d-%d" % (p, i), [("h", b"%d" % i)], BASE_MS + i * 1000
                    )
                    for i in range(per_partition)
                ],
            )


def _read(spark, path, **options):
    reader = spark.read.format("mqstore").option("path", str(path))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_batch_read_schema_offsets_and_timestamps(spark, tmp_path):
    path = tmp_path / "s"
    _fill(path)
    df = _read(spark, path, subscribe="t", includeHeaders="true")
    assert df.columns == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers",
    ]  # fmt: skip
    rows = df.orderBy("partition", "offset").collect()
    assert len(rows) == 40
    first = rows[0]
    assert (first.key, first.value, first.topic, first.partition, first.offset) == (
        b"k0", b"p0-0", "t", 0, 0,
    )  # fmt: skip
    assert int(first.timestamp.timestamp() * 1000) == BASE_MS
    assert first.timestampType == 0
    assert [(h.key, h.value) for h in first.headers] == [("h", b"0")]

    starting = json.dumps({"t": {"0": 5, "1": -2}})
    ending = json.dumps({"t": {"0": 7, "1": 3}})
    got = _read(spark, path, subscribe="t", startingOffsets=starting, endingOffsets=ending)
    assert sorted((r.partition, r.offset) for r in got.collect()) == [
        (0, 5), (0, 6), (1, 0), (1, 1), (1, 2),
    ]  # fmt: skip

    by_time = _read(
        spark, path, assign=json.dumps({"t": [1]}),
        startingTimestamp=str(BASE_MS + 15_000), endingTimestamp=str(BASE_MS + 18_000),
    )  # fmt: skip
    assert [r.offset for r in by_time.orderBy("offset").collect()] == [15, 16, 17]
    rocket = _read(spark, path, subscribe="t", includeRocketMQColumns="true")
    row = rocket.where("partition = 0 and offset = 3").collect()[0]
    assert row["keys"] == ["k3"]
    assert row["tags"] is None


def test_min_partitions_splits_ranges(spark, tmp_path):
    path = tmp_path / "s"
    _fill(path, partitions=1, per_partition=100)
    df = _read(spark, path, subscribe="t", minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert sorted(r.offset for r in df.collect()) == list(range(100))


def test_fail_on_data_loss_after_retention(spark, tmp_path):
    path = tmp_path / "s"
    now = [BASE_MS]
    overrides = {"commitlog_file_size_bytes": 64 * 1024, "retention_hours": 1.0}
    config = StoreConfig(**{**SMALL, **overrides, "retention_check_interval_ms": 3_600_000})
    with MessageStore.open(path, config, clock_ms=lambda: now[0]) as store:
        store.create_topic("t", 1)
        store.put_batch("t", 0, [b"x" * 400] * 1000)
        now[0] += 2 * 3_600_000
        store.put_batch("t", 0, [b"y" * 400] * 10)
        store.run_retention()
        earliest = store.min_offset("t", 0)
    assert earliest > 0
    starting = json.dumps({"t": {"0": 0}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        _read(spark, path, subscribe="t", startingOffsets=starting).collect()
    rows = _read(spark, path, subscribe="t", startingOffsets=starting, failOnDataLoss="false")
    assert sorted(r.offset for r in rows.collect()) == list(range(earliest, 1010))


def test_write_round_trip(spark, tmp_path):
    path = tmp_path / "s"
    with _store(path) as store:
        store.create_topic("out", 3)
    data = [(b"k%d" % (i % 5), b"v%d" % i) for i in range(50)] + [(None, b"nokey")]
    spark.createDataFrame(data, "key binary, value binary").repartition(2).write.format(
        "mqstore"
    ).option("path", str(path)).option("topic", "out").mode("append").save()
    back = _read(spark, path, subscribe="out").collect()

    def order(kv):
        return (kv[0] or b"", kv[1])

    assert sorted(((r.key, r.value) for r in back), key=order) == sorted(data, key=order)
    by_key = {}
    for r in back:
        if r.key is not None:
            by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(parts) == 1 for parts in by_key.values())  # a key keeps its partition


def test_available_now_restart_reads_exactly_the_new_rows(spark, tmp_path):
    path = tmp_path / "s"
    _fill(path, partitions=2, per_partition=10)
    with _store(path) as store:
        store.create_topic("copy", 1)
    checkpoint = str(tmp_path / "checkpoint")

    def run():
        stream = (
            spark.readStream.format("mqstore").option("path", str(path)).option("subscribe", "t")
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "7").load()
        )  # fmt: skip
        query = (
            stream.select("key", "value").writeStream.format("mqstore")
            .option("path", str(path)).option("topic", "copy").option("sinkId", "copy")
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination()
        return query

    run()
    assert _read(spark, path, subscribe="copy").count() == 20
    with _store(path) as store:
        store.append_records(
            "t", 1, [ProducerRecord(None, b"new%d" % i, None, None) for i in range(5)]
        )
    run()
    copied = _read(spark, path, subscribe="copy").collect()
    assert len(copied) == 25
    assert sorted(r.value for r in copied if r.value.startswith(b"new")) == [
        b"new%d" % i for i in range(5)
    ]
    assert committed_batch_id(str(path), "copy") >= 3  # 20 rows / 7 per trigger, then 1
