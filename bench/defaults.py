"""The old defaults (RocketMQ's sizes, now ``StoreConfig.broker()``) against the new
lean ones: produce throughput, and disk and memory after one message.

Throughput, in interleaved rounds (old, new, old, new, ...), each on a fresh store:
- async: the service example's producer (KafkaProducer, keyed 100-byte messages over
  8 partitions, flush_mode="async"): send N, flush, then wait until every message is
  readable (dispatched to its ConsumeQueue and the index);
- sync: flush_mode="sync", ``send(...).get()`` per message (a durable ack each).
Open and close are timed apart (``open_ms`` includes pre-warming the first file).

Footprint after ONE message: a fresh subprocess per profile opens a store with that
profile and nothing else, puts one keyed message, waits until it is readable and its
RSS settles, and reports VmRSS and VmHWM (/proc/self/status) and du of the store
directory (allocated blocks, per part) next to its apparent size.

Also times building one CommitLog file (posix_fallocate and pre-warm), the work the
allocation service does in the background before a roll.

    python -m bench.defaults [--quick] [--rounds 5] [--dir DIR] [--out bench/results/defaults.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, Final

from bench.common import load_sample, machine_info, read_text, summarize, write_results
from mqstore import KafkaProducer, MessageStore, StoreConfig
from mqstore.commitlog.mapped_file import MappedFile

TOPIC: Final = "orders"
PARTITIONS: Final = 8  # as in the README's service example
BODY: Final = b"v" * 100
ASYNC_MESSAGES: Final = 200_000
SYNC_MESSAGES: Final = 2_000  # each waits for an fdatasync: about 1 ms apiece here
READABLE_TIMEOUT_S: Final = 120.0
RSS_POLL_S: Final = 0.1
RSS_STABLE_S: Final = 1.0  # RSS is settled once it moved less than RSS_STABLE_KIB over this
RSS_STABLE_KIB: Final = 1024
RSS_SETTLE_MAX_S: Final = 30.0  # bounds the wait for a background pre-warm
BUILD_REPEATS: Final = 3
FOOTPRINT_REPEATS: Final = 3  # subprocesses per profile, interleaved
ROUNDS_MIN: Final = 5  # the machine is shared: fewer rounds give noise, not medians
MIB: Final = 1 << 20

#: profile name -> (what it is, the StoreConfig factory)
PROFILES: Final[dict[str, tuple[str, Callable[..., StoreConfig]]]] = {
    "old": ("broker profile = the old defaults", StoreConfig.broker),
    "new": ("the new defaults", StoreConfig),
}


# ---------------------------------------------------------------- throughput


def _wait_readable(store: MessageStore, count: int) -> None:
    deadline = time.monotonic() + READABLE_TIMEOUT_S
    while sum(store.max_offset(TOPIC, p) for p in range(PARTITIONS)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} messages not readable in {READABLE_TIMEOUT_S} s")
        time.sleep(0.001)


def produce(root: str, profile: str, flush_mode: str, count: int) -> dict[str, float]:
    """Produce ``count`` keyed messages to a fresh store; return rates and open/close ms."""
    path = tempfile.mkdtemp(prefix=f"{profile}-{flush_mode}-", dir=root)
    make_config = PROFILES[profile][1]
    keys = [f"order-{i}" for i in range(count)]  # built before the clock starts
    started = time.perf_counter()
    store = MessageStore.open(path, make_config(flush_mode=flush_mode))
    open_ms = (time.perf_counter() - started) * 1000
    try:
        store.create_topic(TOPIC, partitions=PARTITIONS)
        producer = KafkaProducer(store, key_serializer=str.encode)
        started = time.perf_counter()
        if flush_mode == "sync":
            for key in keys:
                producer.send(TOPIC, BODY, key=key).get()
        else:
            for key in keys:
                producer.send(TOPIC, BODY, key=key)
            producer.flush()
        appended_s = time.perf_counter() - started
        _wait_readable(store, count)
        readable_s = time.perf_counter() - started
        producer.close()
    finally:
        started = time.perf_counter()
        store.close()
        close_ms = (time.perf_counter() - started) * 1000
        shutil.rmtree(path, ignore_errors=True)
    return {
        "msg_per_s": count / appended_s,
        "readable_msg_per_s": count / readable_s,
        "open_ms": open_ms,
        "close_ms": close_ms,
    }


# ---------------------------------------------------------------- footprint


def _status_kib() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile of this process, in KiB."""
    wanted = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
    figures = {}
    for line in read_text("/proc/self/status").splitlines():
        name, _, value = line.partition(":")
        if name in wanted:
            figures[name] = int(value.split()[0])
    return figures


