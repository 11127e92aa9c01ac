"""Dispatch lag: from the end of put() to the message being visible in its ConsumeQueue.

Two runs:
- paced: a producer puts at a fixed rate (default 100,000 msg/s, in 1 ms bursts) and a
  watcher, woken by every dispatch round, stamps when each offset became visible;
- flat out: the producer puts as fast as it can; the dispatcher's backlog (bytes not
  yet dispatched) is sampled every 100 ms to show whether it grows.

    python -m bench.dispatch [--rate 100000] [--seconds 5] [--keys]

Prints p50/p99/max lag (ms) and the backlog series; writes JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from bench.common import write_results
from mqstore import MessageStore, StoreConfig

TOPIC = "lag"
QUEUES = 8
BODY = b"x" * 100


def _store(root: str) -> MessageStore:
    return MessageStore.open(root, StoreConfig(commitlog_file_size_bytes=256 << 20))


def paced(root: str, rate: int, seconds: float, keyed: bool) -> dict[str, Any]:
    store = _store(root)
    dispatcher = store._dispatcher
    assert dispatcher is not None
    total = int(rate * seconds)
    put_ns = np.zeros(total, dtype=np.int64)
    seen_ns = np.zeros(total, dtype=np.int64)
    queues = [store.consume_queues.queue(TOPIC, q) for q in range(QUEUES)]
    done = threading.Event()

    def watch() -> None:
        visible = [0] * QUEUES  # per queue: offsets visible so far
        while not done.is_set() or sum(visible) < total:
            dispatcher.wait_for(lambda: sum(q.max_offset for q in queues) > sum(visible), 50)
            now = time.perf_counter_ns()
            for q, queue in enumerate(queues):
                top = queue.max_offset
                for offset in range(visible[q], top):
                    seen_ns[offset * QUEUES + q] = now
                visible[q] = top
            if done.is_set() and sum(visible) >= total:
                return

    watcher = threading.Thread(target=watch)
    watcher.start()
    burst = max(1, rate // 1000)  # one burst per millisecond
    started = time.perf_counter_ns()
    for i in range(total):
        if i % burst == 0:  # pace: wait for this burst's slot
            slot = started + (i // burst) * 1_000_000
            while time.perf_counter_ns() < slot:
                time.sleep(0.0001)
        store.put(TOPIC, i % QUEUES, BODY, keys=(f"k{i}",) if keyed else ())
        put_ns[i] = time.perf_counter_ns()
    elapsed_s = (time.perf_counter_ns() - started) / 1e9
    done.set()
    watcher.join()
    store.close()
    lag_ms = (seen_ns - put_ns) / 1e6
    return {
        "target_rate": rate,
        "achieved_rate": total / elapsed_s,
        "messages": total,
        "keyed": keyed,
        "lag_ms_p50": float(np.percentile(lag_ms, 50)),
        "lag_ms_p99": float(np.percentile(lag_ms, 99)),
        "lag_ms_max": float(lag_ms.max()),
    }


def flat_out(root: str, seconds: float, keyed: bool) -> dict[str, Any]:
    store = _store(root)
    dispatcher = store._dispatcher
    assert dispatcher is not None
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            samples.append(dispatcher.lag_bytes())

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.perf_counter()
    count = 0
    while time.perf_counter() - started < seconds:
        for _ in range(1000):
            store.put(TOPIC, count % QUEUES, BODY, keys=(f"k{count}",) if keyed else ())
            count += 1
    elapsed = time.perf_counter() - started
    stop.set()
    sampler.join()
    drain_started = time.perf_counter()
    while dispatcher.lag_bytes() > 0:
        time.sleep(0.001)
    drain_s = time.perf_counter() - drain_started
    store.close()
    half = len(samples) // 2
    return {
        "put_rate": count / elapsed,
        "keyed": keyed,
        "backlog_bytes_samples": samples,
        "backlog_bytes_first_half_median": statistics.median(samples[:half]) if half else None,
        "backlog_bytes_second_half_median": statistics.median(samples[half:]) if samples else None,
        "drain_s_after_stop": drain_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--keys", action="store_true", help="give every message a key")
    parser.add_argument("--out", default="bench/results/dispatch.json")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="mqstore-dispatch-")
    try:
        result = {
            "command": " ".join([sys.executable, "-m", "bench.dispatch", *(argv or sys.argv[1:])]),
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "paced": paced(os.path.join(root, "paced"), args.rate, args.seconds, args.keys),
            "flat_out": flat_out(os.path.join(root, "flat"), args.seconds, args.keys),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    p = result["paced"]
    print(
        f"paced {p['target_rate']:,}/s (achieved {p['achieved_rate']:,.0f}/s, "
        f"keyed={p['keyed']}): lag p50 {p['lag_ms_p50']:.2f} ms, "
        f"p99 {p['lag_ms_p99']:.2f} ms, max {p['lag_ms_max']:.2f} ms"
    )
    f = result["flat_out"]
    print(
        f"flat out {f['put_rate']:,.0f} msg/s: backlog median first half "
        f"{f['backlog_bytes_first_half_median']:,} B, second half "
        f"{f['backlog_bytes_second_half_median']:,} B; "
        f"drained {f['drain_s_after_stop']:.3f} s after stop"
    )
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
