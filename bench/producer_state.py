"""What keeping the idempotent producer's state in the log costs a producer.

On the CommitLog engine the broker appends one record of ``__mqstore_producer_state``
after each idempotent batch, as the batch's trailer (one append group: a crash keeps
both or neither; mqstore/broker/producers.py), where it used to write one record to a
side journal (``broker-producers.log``) after the batch. Cases, 100-byte values, one
partition, a confluent-kafka (librdkafka) producer with linger.ms 5 into
``mqstore serve`` (a separate process, async flush), interleaved round by round with
the order rotated each round (medians):

- ``plain``: acks=1, idempotence off (bench/broker.py's acks=1 row: no state written);
- ``idempotent.journal``: enable.idempotence (acks=all; no follower, so it waits for
  nothing more than acks=1), the broker writing the side journal as before (the
  serving process is started with the CommitLog engine's ``producer_log`` removed,
  which is what the broker did before the state went through the log);
- ``idempotent.log``: the same producer, the state through the log (the default);
- ``batch.journal_us`` / ``batch.log_us``: in this process, on a real store (no
  network), what appending one batch of 10 records with its producer's state costs:
  the engine's append and the journal's ``write``, or the append with the state
  record as its trailer. The direct per-batch cost, steadier than the wire figures
  on a loaded machine.

Run: ``python -m bench.producer_state [--rounds 5] [--messages 200000] [--batches 50000]``.
Writes bench/results/producer_state.json (``targets`` rows for bench/REPORT.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Final

from bench.common import (
    load_sample,
    machine_info,
    spawn_serve,
    stop_serve,
    summarize,
    write_results,
)

RESULTS: Final = os.path.join(os.path.dirname(__file__), "results", "producer_state.json")
VALUE: Final = b"v" * 100
TOPIC: Final = "bench"
CASE_TIMEOUT_S: Final = 300.0
CASES: Final = ("plain", "idempotent.journal", "idempotent.log")
#: The "before" broker: the CommitLog engine without its state topic journals to a file.
_JOURNAL_BROKER: Final = (
    "import sys, mqstore.commitlog_engine as engine; del engine.CommitLogEngine.producer_log; "
    "from mqstore.cli import main; sys.argv[0] = 'mqstore'; raise SystemExit(main())"
)


def start_broker(path: str, journal: bool) -> tuple[subprocess.Popen[str], str]:
    prefix = ["-c", _JOURNAL_BROKER] if journal else ["-m", "mqstore"]
    command = [sys.executable, *prefix, "--store", path, "--engine", "commitlog"]
    command += ["--config", "commitlog_file_size_bytes=268435456", "serve"]
    command += ["--listen", "127.0.0.1:0"]
    return spawn_serve(command)


def produce(bootstrap: str, messages: int, idempotent: bool) -> float:
    """msg/s from the first produce until every record is acknowledged."""
    import confluent_kafka

    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "queue.buffering.max.messages": 1_000_000,
        "enable.idempotence": idempotent,
    }
    if not idempotent:
        settings["acks"] = "1"
    producer = confluent_kafka.Producer(settings)
    producer.produce(TOPIC, VALUE)  # creates the topic (Metadata auto-creation)
    producer.flush(30)
    send, poll = producer.produce, producer.poll
    started = time.perf_counter()
    for i in range(messages):
        try:
            send(TOPIC, VALUE)
        except BufferError:
            poll(0.01)
            send(TOPIC, VALUE)
        if i & 0x3FF == 0:
            poll(0)
    left = producer.flush(CASE_TIMEOUT_S)
    elapsed = time.perf_counter() - started
    if left:
        raise RuntimeError(f"{left} messages not acknowledged")
    return messages / elapsed


def run_case(case: str, messages: int) -> tuple[float, bool]:
    """(msg/s, whether the broker kept a side journal) of one case."""
    with tempfile.TemporaryDirectory(prefix="bench-producer-state-") as directory:
        store = os.path.join(directory, "store")
        process, bootstrap = start_broker(store, journal=case == "idempotent.journal")
        try:
            rate = produce(bootstrap, messages, idempotent=case != "plain")
        finally:
            stop_serve(process)
        journal = os.path.join(store, "broker-producers.log")
        journaled = os.path.exists(journal) and os.path.getsize(journal) > 0
    return rate, journaled


def batch_us(where: str, batches: int) -> float:
    """Microseconds one batch of 10 records and its producer's state take in this
    process, on a real store (async flush): the batch with the state record as its
    trailer, or the batch and then the journal's ``write`` (``where``: "log" or
    "journal")."""
    from mqstore import MessageStore, StoreConfig
    from mqstore.broker.producers import ProducerState

    with tempfile.TemporaryDirectory(prefix="bench-producer-state-") as directory:
        store = MessageStore.open(directory, StoreConfig(commitlog_file_size_bytes=256 << 20))
        try:
            if where == "log":
                state = ProducerState(log=store.producer_log)
            else:
                state = ProducerState(directory)
            store.create_topic(TOPIC, 1)
            appended, trailer, put = state.appended, state.trailer, store.put_batch_arrays
            values = [b"v" * 100] * 10
            started = time.perf_counter()
            for i in range(batches):  # 100 producers, each a batch of 10 records
                pid, first = 1000 + i % 100, (i // 100) * 10
                state_record = trailer(pid, 0, TOPIC, 0, first, 10)
                assert (state_record is None) == (where == "journal")
                result = put(TOPIC, 0, values, trailer=state_record)
                appended(pid, 0, TOPIC, 0, first, 10, result.first_queue_offset)
            elapsed = time.perf_counter() - started
            state.close()
        finally:
            store.close()
    return elapsed / batches * 1e6


def targets(cases: dict[str, Any]) -> list[dict[str, Any]]:
    log, journal, plain = (
        float(cases[c]) for c in ("idempotent.log", "idempotent.journal", "plain")
    )
    ratio = log / journal
    return [
        {
            "row": "idempotent librdkafka producer, state through the log, 100 B",
            "value": round(log),
            "unit": "msg/s",
            "peer": "the same, state in the side journal (before)",
            "peer_value": round(journal),
            "ratio": round(ratio, 3),
            "target": ">= 0.9 of the side journal's",
            "met": ratio >= 0.9,
        },
        {
            "row": "a batch of 10 records and its producer state, state as the batch's "
            "trailer (in process)",
            "value": round(float(cases["batch.log_us"]), 2),
            "unit": "us",
            "peer": "the batch, then the side journal's write (before)",
            "peer_value": round(float(cases["batch.journal_us"]), 2),
            "ratio": round(float(cases["batch.log_us"]) / float(cases["batch.journal_us"]), 3),
            "target": "context: the cost per batch",
            "met": True,
        },
        {
            "row": "librdkafka producer acks=1, idempotence off (no state written), 100 B",
            "value": round(plain),
            "unit": "msg/s",
            "peer": None,
            "peer_value": None,
            "ratio": None,
            "target": "context (bench/broker.py's acks=1 row)",
            "met": True,
        },
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=50_000)
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args()
    runs: list[dict[str, float]] = []
    loads = [load_sample()]
    for round_ in range(args.rounds):
        shift = round_ % len(CASES)
        figures: dict[str, float] = {}
        for case in CASES[shift:] + CASES[:shift]:
            rate, journaled = run_case(case, args.messages)
            assert journaled == (case == "idempotent.journal"), (case, journaled)
            figures[case] = rate
        for where in ("journal", "log")[:: 1 if round_ % 2 else -1]:
            figures[f"batch.{where}_us"] = batch_us(where, args.batches)
        runs.append(figures)
        shown = "  ".join(f"{k} {v:,.0f}" for k, v in sorted(figures.items()))
        print(f"round {round_ + 1}: {shown}", flush=True)
        loads.append(load_sample())
    cases = summarize(runs)
    rows = targets(cases)
    for row in rows:
        print(f"{row['row']}: {row['value']:,} {row['unit']} ratio {row['ratio']} {row['target']}")
    write_results(
        args.output,
        {
            "machine": machine_info(),
            "load": loads,
            "messages": args.messages,
            "value_bytes": len(VALUE),
            "rounds": args.rounds,
            "command": "python -m bench.producer_state " + " ".join(sys.argv[1:]),
            "cases": cases,
            "runs": runs,
            "targets": rows,
        },
    )


if __name__ == "__main__":
    main()