def _settled_status_kib() -> dict[str, int]:
    """/proc/self/status figures once VmRSS stopped moving (a background pre-warm
    done), or after RSS_SETTLE_MAX_S."""
    samples = [_status_kib()["VmRSS"]]
    window = round(RSS_STABLE_S / RSS_POLL_S)
    deadline = time.monotonic() + RSS_SETTLE_MAX_S
    while time.monotonic() < deadline:
        time.sleep(RSS_POLL_S)
        samples.append(_status_kib()["VmRSS"])
        recent = samples[-window - 1 :]
        if len(recent) > window and max(recent) - min(recent) < RSS_STABLE_KIB:
            break
    return _status_kib()


def du_bytes(path: str, apparent: bool = False) -> int:
    """``du -s -B1``: bytes the tree takes on disk (or its apparent size)."""
    command = ["du", "-s", "-B1", *(["--apparent-size"] if apparent else []), path]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0])


def footprint_child(profile: str, path: str) -> dict[str, Any]:
    """In a fresh process: open with the profile alone, put one message, measure."""
    started = time.perf_counter()
    store = MessageStore.open(path, None if profile == "new" else StoreConfig.broker())
    open_ms = (time.perf_counter() - started) * 1000
    try:
        after_open = _settled_status_kib()
        store.put(TOPIC, 0, BODY, keys=["order-1"])
        deadline = time.monotonic() + READABLE_TIMEOUT_S
        while not store.query_by_key(TOPIC, "order-1", 0, 2**62, 1):
            assert time.monotonic() < deadline, "the message never became readable by key"
            time.sleep(0.001)
        after_put = _settled_status_kib()
        disk = {
            part: du_bytes(os.path.join(path, part))
            for part in ("commitlog", "index", "consumequeue")
        }
        disk["store"] = du_bytes(path)
        disk["store_apparent"] = du_bytes(path, apparent=True)
        disk["consumequeue_apparent"] = du_bytes(os.path.join(path, "consumequeue"), True)
        files = len(os.listdir(os.path.join(path, "commitlog")))
    finally:
        store.close()
    return {
        "open_ms": open_ms,
        "after_open_kib": after_open,
        "after_one_message_kib": after_put,
        "du_bytes": disk,
        "commitlog_files": files,
    }


def footprint(root: str, profile: str) -> dict[str, Any]:
    path = tempfile.mkdtemp(prefix=f"footprint-{profile}-", dir=root)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bench.defaults", "--child", profile, path],
            capture_output=True,
            text=True,
            check=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
    finally:
        shutil.rmtree(path, ignore_errors=True)
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def _flat_footprint(figures: dict[str, Any]) -> dict[str, float]:
    """The figures summarize() takes: one number per name."""
    flat = {"open_ms": figures["open_ms"], "commitlog_files": figures["commitlog_files"]}
    for stage in ("after_open_kib", "after_one_message_kib"):
        for name, kib in figures[stage].items():
            flat[f"{stage.removesuffix('_kib')}_{name}_mib"] = kib / 1024
    for part, size_bytes in figures["du_bytes"].items():
        flat[f"du_{part}_mib"] = size_bytes / MIB
    return flat


# ---------------------------------------------------------------- one file's build


def build_ms(root: str, size_bytes: int) -> float:
    """Milliseconds to create and pre-warm one CommitLog file of ``size_bytes``."""
    directory = tempfile.mkdtemp(prefix="build-", dir=root)
    try:
        started = time.perf_counter()
        mapped = MappedFile.create(directory, 0, size_bytes, prewarm=True, lock_memory=False)
        elapsed_ms = (time.perf_counter() - started) * 1000
        mapped.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return elapsed_ms


