"""Replication catch-up: a follower N MiB behind its leader, in MB/s (issue 18's target).

The leader is ``mqstore serve`` (a separate process) over a store of N MiB of 1 KiB
messages written beforehand; the follower is an empty store in this process with a
``ReplicaFetcher`` (mqstore.replication), timed from its start until its CommitLog
end equals the leader's. Its own dispatcher builds the ConsumeQueues and index from
the copied bytes meanwhile (``append_replica`` helps it when it falls 256 KiB behind),
and a second figure per case times it until everything copied is dispatched too.

Cases: the ReplicaFetch ``max_bytes`` per response, RocketMQ's 32 KiB
(haTransferBatchSize), 1 MiB (our default) and 4 MiB, interleaved round by round
with the order rotated each round; medians. MB/s is 10^6 bytes per second.

Run: ``python -m bench.replication [--mib 1024] [--rounds 3]``.
Writes bench/results/replication.json (``targets``: catch-up >= 300 MB/s for 1 GiB).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Final

from bench.broker import start_broker
from bench.common import load_sample, machine_info, stop_serve, summarize, write_results

RESULTS: Final = os.path.join(os.path.dirname(__file__), "results", "replication.json")
BODY: Final = b"r" * 1024
BATCH: Final = 1000
FILE_BYTES: Final = 256 << 20  # the broker profile's files are 1 GiB; 256 MiB rolls too
CASES: Final = {"32KiB": 32 << 10, "1MiB": 1 << 20, "4MiB": 4 << 20}
CATCH_UP_TIMEOUT_S: Final = 600.0
TARGET_MB_S: Final = 300.0


def build_leader(path: str, mib: int) -> int:
    """Write ``mib`` MiB of messages (8 partitions) into a new store; its end."""
    from mqstore import MessageStore, StoreConfig

    config = StoreConfig(commitlog_file_size_bytes=FILE_BYTES)
    with MessageStore.open(path, config) as store:
        store.create_topic("bench", partitions=8)
        queue = 0
        while store.commitlog.write_position < mib << 20:
            store.put_batch("bench", queue % 8, [BODY] * BATCH)
            queue += 1
        return int(store.commitlog.write_position)


def catch_up(bootstrap: str, end: int, max_bytes: int) -> tuple[float, float]:
    """(MB/s of an empty follower copying the leader up to ``end``, MB/s until its
    dispatcher has also built the ConsumeQueues and index of all of it)."""
    from mqstore import MessageStore, StoreConfig
    from mqstore.replication.fetcher import ReplicaFetcher

    host, port = bootstrap.rsplit(":", 1)
    directory = tempfile.mkdtemp(prefix="mqstore-follower-")
    try:
        store = MessageStore.open(directory, StoreConfig(commitlog_file_size_bytes=FILE_BYTES))
        try:
            store.become_follower()
            fetcher = ReplicaFetcher(store, host, int(port), max_bytes=max_bytes)
            started = time.perf_counter()
            fetcher.start()
            deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
            while store.commitlog.write_position < end:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"catch-up stalled: {fetcher.last_error}")
                time.sleep(0.002)
            seconds = time.perf_counter() - started
            while store.stats()["dispatched_position"] < end:
                if time.monotonic() > deadline:
                    raise RuntimeError("dispatch stalled")
                time.sleep(0.002)
            dispatched_s = time.perf_counter() - started
            fetcher.stop()
        finally:
            store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return end / seconds / 1e6, end / dispatched_s / 1e6


def targets(mib: int, cases: dict[str, Any]) -> list[dict[str, Any]]:
    value = float(cases["1MiB"])
    peer = float(cases["32KiB"])
    return [
        {
            "row": f"follower catch-up, {mib} MiB behind, 1 MiB per fetch (the default)",
            "value": round(value, 1),
            "unit": "MB/s",
            "peer": "the same follower, 32 KiB per fetch (RocketMQ's haTransferBatchSize)",
            "peer_value": round(peer, 1),
            "ratio": round(value / peer, 2) if peer else None,
            "target": f">= {TARGET_MB_S:.0f} MB/s (for 1 GiB)",
            "met": value >= TARGET_MB_S,
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args()
    leader_path = tempfile.mkdtemp(prefix="mqstore-leader-")
    loads = [load_sample()]
    runs: list[dict[str, float]] = []
    try:
        end = build_leader(leader_path, args.mib)
        process, bootstrap = start_broker(leader_path, "commitlog", sync=False)
        try:
            names = list(CASES)
            for round_ in range(args.rounds):
                shift = round_ % len(names)
                figures = {}
                for name in names[shift:] + names[:shift]:
                    figures[name], figures[name + ".dispatched"] = catch_up(
                        bootstrap, end, CASES[name]
                    )
                runs.append(figures)
                shown = "  ".join(f"{k} {v:,.1f} MB/s" for k, v in figures.items())
                print(f"round {round_ + 1}: {shown}", flush=True)
                loads.append(load_sample())
        finally:
            stop_serve(process)
    finally:
        shutil.rmtree(leader_path, ignore_errors=True)
    cases = summarize(runs)
    rows = targets(args.mib, cases)
    for row in rows:
        print(f"{row['row']}: {row['value']} MB/s (32 KiB: {row['peer_value']}) "
              f"target {row['target']}: {'met' if row['met'] else 'MISSED'}")  # fmt: skip
    write_results(
        args.output,
        {
            "machine": machine_info(),
            "load": loads,
            "mib": args.mib,
            "log_bytes": end,
            "body_bytes": len(BODY),
            "rounds": args.rounds,
            "command": "python -m bench.replication " + " ".join(sys.argv[1:]),
            "cases": cases,
            "targets": rows,
        },
    )


if __name__ == "__main__":
    main()
