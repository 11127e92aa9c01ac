"""Compaction throughput of the segmented engine's cleaner (issue 17).

One round = a fresh store in a fresh temp dir; one compacted topic of one partition;
``--records`` records of ``VALUE_BYTES``-byte values over ``--keys`` keys (round robin,
so all but the last ``--keys`` records are obsolete), appended ``BATCH_RECORDS`` to a
batch (not timed); the active segment rolled; then ONE cleaning pass (``compact``),
timed. Figure: MB/s of log read by the pass (``bytes_read``: the dirty section read
to build the key map, plus every segment read to copy it; Kafka counts the same), and
the key map's memory per key (tracemalloc over an ``OffsetMap`` holding ``--keys``
keys). Medians over ``--rounds`` with [min, max]; no peer runs in this benchmark.

    python -m bench.compaction [--rounds 3] [--records 1000000] [--keys 100000]

The issue's size is 10M records over 1M keys; the default is a tenth of it, so a
round takes seconds, not minutes. Writes bench/results/compaction.json with a
``targets`` list (compaction >= 100 MB/s of log read; the key map's bytes per key,
stated, bounded by ``cleaner_dedupe_buffer_bytes``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import tracemalloc
from typing import Any

from bench.common import machine_info, write_results

VALUE_BYTES = 100
BATCH_RECORDS = 100  # records per append: a producer's batch
SEGMENT_BYTES = 64 << 20  # Kafka's 1 GiB would hold the whole run in one segment
TARGET_MB_PER_S = 100.0
RESULTS = os.path.join(os.path.dirname(__file__), "results", "compaction.json")


def _round(records: int, keys: int) -> dict[str, Any]:
    from mqstore.engine import ProducerRecord
    from mqstore.segmented import SegmentedConfig, SegmentedStore

    directory = tempfile.mkdtemp(prefix="mqstore-compaction-")
    try:
        config = SegmentedConfig(
            segment_bytes=SEGMENT_BYTES, cleaner_enable=False, file_delete_delay_ms=0
        )
        with SegmentedStore.open(directory, config) as store:
            store.create_topic("table", topic_configs={"cleanup.policy": "compact"})
            value = b"v" * VALUE_BYTES
            for start in range(0, records, BATCH_RECORDS):
                batch = [
                    ProducerRecord(b"key-%08d" % (i % keys), value, [], None)
                    for i in range(start, min(start + BATCH_RECORDS, records))
                ]
                store.append_records("table", 0, batch)
            store._logs[("table", 0)].roll()
            log_bytes = store._logs[("table", 0)].size_bytes
            (result,) = store.compact("table")
            left = store._logs[("table", 0)].size_bytes
        assert result.keys == keys, (result.keys, keys)
        return {
            "log_bytes": log_bytes,
            "bytes_read": result.bytes_read,
            "bytes_written": result.bytes_written,
            "log_bytes_after": left,
            "duration_s": result.duration_ms / 1000,
            "mb_per_s": result.bytes_read / 1e6 / (result.duration_ms / 1000),
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _map_bytes_per_key(keys: int) -> float:
    from mqstore.segmented.cleaner import OffsetMap

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    offset_map = OffsetMap(1 << 40)
    for i in range(keys):
        offset_map.put(b"key-%08d" % i, i)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(offset_map) == keys
    return used / keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args()
    rounds = []
    for number in range(args.rounds):
        started = time.perf_counter()
        figures = _round(args.records, args.keys)
        rounds.append(figures)
        print(
            f"round {number + 1}: {figures['mb_per_s']:.2f} MB/s of log read "
            f"({figures['bytes_read'] / 1e6:.1f} MB in {figures['duration_s']:.2f} s; "
            f"{figures['log_bytes'] / 1e6:.1f} MB -> {figures['log_bytes_after'] / 1e6:.1f} MB)"
            f"; round {time.perf_counter() - started:.1f} s"
        )
    rates = [r["mb_per_s"] for r in rounds]
    rate = statistics.median(rates)
    per_key = _map_bytes_per_key(args.keys)
    from mqstore.segmented.cleaner import ENTRY_BYTES

    print(f"median {rate:.2f} MB/s [{min(rates):.2f}, {max(rates):.2f}]")
    print(f"key map: {per_key:.0f} B per key measured (the bound assumes {ENTRY_BYTES} B)")
    write_results(
        RESULTS,
        {
            "benchmark": "compaction",
            "command": "python -m bench.compaction "
            f"--rounds {args.rounds} --records {args.records} --keys {args.keys}",
            "machine": machine_info(),
            "value_bytes": VALUE_BYTES,
            "records": args.records,
            "keys": args.keys,
            "rounds": rounds,
            "mb_per_s_median": rate,
            "mb_per_s_min": min(rates),
            "mb_per_s_max": max(rates),
            "map_bytes_per_key": per_key,
            "map_entry_bytes_assumed": ENTRY_BYTES,
            "targets": [
                {
                    "row": "segmented compaction, MB/s of log read per pass "
                    f"({args.records:,} records, {args.keys:,} keys, 100 B values)",
                    "value": rate,
                    "unit": "MB/s",
                    "peer": None,
                    "peer_value": None,
                    "ratio": None,
                    "target": f">= {TARGET_MB_PER_S:.0f} MB/s",
                    "met": rate >= TARGET_MB_PER_S,
                },
                {
                    "row": "segmented compaction, key map bytes per key",
                    "value": per_key,
                    "unit": "B/key",
                    "peer": None,
                    "peer_value": None,
                    "ratio": None,
                    "target": f"stated and bounded (<= {ENTRY_BYTES} B/key assumed by the bound)",
                    "met": per_key <= ENTRY_BYTES,
                },
            ],
        },
    )


if __name__ == "__main__":
    main()
