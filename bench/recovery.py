"""Reopen after SIGKILL with 1 GiB written since the last checkpoint (issue 15).

    python -m bench.recovery [--mib 1024] [--body-bytes 1024 100] [--rounds 3]
                             [--peer-mib 1024] [--out bench/results/recovery.json]
    python -m bench.recovery --many-queues 20000 3 [--rounds 3]
                             [--out bench/results/recovery_queues.json]

The case: a child process opens a store, writes a 1 MiB preamble and closes it (the
checkpoint now sits at the preamble's end), opens it again with the checkpoint
effectively frozen (``checkpoint_interval_ms`` and ``consumequeue_flush_interval_ms``
at their maximum), writes ``--mib`` MiB of messages of ``--body-bytes`` bodies
round-robin over 8 partitions (``put_batch_arrays``, 256 bodies a call, no keys or
tags), prints ``ready <messages> <start position>`` and is SIGKILLed. The parent then
reads the checkpoint file and asserts both its positions are at or before the start
of the run (so the whole run was written since the last checkpoint), times
``MessageStore.open``, and checks the recovered message count (sum of the
partitions' next offsets) against what the child reported. Every message the child
wrote was acknowledged by ``put_batch_arrays``; async flush, and a SIGKILL keeps the
page cache, so every one must come back.

Then the same store is closed and opened again: the clean reopen. The peers (lmdb
with sync=False, sqlite3 in WAL mode with synchronous=NORMAL) get the same bytes of
values from a child that is SIGKILLed the same way; their reopen is timed to the
first answer (lmdb: open and a read transaction's entry count; sqlite: connect and
``SELECT max(id)``).

Method: ``--rounds`` rounds, and every round runs every case (mqstore crash and clean
reopen, lmdb, sqlite) for every body size one after the other, so the drift of a
shared machine hits all alike; figures are medians over rounds [min .. max]. The page
cache is warm (the child's writes are in it), as after a process crash. After the
rounds, one more crash of each body size is reopened under cProfile: where the time
goes, in the JSON (and, on one line, in a missed target row's "profile").

``--many-queues Q N`` runs another case alone: the child puts N rounds of one 100 B
message to each of Q queues (most stay in their topic's shared unit log) after the
same preamble, and is SIGKILLed; the store is reopened as it is (its queues kept their
units, which the re-dispatch compares) and, in a copy, without its ConsumeQueue and
index directories (the re-dispatch writes every unit).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
import pstats
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import load_sample, machine_info, profile_rows, write_results
from bench.peers import open_lmdb
from mqstore import MessageStore, StoreConfig
from mqstore.commitlog.checkpoint import CheckpointFile
from mqstore.commitlog.record import HEADER_SIZE

TOPIC = "recovery"
PARTITIONS = 8
BATCH_BODIES = 256  # bodies per put_batch_arrays call
PREAMBLE_BYTES = 1 << 20  # written and closed before the run: a checkpoint that is not 0
PEER_BATCH = 1_000  # values per peer transaction (bench/peers.py's batch)
TARGET_S = 0.3  # the target for the reopen after SIGKILL of 1 GiB
MANY_QUEUES_BODY_BYTES = 100
#: Rows the reopen profile keeps (by own time).
PROFILE_ROWS = 14
PROFILE_TEXT_ROWS = 8  # of those, in a missed target row's "profile" string


def _config(frozen_checkpoint: bool) -> StoreConfig:
    if not frozen_checkpoint:
        return StoreConfig(flush_mode="async")
    return StoreConfig(
        flush_mode="async",
        checkpoint_interval_ms=600_000,  # the maxima: no checkpoint during the run
        consumequeue_flush_interval_ms=3_600_000,
    )


def _bodies(body_bytes: int, total_bytes: int) -> tuple[list[bytes], int]:
    """One batch of bodies and how many batches make ``total_bytes`` of CommitLog
    records (header, topic and body each)."""
    batch = [b"r" * body_bytes] * BATCH_BODIES
    record_bytes = HEADER_SIZE + len(TOPIC) + body_bytes
    return batch, max(1, total_bytes // (record_bytes * BATCH_BODIES))


def writer(directory: str, mib: int, body_bytes: int) -> None:
    """Child: the mqstore case (see the module); waits to be SIGKILLed."""
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    store = MessageStore.open(directory, _config(frozen_checkpoint=False))
    batch, batches = _bodies(body_bytes, PREAMBLE_BYTES)
    for i in range(batches):
        store.put_batch_arrays(TOPIC, i % PARTITIONS, batch)
    preamble = batches * len(batch)
    store.close()
    store = MessageStore.open(directory, _config(frozen_checkpoint=True))
    start = store.commitlog.write_position
    batch, batches = _bodies(body_bytes, mib << 20)
    for i in range(batches):
        store.put_batch_arrays(TOPIC, i % PARTITIONS, batch)
    print(f"ready {preamble + batches * len(batch)} {start}", flush=True)
    time.sleep(600)


def queue_writer(directory: str, queues: int, per_queue: int) -> None:
    """Child of the many-queues case: ``per_queue`` rounds of one 100 B ``put`` to each
    of ``queues`` queues, after a preamble as ``writer``'s; waits to be SIGKILLed."""
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    store = MessageStore.open(directory, _config(frozen_checkpoint=False))
    store.put(TOPIC, 0, b"preamble")
    store.close()
    store = MessageStore.open(directory, _config(frozen_checkpoint=True))
    start = store.commitlog.write_position
    body = b"q" * MANY_QUEUES_BODY_BYTES
    for _ in range(per_queue):
        for queue_id in range(queues):
            store.put(TOPIC, queue_id, body)
    print(f"ready {1 + queues * per_queue} {start}", flush=True)
    time.sleep(600)


