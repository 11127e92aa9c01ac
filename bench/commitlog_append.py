"""CommitLog append benchmark: per-message and batch, 100 B and 1 KiB, async and sync
flush, 1 and 8 threads, against a plain-Python floor measured in the same run.

The floor is what any pure-Python log must at least do per message: struct.pack_into
of the 68-byte header plus a slice copy of topic and body into a pre-faulted mmap.

Also measures roll latency (how long an append waits for the next file) with the
allocation service pre-warming files and without.

    python -m bench.commitlog_append [--quick] [--repeats 3] [--out bench/results/...]

Prints one line per case (median of the repeats, with the range) and writes JSON.
"""

from __future__ import annotations

import argparse
import mmap
import os
import platform
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from bench.common import summarize, write_results
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.config import CommitLogConfig

TOPIC = "bench-topic"
HEADER = struct.Struct("<IIQqqqqiIIIHBB")  # the record header's shape, for the floor


def floor_rate(body: bytes, count: int) -> float:
    """msg/s of header pack + topic and body copy into a pre-faulted mmap."""
    size = HEADER.size + len(TOPIC) + len(body)
    region = mmap.mmap(-1, size * count + 4096)
    region.madvise(23) if hasattr(region, "madvise") else None  # MADV_POPULATE_WRITE
    topic = TOPIC.encode()
    pack = HEADER.pack_into
    started = time.perf_counter()
    position = 0
    for i in range(count):
        pack(region, position, size, 1, 0, i, position, 1, 1, 0, 0, len(body), 0, 0, len(topic), 0)
        start = position + HEADER.size
        region[start : start + len(topic)] = topic
        start += len(topic)
        region[start : start + len(body)] = body
        position += size
    elapsed = time.perf_counter() - started
    region.close()
    return count / elapsed


def run_case(
    directory: str, config: CommitLogConfig, body: bytes, count: int, threads: int, batch: int
) -> dict[str, float]:
    """Append ``count`` messages; return msg/s and MB/s."""
    log = CommitLog.open(directory, config)
    try:
        per_thread = count // threads

        def produce(queue_id: int) -> None:
            if batch > 1:
                bodies = [body] * batch
                for _ in range(per_thread // batch):
                    log.append_batch(TOPIC, queue_id, bodies)
            else:
                append = log.append
                for _ in range(per_thread):
                    append(TOPIC, queue_id, body)

        workers = [threading.Thread(target=produce, args=(i,)) for i in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - started
        done = per_thread * threads if batch == 1 else (per_thread // batch) * batch * threads
        return {"msg_per_s": done / elapsed, "mb_per_s": done * len(body) / elapsed / 1e6}
    finally:
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


def roll_latency(
    root: str, preallocate: bool, prewarm: bool, file_size: int, files: int
) -> dict[str, Any]:
    """Append 1 KiB messages across ``files`` rolls; report roll waits and throughput."""
    directory = os.path.join(root, f"roll-{preallocate}-{prewarm}")
    config = CommitLogConfig(
        file_size_bytes=file_size,
        prewarm=prewarm,
        preallocate_next=preallocate,
        flush_interval_ms=500,
    )
    log = CommitLog.open(directory, config)
    body = b"r" * 1024
    count = files * file_size // (len(body) + 100)
    try:
        bodies = [body] * 1000
        started = time.perf_counter()
        for _ in range(count // 1000):
            log.append_batch(TOPIC, 0, bodies)
        elapsed = time.perf_counter() - started
        waits_ms = sorted(ns / 1e6 for ns in log.roll_wait_ns)
    finally:
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "preallocate_next": preallocate,
        "prewarm": prewarm,
        "rolls": len(waits_ms),
        "roll_wait_ms_p50": statistics.median(waits_ms) if waits_ms else None,
        "roll_wait_ms_max": waits_ms[-1] if waits_ms else None,
        "mb_per_s": count * len(body) / elapsed / 1e6,
    }


def measure(repeats: int, samples: Callable[[], dict[str, float]]) -> dict[str, Any]:
    return summarize([samples() for _ in range(repeats)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/commitlog_append.json")
    parser.add_argument("--dir", default=None, help="where to put the logs (default: a temp dir)")
    parser.add_argument("--rolls-only", action="store_true", help="only the roll latency part")
    args = parser.parse_args(argv)
    scale = 10 if args.quick else 1
    root = tempfile.mkdtemp(prefix="mqstore-bench-", dir=args.dir)
    file_size = 256 << 20
    cases = [
        # name, body, count, threads, batch, flush mode
        ("per-message 100 B async 1 thread", 100, 400_000, 1, 1, "async"),
        ("per-message 1 KiB async 1 thread", 1024, 300_000, 1, 1, "async"),
        ("per-message 100 B async 8 threads", 100, 400_000, 8, 1, "async"),
        ("append_batch(1000) 100 B async", 100, 1_000_000, 1, 1000, "async"),
        ("append_batch(1000) 1 KiB async", 1024, 400_000, 1, 1000, "async"),
        ("per-message 100 B sync 1 thread", 100, 20_000, 1, 1, "sync"),
        ("per-message 100 B sync 8 threads", 100, 80_000, 8, 1, "sync"),
        ("append_batch(1000) 100 B sync 8 threads", 100, 400_000, 8, 1000, "sync"),
    ]
    results: dict[str, Any] = {
        "command": " ".join(
            [sys.executable, "-m", "bench.commitlog_append", *(argv or sys.argv[1:])]
        ),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "cases": {},
    }
    try:
        for name, body_size, count, threads, batch, mode in [] if args.rolls_only else cases:
            body = b"x" * body_size
            count //= scale
            config = CommitLogConfig(file_size_bytes=file_size, flush_mode=mode)
            floor: list[float] = []

            def sample(
                floor: list[float] = floor,
                body: bytes = body,
                count: int = count,
                threads: int = threads,
                batch: int = batch,
                config: CommitLogConfig = config,
            ) -> dict[str, float]:
                # Interleave: the floor and the case alternate within each repeat.
                floor.append(floor_rate(body, min(count, 200_000)))
                return run_case(os.path.join(root, "log"), config, body, count, threads, batch)

            result = measure(args.repeats, sample)
            result["floor_msg_per_s"] = statistics.median(floor)
            result["ratio_to_floor"] = result["msg_per_s"] / result["floor_msg_per_s"]
            results["cases"][name] = result
            print(
                f"{name:45s} {result['msg_per_s']:>12,.0f} msg/s "
                f"[{result['msg_per_s_range'][0]:,.0f} .. {result['msg_per_s_range'][1]:,.0f}] "
                f"{result['mb_per_s']:>8,.1f} MB/s  x{result['ratio_to_floor']:.2f} of floor "
                f"({result['floor_msg_per_s']:,.0f} msg/s)",
                flush=True,
            )
        rolls = []
        modes = [(True, True), (True, False), (False, True), (False, False)]
        for _ in range(2):  # interleaved: every mode once per round
            for preallocate, prewarm in modes:
                rolls.append(
                    roll_latency(root, preallocate, prewarm, 64 << 20, 4 if args.quick else 8)
                )
                r = rolls[-1]
                print(
                    f"roll preallocate={preallocate!s:5s} prewarm={prewarm!s:5s} "
                    f"rolls={r['rolls']} wait p50={r['roll_wait_ms_p50']:.3f} ms "
                    f"max={r['roll_wait_ms_max']:.3f} ms append {r['mb_per_s']:,.0f} MB/s",
                    flush=True,
                )
        results["rolls"] = rolls
    finally:
        shutil.rmtree(root, ignore_errors=True)
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
