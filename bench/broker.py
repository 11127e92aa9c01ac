"""The broker's first figures: librdkafka against ``mqstore serve``, and the same
workload through the embedded API, in one run (issue 16's targets).

Cases, 100-byte values, one partition, in every round (peers interleaved round by
round, the order rotated each round; medians):

- ``wire.produce``: a confluent-kafka (librdkafka) producer, acks=1, linger.ms 5,
  into ``mqstore serve`` (a separate process, async flush); msg/s from the first
  ``produce`` until ``flush`` returns (every record acknowledged);
- ``wire.consume``: a librdkafka consumer reading those records from the earliest
  offset (assign), msg/s until the last one arrives;
- ``wire.produce.sync``: acks=all into a broker whose store flushes in sync mode
  (every acknowledged record durable);
- ``embedded.produce`` / ``embedded.consume`` / ``embedded.produce.sync``: the same
  records through ``mqstore.KafkaProducer(store)`` (linger_ms 5) and
  ``mqstore.KafkaConsumer(store=...)`` in this process: what the network front costs.

``--baseline-tree PATH`` adds the wire cases of one engine (``--baseline-engine``,
the CommitLog one unless told) with the broker process importing another checkout of
mqstore (PYTHONPATH=PATH, e.g. a copy of main with its C module built), as
``ENGINE.baseline``, in the same rounds: a change and what it replaces measured in
one run.

Run: ``python -m bench.broker [--rounds 3] [--messages 200000] [--engines commitlog]
[--baseline-tree PATH [--baseline-engine segmented]]``.
Writes bench/results/broker.json (``targets`` rows for bench/REPORT.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Final

from bench.common import (
    load_sample,
    machine_info,
    spawn_serve,
    stop_serve,
    summarize,
    write_results,
)

RESULTS: Final = os.path.join(os.path.dirname(__file__), "results", "broker.json")
VALUE: Final = b"v" * 100
TOPIC: Final = "bench"
START_TIMEOUT_S: Final = 60.0
CASE_TIMEOUT_S: Final = 300.0
SYNC_SHARE: Final = 4  # the sync cases send messages / this (they are the slowest)
SMALL_STORE: Final = {"commitlog": ["commitlog_file_size_bytes=268435456"], "segmented": []}
#: librdkafka stops fetching for fetch.queue.backoff.ms (default 1,000) whenever its
#: queue holds queued.min.messages (100,000): a broker faster than the application
#: then idles a second at a time (bench/broker_fetch.py measured every engine at
#: ~135,000 msg/s that way). 1 ms keeps the fetcher going.
FETCH_QUEUE_BACKOFF_MS: Final = 1
BASELINE_SUFFIX: Final = ".baseline"


def start_broker(
    path: str, engine: str, sync: bool, tree: str | None = None
) -> tuple[subprocess.Popen[str], str]:
    """``mqstore serve`` over ``path``; ``tree``: import mqstore from that checkout."""
    command = [sys.executable, "-m", "mqstore", "--store", path, "--engine", engine]
    for item in [*SMALL_STORE[engine], *(["flush_mode=sync"] if sync else [])]:
        command += ["--config", item]
    command += ["serve", "--listen", "127.0.0.1:0"]
    env = None if tree is None else {**os.environ, "PYTHONPATH": tree}
    return spawn_serve(command, env=env, cwd=tree)


def wire_produce(bootstrap: str, messages: int, acks: str) -> float:
    import confluent_kafka

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
            "enable.idempotence": False,
        }
    )
    producer.produce(TOPIC, VALUE)  # creates the topic (Metadata auto-creation)
    producer.flush(30)
    failed = []
    started = time.perf_counter()
    produce, poll = producer.produce, producer.poll
    for i in range(messages):
        try:
            produce(TOPIC, VALUE, on_delivery=None)
        except BufferError:
            poll(0.01)
            produce(TOPIC, VALUE)
        if i & 0x3FF == 0:
            poll(0)
    left = producer.flush(CASE_TIMEOUT_S)
    elapsed = time.perf_counter() - started
    if left:
        failed.append(left)
        raise RuntimeError(f"{left} messages not acknowledged")
    return messages / elapsed


def wire_consume(bootstrap: str, messages: int) -> float:
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 1_048_576,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        }
    )
    consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
    got = 0
    started = time.perf_counter()
    deadline = time.monotonic() + CASE_TIMEOUT_S
    while got < messages and time.monotonic() < deadline:
        # consume(n, timeout) returns at n messages or the timeout: ask for no more
        # than are left, or the last call waits out its 0.5 s (a 200,000-message
        # run measured 0.71 s where the messages took 0.21 s).
        wanted = min(10_000, messages - got)
        got += sum(1 for m in consumer.consume(wanted, 0.5) if m.error() is None)
    elapsed = time.perf_counter() - started
    consumer.close()
    if got < messages:
        raise RuntimeError(f"consumed {got} of {messages}")
    return messages / elapsed


def wire_case(engine: str, messages: int, tree: str | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as directory:
        path = os.path.join(directory, "store")
        process, bootstrap = start_broker(path, engine, sync=False, tree=tree)
        try:
            produced = wire_produce(bootstrap, messages, "1")
            consumed = wire_consume(bootstrap, messages + 1)  # + the topic-creating one
        finally:
            stop_serve(process)
    return {"wire.produce": produced, "wire.consume": consumed}


def wire_sync_case(engine: str, messages: int, tree: str | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as directory:
        path = os.path.join(directory, "store")
        process, bootstrap = start_broker(path, engine, sync=True, tree=tree)
        try:
            produced = wire_produce(bootstrap, messages // SYNC_SHARE, "all")
        finally:
            stop_serve(process)
    return {"wire.produce.sync": produced}


def open_engine(engine: str, path: str, sync: bool) -> Any:
    if engine == "commitlog":
        from mqstore import MessageStore, StoreConfig

        return MessageStore.open(
            path,
            StoreConfig(
                commitlog_file_size_bytes=256 << 20, flush_mode="sync" if sync else "async"
            ),
        )
    from mqstore.segmented import SegmentedConfig, SegmentedStore

    return SegmentedStore.open(path, SegmentedConfig(flush_mode="sync" if sync else "async"))


def embedded_case(engine: str, messages: int, sync: bool) -> dict[str, float]:
    from mqstore import KafkaConsumer, KafkaProducer, TopicPartition

    count = messages // SYNC_SHARE if sync else messages
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as directory:
        store = open_engine(engine, os.path.join(directory, "store"), sync)
        try:
            producer = KafkaProducer(store, linger_ms=5)
            started = time.perf_counter()
            for _ in range(count):
                producer.send(TOPIC, VALUE)
            producer.flush()
            produced = count / (time.perf_counter() - started)
            producer.close()
            if sync:
                return {"embedded.produce.sync": produced}
            consumer = KafkaConsumer(store=store, auto_offset_reset="earliest")
            consumer.assign([TopicPartition(TOPIC, 0)])
            got = 0
            started = time.perf_counter()
            while got < count:
                got += sum(len(r) for r in consumer.poll(500, max_records=10_000).values())
            consumed = count / (time.perf_counter() - started)
            consumer.close()
        finally:
            store.close()
    return {"embedded.produce": produced, "embedded.consume": consumed}


def targets(engine: str, cases: dict[str, Any]) -> list[dict[str, Any]]:
    def row(name: str, figure: str, peer: str, target: float, text: str) -> dict[str, Any]:
        value = float(cases.get(figure, 0.0))
        peer_value = cases.get(peer)
        return {
            "row": f"{name} ({engine})",
            "value": round(value),
            "unit": "msg/s",
            "peer": f"embedded API, {peer}",
            "peer_value": None if peer_value is None else round(float(peer_value)),
            "ratio": round(value / peer_value, 3) if peer_value else None,
            "target": text,
            "met": value >= target,
        }

    return [
        row("librdkafka producer acks=1, linger 5 ms, 100 B", "wire.produce",
            "embedded.produce", 500_000, ">= 500,000 msg/s"),
        row("librdkafka consumer, 100 B", "wire.consume", "embedded.consume", 1_000_000,
            ">= 1,000,000 msg/s"),
        row("librdkafka producer acks=all, sync flush, 100 B", "wire.produce.sync",
            "embedded.produce.sync", 200_000, ">= 200,000 msg/s"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--engines", default="commitlog")
    parser.add_argument("--output", default=RESULTS)
    parser.add_argument("--baseline-tree", metavar="PATH", help="see the module docstring")
    parser.add_argument(
        "--baseline-engine", default="commitlog", choices=["commitlog", "segmented"]
    )
    args = parser.parse_args()
    engines = args.engines.split(",")
    baseline = args.baseline_engine + BASELINE_SUFFIX
    variants = engines + ([baseline] if args.baseline_tree else [])
    runs: dict[str, list[dict[str, float]]] = {variant: [] for variant in variants}
    loads = [load_sample()]
    for round_ in range(args.rounds):
        for engine in variants:
            steps: list[Callable[[], dict[str, float]]] = [
                partial(wire_case, engine, args.messages),
                partial(embedded_case, engine, args.messages, sync=False),
                partial(wire_sync_case, engine, args.messages),
                partial(embedded_case, engine, args.messages, sync=True),
            ]
            if engine == baseline:  # the other checkout serves; nothing embedded
                steps = [
                    partial(wire_case, args.baseline_engine, args.messages, args.baseline_tree),
                    partial(
                        wire_sync_case, args.baseline_engine, args.messages, args.baseline_tree
                    ),
                ]
            shift = round_ % len(steps)
            figures: dict[str, float] = {}
            for step in steps[shift:] + steps[:shift]:
                figures.update(step())
            runs[engine].append(figures)
            shown = "  ".join(f"{k} {v:,.0f}" for k, v in sorted(figures.items()))
            print(f"round {round_ + 1} {engine}: {shown}", flush=True)
        loads.append(load_sample())
    cases = {variant: summarize(variant_runs) for variant, variant_runs in runs.items()}
    rows = [row for engine in engines for row in targets(engine, cases[engine])]
    for row in rows:
        print(
            f"{row['row']}: {row['value']:,} msg/s (embedded {row['peer_value']:,}, "
            f"ratio {row['ratio']}) target {row['target']}: {'met' if row['met'] else 'MISSED'}"
        )
    write_results(
        args.output,
        {
            "machine": machine_info(),
            "load": loads,
            "messages": args.messages,
            "value_bytes": len(VALUE),
            "rounds": args.rounds,
            "command": "python -m bench.broker " + " ".join(sys.argv[1:]),
            "baseline_tree": args.baseline_tree,
            "baseline_engine": args.baseline_engine if args.baseline_tree else None,
            "cases": cases,
            "targets": rows,
        },
    )


if __name__ == "__main__":
    main()