def run_many_queues(root: str, queues: int, per_queue: int) -> dict[str, Any]:
    """The many-queues case: one SIGKILLed writer; its store reopened as it is (the
    queues kept their units: the re-dispatch compares them) and, in a copy, with the
    ConsumeQueue and index directories removed (the re-dispatch writes every unit)."""
    directory = tempfile.mkdtemp(dir=root)
    rebuilt = directory + "-rebuilt"
    try:
        args = ["--queue-writer", directory, str(queues), str(per_queue)]
        messages, start, write_s = _crash(args)
        checkpoint = CheckpointFile(directory, read_only=True).load()
        assert checkpoint is not None and checkpoint.dispatched_position <= start
        shutil.copytree(directory, rebuilt)
        for name in ("consumequeue", "index"):
            shutil.rmtree(os.path.join(rebuilt, name))
        figures: dict[str, Any] = {"messages": messages, "write_s": write_s}
        for key, path in (("kept_reopen_s", directory), ("rebuilt_reopen_s", rebuilt)):
            started = time.perf_counter()
            store = MessageStore.open(path, _config(frozen_checkpoint=False))
            figures[key] = time.perf_counter() - started
            try:
                recovered = sum(store.max_offset(TOPIC, q) for q in range(queues))
                if recovered != messages:
                    raise AssertionError(f"{key}: recovered {recovered} of {messages}")
            finally:
                store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(rebuilt, ignore_errors=True)
    return figures