# ---------------------------------------------------------------- main


def _ratio(results: dict[str, Any], figure: str) -> float:
    return float(results["new"][figure] / results["old"][figure])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10x fewer messages, 2 rounds")
    parser.add_argument("--rounds", type=int, default=ROUNDS_MIN, help="rounds per profile")
    parser.add_argument("--out", default="bench/results/defaults.json")
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    parser.add_argument("--child", nargs=2, metavar=("PROFILE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(footprint_child(*args.child)))
        return 0
    if args.rounds < ROUNDS_MIN and not args.quick:
        parser.error(f"--rounds must be at least {ROUNDS_MIN}: medians of fewer mislead here")
    rounds = 2 if args.quick else args.rounds
    scale = 10 if args.quick else 1
    root = tempfile.mkdtemp(prefix="mqstore-defaults-", dir=args.dir)
    results: dict[str, Any] = {
        "command": " ".join([sys.executable, "-m", "bench.defaults", *sys.argv[1:]]),
        "machine": machine_info(),
        "load": [load_sample()],
        "profiles": {name: described for name, (described, _) in PROFILES.items()},
        "rounds": rounds,
        "throughput": {},
    }
    try:
        cases = [("async", ASYNC_MESSAGES // scale), ("sync", SYNC_MESSAGES // scale)]
        for flush_mode, count in cases:
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in PROFILES}
            for _ in range(rounds):
                for name in PROFILES:  # interleaved: old, new, old, new, ...
                    runs[name].append(produce(root, name, flush_mode, count))
            case: dict[str, Any] = {name: summarize(runs[name]) for name in runs}
            case["messages"] = count
            case["new_to_old_msg_per_s"] = _ratio(case, "msg_per_s")
            case["new_to_old_readable_msg_per_s"] = _ratio(case, "readable_msg_per_s")
            case["new_to_old_open_ms"] = _ratio(case, "open_ms")
            results["throughput"][flush_mode] = case
            print(
                f"{flush_mode:5s} {count:>7,} msgs  old {case['old']['msg_per_s']:>9,.0f} msg/s  "
                f"new {case['new']['msg_per_s']:>9,.0f} msg/s  (new/old "
                f"{case['new_to_old_msg_per_s']:.2f}); readable new/old "
                f"{case['new_to_old_readable_msg_per_s']:.2f}; open "
                f"{case['old']['open_ms']:,.0f} -> {case['new']['open_ms']:,.0f} ms",
                flush=True,
            )
            results["load"].append(load_sample())
        prints: dict[str, list[dict[str, float]]] = {name: [] for name in PROFILES}
        for _ in range(FOOTPRINT_REPEATS):
            for name in PROFILES:  # interleaved too
                prints[name].append(_flat_footprint(footprint(root, name)))
        results["footprint"] = {name: summarize(samples) for name, samples in prints.items()}
        for name, figures in results["footprint"].items():
            print(
                f"{name}: after one message VmRSS {figures['after_one_message_VmRSS_mib']:,.0f} "
                f"MiB (VmHWM {figures['after_one_message_VmHWM_mib']:,.0f}, after open "
                f"{figures['after_open_VmRSS_mib']:,.0f}); du {figures['du_store_mib']:,.1f} MiB "
                f"(commitlog {figures['du_commitlog_mib']:,.1f}, index "
                f"{figures['du_index_mib']:,.1f}, consumequeue "
                f"{figures['du_consumequeue_mib']:,.2f} of "
                f"{figures['du_consumequeue_apparent_mib']:,.1f} apparent)",
                flush=True,
            )
        results["file_build_ms"] = {}
        for name, size_bytes in (("old", 1 << 30), ("new", 128 * MIB)):
            samples = [{"ms": build_ms(root, size_bytes)} for _ in range(BUILD_REPEATS)]
            results["file_build_ms"][name] = summarize(samples)
            print(f"{name}: build and pre-warm one {size_bytes // MIB} MiB file: "
                  f"{results['file_build_ms'][name]['ms']:,.0f} ms", flush=True)  # fmt: skip
        results["load"].append(load_sample())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
