"""Peers on one produce/consume workload, at matched durability, each with its best
batch API: sqlite3 (WAL), lmdb, persist-queue, and mqstore itself (one partition),
through its own API (MessageStore) and through the Kafka-style adapter.

Workload: 100 B values, one process, one thread, a fresh store in a temp dir.
- single: one message per commit (per call), over a time window;
- batch: 1,000 messages per commit (sqlite executemany in one transaction, lmdb
  one write transaction with cursor.putmulti(append=True), persist-queue put() x 1,000
  then task_done() with auto_commit=False, mqstore MessageStore.put_batch_arrays, or
  KafkaProducer.send_batch for the "-kafka" rows);
- consume: read everything back in order (sqlite fetchmany(1000), lmdb cursor scan,
  persist-queue get() with one task_done() per 1,000, mqstore MessageStore.get of
  1,000, or KafkaConsumer.poll for the "-kafka" rows).
- single for mqstore: MessageStore.put, or KafkaProducer.send for the "-kafka" rows.

Durability classes (a commit returns when...):
- "no fsync per commit": survives a process crash, may lose the tail on power loss:
  sqlite WAL synchronous=NORMAL, lmdb sync=False, mqstore flush_mode=async;
- "fsync per commit": survives power loss: sqlite WAL synchronous=FULL, lmdb sync=True,
  persist-queue SQLiteQueue (sqlite defaults: rollback journal, synchronous=FULL),
  mqstore flush_mode=sync.
"""

from __future__ import annotations

import cProfile
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from typing import Any

import lmdb
import persistqueue

from mqstore import KafkaConsumer, KafkaProducer, MessageStore, StoreConfig
from mqstore.kafka import TopicPartition

VALUE = b"p" * 100
BATCH = 1000  # messages per commit in the batch case: the peers note's figure
MAX_SINGLE = 200_000  # caps per window, so a fast peer ends on the cap, not the clock
MAX_BATCHES = 400
LMDB_MAP_BYTES = 4 << 30  # sparse; bounds the fastest peer's 0.5-2 s of writes

PEERS: dict[str, dict[str, str]] = {
    "mqstore-async": {"engine": "mqstore", "durability": "no fsync per commit",
                      "setting": "flush_mode=async (flush every 500 ms); MessageStore API"},
    "mqstore-async-kafka": {"engine": "mqstore", "durability": "no fsync per commit",
                            "setting": "flush_mode=async; KafkaProducer/KafkaConsumer"},
    "sqlite-wal-normal": {"engine": "sqlite3", "durability": "no fsync per commit",
                          "setting": "journal_mode=WAL, synchronous=NORMAL"},
    "lmdb-nosync": {"engine": "lmdb", "durability": "no fsync per commit",
                    "setting": "sync=False"},
    "mqstore-sync": {"engine": "mqstore", "durability": "fsync per commit",
                     "setting": "flush_mode=sync (group commit); MessageStore API"},
    "mqstore-sync-kafka": {"engine": "mqstore", "durability": "fsync per commit",
                           "setting": "flush_mode=sync; KafkaProducer/KafkaConsumer"},
    "sqlite-wal-full": {"engine": "sqlite3", "durability": "fsync per commit",
                        "setting": "journal_mode=WAL, synchronous=FULL"},
    "lmdb-sync": {"engine": "lmdb", "durability": "fsync per commit", "setting": "sync=True"},
    "persist-queue": {"engine": "persist-queue", "durability": "fsync per commit",
                      "setting": "SQLiteQueue, sqlite defaults (DELETE journal, "
                                 "synchronous=FULL); no bulk put"},
}  # fmt: skip


def describe(name: str) -> dict[str, str]:
    return {"name": name, **PEERS[name]}


def _timed(
    window_s: float, cap: int, step: Callable[[int], None], check_every: int = 16
) -> tuple[float, int]:
    """Call step(i) until the window or cap; return (calls per second, calls).

    The clock is read every ``check_every`` calls (16 for single messages, where
    perf_counter would show in the figure; 1 for batches, which may take seconds)."""
    calls = 0
    started = time.perf_counter()
    deadline = started + window_s
    while calls < cap:
        step(calls)
        calls += 1
        if calls % check_every == 0 and time.perf_counter() >= deadline:
            break
    return calls / (time.perf_counter() - started), calls


# ---------------------------------------------------------------------- sqlite


