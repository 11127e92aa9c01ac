"""Pipeline: a service produces events into the store, Spark Structured Streaming
counts them per key over 10-second event-time windows, writes the counts back into
another topic, and a consumer reads them.

    .venv/bin/python -m examples.pipeline [--path ./pipeline-data] [--events 2000]

The store has ONE writer. The producing service holds the store open while it
runs; Spark's sink must be the writer when it writes, so the service produces its
events and closes, then the streaming job (availableNow) aggregates and writes,
then the consumer reads the results read-only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from mqstore import KafkaProducer, MessageStore, StoreConfig

BASE_MS = 1_700_000_000_000


def produce(path: str, events: int) -> None:
    """The service: events keyed by user, one per 100 ms of event time."""
    with MessageStore.open(path, StoreConfig(prewarm=False)) as store:
        for topic in ("events", "counts"):
            if topic not in store.list_topics():
                store.create_topic(topic, partitions=2)
        producer = KafkaProducer(store, key_serializer=str.encode, value_serializer=str.encode)
        for i in range(events):
            producer.send(
                "events", f"click-{i}", key=f"user-{i % 5}", timestamp_ms=BASE_MS + i * 100
            )
        producer.flush()


def aggregate(path: str, checkpoint: str) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import mqstore.spark

    spark = (
        SparkSession.builder.master("local[2]").appName("mqstore-pipeline")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", sys.executable).getOrCreate()
    )  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    mqstore.spark.register(spark)
    events = (
        spark.readStream.format("mqstore").option("path", path).option("subscribe", "events")
        .option("startingOffsets", "earliest").load()
    )  # fmt: skip
    counts = (
        events.withWatermark("timestamp", "10 seconds")
        .groupBy(F.window("timestamp", "10 seconds"), F.col("key"))
        .count()
        .select(
            F.col("key"),
            F.to_json(F.struct(F.col("window.start").alias("start"), "count"))
            .cast("binary").alias("value"),
        )
    )  # fmt: skip
    query = (
        counts.writeStream.format("mqstore").outputMode("append").option("path", path)
        .option("topic", "counts").option("sinkId", "pipeline-counts")
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    spark.stop()


def consume(path: str) -> None:
    with MessageStore.open(path, StoreConfig(prewarm=False), read_only=True) as store:
        total = 0
        for partition in range(store.describe_topic("counts").partitions):
            offset = store.earliest_offset("counts", partition)
            for record in store.read_records("counts", partition, offset, 10_000):
                total += 1
                if total <= 5:
                    print(record.key, record.value)
        print(f"{total} window counts read back from topic 'counts'")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", default="./pipeline-data")
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    shutil.rmtree(args.path, ignore_errors=True)
    store_path = os.path.join(args.path, "store")
    produce(store_path, args.events)
    aggregate(store_path, os.path.join(args.path, "checkpoint"))
    consume(store_path)


if __name__ == "__main__":
    main()
