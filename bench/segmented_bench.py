"""Segmented (Kafka-design) baseline: append and read throughput through the engine
interface, 100 B values, async flush (every 500 ms, the store's default), 1 and 64
partitions, 1 and 100 records per call.

Every repeat runs every case once, in turn (repeats are interleaved, so drift in the
machine spreads over all cases), each on a fresh store with Kafka's default segment
and index sizes. A case appends ``records`` round-robin over the partitions (one
batch per call), then reads every partition back from offset 0 with ``max_records``
equal to the records per call. Figures are medians of the repeats, with the range.

Also timed: one flush pass (the async flush job's work) right after one more record
went to every partition, so every partition is dirty: a .log fdatasync and two index
syncs per partition. With 64 partitions that pass can outlast the 500 ms period;
apscheduler then logs "skipped: maximum number of running instances reached".

    python -m bench.segmented_bench [--quick] [--repeats 3] [--out bench/results/...]

Prints one line per case and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Any

from bench.common import summarize, write_results
from mqstore.engine import ProducerRecord
from mqstore.segmented import SegmentedConfig, SegmentedStore

TOPIC = "bench"
VALUE_BYTES = 100
CASES = [  # partitions, records per call, records per repeat
    (1, 1, 200_000),
    (1, 100, 400_000),
    (64, 1, 200_000),
    (64, 100, 400_000),
]


def run_case(root: str, partitions: int, per_call: int, count: int) -> dict[str, float]:
    """Append ``count`` records then read them back; return rates and store figures."""
    directory = tempfile.mkdtemp(dir=root)
    value = b"v" * VALUE_BYTES
    batch = [ProducerRecord(None, value, [], None)] * per_call
    calls = count // per_call
    store = SegmentedStore.open(directory, SegmentedConfig(flush_mode="async"))
    try:
        store.create_topic(TOPIC, partitions)
        append = store.append_records
        started = time.perf_counter()
        for call in range(calls):
            append(TOPIC, call % partitions, batch)
        append_s = time.perf_counter() - started
        for partition in range(partitions):
            append(TOPIC, partition, batch[:1])
        started = time.perf_counter()
        store.flush()
        flush_pass_ms = (time.perf_counter() - started) * 1000

        read = store.read_records
        read_count = 0
        started = time.perf_counter()
        for partition in range(partitions):
            offset, end = 0, store.latest_offset(TOPIC, partition)
            while offset < end:
                records = read(TOPIC, partition, offset, per_call)
                offset += len(records)
            read_count += end
        read_s = time.perf_counter() - started
        assert read_count == calls * per_call + partitions
        stats = store.stats()
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)
    done = calls * per_call
    return {
        "append_msg_per_s": done / append_s,
        "append_mb_per_s": done * VALUE_BYTES / append_s / 1e6,
        "read_msg_per_s": read_count / read_s,
        "read_mb_per_s": read_count * VALUE_BYTES / read_s / 1e6,
        "flush_pass_ms": flush_pass_ms,
        "log_bytes_per_record": stats["bytes"] / read_count,
        "open_fds": stats["open_fds"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a tenth of the records")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/segmented_bench.json")
    parser.add_argument("--dir", default=None, help="where to put the stores (default: temp)")
    args = parser.parse_args(argv)
    scale = 10 if args.quick else 1
    root = tempfile.mkdtemp(prefix="segmented-bench-", dir=args.dir)
    runs: dict[str, list[dict[str, float]]] = {}
    names = {case: f"{case[0]:>2} partitions, {case[1]:>3} records/call" for case in CASES}
    try:
        for repeat in range(args.repeats):
            for case in CASES:
                partitions, per_call, count = case
                runs.setdefault(names[case], []).append(
                    run_case(root, partitions, per_call, count // scale)
                )
            print(f"repeat {repeat + 1}/{args.repeats} done", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results: dict[str, Any] = {
        "command": " ".join(
            [sys.executable, "-m", "bench.segmented_bench", *(argv or sys.argv[1:])]
        ),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "value_bytes": VALUE_BYTES,
        "flush_mode": "async",
        "repeats": args.repeats,
        "cases": {},
    }
    for case in CASES:
        name = names[case]
        result = summarize(runs[name])
        result["records"] = case[2] // scale
        results["cases"][name] = result
        for op in ("append", "read"):
            low, high = result[f"{op}_msg_per_s_range"]
            print(
                f"{name}  {op:6s} {result[f'{op}_msg_per_s']:>10,.0f} msg/s "
                f"[{low:,.0f} .. {high:,.0f}]  {result[f'{op}_mb_per_s']:6.1f} MB/s",
                flush=True,
            )
        print(
            f"{name}  log {result['log_bytes_per_record']:.1f} B/record, "
            f"{result['open_fds']:.0f} open fds, "
            f"flush pass {result['flush_pass_ms']:.1f} ms",
            flush=True,
        )
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
