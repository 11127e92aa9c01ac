"""The console consumer behind ``mqstore consume``: start positions, the poll loop
and the output formats.

Text output writes each value's bytes as they are, one record per line (optionally
with the key and the partition, offset and timestamp before it, tab-separated), so
``produce`` then ``consume`` round-trips a file of lines. JSON output is one object
per record; bytes that are not UTF-8 become a ``*_base64`` field (``cli_dump.to_json``).

--follow keeps polling with long polls of at most POLL_WAIT_MS until SIGINT or
SIGTERM, or until --timeout-ms passed without a record.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any, Final

from mqstore.cli_dump import to_json
from mqstore.commitlog.errors import OffsetOutOfRangeError

__all__ = ["TIMESTAMP_NAMES", "consume", "print_record", "start_offset"]

READ_BATCH_RECORDS: Final = 500  # records read per partition per round (max_poll_records)
POLL_WAIT_MS: Final = 200  # --follow: one long poll; bounds how late SIGINT is noticed
TIMESTAMP_NAMES: Final = ("CreateTime", "LogAppendTime")  # by EngineRecord.timestamp_type


def start_offset(store: Any, args: argparse.Namespace, partition: int, committed: Any) -> int:
    """Where to start reading a partition: --from-time, --from, the group's committed
    offset, else the earliest offset."""
    topic = args.topic
    if args.from_time is not None:
        found = store.offset_for_timestamp(topic, partition, args.from_time)
        return store.latest_offset(topic, partition) if found is None else int(found[0])
    earliest = int(store.earliest_offset(topic, partition))
    latest = int(store.latest_offset(topic, partition))
    where = args.start
    if where is None:
        entry = committed.get((topic, partition))
        # A committed offset that retention left behind restarts at the log start.
        return earliest if entry is None else min(max(entry[0], earliest), latest)
    if where == "earliest" or where == "latest":
        return earliest if where == "earliest" else latest
    if not earliest <= where <= latest:
        raise OffsetOutOfRangeError(
            f"offset {where} is outside partition {partition}'s [{earliest}, {latest}]"
        )
    return int(where)


def consume(store: Any, args: argparse.Namespace, positions: dict[int, int]) -> int:
    """Print records until the end, or with --follow until SIGINT/SIGTERM or the idle
    timeout; advance ``positions``. With --follow the signals only set a flag (an
    exception raised inside the store's locks could leave them half-released); every
    wait is bounded by POLL_WAIT_MS, so the flag is seen within it."""
    limit = args.max_messages
    count = 0
    idle_since = time.monotonic()
    stop = threading.Event()
    previous = {}
    if args.follow:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda signum, frame: stop.set())
    try:
        while not stop.is_set() and (limit is None or count < limit):
            got = 0
            for partition, offset in positions.items():
                wanted = (
                    READ_BATCH_RECORDS if limit is None else min(READ_BATCH_RECORDS, limit - count)
                )
                if wanted <= 0:
                    break
                records = store.read_records(args.topic, partition, offset, wanted)
                assert not records or records[0].offset >= offset  # compaction leaves gaps
                assert len(records) <= wanted
                for record in records:
                    print_record(args, partition, record)
                    positions[partition] = record.offset + 1
                got += len(records)
                count += len(records)
            sys.stdout.flush()
            if got:
                idle_since = time.monotonic()
                continue
            idle_ms = (time.monotonic() - idle_since) * 1000
            if not args.follow or (args.timeout_ms is not None and idle_ms >= args.timeout_ms):
                break
            wait_ms = POLL_WAIT_MS
            if args.timeout_ms is not None:
                wait_ms = max(1, min(wait_ms, int(args.timeout_ms - idle_ms)))
            waits = [(args.topic, partition, offset) for partition, offset in positions.items()]
            store.wait_for_data(waits, wait_ms)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return count


def print_record(args: argparse.Namespace, partition: int, record: Any) -> None:
    stamp_name = TIMESTAMP_NAMES[record.timestamp_type]
    if args.json:
        data = {
            "partition": partition,
            "offset": record.offset,
            "timestamp": record.timestamp_ms,
            "timestamp_type": stamp_name,
            "key": record.key,
            "value": record.value,
            "headers": [{"key": name, "value": value} for name, value in record.headers],
        }
        print(json.dumps(to_json(data), ensure_ascii=False))
        return
    out = sys.stdout.buffer  # values are bytes: written as they are
    if args.print_metadata:
        stamp = f"{stamp_name}:{record.timestamp_ms}"
        out.write(f"Partition:{partition}\tOffset:{record.offset}\t{stamp}\t".encode())
    if args.print_key:
        out.write(b"null" if record.key is None else record.key)
        out.write(args.key_separator.encode("utf-8"))
    out.write(b"null" if record.value is None else record.value)
    out.write(b"\n")
