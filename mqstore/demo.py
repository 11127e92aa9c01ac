"""``make demo``: the main job on an embedded store in a local folder.

Writes messages, closes, reopens (recovery), reads them back, and prints what
happened with timings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

from commitlog.commitlog import CommitLog
from commitlog.config import CommitLogConfig

MESSAGES = 200_000
BODY = b"x" * 100


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--path", default="./demo-data", help="store directory (recreated)")
    parser.add_argument("--messages", type=int, default=MESSAGES)
    args = parser.parse_args(argv)
    if os.path.exists(args.path):
        shutil.rmtree(args.path)
    directory = os.path.join(args.path, "commitlog")
    config = CommitLogConfig(file_size_bytes=64 << 20)

    started = time.perf_counter()
    log = CommitLog.open(directory, config)
    opened = time.perf_counter()
    for i in range(args.messages // 2):
        log.append("demo", i % 4, BODY, keys=[f"order-{i}"] if i % 1000 == 0 else ())
    single = time.perf_counter()
    half = args.messages - args.messages // 2
    for start in range(0, half, 1000):
        log.append_batch("demo", 4, [BODY] * min(1000, half - start))
    batched = time.perf_counter()
    end = log.write_position
    log.close()
    closed = time.perf_counter()
    print(f"opened new store in {args.path} in {(opened - started) * 1e3:.1f} ms")
    print(
        f"appended {args.messages // 2:,} messages one by one in {(single - opened):.2f} s "
        f"({args.messages // 2 / (single - opened):,.0f} msg/s)"
    )
    print(
        f"appended {half:,} messages in batches of 1000 in {(batched - single):.2f} s "
        f"({half / (batched - single):,.0f} msg/s)"
    )
    print(f"closed (flushed {end:,} bytes) in {(closed - batched) * 1e3:.1f} ms")

    started = time.perf_counter()
    log = CommitLog.open(directory, config)
    reopened = time.perf_counter()
    count = 0
    body_bytes = 0
    for record in log.iter_records(0):
        count += 1
        body_bytes += len(record.body) if record.body is not None else 0
    read = time.perf_counter()
    took_ms = (reopened - started) * 1e3
    print(f"reopened in {took_ms:.1f} ms (recovery scan, end {log.write_position:,})")
    print(
        f"read back {count:,} verified records ({body_bytes:,} body bytes) in "
        f"{(read - reopened):.2f} s ({count / (read - reopened):,.0f} msg/s)"
    )
    assert count == args.messages, f"expected {args.messages} records, read {count}"
    log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