def many_queues_main(argv: list[str], queues: int, per_queue: int, rounds: int, out: str
                     ) -> int:  # fmt: skip
    """``--many-queues Q N``: only the many-queues case, ``rounds`` times."""
    root = tempfile.mkdtemp(prefix="mqstore-recovery-")
    runs, load = [], [load_sample()]
    try:
        for round_ in range(rounds):
            runs.append(run_many_queues(root, queues, per_queue))
            shown = ", ".join(f"{k} {v:.4g}" for k, v in runs[-1].items())
            print(f"[{round_ + 1}] {queues} queues x {per_queue}: {shown}", flush=True)
            load.append(load_sample())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "command": " ".join(["python", "-m", "bench.recovery", *argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "load": load,
        "queues": queues,
        "messages_per_queue": per_queue,
        "body_bytes": MANY_QUEUES_BODY_BYTES,
        **{key: _median(runs, key) for key in ("kept_reopen_s", "rebuilt_reopen_s")},
        "runs": runs,
        "targets": [],
    }
    for key in ("kept_reopen_s", "rebuilt_reopen_s"):
        print(f"{key}: {result[key]['median']:.3f} s {result[key]['range']}")
    write_results(out, result)
    return 0


def peer_writer(kind: str, directory: str, mib: int, body_bytes: int) -> None:
    """Child: the same bytes of values into lmdb or sqlite; waits to be SIGKILLed."""
    value = b"r" * body_bytes
    count = (mib << 20) // body_bytes
    if kind == "lmdb":
        env = open_lmdb(os.path.join(directory, "lmdb"), sync=False)
        for first in range(0, count, PEER_BATCH):
            rows = range(first, min(count, first + PEER_BATCH))
            with env.begin(write=True) as txn:
                txn.cursor().putmulti([(i.to_bytes(8, "big"), value) for i in rows], append=True)
    else:
        connection = sqlite3.connect(os.path.join(directory, "q.db"), isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        for first in range(0, count, PEER_BATCH):
            connection.execute("BEGIN")
            rows = [(value,)] * (min(count, first + PEER_BATCH) - first)
            connection.executemany("INSERT INTO q (body) VALUES (?)", rows)
            connection.execute("COMMIT")
    print(f"ready {count} 0", flush=True)
    time.sleep(600)


def _crash(args: list[str]) -> tuple[int, int, float]:
    """Run a writer child to "ready", SIGKILL it; (messages, start, write seconds)."""
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.recovery", *args], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    line = child.stdout.readline().split()
    write_s = time.perf_counter() - started
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    if len(line) != 3 or line[0] != "ready":
        raise RuntimeError(f"recovery writer failed: {line!r}")
    return int(line[1]), int(line[2]), write_s


def _recovered(store: MessageStore) -> int:
    return sum(store.max_offset(TOPIC, p) for p in range(PARTITIONS))


def run_mqstore(root: str, mib: int, body_bytes: int, profile: cProfile.Profile | None = None
                ) -> dict[str, Any]:  # fmt: skip
    directory = tempfile.mkdtemp(dir=root)
    try:
        messages, start, write_s = _crash(["--writer", directory, str(mib), str(body_bytes)])
        checkpoint = CheckpointFile(directory, read_only=True).load()
        assert checkpoint is not None, "the preamble's close wrote a checkpoint"
        # The whole run was written since the last checkpoint:
        assert 0 < checkpoint.flushed_position <= start, (checkpoint, start)
        assert 0 < checkpoint.dispatched_position <= start, (checkpoint, start)
        log_bytes = sum(
            os.path.getsize(os.path.join(directory, "commitlog", name))
            for name in os.listdir(os.path.join(directory, "commitlog"))
        )
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        store = MessageStore.open(directory, _config(frozen_checkpoint=False))
        if profile is not None:
            profile.disable()
        crash_s = time.perf_counter() - started
        try:
            assert store.recovered_from_crash
            end = store.commitlog.write_position
            recovered = _recovered(store)
            if recovered != messages:
                raise AssertionError(f"recovered {recovered} of {messages} messages")
        finally:
            store.close()
        started = time.perf_counter()
        store = MessageStore.open(directory, _config(frozen_checkpoint=False))
        clean_s = time.perf_counter() - started
        try:
            assert not store.recovered_from_crash
            assert _recovered(store) == messages
        finally:
            store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"crash_reopen_s": crash_s, "clean_reopen_s": clean_s, "messages": messages,
            "since_checkpoint_bytes": end - checkpoint.dispatched_position,
            "log_files_bytes": log_bytes, "write_s": write_s}  # fmt: skip


def run_peer(root: str, kind: str, mib: int, body_bytes: int) -> dict[str, Any]:
    directory = tempfile.mkdtemp(dir=root)
    try:
        messages, _, write_s = _crash(["--peer-writer", kind, directory, str(mib), str(body_bytes)])
        started = time.perf_counter()
        if kind == "lmdb":
            env = open_lmdb(os.path.join(directory, "lmdb"), sync=False)
            with env.begin() as txn:
                recovered = txn.stat()["entries"]
            reopen_s = time.perf_counter() - started
            env.close()
        else:
            connection = sqlite3.connect(os.path.join(directory, "q.db"), isolation_level=None)
            (recovered,) = connection.execute("SELECT max(id) FROM q").fetchone()
            reopen_s = time.perf_counter() - started
            connection.close()
        if recovered != messages:
            raise AssertionError(f"{kind}: recovered {recovered} of {messages} values")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"crash_reopen_s": reopen_s, "messages": messages, "write_s": write_s}


