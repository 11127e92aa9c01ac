"""Pipeline: a live service produces events into the store; Spark Structured
Streaming counts them per key over 10-second event-time windows and writes the
counts into another topic of the same store; a consumer reads them. The service
keeps running, and keeps the store open as its writer, through all of it.

    .venv/bin/python -m examples.pipeline [--path ./pipeline-data] [--windows 6]

Processes:

- the service (``--service``, started by the pipeline): opens the store as THE
  writer, creates topics ``events`` and ``counts``, then produces events without
  end: ``user-<i % 5>`` keyed clicks, one per 100 ms of event time, at about
  ``--rate`` events per second of wall time. It stops cleanly when its stdin closes.
- the Spark driver (this process, ``local[2]``): a streaming query reads
  ``events`` (executors open the store read-only, following the service), counts
  per (window, key) with a 10 s watermark, and appends each closed window's counts
  to ``counts``. The store's lock is held by the service, so Spark's sink tasks
  hand their rows over as spool files; the service appends them (``mqstore.inbox``)
  within ``inbox_interval_ms``, and each task waits for that before it succeeds.
- the consumer (this process): a KafkaConsumer on a read-only store polls
  ``counts`` until ``--windows`` complete windows arrived for every key, and checks
  each count: 100 events per window, 20 per key.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from mqstore import KafkaConsumer, KafkaProducer, MessageStore, StoreConfig, TopicPartition

BASE_MS = 1_700_000_000_000
EVENT_STEP_MS = 100  # event time between two events
KEYS = 5
WINDOW_MS = 10_000
PER_KEY_PER_WINDOW = WINDOW_MS // EVENT_STEP_MS // KEYS  # 20
PARTITIONS = 2
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where -m finds examples
DEADLINE_S = 240.0  # the whole pipeline; a loaded machine takes 30-60 s
SERVICE_CONFIG = StoreConfig(prewarm=False, inbox_interval_ms=100)


def service(path: str, rate: int) -> None:
    """The producing service: holds the store open and produces until stdin closes."""
    import logging
    import threading

    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # "job skipped" on a busy box
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with MessageStore.open(path, SERVICE_CONFIG) as store:
        for topic in ("events", "counts"):
            if topic not in store.list_topics():
                store.create_topic(topic, partitions=PARTITIONS)
        producer = KafkaProducer(store, key_serializer=str.encode, value_serializer=str.encode)
        print("ready", flush=True)
        i = 0
        while not stop.wait(1 / rate):
            producer.send(
                "events",
                f"click-{i}",
                key=f"user-{i % KEYS}",
                timestamp_ms=BASE_MS + i * EVENT_STEP_MS,
            )
            i += 1
        producer.flush()
    print(f"service: produced {i} events", flush=True)


def start_service(path: str, rate: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "examples.pipeline", "--service", "--path", path]
    child = subprocess.Popen(
        [*command, "--rate", str(rate)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if line != "ready":
        child.kill()
        raise RuntimeError(f"the service did not start (said {line!r})")
    return child


def stop_service(child: subprocess.Popen[str]) -> str:
    assert child.stdin is not None
    assert child.stdout is not None
    child.stdin.close()  # the service's signal to close the store cleanly
    said = child.stdout.read().strip()
    if child.wait(60) != 0:
        raise RuntimeError(f"the service exited with {child.returncode}")
    return said


def session() -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

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
    return spark


def start_aggregation(spark: Any, path: str, checkpoint: str) -> Any:
    """The streaming query: windowed counts per key from ``events`` into ``counts``."""
    from pyspark.sql import functions as F

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
    return (
        counts.writeStream.format("mqstore").outputMode("append").option("path", path)
        .option("topic", "counts").option("sinkId", "pipeline-counts")
        .option("checkpointLocation", checkpoint).trigger(processingTime="500 milliseconds")
        .start()
    )  # fmt: skip


def consume(path: str, windows: int, deadline: float, query: Any) -> dict[tuple[str, str], int]:
    """Poll ``counts`` until ``windows`` windows arrived for every key; return
    {(key, window start): count}."""
    seen: dict[tuple[str, str], int] = {}
    with MessageStore.open(path, SERVICE_CONFIG, read_only=True) as store:
        consumer = KafkaConsumer(store=store, auto_offset_reset="earliest")
        consumer.assign([TopicPartition("counts", p) for p in range(PARTITIONS)])
        while len({start for _, start in seen}) < windows or len(seen) < windows * KEYS:
            if query.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(seen)} window counts arrived in time")
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    window = json.loads(record.value)
                    name = (record.key.decode(), window["start"])
                    if len(seen) < 5 and name not in seen:
                        print(f"consumer: {name[0]} window {name[1]}: {window['count']} clicks")
                    seen[name] = seen.get(name, 0) + window["count"]
        consumer.close()
    return seen


def _stop(spark: Any, query: Any) -> None:
    """Stop the query. With events arriving all the time a micro-batch is nearly always
    running, and stopping aborts its write: harmless (that batch is not committed; a
    restart from the checkpoint runs it again, and the sink is idempotent per batchId),
    but Spark logs the abort as an ERROR, so the log is quiet for the stop."""
    spark.sparkContext.setLogLevel("FATAL")
    try:
        query.stop()
    finally:
        spark.sparkContext.setLogLevel("ERROR")


def run(root: str, windows: int, rate: int, spark: Any = None) -> dict[str, Any]:
    """Run the whole pipeline under ``root`` (created afresh); return a summary."""
    root = os.path.abspath(root)
    shutil.rmtree(root, ignore_errors=True)
    path = os.path.join(root, "store")
    deadline = time.monotonic() + DEADLINE_S
    child = start_service(path, rate)
    own_session = spark is None
    try:
        spark = spark or session()
        query = start_aggregation(spark, path, os.path.join(root, "checkpoint"))
        try:
            counts = consume(path, windows, deadline, query)
            service_alive = child.poll() is None  # it ran through the job and the reads
        finally:
            _stop(spark, query)
    finally:
        if own_session and spark is not None:
            spark.stop()
        said = stop_service(child) if child.poll() is None else "service: died"
    wrong = {name: n for name, n in counts.items() if n != PER_KEY_PER_WINDOW}
    print(said)
    print(f"consumer: {len(counts)} window counts read back from topic 'counts'")
    return {"counts": counts, "wrong": wrong, "service_alive": service_alive, "service": said}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", default="./pipeline-data")
    parser.add_argument("--windows", type=int, default=6, help="complete windows to read back")
    parser.add_argument("--rate", type=int, default=200, help="events per second of wall time")
    parser.add_argument("--service", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.service:
        service(args.path, args.rate)
        return
    summary = run(args.path, args.windows, args.rate)
    if summary["wrong"] or not summary["service_alive"]:
        raise SystemExit(f"pipeline check failed: {summary['wrong'] or 'the service stopped'}")
    print(f"every window holds {PER_KEY_PER_WINDOW} clicks per key: OK")


if __name__ == "__main__":
    main()
