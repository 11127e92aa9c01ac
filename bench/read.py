"""The read path: 1,000,000 messages of 100 B read back three ways, against lmdb's
cursor over the same 1,000,000 values.

    python -m bench.read [--messages 1000000] [--rounds 5] [--out bench/results/read.json]

Readers (each reads a whole case, first offset to last):

- ``get_batch``: ``MessageStore.get_batch(topic, q, offset, GET_BATCH_ROWS)``, the
  columnar read; nothing is made per message (the bodies are one buffer);
- ``get``: ``MessageStore.get(topic, q, offset, 500)`` and ``bytes(message.body)`` per
  message;
- ``poll``: ``KafkaConsumer.poll`` (max_poll_records 500, kafka-python's default) with
  every partition of the topic assigned, from the beginning;
- ``lmdb``: one read transaction's cursor, ``for key, value in cursor``, over the same
  number of 100 B values under 8-byte big-endian keys (bench/peers.py's lmdb peer,
  sync=False, filled with its 1,000-value ``putmulti`` transactions).

Cases: ``1 queue`` (topic ``one``, queue 0) and ``8 queues`` (topic ``eight``, the same
number of messages written round-robin in batches of 1,000; get_batch and get read one
queue after the other). Both topics live in one store (1 GiB CommitLog files, as
RocketMQ's default), filled with ``put_batch_arrays``, closed and reopened, so reads run
on a recovered store.

Method: page cache warm (one untimed pass of every reader first), then ``--rounds``
rounds; a round times lmdb and every (case, reader) once, in an order rotated by one
each round, so slow drifts of a shared machine hit every reader alike. Figures are
the median [min .. max] msg/s over rounds; a ratio is a round's rate over the same
round's lmdb rate, median over rounds. A reader the code under test lacks (get_batch
before it existed) is reported as missing.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import logging
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.common import machine_info, write_results
from bench.peers import BATCH, VALUE, lmdb_put_batch, lmdb_scan, open_lmdb
from mqstore import KafkaConsumer, MessageStore, StoreConfig
from mqstore.kafka import TopicPartition

GET_BATCH_ROWS = 10_000  # messages per get_batch call: ~1.7 MB of records at 100 B
GET_ROWS = 500  # messages per get call (the figure)
POLL_RECORDS = 500  # max_poll_records: kafka-python's default
CASES = {"1 queue": ("one", 1), "8 queues": ("eight", 8)}
READERS = ("get_batch", "get", "poll")
#: Each target: (case, reader, the least ratio to lmdb's cursor).
TARGETS = (("1 queue", "get_batch", 1.0), ("1 queue", "get", 0.4), ("1 queue", "poll", 0.25))


def _config() -> StoreConfig:
    return StoreConfig(commitlog_file_size_bytes=1 << 30, prewarm=False, flush_mode="async")


def fill(root: str, messages: int) -> float:
    """Write both cases' topics and the lmdb peer; the seconds it took."""
    started = time.perf_counter()
    values = [VALUE] * BATCH
    with MessageStore.open(os.path.join(root, "store"), _config()) as store:
        for topic, queues in CASES.values():
            store.create_topic(topic, queues)
            for index, first in enumerate(range(0, messages, BATCH)):
                count = min(BATCH, messages - first)
                store.put_batch_arrays(topic, index % queues, values[:count])
    env = open_lmdb(os.path.join(root, "lmdb"), sync=False)
    for first in range(0, messages, BATCH):
        lmdb_put_batch(env, first, min(BATCH, messages - first))
    env.close()
    return time.perf_counter() - started


def read_get_batch(store: MessageStore, topic: str, queues: int) -> int:
    got = 0
    for queue_id in range(queues):
        offset = store.min_offset(topic, queue_id)
        end = store.max_offset(topic, queue_id)
        while offset < end:
            batch = store.get_batch(topic, queue_id, offset, GET_BATCH_ROWS)  # type: ignore[attr-defined]
            offset += len(batch)
            got += len(batch)
    return got


def read_get(store: MessageStore, topic: str, queues: int) -> int:
    got = 0
    for queue_id in range(queues):
        offset = store.min_offset(topic, queue_id)
        end = store.max_offset(topic, queue_id)
        while offset < end:
            messages = store.get(topic, queue_id, offset, GET_ROWS)
            for message in messages:
                bytes(message.body)  # type: ignore[arg-type]  # bodies are never None here
            offset += len(messages)
            got += len(messages)
    return got


def read_poll(store: MessageStore, topic: str, queues: int, expected: int) -> int:
    consumer = KafkaConsumer(
        store=store, enable_auto_commit=False, auto_offset_reset="earliest",
        max_poll_records=POLL_RECORDS,
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, p) for p in range(queues)])
    consumer.seek_to_beginning()
    got = 0
    while got < expected:
        for records in consumer.poll(timeout_ms=100).values():
            got += len(records)
    consumer.close()
    return got


def _timed(read: Callable[[], int], expected: int) -> float:
    started = time.perf_counter()
    got = read()
    elapsed = time.perf_counter() - started
    assert got == expected, (got, expected)
    return got / elapsed


