"""The two designs side by side (CommitLog vs segmented), and the Python tools a user
would pick instead (sqlite3 WAL, lmdb, persist-queue), in one run on one machine.

Design comparison: both engines behind the same adapter (``KafkaProducer`` /
``KafkaConsumer``), so the figures compare designs, not adapters.
- producer throughput against partition count (round-robin, explicit ``partition=``),
  async flush (one producer) and sync flush (group commit, 8 producer threads);
- consumer throughput (``poll``), ``offsets_for_times`` latency, key look-up latency
  (CommitLog only: the segmented baseline, like Kafka, has no key index);
- open files, mappings (/proc/self/maps lines) and RSS after each case;
- open (recovery) time after SIGKILL of a writer, against log size.

Peers: the same produce / consume workload at matched durability, each with its
best batch API. See ``peers.py``.

Method: every repeat runs every case once, in a fixed order with the two engines
adjacent (A, B, A, B), each on a fresh store in a fresh temp dir that is deleted
after. Only one store is open at a time (4,096 segmented partitions hold ~12k fds;
the machine caps at 20,000). Throughput is measured over a time window (capped in
messages) after an untimed warm-up round of one message per partition, so the
first-touch cost of per-partition files is reported as set-up time, not mixed into
steady-state throughput. Figures are medians of the repeats with [min, max].

    python -m bench.compare --quick   # under 5 minutes; writes JSON, REPORT.md, plots
    python -m bench.compare --full    # the complete sweep

The report and plots are generated from the JSON by ``bench.compare_report``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import mmap
import os
import pstats
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from bench import peers
from bench.common import load_sample, machine_info, read_text
from mqstore import KafkaConsumer, KafkaProducer, MessageStore, StoreConfig
from mqstore.kafka import TopicPartition
from mqstore.segmented import SegmentedConfig, SegmentedStore

MIB = 1 << 20
TOPIC = "bench"
SYNC_PRODUCERS = 8  # the group-commit case: 8 producer threads
# Small files keep set-up time down (stated in the report): 64 MiB CommitLog files
# without pre-warm; 64 MiB segments and 1 MiB preallocated indexes (Kafka: 1 GiB, 10 MiB).
COMMITLOG_FILE_BYTES = 64 * MIB
SEGMENT_BYTES = 64 * MIB
SEGMENT_INDEX_BYTES = 1 * MIB
LATENCY_SAMPLES = 200  # per case: enough for a p99 of a CDF, cheap at 4,096 partitions

MODES: dict[str, dict[str, Any]] = {
    "quick": {
        "partitions_async": [1, 8, 64, 512, 4096],
        "partitions_sync": [1, 4096],
        "value_bytes": [100],
        "window_s": 0.5,  # measuring window per case
        "max_messages": 60_000,  # cap per window (a fast case ends on the cap)
        "commitlog_only_partitions": [],
        "recovery_mib": [16],
        "lookup_messages": 20_000,
        "peer_window_s": 0.3,
    },
    "smoke": {  # a seconds-long check of the machinery, not a benchmark
        "partitions_async": [1, 8],
        "partitions_sync": [1, 8],
        "value_bytes": [100],
        "window_s": 0.2,
        "max_messages": 5_000,
        "commitlog_only_partitions": [],
        "recovery_mib": [2],
        "lookup_messages": 2_000,
        "peer_window_s": 0.1,
    },
    "full": {
        "partitions_async": [1, 8, 64, 512, 4096],
        "partitions_sync": [1, 8, 64, 512, 4096],
        "value_bytes": [100, 1024],
        "window_s": 3.0,
        "max_messages": 400_000,
        "commitlog_only_partitions": [100_000],
        "recovery_mib": [32, 128, 512],
        "lookup_messages": 200_000,
        "peer_window_s": 2.0,
    },
}


# ---------------------------------------------------------------------- machine


def resources() -> dict[str, float]:
    """Open fds, mapping lines and RSS of this process right now."""
    rss_kib = 0
    for line in read_text("/proc/self/status").splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
    return {
        "open_fds": len(os.listdir("/proc/self/fd")),
        "maps": len(read_text("/proc/self/maps").splitlines()),
        "rss_mib": rss_kib / 1024,
    }


# ---------------------------------------------------------------------- stores


def open_engine(engine: str, directory: str, flush_mode: str) -> Any:
    if engine == "commitlog":
        config = StoreConfig(
            commitlog_file_size_bytes=COMMITLOG_FILE_BYTES, prewarm=False, flush_mode=flush_mode
        )
        return MessageStore.open(directory, config)
    assert engine == "segmented", engine
    return SegmentedStore.open(
        directory,
        SegmentedConfig(
            segment_bytes=SEGMENT_BYTES, index_max_bytes=SEGMENT_INDEX_BYTES, flush_mode=flush_mode
        ),
    )


def _produce_loop(
    producer: KafkaProducer, value: bytes, partitions: int, first: int, step: int,
    deadline: float, cap: int, counts: list[int], slot: int,
) -> None:  # fmt: skip
    """Send round-robin (partition first, first+step, ...) until the deadline or cap."""
    send = producer.send
    sent = 0
    partition = first % partitions
    while sent < cap:
        for _ in range(64):  # check the clock every 64 sends: time.perf_counter is not free
            send(TOPIC, value, partition=partition)
            partition = (partition + step) % partitions
        sent += 64
        if time.perf_counter() >= deadline:
            break
    counts[slot] = sent


def measure_produce(
    store: Any, value: bytes, partitions: int, producers: int, window_s: float, cap: int,
    profile: cProfile.Profile | None = None,
) -> float:  # fmt: skip
    """Messages per second over one window; thread 0 runs in this thread (profiled)."""
    counts = [0] * producers
    per_thread_cap = max(64, cap // producers)
    started = time.perf_counter()
    deadline = started + window_s
    threads = [
        threading.Thread(
            target=_produce_loop,
            args=(KafkaProducer(store), value, partitions, t, producers, deadline,
                  per_thread_cap, counts, t),
        )
        for t in range(1, producers)
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    if profile is not None:
        profile.enable()
    _produce_loop(KafkaProducer(store), value, partitions, 0, producers, deadline,
                  per_thread_cap, counts, 0)  # fmt: skip
    if profile is not None:
        profile.disable()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return sum(counts) / elapsed


def wait_dispatched(store: Any, timeout_s: float = 120.0) -> float:
    """CommitLog engine: wait until the dispatcher has built the ConsumeQueues and the
    index for everything appended (lag 0); return the seconds waited. The segmented
    engine has no dispatch (0)."""
    if not isinstance(store, MessageStore):
        return 0.0
    started = time.perf_counter()
    while store.stats()["dispatch_lag_bytes"]:
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError(f"dispatch still lags after {timeout_s} s")
        time.sleep(0.002)  # stats() lists /proc/self/fd: do not spin on it
    return time.perf_counter() - started


def measure_consume(store: Any, partitions: int, window_s: float) -> tuple[float, int]:
    """Read everything from the beginning with ``poll``; messages per second."""
    consumer = KafkaConsumer(
        store=store, auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=500
    )
    consumer.assign([TopicPartition(TOPIC, p) for p in range(partitions)])
    consumer.seek_to_beginning()
    total = sum(store.latest_offset(TOPIC, p) for p in range(partitions))
    got = 0
    started = time.perf_counter()
    deadline = started + window_s
    while got < total and time.perf_counter() < deadline:
        for records in consumer.poll(timeout_ms=0, max_records=500).values():
            got += len(records)
    elapsed = time.perf_counter() - started
    consumer.close()
    return got / elapsed, got


def measure_offsets_for_times(store: Any, partitions: int, rng: random.Random) -> list[float]:
    """Latency (us) of single-partition offsets_for_times at random targets."""
    consumer = KafkaConsumer(store=store, enable_auto_commit=False)
    tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
    consumer.assign(tps)
    bounds = []
    for tp in tps[:LATENCY_SAMPLES]:
        first = store.read_records(
            TOPIC, tp.partition, store.earliest_offset(TOPIC, tp.partition), 1
        )
        if first:
            bounds.append(first[0].timestamp_ms)
    low = min(bounds) if bounds else 0
    high = int(time.time() * 1000)
    samples = []
    for _ in range(LATENCY_SAMPLES):
        tp = tps[rng.randrange(partitions)]
        target = rng.randint(low, high)
        started = time.perf_counter_ns()
        consumer.offsets_for_times({tp: target})
        samples.append((time.perf_counter_ns() - started) / 1000)
    consumer.close()
    return samples


def run_design_case(
    root: str, engine: str, flush_mode: str, partitions: int, value_bytes: int,
    mode: dict[str, Any], rng: random.Random, profile_after: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """One fresh store: set up, warm up, produce, consume, look up, measure, close.

    ``profile_after``: then one more produce window under cProfile (not in the figures),
    on the same store, so a missed target can say why without another set-up."""
    directory = tempfile.mkdtemp(dir=root)
    value = b"v" * value_bytes
    producers = SYNC_PRODUCERS if flush_mode == "sync" else 1
    before = resources()
    started = time.perf_counter()
    store = open_engine(engine, directory, flush_mode)
    try:
        store.create_topic(TOPIC, partitions)
        warm = KafkaProducer(store)
        for partition in range(partitions):  # first touch of every partition's files
            warm.send(TOPIC, value, partition=partition)
        wait_dispatched(store)  # the warm-up's queue files are made before the window
        setup_s = time.perf_counter() - started
        produce = measure_produce(
            store, value, partitions, producers, mode["window_s"], mode["max_messages"]
        )
        drain_s = wait_dispatched(store)
        after = resources()
        consume, consumed = measure_consume(store, partitions, mode["window_s"])
        oft = measure_offsets_for_times(store, partitions, rng)
        profile = None
        if profile_after:
            profiler = cProfile.Profile()
            wait_dispatched(store)
            measure_produce(store, value, partitions, producers, mode["window_s"],
                            mode["max_messages"], profiler)  # fmt: skip
            profile = profile_text(profiler)
    finally:
        started = time.perf_counter()
        store.close()
        close_s = time.perf_counter() - started
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "produce_msg_per_s": produce,
        "dispatch_drain_s": drain_s,
        "consume_msg_per_s": consume,
        "consumed": consumed,
        "setup_s": setup_s,
        "close_s": close_s,
        "open_fds": after["open_fds"] - before["open_fds"],
        "maps": after["maps"] - before["maps"],
        "rss_mib": after["rss_mib"],
        "oft_p50_us": statistics.median(oft),
        "oft_p99_us": _percentile(oft, 99),
        "oft_samples_us": oft,
        "profile": profile,
    }


def measure_fsync(root: str, groups: int = 200) -> dict[str, float]:
    """What a durable group costs on this disk, without Python on the path: p50 (us)
    of write + fdatasync of a 170-byte record, (a) through a mapping of one
    fallocate'd file (the CommitLog's sync flush), (b) appended to one file, and
    (c) appended to SYNC_PRODUCERS files with one fdatasync each (a segmented group
    whose producers write to different partitions)."""
    directory = tempfile.mkdtemp(dir=root)
    record = b"r" * 170
    out: dict[str, float] = {}
    try:
        fd = os.open(os.path.join(directory, "mapped"), os.O_RDWR | os.O_CREAT, 0o644)
        os.posix_fallocate(fd, 0, 16 << 20)
        with mmap.mmap(fd, 16 << 20) as mapping:
            samples = []
            for i in range(groups):
                mapping[i * 170 : (i + 1) * 170] = record
                started = time.perf_counter_ns()
                os.fdatasync(fd)
                samples.append((time.perf_counter_ns() - started) / 1000)
        os.close(fd)
        out["mapped_one_file_us"] = statistics.median(samples)
        fds = [
            os.open(os.path.join(directory, f"p{i}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            for i in range(SYNC_PRODUCERS)
        ]
        for name, files in (("append_one_file_us", fds[:1]), ("append_n_files_us", fds)):
            samples = []
            for _ in range(groups):
                for handle in files:
                    os.write(handle, record)
                started = time.perf_counter_ns()
                for handle in files:
                    os.fdatasync(handle)
                samples.append((time.perf_counter_ns() - started) / 1000)
            out[name] = statistics.median(samples)
        for handle in fds:
            os.close(handle)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return out


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def run_key_lookup(root: str, count: int, rng: random.Random) -> dict[str, Any]:
    """CommitLog engine: keyed produce, then query_by_key latency at random keys."""
    directory = tempfile.mkdtemp(dir=root)
    store = open_engine("commitlog", directory, "async")
    try:
        store.create_topic(TOPIC, 8)
        producer = KafkaProducer(store)
        value = b"v" * 100
        for i in range(count):
            producer.send(TOPIC, value, key=f"k{i}".encode(), partition=i % 8)
        samples, misses = [], 0
        for _ in range(LATENCY_SAMPLES):
            key = f"k{rng.randrange(count)}"
            started = time.perf_counter_ns()
            found = store.query_by_key(TOPIC, key, max_results=4)
            samples.append((time.perf_counter_ns() - started) / 1000)
            misses += not found
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)
    return {"samples_us": samples, "p50_us": statistics.median(samples),
            "p99_us": _percentile(samples, 99), "misses": misses, "messages": count}  # fmt: skip


# ---------------------------------------------------------------------- recovery


def recovery_writer(engine: str, directory: str, mib: int) -> None:
    """Child process: write ``mib`` MiB of 1 KiB messages over 8 partitions, say
    "ready", then wait to be SIGKILLed (no close, no final flush)."""
    store = open_engine(engine, directory, "async")
    store.create_topic(TOPIC, 8)
    producer = KafkaProducer(store)
    batch = [b"r" * 1024] * 256
    for i in range(mib * 4):  # 256 KiB per batch
        producer.send_batch(TOPIC, i % 8, batch)
    print("ready", flush=True)
    time.sleep(600)


def run_recovery(root: str, engine: str, mib: int) -> dict[str, Any]:
    directory = tempfile.mkdtemp(dir=root)
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.compare", "--recovery-writer", engine, directory,
             str(mib)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout is not None
        line = child.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"recovery writer failed: {line!r}")
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        started = time.perf_counter()
        store = open_engine(engine, directory, "async")
        open_s = time.perf_counter() - started
        recovered = sum(store.latest_offset(TOPIC, p) for p in range(8))
        crashed = bool(store.stats().get("recovered_from_crash"))
        store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"open_s": open_s, "recovered_messages": recovered, "recovered_from_crash": crashed}


# ---------------------------------------------------------------------- summary


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        if isinstance(first, int | float) and not isinstance(first, bool):
            values = [run[key] for run in runs]
            out[key] = {"median": statistics.median(values), "min": min(values),
                        "max": max(values)}  # fmt: skip
    return out


def profile_text(profile: cProfile.Profile, lines: int = 14) -> str:
    stream = io.StringIO()
    stats = pstats.Stats(profile, stream=stream)
    stats.strip_dirs().sort_stats("tottime").print_stats(lines)
    text = stream.getvalue()
    start = text.find("   ncalls")
    return text[start:].rstrip() if start >= 0 else text


def design_cases(mode: dict[str, Any]) -> list[tuple[str, str, int, int]]:
    """(engine, flush, partitions, value_bytes), the two engines adjacent."""
    cases = []
    for value_bytes in mode["value_bytes"]:
        for flush, key in (("async", "partitions_async"), ("sync", "partitions_sync")):
            for partitions in mode[key]:
                for engine in ("commitlog", "segmented"):
                    cases.append((engine, flush, partitions, value_bytes))
    for partitions in mode["commitlog_only_partitions"]:
        cases.append(("commitlog", "async", partitions, 100))
    return cases


def case_name(engine: str, flush: str, partitions: int, value_bytes: int) -> str:
    return f"{engine}/{flush}/{partitions}p/{value_bytes}B"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--recovery-writer"]:
        recovery_writer(argv[1], argv[2], int(argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="the quick suite (default)")
    group.add_argument("--full", action="store_true", help="the complete sweep")
    group.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--out", default="bench/results/compare.json")
    parser.add_argument("--report", default="bench/REPORT.md")
    parser.add_argument("--plots", default="bench/plots")
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error("at least 3 repeats: medians and ranges need them")
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # "skipped: max instances"
    mode_name = "full" if args.full else "smoke" if args.smoke else "quick"
    mode = MODES[mode_name]
    rng = random.Random(args.seed)
    wall_started = time.perf_counter()
    results: dict[str, Any] = {
        "command": " ".join(["python", "-m", "bench.compare", *argv]),
        "executable": sys.executable,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "mode": mode_name,
        "mode_settings": mode,
        "repeats": args.repeats,
        "seed": args.seed,
        "settings": {
            "commitlog": f"commitlog_file_size_bytes={COMMITLOG_FILE_BYTES}, prewarm=False, "
            "other StoreConfig fields default",
            "segmented": f"segment_bytes={SEGMENT_BYTES}, index_max_bytes={SEGMENT_INDEX_BYTES}, "
            "other SegmentedConfig fields default (Kafka's)",
            "sync_producers": SYNC_PRODUCERS,
            "latency_samples": LATENCY_SAMPLES,
        },
        "load": [load_sample()],
    }
    root = tempfile.mkdtemp(prefix="mqstore-compare-")
    design_runs: dict[str, list[dict[str, Any]]] = {}
    key_runs: list[dict[str, Any]] = []
    fsync_runs: list[dict[str, float]] = []
    recovery_runs: dict[str, list[dict[str, Any]]] = {}
    peer_runs: dict[str, list[dict[str, Any]]] = {}
    cases = design_cases(mode)
    try:
        for repeat in range(args.repeats):
            last = repeat == args.repeats - 1
            top = max(c[2] for c in cases if c[0] == "segmented")
            for case in cases:
                profile_after = last and case[0] == "commitlog" and case[2] == top
                run = run_design_case(root, *case[:3], case[3], mode, rng, profile_after)
                design_runs.setdefault(case_name(*case), []).append(run)
                print(f"[{repeat + 1}] {case_name(*case):32s} produce "
                      f"{run['produce_msg_per_s']:>10,.0f}/s consume "
                      f"{run['consume_msg_per_s']:>10,.0f}/s setup {run['setup_s']:.1f}s "
                      f"close {run['close_s']:.1f}s", flush=True)  # fmt: skip
            key_runs.append(run_key_lookup(root, mode["lookup_messages"], rng))
            fsync_runs.append(measure_fsync(root))
            for mib in mode["recovery_mib"]:
                for engine in ("commitlog", "segmented"):
                    name = f"{engine}/{mib}MiB"
                    recovery_runs.setdefault(name, []).append(run_recovery(root, engine, mib))
            for name, run in peers.run_all(root, mode["peer_window_s"]).items():
                peer_runs.setdefault(name, []).append(run)
            results["load"].append(load_sample())
            print(f"repeat {repeat + 1}/{args.repeats} done at "
                  f"{time.perf_counter() - wall_started:.0f}s", flush=True)  # fmt: skip
        results["design"] = [
            {"engine": c[0], "flush": c[1], "partitions": c[2], "value_bytes": c[3],
             "producers": SYNC_PRODUCERS if c[1] == "sync" else 1,
             "summary": summarize(design_runs[case_name(*c)]),
             "runs": design_runs[case_name(*c)]}
            for c in cases
        ]  # fmt: skip
        results["key_lookup"] = {"summary": summarize(key_runs), "runs": key_runs}
        results["fsync"] = {"summary": summarize(fsync_runs), "runs": fsync_runs}
        results["recovery"] = [
            {"engine": name.split("/")[0], "log_mib": int(name.split("/")[1][:-3]),
             "summary": summarize(runs), "runs": runs}
            for name, runs in recovery_runs.items()
        ]  # fmt: skip
        results["peers"] = [
            {**peers.describe(name), "summary": summarize(runs), "runs": runs}
            for name, runs in peer_runs.items()
        ]
        results["targets"] = evaluate_targets(results)
        results["profiles"] = profile_missed(root, results)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["load"].append(load_sample())
    results["wall_s"] = time.perf_counter() - wall_started
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    print(f"wrote {args.out} after {results['wall_s']:.0f}s")
    from bench import compare_report

    compare_report.generate(args.out, args.report, args.plots)
    return 0


# ---------------------------------------------------------------------- targets


def _design(results: dict[str, Any], engine: str, flush: str, partitions: int) -> float | None:
    for entry in results["design"]:
        if (entry["engine"], entry["flush"], entry["partitions"], entry["value_bytes"]) == (
            engine, flush, partitions, 100,
        ):  # fmt: skip
            return float(entry["summary"]["produce_msg_per_s"]["median"])
    return None


def _peer(results: dict[str, Any], name: str, field: str) -> float:
    for entry in results["peers"]:
        if entry["name"] == name:
            return float(entry["summary"][field]["median"])
    raise KeyError(name)


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's five targets, each with both sides, the ratio and met/missed."""
    top = max(results["design"], key=lambda e: e["partitions"] if e["engine"] == "segmented"
              else 0)["partitions"]  # fmt: skip
    peers_async = [p for p in results["peers"] if p["durability"] == "no fsync per commit"
                   and p["engine"] != "mqstore"]  # fmt: skip
    fastest = max(peers_async, key=lambda p: p["summary"]["single_msg_per_s"]["median"])
    targets: list[tuple[str, str, float | None, str, float | None, float, str]] = [
        ("commitlog_partitions", f"CommitLog at {top} partitions vs its own 1 partition (async)",
         _design(results, "commitlog", "async", top), "commitlog async 1p",
         _design(results, "commitlog", "async", 1), 0.8, ">= 80%"),
        ("sync_vs_segmented", f"CommitLog vs segmented at {top} partitions, sync, 8 producers",
         _design(results, "commitlog", "sync", top), "segmented sync",
         _design(results, "segmented", "sync", top), 5.0, ">= 5x"),
        ("async_vs_segmented", f"CommitLog vs segmented at {top} partitions, async flush",
         _design(results, "commitlog", "async", top), "segmented async",
         _design(results, "segmented", "async", top), 1.0, "ahead (> 1x)"),
        ("per_message_vs_peer", "mqstore per-message produce (async, put) vs the fastest peer's "
         f"per-message produce ({fastest['name']})",
         _peer(results, "mqstore-async", "single_msg_per_s"), fastest["name"],
         float(fastest["summary"]["single_msg_per_s"]["median"]), 5.0, ">= 5x"),
        ("batch_vs_lmdb", "mqstore batch produce (async, put_batch_arrays) vs lmdb batch "
         "(sync=False, putmulti)",
         _peer(results, "mqstore-async", "batch_msg_per_s"), "lmdb-nosync",
         _peer(results, "lmdb-nosync", "batch_msg_per_s"), 2.0, ">= 2x"),
    ]  # fmt: skip
    out = []
    for key, what, ours, other_name, other, goal, goal_text in targets:
        ratio = ours / other if ours and other else None
        met = ratio is not None and (ratio > goal if key == "async_vs_segmented" else ratio >= goal)
        out.append(
            {
                "key": key,
                "target": what,
                "goal": goal_text,
                "ours_msg_per_s": ours,
                "other": other_name,
                "other_msg_per_s": other,
                "ratio": ratio,
                "met": met,
            }
        )
    return out  # fmt: skip


def profile_missed(root: str, results: dict[str, Any]) -> dict[str, str]:
    """cProfile (top functions by own time) of our side of every missed target: the
    design cases were profiled in their last repeat; the peer cases run here."""
    top = max(e["partitions"] for e in results["design"] if e["engine"] == "segmented")

    def design_profile(flush: str) -> str:
        for entry in results["design"]:
            if (entry["engine"], entry["flush"], entry["partitions"]) == ("commitlog", flush, top):
                return str(entry["runs"][-1].get("profile") or "")
        return ""

    out: dict[str, str] = {}
    for target in results["targets"]:
        key = target["key"]
        if target["met"]:
            continue
        if key in ("commitlog_partitions", "async_vs_segmented"):
            out[key] = design_profile("async")
        elif key == "sync_vs_segmented":
            out[key] = design_profile("sync")
        else:
            profile = cProfile.Profile()
            peers.profile_mqstore(root, "single" if key == "per_message_vs_peer" else "batch",
                                  profile)  # fmt: skip
            out[key] = profile_text(profile)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
