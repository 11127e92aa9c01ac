"""Look-ups on a filled store: key look-up, offset_for_time, and sequential consume.

- key look-up: p50/p99 of ``query_by_key`` for existing keys (one hit each), on a
  store holding N keyed messages (default 1,000,000; ``--keys 10000000`` for 10M);
- offset_for_time: p50/p99 for random timestamps within the queue's range;
- consume: ``get`` in batches of 500 through one queue of 100 B messages, msg/s.

    python -m bench.lookup [--keys 1000000] [--samples 2000]

Prints the figures and writes JSON. The store is filled with put_batch (keys given
per message), then closed and reopened, so look-ups run on a recovered store.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

from bench.common import write_results
from mqstore import MessageStore, StoreConfig

TOPIC = "lookup"
QUEUES = 4
BATCH = 1000


def _percentiles(samples_ns: list[int]) -> dict[str, float]:
    values = np.array(samples_ns) / 1000
    return {"p50_us": float(np.percentile(values, 50)), "p99_us": float(np.percentile(values, 99))}


def fill(root: str, keys: int) -> tuple[StoreConfig, float]:
    config = StoreConfig(
        commitlog_file_size_bytes=1 << 30,
        index_slot_count=max(1024, keys // 4),
        index_entry_count=max(4096, keys + BATCH),
    )
    started = time.perf_counter()
    with MessageStore.open(root, config) as store:
        body = b"v" * 100
        for start in range(0, keys, BATCH):
            count = min(BATCH, keys - start)
            store.put_batch(
                TOPIC, (start // BATCH) % QUEUES, [body] * count,
                keys=[(f"key-{start + i}",) for i in range(count)],
            )  # fmt: skip
    return config, time.perf_counter() - started


def key_lookups(store: MessageStore, keys: int, samples: int) -> dict[str, Any]:
    rng = random.Random(7)
    timings = []
    for _ in range(samples):
        key = f"key-{rng.randrange(keys)}"
        started = time.perf_counter_ns()
        hits = store.query_by_key(TOPIC, key, 0, 2**62, 64)
        timings.append(time.perf_counter_ns() - started)
        assert len(hits) == 1 and key in hits[0].keys
    return _percentiles(timings)


def time_lookups(store: MessageStore, samples: int) -> dict[str, Any]:
    first = store.get(TOPIC, 0, 0, 1)[0].store_timestamp_ms
    last_offset = store.max_offset(TOPIC, 0) - 1
    last = store.get(TOPIC, 0, last_offset, 1)[0].store_timestamp_ms
    rng = random.Random(11)
    timings = []
    for _ in range(samples):
        target = rng.randint(first, last)
        started = time.perf_counter_ns()
        store.offset_for_time(TOPIC, rng.randrange(QUEUES), target)
        timings.append(time.perf_counter_ns() - started)
    return _percentiles(timings)


def consume(store: MessageStore) -> dict[str, Any]:
    offset = store.min_offset(TOPIC, 0)
    end = store.max_offset(TOPIC, 0)
    count = 0
    body_bytes = 0
    started = time.perf_counter()
    while offset < end:
        messages = store.get(TOPIC, 0, offset, 500)
        for message in messages:
            body_bytes += len(message.body)  # touch every body (zero-copy views)
        count += len(messages)
        offset += len(messages)
    elapsed = time.perf_counter() - started
    return {"messages": count, "msg_per_s": count / elapsed, "mb_per_s": body_bytes / elapsed / 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--out", default="bench/results/lookup.json")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="mqstore-lookup-")
    try:
        config, fill_s = fill(root, args.keys)
        print(f"filled {args.keys:,} keyed messages in {fill_s:.1f} s", flush=True)
        with MessageStore.open(root, config) as store:
            command = [sys.executable, "-m", "bench.lookup", *(argv or sys.argv[1:])]
            result = {
                "command": " ".join(command),
                "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
                "keys": args.keys,
                "fill_s": fill_s,
                "key_lookup": key_lookups(store, args.keys, args.samples),
                "offset_for_time": time_lookups(store, args.samples),
                "consume_batches_of_500": consume(store),
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    k, t, c = result["key_lookup"], result["offset_for_time"], result["consume_batches_of_500"]
    print(f"key look-up ({args.keys:,} keys): p50 {k['p50_us']:.1f} us, p99 {k['p99_us']:.1f} us")
    print(f"offset_for_time: p50 {t['p50_us']:.1f} us, p99 {t['p99_us']:.1f} us")
    print(f"consume get(500): {c['msg_per_s']:,.0f} msg/s ({c['mb_per_s']:.1f} MB/s of bodies)")
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
