"""Crash harness: SIGKILL a store's writer at random points, reopen, check every ack.

    python -m bench.crash_harness --iterations 20 [--seed 1] [--path DIR] [--json FILE]

Each iteration starts a child process that opens the store (flush mode alternating
sync / async between iterations) and runs a mixed workload through the public API:
KafkaProducer.send (one record) and send_batch, MessageStore.put with keys on a
second topic, a KafkaConsumer of group ``g`` that polls and commits, and
run_retention over small CommitLog files (retention_bytes), so files roll and are
deleted while the child is killed. The child reports every acknowledged message
``A topic partition offset crc32`` and every commit ``C topic partition offset`` on
a pipe the moment the call returns. The parent SIGKILLs it after a seeded random
delay (sometimes before its store is even open, i.e. during recovery), reopens the
store itself and checks:

- every acknowledged message at or above the log start is present at its offset
  with the right content (crc32 of the value); below the log start only retention
  may have removed it. Both flush modes must lose nothing on a process kill: the
  page cache survives the process. Only a power loss could lose an async store's
  unflushed tail: bench.powerloss simulates that, with this workload and verifier;
- no message read back is corrupt: every value carries its own crc32, and every
  message of every queue is read with ``get`` from the log start to the end;
- ConsumeQueues are dense: offsets min..max-1 each appear exactly once;
- committed offsets are <= the partition's end and >= every offset the child
  reported as committed before.

Figures (iterations, acked messages, checks, losses, corrupt reads, gaps and
duplicates, ...) are printed and optionally saved as JSON. Exit status 1 if any
check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from typing import Any

import attrs

from mqstore import (
    CorruptDataError,
    KafkaConsumer,
    KafkaProducer,
    MessageStore,
    StoreConfig,
    StoreError,
    TopicPartition,
    UnknownTopicError,
)

__all__ = ["CrashFigures", "Harness", "run"]

KAFKA_TOPIC = "crash"
KAFKA_PARTITIONS = 3
RAW_TOPIC = "raw"  # put() with keys, implicitly created
RAW_QUEUES = 2
GROUP = "g"
FILE_SIZE_BYTES = 64 * 1024  # small files: a few hundred records each, so files roll
RETENTION_FILES = 4  # retention_bytes keeps about this many files
VALUE_BYTES_MAX = 600
KILL_DELAY_S_MAX = 0.4  # how long after "ready" the child may live
EARLY_KILL_PERCENT = 10  # share of kills aimed before the child is ready (during open)
READ_CHUNK = 1_000  # messages per get() while verifying
QUERY_SAMPLES = 5  # keys looked up per iteration
# <seq u32><crc32 of payload u32> then the payload: every value verifies itself.
VALUE_HEADER = struct.Struct(">II")


def config_for(flush_mode: str, overrides: dict[str, Any] | None = None) -> StoreConfig:
    """The workload's store settings; ``overrides`` replaces some (bench.powerloss)."""
    settings: dict[str, Any] = dict(
        commitlog_file_size_bytes=FILE_SIZE_BYTES,
        consumequeue_units_per_file=256,
        index_slot_count=256,
        index_entry_count=2048,
        prewarm=False,
        flush_mode=flush_mode,
        checkpoint_interval_ms=50,
        retention_bytes=RETENTION_FILES * FILE_SIZE_BYTES,
        retention_check_interval_ms=200,
    )
    settings.update(overrides or {})
    return StoreConfig(**settings)


def make_value(rng: random.Random, seq: int) -> bytes:
    payload = rng.randbytes(rng.randint(0, VALUE_BYTES_MAX))
    return VALUE_HEADER.pack(seq, zlib.crc32(payload)) + payload


def value_is_intact(value: bytes) -> bool:
    if len(value) < VALUE_HEADER.size:
        return False
    _, crc = VALUE_HEADER.unpack_from(value)
    return zlib.crc32(value[VALUE_HEADER.size :]) == crc


# ---------------------------------------------------------------------- child


