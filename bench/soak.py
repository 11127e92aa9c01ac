"""Soak: hours-style load in minutes, with retention rolling files; watch RSS and fds.

    python -m bench.soak --minutes 10 [--path DIR] [--json FILE]

First measures the maximum put rate for a few seconds, then produces at half of it
(1 ms bursts) for ``--minutes`` while a consumer group reads and commits and
retention (retention_bytes over small CommitLog files) deletes old files. Every
SAMPLE_S seconds it samples VmRSS (/proc/self/status) and the open descriptors
(/proc/self/fd). Prints and saves the start and end figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from mqstore import KafkaConsumer, KafkaProducer, MessageStore, StoreConfig

TOPIC = "soak"
PARTITIONS = 4
VALUE = b"v" * 200
SAMPLE_S = 5.0
MEASURE_S = 3.0
FILE_SIZE_BYTES = 1 << 20  # small files: retention deletes one every few seconds
RETENTION_FILES = 8


def rss_kib() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _config() -> StoreConfig:
    return StoreConfig(
        commitlog_file_size_bytes=FILE_SIZE_BYTES,
        consumequeue_units_per_file=20_000,
        index_slot_count=50_000,
        index_entry_count=200_000,
        retention_bytes=RETENTION_FILES * FILE_SIZE_BYTES,
        retention_check_interval_ms=1_000,
        prewarm=False,
    )


def measure_max_rate(store: MessageStore) -> float:
    producer = KafkaProducer(store)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < MEASURE_S:
        producer.send(TOPIC, VALUE, partition=count % PARTITIONS)
        count += 1
    return count / (time.perf_counter() - started)


def consume(store: MessageStore, stop: threading.Event, totals: dict[str, int]) -> None:
    consumer = KafkaConsumer(TOPIC, store=store, group_id="soak",
                             auto_offset_reset="earliest", enable_auto_commit=False)  # fmt: skip
    while not stop.is_set():
        batch = consumer.poll(timeout_ms=100, max_records=2_000)
        totals["consumed"] += sum(len(records) for records in batch.values())
        if batch:
            consumer.commit()
    consumer.close(autocommit=False)


def run(minutes: float, path: str) -> dict[str, Any]:
    store = MessageStore.open(path, _config())
    store.create_topic(TOPIC, partitions=PARTITIONS)
    max_rate = measure_max_rate(store)
    rate = max_rate / 2
    producer = KafkaProducer(store)
    stop = threading.Event()
    totals = {"consumed": 0}
    reader = threading.Thread(target=consume, args=(store, stop, totals))
    reader.start()
    samples: list[dict[str, float]] = []
    started = time.monotonic()
    next_sample = started
    sent = 0
    while (now := time.monotonic()) - started < minutes * 60:
        if now >= next_sample:
            samples.append({"t_s": round(now - started, 1), "rss_kib": rss_kib(),
                            "fds": open_fds(), "files": store.commitlog.file_count,
                            "sent": sent, "consumed": totals["consumed"]})  # fmt: skip
            print(samples[-1], flush=True)
            next_sample += SAMPLE_S
        due = int((now - started) * rate)
        while sent < due:  # a burst catches up to the schedule (about 1 ms of work)
            producer.send(TOPIC, VALUE, partition=sent % PARTITIONS)
            sent += 1
        time.sleep(0.001)
    stop.set()
    reader.join()
    samples.append({"t_s": round(time.monotonic() - started, 1), "rss_kib": rss_kib(),
                    "fds": open_fds(), "files": store.commitlog.file_count,
                    "sent": sent, "consumed": totals["consumed"]})  # fmt: skip
    min_position = store.commitlog.min_position
    store.close()
    return {"minutes": minutes, "max_rate_msg_s": round(max_rate), "rate_msg_s": round(rate),
            "sent": sent, "consumed": totals["consumed"], "log_start_position": min_position,
            "start": samples[0], "end": samples[-1], "samples": samples}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--path", help="store directory (default: a temp dir, removed)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    root = args.path or tempfile.mkdtemp(prefix="mqstore-soak-")
    try:
        result = run(args.minutes, os.path.join(root, "store"))
    finally:
        if not args.path:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
