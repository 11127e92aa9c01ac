"""Visibility: from ``put`` returning in the writer to the message coming back from a
waiting reader's read, at a paced 50,000 msg/s of 100 B bodies, against lmdb.

    python -m bench.visibility [--messages 20000] [--rounds 5] [--out bench/results/visibility.json]

Cases (each writes ``--messages`` messages at ``--rate`` msg/s; the writer sleeps
until each message is due and stamps ``time.perf_counter_ns()`` when its put returns):

- ``mqstore same process``: a reader thread loops ``wait_for(topic, 0, offset)`` then
  ``get_batch(topic, 0, offset, ...)`` and stamps every message it got;
- ``mqstore same process (no kick)``: the same with the append listener set back to
  waking the dispatcher thread (``Dispatcher.wake``), which then dispatches and wakes
  the reader: the two-hop path that kicks (dispatch/waiters.py) replace;
- ``lmdb same process`` (the peer): one write transaction per message (sync=False,
  as the store's async flush), then a ``threading.Condition`` notify; the reader
  thread waits on the condition and reads the new keys in one read transaction;
- ``mqstore other process (notify)``: the reader is a read-only follower
  (``MessageStore.open(path, read_only=True)``) in a second process, woken through the
  store's ``notify`` file (futex, dispatch/notify.py);
- ``mqstore other process (poll)``: the same follower with ``notify`` hidden from it,
  the follower's behaviour before it existed (a 1 ms poll);
- ``mqstore other process (inotify)``: the other mechanism measured for ``notify``:
  the writer's round listener writes one byte to a file (``pwrite``) after each
  round, and the follower sleeps in ``select`` on an inotify descriptor watching that
  file for IN_MODIFY (both sides set up here, over the store's round-listener seam);
- ``lmdb other process (pipe)``: what an lmdb user would do across processes: the
  writer writes one byte to a pipe after each commit, the reader process blocks in
  ``read`` on it, then reads the new keys in a read transaction.

Clocks: ``perf_counter_ns`` is CLOCK_MONOTONIC, one clock for every process of the
machine, so a latency is the reader's stamp minus the writer's. The first
WARMUP_MESSAGES of each run are left out.

Method: ``--rounds`` rounds; a round runs every case once, in an order rotated by one
each round. A case's figure is the median over rounds of its per-round p50 and p99;
a ratio is a round's mqstore p99 over the same round's lmdb p99, median over rounds.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench import visibility_stages
from bench.common import load_sample, machine_info, write_results
from bench.peers import open_lmdb
from mqstore import MessageStore, StoreConfig

TOPIC = "vis"
BODY = b"v" * 100
WARMUP_MESSAGES = 1_000  # left out of each run: first files, first rounds, caches
WAIT_MS = 2_000  # a reader's long poll; a run is over well before
READ_ROWS = 1_000  # rows per get_batch: more than a round ever holds at 50k msg/s
RUN_TIMEOUT_S = 60.0  # a run that has not ended by then is a failure, not a hang
CASES = (
    "mqstore same process",
    "mqstore same process (no kick)",
    "lmdb same process",
    "mqstore other process (notify)",
    "mqstore other process (poll)",
    "mqstore other process (inotify)",
    "lmdb other process (pipe)",
)
#: (row, case, peer case or None, target text, check(value, peer_value)).
TARGETS = (
    ("visibility p99, same process", "mqstore same process", "lmdb same process",
     "<= 2x lmdb + condition variable"),
    ("visibility p99, other process (read-only follower)", "mqstore other process (notify)",
     None, "<= 500 us"),
)  # fmt: skip


def _config() -> StoreConfig:
    return StoreConfig(prewarm=False, flush_mode="async")


def _paced_writes(count: int, rate: int, put: Callable[[int], None]) -> np.ndarray:
    """Call ``put(i)`` for i in range(count) at ``rate`` per second; the put-return
    stamps. The writer sleeps until the next message is due (releasing the GIL) and
    then writes every message that is due."""
    stamps = np.zeros(count, dtype=np.int64)
    period_ns = 1_000_000_000 // rate
    start_ns = time.perf_counter_ns()
    clock = time.perf_counter_ns
    for i in range(count):
        wait_ns = start_ns + i * period_ns - clock()
        if wait_ns > 0:
            time.sleep(wait_ns / 1e9)
        put(i)
        stamps[i] = clock()
    return stamps


def _latencies_us(put_ns: np.ndarray, read_ns: np.ndarray) -> dict[str, float]:
    assert len(put_ns) == len(read_ns)
    lat = (read_ns[WARMUP_MESSAGES:] - put_ns[WARMUP_MESSAGES:]) / 1000
    if (read_ns[WARMUP_MESSAGES:] == 0).any():
        raise RuntimeError("the reader missed messages")
    return {"p50_us": float(np.percentile(lat, 50)), "p99_us": float(np.percentile(lat, 99)),
            "max_us": float(lat.max())}  # fmt: skip


# ------------------------------------------------------------------ readers


def _store_reader(store: MessageStore, first: int, stamps: np.ndarray) -> None:
    """wait_for, then get_batch, from offset ``first`` until ``len(stamps)`` messages
    were read; stamp each (``stamps[offset - first]``)."""
    offset, end = first, first + len(stamps)
    clock = time.perf_counter_ns
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while offset < end:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the reader is stuck at {offset}")
        if not store.wait_for(TOPIC, 0, offset, WAIT_MS):
            continue
        batch = store.get_batch(TOPIC, 0, offset, min(READ_ROWS, end - offset))
        now = clock()
        got = len(batch)
        stamps[offset - first : offset - first + got] = now
        offset += got


def _lmdb_reader(env: Any, count: int, stamps: np.ndarray, wait: Callable[[int], int]) -> None:
    """``wait(offset)`` returns the number of keys written; read the new ones."""
    offset = 0
    clock = time.perf_counter_ns
    while offset < count:
        written = wait(offset)
        with env.begin() as txn:
            got = 0
            for key in range(offset, written):
                if txn.get(key.to_bytes(8, "big")) is None:
                    break
                got += 1
        stamps[offset : offset + got] = clock()
        offset += got


# ------------------------------------------------------------------ same process


def run_store_same(root: str, count: int, rate: int, kick: bool) -> dict[str, float]:
    store = MessageStore.open(root, _config())
    read_ns = np.zeros(count, dtype=np.int64)
    try:
        store.put(TOPIC, 0, BODY)  # offset 0: the topic exists before the reader waits
        if not kick:
            assert store._dispatcher is not None
            store.commitlog.set_append_listener(store._dispatcher.wake)
        reader = threading.Thread(target=_store_reader, args=(store, 1, read_ns))
        reader.start()
        put_ns = _paced_writes(count, rate, lambda _i: store.put(TOPIC, 0, BODY))
        reader.join(RUN_TIMEOUT_S)
    finally:
        store.close()
    return _latencies_us(put_ns, read_ns)


def run_lmdb_same(root: str, count: int, rate: int) -> dict[str, float]:
    env = open_lmdb(root, sync=False)
    read_ns = np.zeros(count, dtype=np.int64)
    changed = threading.Condition()
    written = [0]

    def wait(offset: int) -> int:
        with changed:
            while written[0] <= offset:
                changed.wait(WAIT_MS / 1000)
            return written[0]

    def put(i: int) -> None:
        with env.begin(write=True) as txn:
            txn.put(i.to_bytes(8, "big"), BODY)
        with changed:
            written[0] = i + 1
            changed.notify()

    reader = threading.Thread(target=_lmdb_reader, args=(env, count, read_ns, wait))
    reader.start()
    try:
        put_ns = _paced_writes(count, rate, put)
        reader.join(RUN_TIMEOUT_S)
    finally:
        env.close()
    return _latencies_us(put_ns, read_ns)


# ------------------------------------------------------------------ other process


def _child(args: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[str]:
    """Start a reader process and wait for its "ready" line."""
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.visibility", *args],
        stdout=subprocess.PIPE, text=True, pass_fds=pass_fds,
    )  # fmt: skip
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "ready":
        child.kill()
        raise RuntimeError(f"the reader process did not start: {line!r}")
    return child


def _finish(child: subprocess.Popen[str], stamps_path: str) -> np.ndarray:
    if child.wait(RUN_TIMEOUT_S) != 0:
        raise RuntimeError(f"the reader process failed ({child.returncode})")
    return np.load(stamps_path)


INOTIFY_FILE = "notify-inotify"  # the inotify case's file (bench only)
_IN_MODIFY = 0x2
_IN_NONBLOCK_CLOEXEC = 0o4000 | 0o2000000


class _InotifyFollower:
    """Follower's interface (sequence, wait, close) over inotify: ``wait`` sleeps in
    select until the watched file is modified; events queue in the descriptor, so a
    write between a check and the select ends the select at once."""

    def __init__(self, root: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(_IN_NONBLOCK_CLOEXEC)
        path = os.path.join(root, INOTIFY_FILE).encode()
        if self._fd < 0 or libc.inotify_add_watch(self._fd, path, _IN_MODIFY) < 0:
            raise OSError(ctypes.get_errno(), "inotify")

    @property
    def sequence(self) -> int:
        return 0

    def wait(self, _sequence: int, timeout_s: float) -> None:
        if select.select([self._fd], [], [], timeout_s)[0]:
            try:
                os.read(self._fd, 65536)  # drain
            except BlockingIOError:
                pass

    def close(self) -> None:
        os.close(self._fd)


def run_store_other(root: str, count: int, rate: int, mechanism: str) -> dict[str, float]:
    store = MessageStore.open(root, _config())
    stamps_path = os.path.join(root, "stamps.npy")
    fd = -1
    try:
        store.put(TOPIC, 0, BODY)
        if mechanism == "inotify":
            fd = os.open(os.path.join(root, INOTIFY_FILE), os.O_RDWR | os.O_CREAT, 0o644)
            assert store._dispatcher is not None
            store._dispatcher.set_round_listener(lambda: os.pwrite(fd, b"\x01", 0) and None)
        role = f"store-reader-{mechanism}"
        child = _child(["--role", role, "--root", root, "--messages", str(count)])
        put_ns = _paced_writes(count, rate, lambda _i: store.put(TOPIC, 0, BODY))
        read_ns = _finish(child, stamps_path)
    finally:
        store.close()
        if fd >= 0:
            os.close(fd)
    return _latencies_us(put_ns, read_ns)


def run_lmdb_other(root: str, count: int, rate: int) -> dict[str, float]:
    env = open_lmdb(root, sync=False)
    stamps_path = os.path.join(root, "stamps.npy")
    read_fd, write_fd = os.pipe()
    try:
        args = ["--role", "lmdb-reader", "--root", root, "--messages", str(count)]
        child = _child([*args, "--fd", str(read_fd)], pass_fds=(read_fd,))
        os.close(read_fd)

        def put(i: int) -> None:
            with env.begin(write=True) as txn:
                txn.put(i.to_bytes(8, "big"), BODY)
            os.write(write_fd, b"\x01")

        put_ns = _paced_writes(count, rate, put)
        read_ns = _finish(child, stamps_path)
    finally:
        os.close(write_fd)
        env.close()
    return _latencies_us(put_ns, read_ns)


def _reader_process(role: str, root: str, count: int, fd: int | None) -> None:
    """A reader process: say "ready", read ``count`` messages, save the stamps."""
    stamps = np.zeros(count, dtype=np.int64)
    if role == "lmdb-reader":
        assert fd is not None
        env = open_lmdb(root, sync=False)
        written = [0]

        def wait(offset: int) -> int:
            while written[0] <= offset:
                written[0] += len(os.read(fd, 65536))
            return written[0]

        print("ready", flush=True)
        _lmdb_reader(env, count, stamps, wait)
        env.close()
    else:
        import mqstore.store

        if role == "store-reader-poll":  # the follower as it was before ``notify``
            mqstore.store.Follower.open = staticmethod(lambda _root: None)  # type: ignore[method-assign]
        elif role == "store-reader-inotify":
            mqstore.store.Follower.open = staticmethod(_InotifyFollower)  # type: ignore[method-assign,assignment]
        store = MessageStore.open(root, read_only=True)
        print("ready", flush=True)
        _store_reader(store, 1, stamps)
        store.close()
    np.save(os.path.join(root, "stamps.npy"), stamps)


# ------------------------------------------------------------------ driver


def _run_case(case: str, count: int, rate: int) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="mqstore-vis-")
    try:
        if case.startswith("mqstore same process"):
            return run_store_same(root, count, rate, kick="no kick" not in case)
        if case == "lmdb same process":
            return run_lmdb_same(root, count, rate)
        if case.startswith("mqstore other process ("):
            return run_store_other(root, count, rate, case.split("(")[1].rstrip(")"))
        assert case == "lmdb other process (pipe)"
        return run_lmdb_other(root, count, rate)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _targets(figures: dict[str, dict[str, Any]], ratios: list[float]) -> list[dict[str, Any]]:
    rows = []
    for row, case, peer, target in TARGETS:
        value = figures[case]["p99_us"]
        if peer is not None:
            peer_value = figures[peer]["p99_us"]
            ratio = statistics.median(ratios)
            met = ratio <= 2.0
        else:
            peer_value, ratio, met = None, None, value <= 500.0
        rows.append({"row": row, "value": round(value, 1), "unit": "us", "peer": peer,
                     "peer_value": None if peer_value is None else round(peer_value, 1),
                     "ratio": None if ratio is None else round(ratio, 2),
                     "target": target, "met": met})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=50_000, help="msg/s")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench/results/visibility.json")
    parser.add_argument("--only", help="run only the cases whose name contains this")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "store-reader-stages":
        visibility_stages.follower_process(args.root, args.messages, TOPIC)
        return
    if args.role:
        _reader_process(args.role, args.root, args.messages, args.fd)
        return
    cases = tuple(case for case in CASES if args.only is None or args.only in case)
    per_case: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    ratios: list[float] = []
    loads = [load_sample()]
    for round_ in range(args.rounds):
        order = cases[round_ % len(cases) :] + cases[: round_ % len(cases)]
        for case in order:
            figures = _run_case(case, args.messages, args.rate)
            per_case[case].append(figures)
            print(f"round {round_ + 1} {case:32} p50 {figures['p50_us']:8.1f} us  "
                  f"p99 {figures['p99_us']:8.1f} us  max {figures['max_us']:9.1f} us",
                  flush=True)  # fmt: skip
        if "mqstore same process" in per_case and "lmdb same process" in per_case:
            same = per_case["mqstore same process"][-1]["p99_us"]
            ratios.append(same / per_case["lmdb same process"][-1]["p99_us"])
        loads.append(load_sample())
    figures = {
        case: {
            "p50_us": statistics.median(r["p50_us"] for r in runs),
            "p99_us": statistics.median(r["p99_us"] for r in runs),
            "p50_us_range": [min(r["p50_us"] for r in runs), max(r["p50_us"] for r in runs)],
            "p99_us_range": [min(r["p99_us"] for r in runs), max(r["p99_us"] for r in runs)],
        }
        for case, runs in per_case.items()
    }
    targets = _targets(figures, ratios) if cases == CASES else []
    for target in targets:  # a miss gets where the time goes: one more, stamped run
        if not target["met"]:
            kind = "same" if "same" in target["row"] else "other"
            target["profile"] = visibility_stages.stages_text(
                kind, args.messages, args.rate, WARMUP_MESSAGES, _config(), _paced_writes,
                TOPIC, BODY,
            )  # fmt: skip
    for case, figure in figures.items():
        print(f"{case:32} p50 {figure['p50_us']:8.1f} us  p99 {figure['p99_us']:8.1f} us")
    for target in targets:
        print(target)
    write_results(args.out, {
        "benchmark": "visibility",
        "command": " ".join(["python -m bench.visibility", *sys.argv[1:]]),
        "messages": args.messages, "rate_msg_s": args.rate, "rounds": args.rounds,
        "body_bytes": len(BODY), "warmup_messages": WARMUP_MESSAGES,
        "cases": figures, "p99_ratio_same_process_per_round": ratios, "targets": targets,
        "runs": per_case, "load": loads, "machine": machine_info(),
    })  # fmt: skip


if __name__ == "__main__":
    main()
