"""Fetch over the wire, engine against engine: the segmented engine's sendfile Fetch
(its ``.log`` files are the wire format) against the CommitLog engine's (records read
as columns and built into batches in C), and the segmented engine's copying path
(the same batches read with pread, what TLS connections take) as a third row
(issue 16).

Setup, once per engine: a librdkafka producer (acks=1, linger 5 ms, no compression)
writes ``--messages`` 100-byte values into one partition through ``mqstore serve``;
the segmented engine keeps the producer's batches as they came, the CommitLog engine
one record per message. Then, in every round, the cases in a rotated order, each a
fresh broker process over its store (started and stopped outside the timing):

- ``commitlog``: a librdkafka consumer reads every message from offset 0 (assign;
  ``fetch.queue.backoff.ms`` 1, see FETCH_QUEUE_BACKOFF_MS), msg/s from the first
  ``consume`` until the last message arrives;
- ``segmented.sendfile``: the same, from the segmented store, zero copy;
- ``segmented.copy``: the same store, ``zero_copy_fetch`` off (the copying path);
- ``segmented.tls``: the same store over TLS (a self-signed certificate made with
  openssl; the consumer trusts it), which takes the copying path and encrypts;
- ``CASE.baseline`` (with ``--baseline-tree PATH``): the ``--baseline-case`` case
  (``commitlog`` unless told) with the broker process importing another checkout of
  mqstore (PYTHONPATH=PATH, e.g. a copy of main with its C module built), so that a
  change and what it replaces are measured in one run, interleaved.

Medians over the rounds; ratios of the medians. ``--profile`` also runs the CommitLog
engine's Fetch work (``Handlers.fetch_pass`` + ``encode_response``, what a read thread
and the loop do per Fetch) under cProfile on one thread, and prints where it goes.

Run: ``python -m bench.broker_fetch [--rounds 3] [--messages 1000000] [--profile]
[--baseline-tree PATH [--baseline-case segmented.copy]]``.
Writes bench/results/broker_fetch.json (``targets`` rows for bench/REPORT.md).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
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

RESULTS: Final = os.path.join(os.path.dirname(__file__), "results", "broker_fetch.json")
VALUE: Final = b"v" * 100
TOPIC: Final = "fetch"
CASE_TIMEOUT_S: Final = 300.0
START_TIMEOUT_S: Final = 60.0
CASES: Final = ("commitlog", "segmented.sendfile", "segmented.copy", "segmented.tls")
TARGET_MSG_S: Final = 1_000_000  # issue 16: the librdkafka consumer, 100 B values
FETCH_MAX_BYTES: Final = 1 << 20  # librdkafka's default max.partition.fetch.bytes
#: librdkafka stops fetching for fetch.queue.backoff.ms (default 1,000) whenever its
#: queue holds queued.min.messages (100,000): a broker faster than the application
#: then idles a second at a time, and every engine measured ~135,000 msg/s (the
#: client's pacing, not the broker's). 1 ms keeps the fetcher going.
FETCH_QUEUE_BACKOFF_MS: Final = 1
PROFILE_FETCHES: Final = 200  # Fetches of FETCH_MAX_BYTES under the profiler


def open_engine(engine: str, path: str) -> Any:
    if engine == "commitlog":
        from mqstore import MessageStore, StoreConfig

        return MessageStore.open(path, StoreConfig(commitlog_file_size_bytes=256 << 20))
    from mqstore.segmented import SegmentedConfig, SegmentedStore

    return SegmentedStore.open(path, SegmentedConfig())


def serve_main(engine: str, path: str, zero_copy: bool, tls: list[str] | None = None) -> None:
    """The broker process: serve ``path`` until SIGTERM, printing the address;
    ``tls``: [certificate, key], a TLS listener."""
    from mqstore.broker import BrokerConfig
    from mqstore.broker.serve import serve

    store = open_engine(engine, path)
    tls_paths = {} if tls is None else {"tls_cert_path": tls[0], "tls_key_path": tls[1]}
    try:
        serve(
            store, "127.0.0.1", 0, config=BrokerConfig(zero_copy_fetch=zero_copy, **tls_paths),
            on_listening=lambda b: print(f"listening on {b.bootstrap}", flush=True),
        )  # fmt: skip
    finally:
        store.close()


def start_broker(
    engine: str,
    path: str,
    zero_copy: bool,
    tree: str | None = None,
    tls: tuple[str, str] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """A broker process over ``path``; ``tree``: import mqstore from that checkout;
    ``tls``: (certificate, key) for a TLS listener."""
    command = [sys.executable, "-m", "bench.broker_fetch", "--serve", engine, path]
    command += ["--zero-copy"] if zero_copy else []
    command += ["--tls", *tls] if tls is not None else []
    env = None if tree is None else {**os.environ, "PYTHONPATH": tree}
    return spawn_serve(command, env=env, cwd=tree)


def produce(bootstrap: str, messages: int) -> None:
    import confluent_kafka

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5,
         "queue.buffering.max.messages": 1_000_000, "enable.idempotence": False}
    )  # fmt: skip
    for _ in range(messages):
        while True:
            try:
                producer.produce(TOPIC, VALUE, partition=0)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(CASE_TIMEOUT_S):
        raise RuntimeError("messages not acknowledged")


def consume(bootstrap: str, messages: int, ca: str | None = None) -> float:
    """msg/s of a librdkafka consumer reading ``messages`` from offset 0 (over TLS,
    trusting the certificate ``ca``, when given)."""
    import confluent_kafka

    tls = {} if ca is None else {"security.protocol": "SSL", "ssl.ca.location": ca}
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
         "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": FETCH_MAX_BYTES,
         "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS, **tls}
    )  # fmt: skip
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


def setup(directory: str, messages: int) -> dict[str, str]:
    """A store per engine holding the same messages; their paths."""
    paths = {}
    for engine in ("commitlog", "segmented"):
        path = os.path.join(directory, engine)
        store = open_engine(engine, path)
        store.create_topic(TOPIC, 1)
        store.close()
        process, bootstrap = start_broker(engine, path, zero_copy=True)
        try:
            produce(bootstrap, messages)
        finally:
            stop_serve(process)
        paths[engine] = path
    paths["certificate"] = os.path.join(directory, "cert.pem")
    paths["key"] = os.path.join(directory, "key.pem")
    subprocess.run(  # a self-signed certificate for the TLS case (openssl, as the tests)
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", paths["key"], "-out", paths["certificate"], "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return paths


def run_case(case: str, paths: dict[str, str], messages: int, tree: str | None = None) -> float:
    engine = case.split(".")[0]
    tls = (paths["certificate"], paths["key"]) if case.startswith("segmented.tls") else None
    process, bootstrap = start_broker(
        engine, paths[engine], zero_copy=not case.startswith("segmented.copy"),
        tree=tree if case.endswith(".baseline") else None, tls=tls,
    )  # fmt: skip
    try:
        return consume(bootstrap, messages, ca=None if tls is None else tls[0])
    finally:
        stop_serve(process)


def profile_commitlog(path: str, messages: int, top: int = 18) -> str:
    """Where one thread's CommitLog Fetch work goes (no network): cProfile's top
    functions by own time over PROFILE_FETCHES Fetches of FETCH_MAX_BYTES."""
    from kafka.protocol.consumer import FetchRequest

    from mqstore.broker import BrokerConfig
    from mqstore.broker.column_log import ColumnLog
    from mqstore.broker.handlers import Handlers
    from mqstore.broker.protocol import encode_response

    store = open_engine("commitlog", path)
    try:
        handlers = Handlers(ColumnLog(store), store.offsets, BrokerConfig(), 0)
        partition = FetchRequest.FetchTopic.FetchPartition(
            partition=0, fetch_offset=0, partition_max_bytes=FETCH_MAX_BYTES,
            log_start_offset=-1, current_leader_epoch=-1,
        )  # fmt: skip
        request = FetchRequest(
            version=11, replica_id=-1, max_wait_ms=0, min_bytes=1,
            max_bytes=FETCH_MAX_BYTES, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=[partition])],
            forgotten_topics_data=[], rack_id="",
        )  # fmt: skip
        profiler = cProfile.Profile()
        fetched = 0
        started = time.perf_counter()
        profiler.enable()
        for i in range(PROFILE_FETCHES):
            partition.fetch_offset = (i * 9_000) % max(messages - 9_000, 1)
            result = handlers.fetch_pass(request, 11, True)
            fetched += len(encode_response(result.response, i))
        profiler.disable()
        elapsed = time.perf_counter() - started
    finally:
        store.close()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    head = (
        f"{PROFILE_FETCHES} Fetches, {fetched / 1e6:.1f} MB, {elapsed:.2f} s under cProfile "
        f"({fetched / elapsed / 1e6:.1f} MB/s with the profiler's overhead)\n"
    )
    return head + out.getvalue()


def targets(cases: dict[str, Any]) -> list[dict[str, Any]]:
    """The target rows (the baseline, when measured, is in ``cases`` only)."""

    def row(case: str, peer: str | None, name: str) -> dict[str, Any]:
        value = float(cases[case])
        peer_value = None if peer is None else float(cases[peer])
        return {
            "row": name,
            "value": round(value),
            "unit": "msg/s",
            "peer": peer,
            "peer_value": None if peer_value is None else round(peer_value),
            "ratio": round(value / peer_value, 3) if peer_value else None,
            "target": ">= 1,000,000 msg/s",
            "met": value >= TARGET_MSG_S,
        }

    return [
        row("segmented.sendfile", "commitlog",
            "librdkafka consumer, 100 B: segmented engine, sendfile Fetch"),
        row("commitlog", None, "librdkafka consumer, 100 B: CommitLog engine Fetch"),
        row("segmented.copy", "segmented.sendfile",
            "librdkafka consumer, 100 B: segmented engine, copying Fetch (zero copy off)"),
        row("segmented.tls", "segmented.sendfile",
            "librdkafka consumer, 100 B: segmented engine over TLS (copying Fetch)"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--output", default=RESULTS)
    parser.add_argument(
        "--baseline-tree", metavar="PATH",
        help="also serve the CommitLog store from the mqstore checkout at PATH (a case)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline-case", default="commitlog", choices=CASES,
        help="the case the --baseline-tree checkout serves (as CASE.baseline)",
    )  # fmt: skip
    parser.add_argument("--serve", nargs=2, metavar=("ENGINE", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--zero-copy", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_main(args.serve[0], args.serve[1], args.zero_copy, args.tls)
        return
    directory = tempfile.mkdtemp(prefix="bench-fetch-")
    try:
        paths = setup(directory, args.messages)
        runs: list[dict[str, float]] = []
        loads = [load_sample()]
        baseline = (args.baseline_case + ".baseline",) if args.baseline_tree else ()
        cases_run = CASES + baseline
        for round_ in range(args.rounds):
            shift = round_ % len(cases_run)
            figures = {}
            for case in cases_run[shift:] + cases_run[:shift]:
                figures[case] = run_case(case, paths, args.messages, args.baseline_tree)
            runs.append(figures)
            loads.append(load_sample())
            shown = "  ".join(f"{k} {v:,.0f}" for k, v in figures.items())
            print(f"round {round_ + 1}: {shown}", flush=True)
        profile = profile_commitlog(paths["commitlog"], args.messages) if args.profile else None
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    cases = summarize(runs)
    rows = targets(cases)
    if profile:  # where the CommitLog engine's Fetch goes (its row misses)
        rows[1]["profile"] = profile
    for row in rows:
        print(
            f"{row['row']}: {row['value']:,} msg/s (peer {row['peer']}: {row['peer_value']}, "
            f"ratio {row['ratio']}) target {row['target']}: {'met' if row['met'] else 'MISSED'}"
        )
    if profile:
        print(profile)
    write_results(
        args.output,
        {
            "machine": machine_info(),
            "load": loads,
            "messages": args.messages,
            "value_bytes": len(VALUE),
            "rounds": args.rounds,
            "command": "python -m bench.broker_fetch " + " ".join(sys.argv[1:]),
            "baseline_tree": args.baseline_tree,
            "baseline_case": args.baseline_case if args.baseline_tree else None,
            "cases": cases,
            "runs": runs,
            "targets": rows,
            "profile": profile,
        },
    )


if __name__ == "__main__":
    main()