def _median(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [run[key] for run in runs]
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def _profile_rows(profile: cProfile.Profile) -> list[dict[str, Any]]:
    total = pstats.Stats(profile, stream=io.StringIO()).total_tt  # type: ignore[attr-defined]
    return [{"total_s": round(total, 4)}, *profile_rows(profile, PROFILE_ROWS)]


def _profile_text(profiled: dict[str, Any]) -> str:
    """The top of one profiled reopen, on one line: its time, then own time per row."""
    rows = profiled["top_by_own_time"][1 : PROFILE_TEXT_ROWS + 1]
    parts = [f"{row['function']} {row['own_s']:.3f} s ({row['calls']} calls)" for row in rows]
    return f"cProfile of one reopen, {profiled['reopen_s']:.3f} s; by own time: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--writer"]:
        writer(argv[1], int(argv[2]), int(argv[3]))
        return 0
    if argv[:1] == ["--peer-writer"]:
        peer_writer(argv[1], argv[2], int(argv[3]), int(argv[4]))
        return 0
    if argv[:1] == ["--queue-writer"]:
        queue_writer(argv[1], int(argv[2]), int(argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--peer-mib", type=int, default=None, help="default: --mib")
    parser.add_argument("--body-bytes", type=int, nargs="+", default=[1024, 100])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--many-queues", type=int, nargs=2, metavar=("QUEUES", "PER_QUEUE"),
                        help="run only the many-queues case")  # fmt: skip
    parser.add_argument("--out", default=None, help="default bench/results/recovery.json "
                        "(recovery_queues.json with --many-queues)")  # fmt: skip
    args = parser.parse_args(argv)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    if args.many_queues:
        out = args.out or "bench/results/recovery_queues.json"
        return many_queues_main(argv, *args.many_queues, args.rounds, out)
    args.out = args.out or "bench/results/recovery.json"
    peer_mib = args.mib if args.peer_mib is None else args.peer_mib
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    root = tempfile.mkdtemp(prefix="mqstore-recovery-")
    runs: dict[str, list[dict[str, Any]]] = {}
    load = [load_sample()]
    try:
        for round_ in range(args.rounds):
            for body in args.body_bytes:
                cases = [("mqstore", lambda b=body: run_mqstore(root, args.mib, b))]
                if not args.no_peers:
                    cases += [(kind, lambda k=kind, b=body: run_peer(root, k, peer_mib, b))
                              for kind in ("lmdb", "sqlite")]  # fmt: skip
                for name, run in cases:
                    figures = run()
                    runs.setdefault(f"{name}/{body}", []).append(figures)
                    shown = ", ".join(f"{k} {v:.4g}" for k, v in figures.items())
                    print(f"[{round_ + 1}] {name:8s} {body:5d} B: {shown}", flush=True)
            load.append(load_sample())
        profiles: dict[int, tuple[cProfile.Profile, dict[str, Any]]] = {}
        for body in args.body_bytes:  # one more crash of each body size, under cProfile
            profile = cProfile.Profile()
            profiles[body] = (profile, run_mqstore(root, args.mib, body, profile))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {
        "command": " ".join(["python", "-m", "bench.recovery", *argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "load": load,
        "mib": args.mib,
        "peer_mib": peer_mib,
        "partitions": PARTITIONS,
        "rounds": args.rounds,
        "cases": {},
        "profile": {
            str(body): {
                "reopen_s": profiled["crash_reopen_s"],
                "top_by_own_time": _profile_rows(profile),
            }
            for body, (profile, profiled) in profiles.items()
        },
        "targets": [],
    }
    for name, case_runs in runs.items():
        keys = [k for k in ("crash_reopen_s", "clean_reopen_s", "write_s") if k in case_runs[0]]
        result["cases"][name] = {
            "messages": case_runs[0]["messages"],
            **{key: _median(case_runs, key) for key in keys},
            "runs": case_runs,
        }
    for body in args.body_bytes:
        crash = result["cases"][f"mqstore/{body}"]["crash_reopen_s"]["median"]
        peer = result["cases"].get(f"lmdb/{body}")
        peer_value = None if peer is None else peer["crash_reopen_s"]["median"]
        result["targets"].append({
            "row": f"reopen after SIGKILL, {args.mib} MiB of {body} B messages since the "
                   "last checkpoint",
            "value": crash, "unit": "s", "peer": None if peer is None else "lmdb",
            "peer_value": peer_value,
            "ratio": None if peer_value is None else crash / peer_value,
            "target": f"<= {TARGET_S} s", "met": crash <= TARGET_S,
        })  # fmt: skip
        if crash > TARGET_S:  # where a missed row's time goes
            result["targets"][-1]["profile"] = _profile_text(result["profile"][str(body)])
    for name, case in result["cases"].items():
        parts = [f"{key} {case[key]['median']:.4f} s [{case[key]['range'][0]:.4f} .. "
                 f"{case[key]['range'][1]:.4f}]" for key in ("crash_reopen_s", "clean_reopen_s")
                 if key in case]  # fmt: skip
        print(f"{name:14s} {case['messages']:>10,} messages: {'; '.join(parts)}")
    for body, profiled_body in result["profile"].items():
        print(f"{body} B: {_profile_text(profiled_body)}")
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