def _sqlite(directory: str, name: str, synchronous: str) -> sqlite3.Connection:
    connection = sqlite3.connect(f"{directory}/{name}.db", isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute(f"PRAGMA synchronous={synchronous}")
    connection.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    return connection


def run_sqlite(directory: str, window_s: float, synchronous: str) -> dict[str, float]:
    single = _sqlite(directory, "single", synchronous)
    rate, _ = _timed(
        window_s, MAX_SINGLE, lambda i: single.execute("INSERT INTO q (body) VALUES (?)", (VALUE,))
    )
    single.close()
    batch = _sqlite(directory, "batch", synchronous)
    rows = [(VALUE,)] * BATCH

    def write_batch(_: int) -> None:
        batch.execute("BEGIN")
        batch.executemany("INSERT INTO q (body) VALUES (?)", rows)
        batch.execute("COMMIT")

    batch_rate, batches = _timed(window_s, MAX_BATCHES, write_batch, 1)
    started = time.perf_counter()
    cursor = batch.execute("SELECT id, body FROM q ORDER BY id")
    got = 0
    while chunk := cursor.fetchmany(BATCH):
        got += len(chunk)
    read_s = time.perf_counter() - started
    assert got == batches * BATCH, (got, batches)
    batch.close()
    return {"single_msg_per_s": rate, "batch_msg_per_s": batch_rate * BATCH,
            "consume_msg_per_s": got / read_s}  # fmt: skip


# ---------------------------------------------------------------------- lmdb


def open_lmdb(path: str, sync: bool, writemap: bool = False) -> lmdb.Environment:
    """An lmdb environment as the peers use it: LMDB_MAP_BYTES of map, ``sync`` per
    commit (``writemap``: writes go through a shared writable mapping, lmdb's fastest
    per-commit form)."""
    return lmdb.open(path, map_size=LMDB_MAP_BYTES, sync=sync, writemap=writemap)


def lmdb_put_batch(env: lmdb.Environment, first: int, count: int) -> None:
    """One write transaction of ``count`` VALUEs under keys ``first``.. (8-byte
    big-endian, so that key order is offset order and ``append=True`` holds)."""
    with env.begin(write=True) as txn:
        txn.cursor().putmulti(
            [((first + j).to_bytes(8, "big"), VALUE) for j in range(count)], append=True
        )


def lmdb_scan(env: lmdb.Environment) -> int:
    """Read everything back in key order with a cursor; the number of values read."""
    got = 0
    with env.begin() as txn:
        for _key, _value in txn.cursor():
            got += 1
    return got


def lmdb_put_one(env: lmdb.Environment) -> Callable[[int], None]:
    """lmdb's per-message form: one write transaction (one commit) per message."""

    def put_one(i: int) -> None:
        with env.begin(write=True) as txn:
            txn.put(i.to_bytes(8, "big"), VALUE, append=True)

    return put_one


def run_lmdb(directory: str, window_s: float, sync: bool) -> dict[str, float]:
    single = open_lmdb(f"{directory}/single", sync)
    rate, _ = _timed(window_s, MAX_SINGLE, lmdb_put_one(single))
    single.close()
    env = open_lmdb(f"{directory}/batch", sync)
    batch_rate, batches = _timed(
        window_s, MAX_BATCHES, lambda b: lmdb_put_batch(env, b * BATCH, BATCH), 1
    )
    started = time.perf_counter()
    got = lmdb_scan(env)
    read_s = time.perf_counter() - started
    assert got == batches * BATCH, (got, batches)
    env.close()
    return {"single_msg_per_s": rate, "batch_msg_per_s": batch_rate * BATCH,
            "consume_msg_per_s": got / read_s}  # fmt: skip


# ---------------------------------------------------------------------- persist-queue


def run_persist_queue(directory: str, window_s: float) -> dict[str, float]:
    one_by_one = persistqueue.SQLiteQueue(f"{directory}/single", auto_commit=True)
    rate, _ = _timed(window_s, MAX_SINGLE, lambda i: one_by_one.put(VALUE))
    queue = persistqueue.SQLiteQueue(f"{directory}/batch", auto_commit=False)

    def put_batch(_: int) -> None:
        for _j in range(BATCH):
            queue.put(VALUE)
        queue.task_done()  # commits the transaction

    batch_rate, batches = _timed(window_s, MAX_BATCHES, put_batch, 1)
    started = time.perf_counter()
    got = 0
    for _ in range(batches * BATCH):
        queue.get(block=False)
        got += 1
        if got % BATCH == 0:
            queue.task_done()
    read_s = time.perf_counter() - started
    return {"single_msg_per_s": rate, "batch_msg_per_s": batch_rate * BATCH,
            "consume_msg_per_s": got / read_s}  # fmt: skip


# ---------------------------------------------------------------------- mqstore


def _mqstore(directory: str, flush_mode: str) -> MessageStore:
    store = MessageStore.open(
        directory, StoreConfig(commitlog_file_size_bytes=64 << 20, prewarm=False,
                               flush_mode=flush_mode)
    )  # fmt: skip
    store.create_topic("single", 1)
    store.create_topic("batch", 1)
    return store


def run_mqstore(directory: str, window_s: float, flush_mode: str, api: str) -> dict[str, float]:
    store = _mqstore(directory, flush_mode)
    values = [VALUE] * BATCH
    try:
        if api == "store":
            put = store.put
            rate, _ = _timed(window_s, MAX_SINGLE, lambda i: put("single", 0, VALUE))
            put_batch = store.put_batch_arrays
            batch_rate, batches = _timed(
                window_s, MAX_BATCHES, lambda i: put_batch("batch", 0, values), 1
            )
            got = 0
            started = time.perf_counter()
            while got < batches * BATCH:
                got += len(store.get("batch", 0, got, BATCH))
            read_s = time.perf_counter() - started
        else:
            producer = KafkaProducer(store)
            send = producer.send
            rate, _ = _timed(window_s, MAX_SINGLE, lambda i: send("single", VALUE, partition=0))
            batch_rate, batches = _timed(
                window_s, MAX_BATCHES, lambda i: producer.send_batch("batch", 0, values), 1
            )
            consumer = KafkaConsumer(store=store, auto_offset_reset="earliest",
                                     enable_auto_commit=False)  # fmt: skip
            consumer.assign([TopicPartition("batch", 0)])
            consumer.seek_to_beginning()
            got = 0
            started = time.perf_counter()
            while got < batches * BATCH:
                for records in consumer.poll(timeout_ms=100, max_records=BATCH).values():
                    got += len(records)
            read_s = time.perf_counter() - started
            consumer.close()
    finally:
        store.close()
    return {"single_msg_per_s": rate, "batch_msg_per_s": batch_rate * BATCH,
            "consume_msg_per_s": got / read_s}  # fmt: skip


def profile_mqstore(root: str, case: str, profile: cProfile.Profile) -> None:
    """Profile mqstore's async single or batch produce (MessageStore API) for one second."""
    directory = tempfile.mkdtemp(dir=root)
    store = _mqstore(directory, "async")
    try:
        values = [VALUE] * BATCH
        profile.enable()
        if case == "single":
            _timed(1.0, MAX_SINGLE, lambda i: store.put("single", 0, VALUE))
        else:
            _timed(1.0, MAX_BATCHES, lambda i: store.put_batch_arrays("batch", 0, values), 1)
        profile.disable()
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


RUNNERS: dict[str, Callable[[str, float], dict[str, float]]] = {
    "mqstore-async": lambda d, w: run_mqstore(d, w, "async", "store"),
    "mqstore-async-kafka": lambda d, w: run_mqstore(d, w, "async", "kafka"),
    "sqlite-wal-normal": lambda d, w: run_sqlite(d, w, "NORMAL"),
    "lmdb-nosync": lambda d, w: run_lmdb(d, w, False),
    "mqstore-sync": lambda d, w: run_mqstore(d, w, "sync", "store"),
    "mqstore-sync-kafka": lambda d, w: run_mqstore(d, w, "sync", "kafka"),
    "sqlite-wal-full": lambda d, w: run_sqlite(d, w, "FULL"),
    "lmdb-sync": lambda d, w: run_lmdb(d, w, True),
    "persist-queue": run_persist_queue,
}
assert set(RUNNERS) == set(PEERS)


def run_all(root: str, window_s: float) -> dict[str, dict[str, Any]]:
    """Every peer once, in a fixed order (mqstore next to each peer class)."""
    out = {}
    for name, runner in RUNNERS.items():
        directory = tempfile.mkdtemp(dir=root)
        try:
            out[name] = runner(directory, window_s)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        print(f"    peer {name:18s} single {out[name]['single_msg_per_s']:>10,.0f}/s batch "
              f"{out[name]['batch_msg_per_s']:>10,.0f}/s consume "
              f"{out[name]['consume_msg_per_s']:>10,.0f}/s", flush=True)  # fmt: skip
    return out
