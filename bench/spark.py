"""Spark throughput of the mqstore data source on local[2]: read and write rows/s
for 100-byte values. Prints and saves its figures (bench/results/spark.json): the
medians of timed repeats after a warm-up, and the cold first write on its own.

    .venv/bin/python -m bench.spark [--rows 4000000] [--partitions 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

VALUE_BYTES = 100
READ_REPEATS = 3  # timed counts per setting; the median is reported (this box is noisy)
# Timed writes after one untimed cold write (the read warms its workers the same way).
# The cold write pays Spark's first plan of the write (codegen, a fresh Python worker):
# a sink that drops every row measured 0.58 M rows/s cold and 3-4 M rows/s warm here.
WRITE_REPEATS = 3


def _session():  # type: ignore[no-untyped-def]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import mqstore.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    mqstore.spark.register(spark)
    return spark


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    # 0: one task per queue (4 tasks on 2 cores). Splitting further (8) measured slower
    # here: each extra task costs Spark scheduling and an Arrow stream, more than the
    # finer split gains on two cores (4 tasks: 1.9-2.6 M rows/s; 8 tasks: 1.3-2.0).
    parser.add_argument("--min-partitions", type=int, default=0)
    args = parser.parse_args()
    from mqstore import MessageStore, StoreConfig

    root = tempfile.mkdtemp(prefix="mqstore-spark-bench-")
    path = os.path.join(root, "store")
    config = StoreConfig(prewarm=False, commitlog_file_size_bytes=256 << 20)
    with MessageStore.open(path, config) as store:
        store.create_topic("bench", args.partitions)
        store.create_topic("sink", args.partitions)
        per = args.rows // args.partitions
        body = b"x" * VALUE_BYTES
        for p in range(args.partitions):
            for first in range(0, per, 65_536):
                store.put_batch("bench", p, [body] * min(65_536, per - first))
    spark = _session()
    results = {}
    try:
        for verify in ("true", "false"):
            reader = (
                spark.read.format("mqstore").option("path", path).option("subscribe", "bench")
                .option("verifyChecksums", verify)
            )  # fmt: skip
            if args.min_partitions:
                reader = reader.option("minPartitions", str(args.min_partitions))
            df = reader.load()
            df.count()  # warm the workers
            rates = []
            for _ in range(READ_REPEATS):
                started = time.perf_counter()
                count = df.count()
                rates.append(count / (time.perf_counter() - started))
                assert count == per * args.partitions
            results[f"read_rows_per_s_verify_{verify}"] = statistics.median(rates)
        write_rows = min(args.rows, 2_000_000)
        frame = spark.range(write_rows, numPartitions=2).selectExpr(
            f"cast(repeat('y', {VALUE_BYTES}) as binary) as value"
        )
        writer = frame.write.format("mqstore").option("path", path).option("topic", "sink")
        rates = []
        for _ in range(1 + WRITE_REPEATS):  # the first write is cold; see WRITE_REPEATS
            started = time.perf_counter()
            writer.mode("append").save()
            rates.append(write_rows / (time.perf_counter() - started))
        results["write_rows_per_s_cold"] = rates[0]
        results["write_rows_per_s"] = statistics.median(rates[1:])
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    results.update(rows=args.rows, value_bytes=VALUE_BYTES, master="local[2]")
    for name, value in results.items():
        print(f"{name:32s} {value:,.0f}" if isinstance(value, float) else f"{name:32s} {value}")
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/spark.json", "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