def _summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def run(root: str, messages: int, rounds: int) -> dict[str, Any]:
    store = MessageStore.open(os.path.join(root, "store"), _config())
    env = open_lmdb(os.path.join(root, "lmdb"), sync=False)
    has_batch = hasattr(store, "get_batch")
    jobs: list[tuple[str, Callable[[], int]]] = [("lmdb", lambda: lmdb_scan(env))]
    for case, (topic, queues) in CASES.items():
        readers: dict[str, Callable[[], int]] = {
            "get_batch": lambda t=topic, q=queues: read_get_batch(store, t, q),
            "get": lambda t=topic, q=queues: read_get(store, t, q),
            "poll": lambda t=topic, q=queues: read_poll(store, t, q, messages),
        }
        for name in READERS:
            if name != "get_batch" or has_batch:
                jobs.append((f"{case}/{name}", readers[name]))
    rates: dict[str, list[float]] = {name: [] for name, _ in jobs}
    ratios: dict[str, list[float]] = {name: [] for name, _ in jobs if name != "lmdb"}
    try:
        for _, read in jobs:  # warm-up: page cache, first mappings, code paths
            _timed(read, messages)
        for round_index in range(rounds):
            shift = round_index % len(jobs)
            this_round = {}
            for name, read in jobs[shift:] + jobs[:shift]:
                this_round[name] = _timed(read, messages)
                rates[name].append(this_round[name])
            for name in ratios:
                ratios[name].append(this_round[name] / this_round["lmdb"])
            print(f"  round {round_index + 1}: " + ", ".join(
                f"{name} {rate / 1e6:.2f}M" for name, rate in this_round.items()
            ), flush=True)  # fmt: skip
        profiles = _profile_misses(dict(jobs), ratios, messages)
    finally:
        env.close()
        store.close()
    out: dict[str, Any] = {"lmdb": _summary(rates["lmdb"]), "cases": {}, "profiles": profiles}
    for case in CASES:
        out["cases"][case] = {}
        for name in READERS:
            key = f"{case}/{name}"
            if key not in rates:
                out["cases"][case][name] = None  # the code under test has no such reader
                continue
            entry = _summary(rates[key])
            entry["ratio_vs_lmdb"] = _summary(ratios[key])
            out["cases"][case][name] = entry
    return out


def _profile_misses(
    jobs: dict[str, Callable[[], int]], ratios: dict[str, list[float]], messages: int
) -> dict[str, str]:
    """A target's reader whose median ratio misses its goal gets a profile: one more
    pass, untimed, under cProfile (top functions by own time), keyed "case/reader"."""
    profiles = {}
    for case, name, goal in TARGETS:
        key = f"{case}/{name}"
        if key not in jobs or statistics.median(ratios[key]) >= goal:
            continue
        collections_s, elapsed_s = _collection_time(jobs[key], messages)
        profiler = cProfile.Profile()
        profiler.enable()
        got = jobs[key]()
        profiler.disable()
        assert got == messages, (got, messages)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
        body = text.getvalue()
        profiles[key] = (
            f"garbage collections in one more pass of {key}, unprofiled: "
            + ", ".join(f"generation {gen}: {count} taking {seconds * 1000:.0f} ms"
                        for gen, (count, seconds) in sorted(collections_s.items()))
            + f", of a {elapsed_s:.3f} s pass\n"
            f"cProfile of another pass ({messages:,} messages), untimed:\n"
            f"{body[body.find('   ncalls'):]}"
        )  # fmt: skip
    return profiles


def _collection_time(
    read: Callable[[], int], messages: int
) -> tuple[dict[int, tuple[int, float]], float]:
    """One pass of ``read`` with the garbage collector's collections timed
    (``gc.callbacks``): per generation (count, seconds), and the pass's seconds."""
    spent: dict[int, tuple[int, float]] = {}
    started_at = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started_at[0] = time.perf_counter()
            return
        count, seconds = spent.get(info["generation"], (0, 0.0))
        spent[info["generation"]] = (count + 1, seconds + time.perf_counter() - started_at[0])

    gc.callbacks.append(timed)
    try:
        started = time.perf_counter()
        got = read()
        elapsed = time.perf_counter() - started
    finally:
        gc.callbacks.remove(timed)
    assert got == messages, (got, messages)
    return spent, elapsed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench/results/read.json")
    args = parser.parse_args(argv)
    if args.rounds < 5:
        parser.error("at least 5 rounds: the medians need them")
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    root = tempfile.mkdtemp(prefix="mqstore-read-")
    try:
        fill_s = fill(root, args.messages)
        print(f"filled {args.messages:,} messages per case and lmdb in {fill_s:.1f} s", flush=True)
        figures = run(root, args.messages, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "command": " ".join(["python", "-m", "bench.read", *argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "messages": args.messages,
        "value_bytes": len(VALUE),
        "rounds": args.rounds,
        "get_batch_rows": GET_BATCH_ROWS,
        "get_rows": GET_ROWS,
        "poll_records": POLL_RECORDS,
        "fill_s": fill_s,
        **figures,
        "targets": [],
    }
    lmdb_rate = figures["lmdb"]["median"]
    print(f"lmdb cursor: {lmdb_rate:,.0f} msg/s")
    for case, readers in figures["cases"].items():
        for name, entry in readers.items():
            if entry is None:
                print(f"{case:9s} {name:9s}: missing")
                continue
            low, high = entry["range"]
            ratio = entry["ratio_vs_lmdb"]["median"]
            print(
                f"{case:9s} {name:9s}: {entry['median']:>12,.0f} msg/s "
                f"[{low:,.0f} .. {high:,.0f}]  {ratio:.2f}x lmdb"
            )
    for case, name, goal in TARGETS:
        entry = figures["cases"][case][name]
        ratio = None if entry is None else entry["ratio_vs_lmdb"]["median"]
        met = ratio is not None and ratio >= goal
        result["targets"].append({"case": case, "reader": name, "goal_ratio": goal,
                                  "ratio": ratio, "met": met})  # fmt: skip
        shown = "missing" if ratio is None else f"{ratio:.2f}x"
        print(f"target {case}/{name} >= {goal}x lmdb: {shown} {'MET' if met else 'MISSED'}")
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