def child_main(
    path: str, flush_mode: str, seed: int, fd: int, overrides: dict[str, Any] | None = None
) -> None:
    """The workload. Never returns normally: the parent kills it."""
    rng = random.Random(seed)

    def report(line: str) -> None:
        os.write(fd, line.encode() + b"\n")  # unbuffered: nothing waits in user space

    store = MessageStore.open(path, config_for(flush_mode, overrides))
    if KAFKA_TOPIC not in store.list_topics():
        store.create_topic(KAFKA_TOPIC, partitions=KAFKA_PARTITIONS)
    producer = KafkaProducer(store)
    consumer = KafkaConsumer(
        KAFKA_TOPIC,
        store=store,
        group_id=GROUP,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    report("R")
    if flush_mode == "async":  # the durable mark the power-loss check holds losses to
        threading.Thread(target=_report_flushes, args=(store, report), daemon=True).start()
    seq = 0
    while True:
        seq += 1
        action = rng.random()
        if action < 0.45:
            value = make_value(rng, seq)
            report(f"B {store.commitlog.write_position}")
            meta = producer.send(KAFKA_TOPIC, value, partition=rng.randrange(3)).get()
            report(f"A {KAFKA_TOPIC} {meta.partition} {meta.offset} {zlib.crc32(value)}")
            report(f"W {store.commitlog.write_position}")
        elif action < 0.60:
            values = [make_value(rng, seq) for _ in range(rng.randint(2, 20))]
            report(f"B {store.commitlog.write_position}")
            metas = producer.send_batch(KAFKA_TOPIC, rng.randrange(3), values)
            report(
                "\n".join(
                    f"A {KAFKA_TOPIC} {m.partition} {m.offset} {zlib.crc32(v)}"
                    for m, v in zip(metas, values, strict=True)
                )
            )
            report(f"W {store.commitlog.write_position}")
        elif action < 0.85:
            value = make_value(rng, seq)
            queue_id = rng.randrange(RAW_QUEUES)
            report(f"B {store.commitlog.write_position}")
            result = store.put(RAW_TOPIC, queue_id, value, keys=[f"k{seq}-{seed}"])
            report(
                f"A {RAW_TOPIC} {queue_id} {result.queue_offset} {zlib.crc32(value)} k{seq}-{seed}"
            )
            report(f"W {store.commitlog.write_position}")
        elif action < 0.97:
            batch = consumer.poll(timeout_ms=0, max_records=200)
            for records in batch.values():
                for record in records:
                    if not value_is_intact(record.value):
                        report(f"X {record.topic} {record.partition} {record.offset}")
            if batch:
                positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
                consumer.commit({tp: offset for tp, offset in positions.items()})
                for tp, offset in positions.items():
                    report(f"C {tp.topic} {tp.partition} {offset}")
        else:
            store.run_retention()


def _report_flushes(store: MessageStore, report: Any) -> None:
    """ "F <position>" each time the CommitLog's durable prefix grows (async flush).

    With "B <write position>" before each append and "W <write position>" after its
    ack (bounds of where the acked records lie), the power-loss check knows which acks
    a completed flush covered."""
    last = -1
    while True:
        flushed = store.commitlog.flushed_position
        if flushed > last:
            report(f"F {flushed}")
            last = flushed
        time.sleep(0.002)


# ---------------------------------------------------------------------- parent


@attrs.define
class CrashFigures:
    iterations: int = 0
    kills_before_ready: int = 0
    acked_messages: int = 0
    acked_checks: int = 0  # acked messages verified, summed over restarts
    messages_read: int = 0
    losses: int = 0
    corrupt_reads: int = 0
    wrong_content: int = 0
    gaps: int = 0
    duplicates: int = 0
    retained_away: int = 0  # acked messages legitimately removed by retention
    commits_reported: int = 0
    commit_violations: int = 0
    key_queries: int = 0
    key_misses: int = 0
    child_failures: int = 0
    reopen_ms_max: float = 0.0
    problems: list[str] = attrs.field(factory=list)

    @property
    def failed(self) -> bool:
        return bool(
            self.losses
            or self.corrupt_reads
            or self.wrong_content
            or self.gaps
            or self.duplicates
            or self.commit_violations
            or self.key_misses
            or self.child_failures
        )

    def summary(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["problems"] = self.problems[:20]
        return data


class Harness:
    """Owns the store directory, the acknowledged state and the figures."""

    def __init__(self, path: str, seed: int) -> None:
        self.path = path
        self.seed = seed
        self.rng = random.Random(seed)
        self.figures = CrashFigures()
        # (topic, queue) -> {offset: crc32}; pruned below the log start
        self.acked: dict[tuple[str, int], dict[int, int]] = {}
        self.keys: dict[str, tuple[str, int, int]] = {}  # key -> (topic, queue, offset)
        self.committed: dict[tuple[str, int], int] = {}
        # Hooks for bench.powerloss: store settings, kill delay, when data arrived.
        self.config_overrides: dict[str, Any] = {}
        self.kill_delay_s_max = KILL_DELAY_S_MAX
        self.received: list[tuple[int, float]] = []  # (buffer length, monotonic time)
        self.kill_time = 0.0
        self.child_module = "bench.crash_harness"  # its main() takes --child
        self.key_samples = QUERY_SAMPLES  # keys looked up per check; 0: every live key

    def _problem(self, text: str) -> None:
        if len(self.figures.problems) < 1_000:
            self.figures.problems.append(text)

    def run_iteration(self, iteration: int) -> None:
        flush_mode = "sync" if iteration % 2 == 0 else "async"
        self._run_child(flush_mode, self.seed * 1_000_003 + iteration)
        self.figures.iterations += 1
        self.verify()

    def _run_child(self, flush_mode: str, child_seed: int) -> None:
        read_fd, write_fd = os.pipe()
        command = [sys.executable, "-m", self.child_module, "--child", self.path,
                   flush_mode, str(child_seed), str(write_fd),
                   json.dumps(self.config_overrides)]  # fmt: skip
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with tempfile.TemporaryFile() as stderr:
            child = subprocess.Popen(command, pass_fds=(write_fd,), stderr=stderr, cwd=root)
            os.close(write_fd)
            early = self.rng.randrange(100) < EARLY_KILL_PERCENT
            delay_s = self.rng.uniform(0, self.kill_delay_s_max if not early else 0.6)
            buffer = bytearray()
            ready = self._pump(read_fd, buffer, child, delay_s, early)
            if not ready:
                self.figures.kills_before_ready += 1
            self.kill_time = time.monotonic()
            child.send_signal(signal.SIGKILL)
            child.wait()
            while chunk := os.read(read_fd, 1 << 16):
                buffer += chunk
            os.close(read_fd)
            if child.returncode != -signal.SIGKILL:
                stderr.seek(0)
                self.figures.child_failures += 1
                self._problem(f"child exited {child.returncode}: {stderr.read()[-2000:]!r}")
        self._absorb(bytes(buffer))

    def _pump(
        self,
        fd: int,
        buffer: bytearray,
        child: subprocess.Popen[bytes],
        delay_s: float,
        early: bool,
    ) -> bool:
        """Drain the pipe until the kill time; returns whether the child got ready.

        The kill time counts from "ready", or from the start for an early kill."""
        selector = selectors.DefaultSelector()
        selector.register(fd, selectors.EVENT_READ)
        self.received = []
        deadline = time.monotonic() + (delay_s if early else 30.0)
        ready = False
        while time.monotonic() < deadline and child.poll() is None:
            if selector.select(timeout=max(0.0, deadline - time.monotonic())):
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                buffer += chunk
                self.received.append((len(buffer), time.monotonic()))
                if not ready and buffer.startswith(b"R\n"):
                    ready = True
                    if not early:
                        deadline = time.monotonic() + delay_s
        selector.close()
        return ready

    def _absorb(self, data: bytes) -> None:
        for line in data.decode().splitlines():
            parts = line.split()
            if not parts or parts[0] == "R":
                continue
            if parts[0] == "A":
                topic, queue, offset, crc = parts[1], int(parts[2]), int(parts[3]), int(parts[4])
                self.acked.setdefault((topic, queue), {})[offset] = crc
                self.figures.acked_messages += 1
                if len(parts) > 5:
                    self.keys[parts[5]] = (topic, queue, offset)
            elif parts[0] == "C":
                tp = (parts[1], int(parts[2]))
                self.committed[tp] = max(self.committed.get(tp, 0), int(parts[3]))
                self.figures.commits_reported += 1
            elif parts[0] == "X":
                self.figures.corrupt_reads += 1
                self._problem(f"child read a corrupt value: {line}")

    def verify(self) -> None:
        started = time.perf_counter()
        # No retention while checking: a file it deleted between the queue and the key
        # checks would count as misses (the child runs retention; this checks it).
        overrides = {**(self.config_overrides or {}), "retention_check_interval_ms": 3_600_000}
        store = MessageStore.open(self.path, config_for("sync", overrides))
        try:
            ms = (time.perf_counter() - started) * 1000
            self.figures.reopen_ms_max = max(self.figures.reopen_ms_max, ms)
            queues = [(KAFKA_TOPIC, p) for p in range(KAFKA_PARTITIONS)]
            queues += [(RAW_TOPIC, q) for q in range(RAW_QUEUES)]
            for topic, queue in queues:
                self._verify_queue(store, topic, queue)
            self._verify_commits(store)
            self._verify_keys(store)
        finally:
            store.close()

    def _verify_queue(self, store: MessageStore, topic: str, queue: int) -> None:
        figures = self.figures
        try:
            low, high = store.min_offset(topic, queue), store.max_offset(topic, queue)
        except UnknownTopicError:  # a child killed before its first put to the topic
            low = high = 0  # (auto-created then): every ack of it, if any, is missing
        acked = self.acked.get((topic, queue), {})
        if acked and high <= max(acked):  # each missing offset is counted below
            self._problem(f"{topic}/{queue}: end {high} but offset {max(acked)} was acked")
        seen: dict[int, bytes] = {}
        offset = low
        while offset < high:
            try:
                batch = store.get(topic, queue, offset, READ_CHUNK)
            except CorruptDataError as error:
                figures.corrupt_reads += 1
                self._problem(f"{topic}/{queue}@{offset}: {error}")
                offset += 1
                continue
            if not batch:
                figures.gaps += high - offset
                self._problem(f"{topic}/{queue}: get({offset}) empty below end {high}")
                break
            for message in batch:
                value = bytes(message.body) if message.body is not None else b""
                figures.messages_read += 1
                if message.queue_offset in seen:
                    figures.duplicates += 1
                elif message.queue_offset != offset:
                    figures.gaps += 1
                    self._problem(f"{topic}/{queue}: expected {offset}, got {message.queue_offset}")
                seen[message.queue_offset] = value
                offset = message.queue_offset + 1
                if not value_is_intact(value):
                    figures.corrupt_reads += 1
                    self._problem(f"{topic}/{queue}@{message.queue_offset}: corrupt value")
        for acked_offset in sorted(acked):
            if acked_offset < low:
                figures.retained_away += 1
                del acked[acked_offset]
                continue
            figures.acked_checks += 1
            found = seen.get(acked_offset)
            if found is None:
                self._on_missing(topic, queue, acked_offset)
            elif zlib.crc32(found) != acked[acked_offset]:
                figures.wrong_content += 1
                self._problem(f"{topic}/{queue}@{acked_offset}: acked content differs")

    def _on_missing(self, topic: str, queue: int, offset: int) -> None:
        """An acknowledged message is absent: a loss (bench.powerloss may allow some)."""
        self.figures.losses += 1
        self._problem(f"{topic}/{queue}@{offset}: acked but missing")

    def _on_commit_past_end(self, tp: TopicPartition, committed: int, end: int) -> None:
        """A stored commit lies past the partition's end."""
        self.figures.commit_violations += 1
        self._problem(f"{tp}: committed {committed} past the end {end}")

    def _verify_commits(self, store: MessageStore) -> None:
        consumer = KafkaConsumer(store=store, group_id=GROUP, enable_auto_commit=False)
        try:
            for partition in range(KAFKA_PARTITIONS):
                tp = TopicPartition(KAFKA_TOPIC, partition)
                committed = consumer.committed(tp)
                reported = self.committed.get((KAFKA_TOPIC, partition))
                latest = store.max_offset(KAFKA_TOPIC, partition)
                if committed is None:
                    if reported is not None:
                        self.figures.commit_violations += 1
                        self._problem(f"{tp}: commit {reported} reported, none stored")
                    continue
                if reported is not None and committed < reported:
                    self.figures.commit_violations += 1
                    self._problem(f"{tp}: committed {committed}, reported {reported}, end {latest}")
                elif committed > latest:
                    self._on_commit_past_end(tp, committed, latest)
        finally:
            consumer.close(autocommit=False)

    def _verify_keys(self, store: MessageStore) -> None:
        live = [
            (key, where)
            for key, where in self.keys.items()
            if where[2] in self.acked.get(where[:2], {})
        ]
        self.keys = dict(live)
        if self.key_samples:
            live = self.rng.sample(live, min(self.key_samples, len(live)))
        for key, (topic, queue, offset) in live:
            self.figures.key_queries += 1
            hits = store.query_by_key(topic, key, 0, 2**62, 4)
            if [(m.queue_id, m.queue_offset) for m in hits] != [(queue, offset)]:
                self.figures.key_misses += 1
                self._problem(f"key {key}: expected {topic}/{queue}@{offset}, got {hits}")


def run(
    iterations: int, seed: int = 1, path: str | None = None, progress: bool = False
) -> CrashFigures:
    """Run the harness; returns the figures (the store directory is removed unless given)."""
    owned = path is None
    root = path or tempfile.mkdtemp(prefix="mqstore-crash-")
    try:
        harness = Harness(os.path.join(root, "store"), seed)
        with MessageStore.open(harness.path, config_for("sync")) as store:
            if KAFKA_TOPIC not in store.list_topics():
                store.create_topic(KAFKA_TOPIC, partitions=KAFKA_PARTITIONS)
        for iteration in range(iterations):
            harness.run_iteration(iteration)
            if progress and (iteration + 1) % 10 == 0:
                figures = harness.figures
                print(
                    f"{iteration + 1} iterations, {figures.acked_messages} acked, "
                    f"failed={figures.failed}",
                    flush=True,
                )
        return harness.figures
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        path, flush_mode, seed, fd = argv[1:5]
        overrides = json.loads(argv[5]) if len(argv) > 5 else None
        try:
            child_main(path, flush_mode, int(seed), int(fd), overrides)
        except StoreError as error:  # reported to the parent through stderr
            print(f"child: {type(error).__name__}: {error}", file=sys.stderr)
            return 2
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--path", help="store directory to keep (default: a temp dir)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    started = time.monotonic()
    figures = run(args.iterations, args.seed, args.path, progress=True)
    summary = figures.summary()
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["seed"] = args.seed
    report(summary, figures.problems, args.json)
    return 1 if figures.failed else 0


def report(summary: dict[str, Any], problems: list[str], json_path: str | None) -> None:
    """Print the figures (and the first 20 problems); save them as JSON if asked."""
    for name, value in summary.items():
        if name != "problems":
            print(f"{name:>24}: {value}")
    for problem in problems[:20]:
        print("PROBLEM:", problem)
    if json_path:
        with open(json_path, "w") as handle:
            json.dump(summary, handle, indent=2)


if __name__ == "__main__":
    sys.exit(main())
