"""The broker's connection and soak figures (issue 16): ``mqstore serve`` holding 1,000
idle connections and 100 active clients, then produce+consume at half the maximum
rate for N minutes, while the broker process's RSS, threads and open fds are sampled.

For each engine (``--engines commitlog,segmented``):

1. ``mqstore serve`` starts as its own process on a free loopback port, with
   ``--max-connections-per-ip 4096 --max-connections 4096`` (the defaults, 1,024 per
   address and 2,048 in all, would refuse part of 1,100+ loopback connections) and
   ``STORE_CONFIG`` (small files and retention by size, so files roll and are deleted
   during the soak), and a topic of ``PARTITIONS`` partitions is created
   (confluent-kafka's AdminClient);
2. ``--idle`` raw TCP connections each send one ApiVersions v0 and read its answer,
   then stay open (one more ApiVersions every ``IDLE_REFRESH_S``, as a client's
   metadata refresh does, so the broker's 10-minute idle timeout does not close
   them); at the end each must still answer one;
3. ``--workers`` processes each run ``--active / 2 / workers`` librdkafka producers
   (idempotent, so acks=all; linger 5 ms, 100-byte values, no key) and as many librdkafka group
   consumers (one group, auto commit); each consumer keeps, per partition, the
   offset ranges it received;
4. **max rate**: the producers send as fast as they can for ``MEASURE_S`` seconds;
   the acknowledged records per second (after a ``MEASURE_SKIP_S`` ramp) is the
   maximum rate;
5. **soak**: the producers send at half that rate for ``--minutes``, paced per
   ``TICK_S``; the broker's VmRSS, RssAnon, RssFile, threads
   (/proc/PID/status) and open fds (/proc/PID/fd) are sampled every ``SAMPLE_S``;
6. the producers flush, the consumers read to the end; the log must hold exactly the
   acknowledged records (sum of the partitions' ends = acked) and the union of every
   received range must cover each partition from 0 to its end: consumed = produced.

Verdicts ("targets" rows): anonymous RSS (the heap; the CommitLog's mapped files
count in RssFile, which grows with the data written and is the page cache) grows
less than ``RSS_GROWTH_MAX_PCT`` over the second half of the soak; open fds are flat:
the sockets do not change during the soak, and the files' fds (a sawtooth: files roll
and retention deletes them) peak in the second half no higher than
``FILE_FDS_SLACK_PCT`` above their first-half peak; every idle connection still
answers at the end; nothing produced is missing.

Run: ``python -m bench.broker_soak --minutes 10 --engines commitlog,segmented``
(issue 16's figures); ``make bench`` runs ``--minutes 1``.
Writes bench/results/broker_soak.json.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Final

from bench.common import load_sample, machine_info, spawn_serve, stop_serve, write_results

RESULTS: Final = os.path.join(os.path.dirname(__file__), "results", "broker_soak.json")
TOPIC: Final = "soak"
PARTITIONS: Final = 50  # one per consumer of the default 50 active consumers
VALUE: Final = b"v" * 100
GROUP: Final = "soak"
START_TIMEOUT_S: Final = 60.0
SAMPLE_S: Final = 5.0
MEASURE_S: Final = 12.0  # the max-rate phase
MEASURE_SKIP_S: Final = 3.0  # its first seconds (connections, batching ramp) not counted
TICK_S: Final = 0.01  # producers' pacing step
#: Records a producer holds unsent: keeps the max-rate phase's backlog (and the
#: requests waiting in the broker) to seconds, not minutes.
PRODUCER_QUEUE_MAX: Final = 10_000
STATUS_S: Final = 1.0  # workers report their counts this often
IDLE_REFRESH_S: Final = 240.0  # well inside the broker's 600 s idle timeout
DRAIN_TIMEOUT_S: Final = 180.0  # consumers reach the end within this after the soak
ASSIGN_TIMEOUT_S: Final = 180.0  # every partition assigned within this
RSS_GROWTH_MAX_PCT: Final = 5.0
FILE_FDS_SLACK_PCT: Final = 10.0
CONNECTIONS_MAX: Final = 4096
#: Files roll and retention deletes them during the soak, so the store is in a steady
#: state (files, mappings and fds bounded) rather than growing with the data written.
STORE_CONFIG: Final = {
    "commitlog": [
        "commitlog_file_size_bytes=67108864",
        "retention_bytes=1073741824",
        "consumequeue_units_per_file=50000",  # ~100 s a file per partition at 30k msg/s
    ],
    "segmented": [
        "segment_bytes=4194304",
        "retention_bytes=16777216",
        "retention_check_interval_ms=10000",
    ],
}
API_VERSIONS_V0: Final = struct.Struct(">ihhih")  # size, api key 18, v0, correlation, client id
FRAME: Final = struct.Struct(">i")


# ---------------------------------------------------------------------- the broker


def start_broker(path: str, engine: str) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "mqstore", "--store", path, "--engine", engine]
    for item in STORE_CONFIG[engine]:
        command += ["--config", item]
    command += ["serve", "--listen", "127.0.0.1:0", "--max-connections", str(CONNECTIONS_MAX)]
    command += ["--max-connections-per-ip", str(CONNECTIONS_MAX)]
    return spawn_serve(command)


def sample(pid: int) -> dict[str, float]:
    """The broker's memory (MiB), threads and open fds now."""
    fields: dict[str, float] = {"t": time.monotonic()}
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                fields[name] = int(rest.split()[0]) / 1024
            elif name == "Threads":
                fields["threads"] = int(rest)
    sockets = files = 0
    names = os.listdir(f"/proc/{pid}/fd")
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        sockets += target.startswith("socket:")
        files += target.startswith("/")
    fields["fds"], fields["fds_sockets"], fields["fds_files"] = len(names), sockets, files
    return fields


def create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result(30)


# ---------------------------------------------------------------------- idle connections


def api_versions(correlation_id: int) -> bytes:
    return API_VERSIONS_V0.pack(API_VERSIONS_V0.size - 4, 18, 0, correlation_id, -1)


def read_frame(conn: socket.socket) -> bytes:
    data = b""
    while len(data) < FRAME.size:
        chunk = conn.recv(FRAME.size - len(data))
        if not chunk:
            raise ConnectionError("closed by the broker")
        data += chunk
    (size,) = FRAME.unpack(data)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("closed by the broker")
        body += chunk
    return body


def ask_all(conns: list[socket.socket], correlation_id: int) -> int:
    """One ApiVersions on every connection (sent to all, then read): how many answered."""
    for conn in conns:
        conn.sendall(api_versions(correlation_id))
    answered = 0
    for conn in conns:
        try:
            body = read_frame(conn)
        except OSError:
            continue
        answered += int.from_bytes(body[:4], "big") == correlation_id
    return answered


def open_idle(bootstrap: str, count: int) -> list[socket.socket]:
    host, port = bootstrap.rsplit(":", 1)
    conns = [socket.create_connection((host, int(port)), timeout=60) for _ in range(count)]
    answered = ask_all(conns, 1)
    if answered != count:
        raise RuntimeError(f"{count - answered} idle connections got no ApiVersions answer")
    return conns


# ---------------------------------------------------------------------- client workers


class _Ranges:
    """Offset ranges received on one partition, merged as they come: [[start, end)]."""

    __slots__ = ("ranges",)

    def __init__(self) -> None:
        self.ranges: list[list[int]] = []

    def add(self, offset: int) -> None:
        ranges = self.ranges
        if ranges and ranges[-1][1] == offset:
            ranges[-1][1] = offset + 1
        else:
            ranges.append([offset, offset + 1])


def worker(
    index: int,
    bootstrap: str,
    producers_n: int,
    consumers_n: int,
    conn: multiprocessing.connection.Connection,
) -> None:
    """One client process: its producers paced at the rate the parent sends, its
    consumers read; counts go to the parent every STATUS_S."""
    import confluent_kafka

    producers = [
        confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                # Idempotent (acks=all): a retried batch is answered with its first
                # offset, not appended again, so the log must hold exactly the acked.
                "enable.idempotence": True,
                "queue.buffering.max.messages": PRODUCER_QUEUE_MAX,
                "delivery.report.only.error": True,
                "client.id": f"soak-p{index}-{i}",
            }
        )
        for i in range(producers_n)
    ]
    errors = [0]

    def failed(error: Any, _message: Any) -> None:
        if error is not None:
            errors[0] += 1

    consumers = []
    for i in range(consumers_n):
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": GROUP,
                "auto.offset.reset": "earliest",
                "client.id": f"soak-c{index}-{i}",
            }
        )
        consumer.subscribe([TOPIC])
        consumers.append(consumer)
    received: dict[int, _Ranges] = {}
    rate: float | None = 0.0  # msg/s of this worker; None: as fast as it can
    phase_started, sent_in_phase, sent = time.monotonic(), 0, 0
    consumed = 0
    status_due = time.monotonic()
    closing = False
    while True:
        while conn.poll(0):
            command, argument = conn.recv()
            if command == "rate":
                rate, phase_started, sent_in_phase = argument, time.monotonic(), 0
            elif command == "flush":
                rate = 0.0
                for producer in producers:
                    producer.flush(60)
            elif command == "close":
                closing = True
        if closing:
            break
        now = time.monotonic()
        due = 5_000 if rate is None else int(rate * (now - phase_started)) - sent_in_phase
        for i in range(max(due, 0)):
            producer = producers[i % producers_n]
            try:
                producer.produce(TOPIC, VALUE, on_delivery=failed)
            except BufferError:
                producer.poll(0.001)
                break
            sent_in_phase += 1
            sent += 1
        for producer in producers:
            producer.poll(0)
        got_any = False
        for consumer in consumers:
            for message in consumer.consume(2000, 0):
                if message.error() is None:
                    partition, offset = message.partition(), message.offset()
                    assert partition is not None and offset is not None
                    ranges = received.get(partition)
                    if ranges is None:
                        ranges = received[partition] = _Ranges()
                    ranges.add(offset)
                    consumed += 1
                    got_any = True
        if now >= status_due:
            queued = sum(len(producer) for producer in producers)
            assigned = sum(len(consumer.assignment()) for consumer in consumers)
            conn.send(("status", (sent, errors[0], queued, consumed, assigned)))
            status_due = now + STATUS_S
        if not got_any and (rate is not None and due <= 0):
            time.sleep(TICK_S)
    for producer in producers:
        producer.flush(60)
    for consumer in consumers:
        consumer.close()
    conn.send(("ranges", {p: r.ranges for p, r in received.items()}))
    conn.send(("status", (sent, errors[0], 0, consumed, 0)))
    conn.close()


class Workers:
    """The client processes and their latest counts."""

    def __init__(self, bootstrap: str, workers_n: int, active: int) -> None:
        context = multiprocessing.get_context("spawn")  # librdkafka threads: never fork
        per = max(active // 2 // workers_n, 1)
        self.producers_n = self.consumers_n = per * workers_n
        self.conns: list[multiprocessing.connection.Connection] = []
        self.processes = []
        self.status: list[tuple[int, int, int, int, int]] = [(0, 0, 0, 0, 0)] * workers_n
        self.ranges: list[dict[int, list[list[int]]]] = []
        for index in range(workers_n):
            parent, child = context.Pipe()
            process = context.Process(
                target=worker, args=(index, bootstrap, per, per, child), daemon=True
            )
            process.start()
            self.conns.append(parent)
            self.processes.append(process)

    def poll(self, timeout_s: float = 0.0) -> None:
        live = [conn for conn in self.conns if not conn.closed]
        for conn in multiprocessing.connection.wait(live, timeout_s):
            assert isinstance(conn, multiprocessing.connection.Connection)
            index = self.conns.index(conn)
            try:
                while conn.poll(0):
                    kind, data = conn.recv()
                    if kind == "status":
                        self.status[index] = data
                    else:
                        self.ranges.append(data)
            except EOFError:
                conn.close()  # the worker finished (or died: its ranges are missing)

    def send(self, command: str, argument: Any = None) -> None:
        for conn in self.conns:
            if not conn.closed:
                conn.send((command, argument))

    @property
    def acked(self) -> int:
        return sum(sent - failed - queued for sent, failed, queued, _, _ in self.status)

    @property
    def failed(self) -> int:
        return sum(status[1] for status in self.status)

    @property
    def consumed(self) -> int:
        return sum(status[3] for status in self.status)

    @property
    def assigned(self) -> int:
        return sum(status[4] for status in self.status)

    def close(self) -> None:
        self.send("close")
        deadline = time.monotonic() + 120
        while not all(conn.closed for conn in self.conns) and time.monotonic() < deadline:
            self.poll(1.0)
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()


# ---------------------------------------------------------------------- one engine


class Sampler:
    """The broker's samples, taken whenever the driver waits."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[dict[str, float]] = []
        self.marks: dict[str, int] = {}  # phase name -> index of its first sample
        self.due = 0.0

    def take(self, phase: str) -> None:
        if time.monotonic() >= self.due:
            self.samples.append({**sample(self.pid), "phase": phase})  # type: ignore[dict-item]
            self.due = time.monotonic() + SAMPLE_S

    def mark(self, name: str) -> None:
        self.due = 0.0
        self.take(name)
        self.marks[name] = len(self.samples) - 1


def wait_while(workers: Workers, sampler: Sampler, phase: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        workers.poll(min(left, 0.5))
        sampler.take(phase)


def watermarks(bootstrap: str) -> dict[int, int]:
    import confluent_kafka

    reader = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-ends"})
    try:
        return {
            p: reader.get_watermark_offsets(confluent_kafka.TopicPartition(TOPIC, p), 30)[1]
            for p in range(PARTITIONS)
        }
    finally:
        reader.close()


def coverage(ranges: list[dict[int, list[list[int]]]], ends: dict[int, int]) -> tuple[int, int]:
    """(records of [0, end) received at least once, records received more than once)."""
    covered = duplicates = 0
    for partition, end in ends.items():
        spans = sorted(span for part in ranges for span in part.get(partition, ()))
        reach = 0
        for start, stop in spans:
            stop = min(stop, end)
            duplicates += max(0, min(stop, reach) - start)
            if stop > reach:
                covered += stop - max(start, reach)
                reach = stop
    return covered, duplicates


def run_engine(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-soak-", dir=args.path) as directory:
        process, bootstrap = start_broker(os.path.join(directory, "store"), engine)
        sampler = Sampler(process.pid)
        sampler.mark("started")
        try:
            return drive(engine, args, bootstrap, process, sampler)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def drive(
    engine: str,
    args: argparse.Namespace,
    bootstrap: str,
    process: subprocess.Popen[str],
    sampler: Sampler,
) -> dict[str, Any]:
    create_topic(bootstrap)
    idle = open_idle(bootstrap, args.idle)
    sampler.mark("idle_open")
    workers = Workers(bootstrap, args.workers, args.active)
    deadline = time.monotonic() + ASSIGN_TIMEOUT_S
    while workers.assigned < PARTITIONS and time.monotonic() < deadline:
        wait_while(workers, sampler, "joining", 1.0)
    if workers.assigned < PARTITIONS:
        raise RuntimeError(f"only {workers.assigned} of {PARTITIONS} partitions assigned")
    sampler.mark("clients_ready")
    print(f"{engine}: {args.idle} idle connections, clients ready", flush=True)
    # Max rate: as fast as the producers can, acknowledged records per second.
    workers.send("rate", None)
    wait_while(workers, sampler, "max_rate", MEASURE_SKIP_S)
    acked_0, started = workers.acked, time.monotonic()
    wait_while(workers, sampler, "max_rate", MEASURE_S - MEASURE_SKIP_S)
    max_rate = (workers.acked - acked_0) / (time.monotonic() - started)
    half = max_rate / 2
    print(f"{engine}: max rate {max_rate:,.0f} msg/s; soak at {half:,.0f}", flush=True)
    workers.send("rate", 0.0)  # the max-rate phase's queued records go out first
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while sum(status[2] for status in workers.status) and time.monotonic() < deadline:
        wait_while(workers, sampler, "backlog", 1.0)
    workers.send("rate", half / args.workers)
    wait_while(workers, sampler, "ramp", 5.0)
    soak_s = args.minutes * 60
    sampler.mark("soak_start")
    acked_1, started, refreshed = workers.acked, time.monotonic(), time.monotonic()
    idle_refreshed = 0
    while time.monotonic() - started < soak_s:
        wait_while(workers, sampler, "soak", min(SAMPLE_S, soak_s - (time.monotonic() - started)))
        if time.monotonic() - refreshed > IDLE_REFRESH_S:
            idle_refreshed += ask_all(idle, 2)
            refreshed = time.monotonic()
        if len(sampler.samples) == sampler.marks["soak_start"] + int(soak_s / SAMPLE_S / 2):
            sampler.marks["soak_half"] = len(sampler.samples) - 1
    soak_rate = (workers.acked - acked_1) / (time.monotonic() - started)
    sampler.mark("soak_end")
    workers.send("rate", 0.0)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        wait_while(workers, sampler, "drain", 1.0)
        queued = sum(status[2] for status in workers.status)
        if queued == 0 and workers.consumed >= workers.acked:
            break
    idle_alive = ask_all(idle, 3)
    ends = watermarks(bootstrap)
    workers.close()
    sampler.mark("end")
    for conn in idle:
        conn.close()
    exit_code = stop_serve(process, 120)
    covered, duplicates = coverage(workers.ranges, ends)
    produced = workers.acked
    return {
        "bootstrap_flags": "--max-connections 4096 --max-connections-per-ip 4096",
        "idle_connections": args.idle,
        "idle_answering_at_end": idle_alive,
        "idle_refresh_answers": idle_refreshed,
        "producers": workers.producers_n,
        "consumers": workers.consumers_n,
        "partitions": PARTITIONS,
        "max_rate_msg_s": round(max_rate),
        "soak_target_msg_s": round(half),
        "soak_rate_msg_s": round(soak_rate),
        "soak_minutes": args.minutes,
        "produced_acked": produced,
        "produce_errors": workers.failed,
        "log_end_total": sum(ends.values()),
        "consumed_unique": covered,
        "consumed_duplicates": duplicates,
        # Acked records missing from the log, plus log records no consumer received.
        "lost": max(produced - sum(ends.values()), 0) + sum(ends.values()) - covered,
        "in_log_not_acked": sum(ends.values()) - produced,  # duplicates appended
        "broker_exit_code": exit_code,
        "figures": figures(sampler),
        "samples": sampler.samples,
        "marks": sampler.marks,
    }


def figures(sampler: Sampler) -> dict[str, Any]:
    """Memory and fds at the phase marks; slope and growth over the soak's second half."""
    samples, marks = sampler.samples, sampler.marks
    start, end = marks["soak_start"], marks["soak_end"]
    half = marks.get("soak_half", start)
    soak, second = samples[start : end + 1], samples[half : end + 1]
    points = ("started", "idle_open", "clients_ready", "soak_start", "soak_half", "soak_end")

    def at(field: str) -> dict[str, float]:
        return {name: round(samples[marks[name]][field], 1) for name in points if name in marks}

    def slope(field: str) -> float:  # least squares, MiB per minute
        xs = [(s["t"] - second[0]["t"]) / 60 for s in second]
        ys = [s[field] for s in second]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mean_x) ** 2 for x in xs) or 1.0
        covar = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
        return round(covar / var, 3)

    def growth_pct(field: str) -> float:
        return round((samples[end][field] / samples[half][field] - 1) * 100, 2)

    def span(rows: list[dict[str, float]], field: str) -> list[int]:
        return [min(int(s[field]) for s in rows), max(int(s[field]) for s in rows)]

    return {
        "rss_mib": at("VmRSS"),
        "rss_anon_mib": at("RssAnon"),
        "rss_file_mib": at("RssFile"),
        "second_half_minutes": round((samples[end]["t"] - samples[half]["t"]) / 60, 2),
        "rss_slope_mib_per_min_second_half": slope("VmRSS"),
        "rss_anon_slope_mib_per_min_second_half": slope("RssAnon"),
        "rss_growth_pct_second_half": growth_pct("VmRSS"),
        "rss_anon_growth_pct_second_half": growth_pct("RssAnon"),
        "fds_mid": int(samples[half]["fds"]),
        "fds_min_max_soak": span(soak, "fds"),
        "fds_min_max_second_half": span(second, "fds"),
        "fds_sockets_min_max_soak": span(soak, "fds_sockets"),
        "fds_files_min_max_soak": span(soak, "fds_files"),
        "fds_files_max_first_half": span(samples[start : half + 1], "fds_files")[1],
        "fds_files_max_second_half": span(second, "fds_files")[1],
        "threads_min_max_soak": span(soak, "threads"),
    }


def targets(engine: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    fig = result["figures"]
    sockets_low, sockets_high = fig["fds_sockets_min_max_soak"]
    files_first, files_second = fig["fds_files_max_first_half"], fig["fds_files_max_second_half"]
    files_growth_pct = round((files_second / max(files_first, 1) - 1) * 100, 1)
    idle = result["idle_connections"]
    active = result["producers"] + result["consumers"]
    minutes = result["soak_minutes"]

    def row(
        name: str, value: float, unit: str, target: str, met: bool, **peer: Any
    ) -> dict[str, Any]:
        return {
            "row": f"{name} ({engine})", "value": value, "unit": unit,
            "peer": peer.get("peer"), "peer_value": peer.get("peer_value"),
            "ratio": peer.get("ratio"), "target": target, "met": bool(met),
        }  # fmt: skip

    return [
        row(f"{idle} idle + {active} active connections held {minutes} min",
            result["idle_answering_at_end"], "idle connections answering at the end",
            f"all {idle} answer", result["idle_answering_at_end"] == idle),
        row(f"RSS (anonymous) growth, second half of {minutes} min at half max rate",
            fig["rss_anon_growth_pct_second_half"], "%", f"< {RSS_GROWTH_MAX_PCT}% (flat)",
            fig["rss_anon_growth_pct_second_half"] < RSS_GROWTH_MAX_PCT),
        row(f"socket fds change during {minutes} min", sockets_high - sockets_low, "fds",
            "0 (flat)", sockets_high == sockets_low),
        row(f"file fds peak, second half vs first half of {minutes} min", files_growth_pct,
            "%", f"<= {FILE_FDS_SLACK_PCT:g}% (flat: rolls and deletions)",
            files_growth_pct <= FILE_FDS_SLACK_PCT),
        row("records lost (consumed = produced)", result["lost"], "messages",
            "0, and the log holds exactly the acked records",
            result["lost"] == 0 and result["in_log_not_acked"] == 0
            and result["produce_errors"] == 0),
        row("soak rate held", result["soak_rate_msg_s"], "msg/s", ">= 90% of half the max rate",
            result["soak_rate_msg_s"] >= 0.9 * result["soak_target_msg_s"],
            peer="max rate", peer_value=result["max_rate_msg_s"],
            ratio=round(result["soak_rate_msg_s"] / max(result["max_rate_msg_s"], 1), 3)),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=1.0, help="soak length per engine")
    parser.add_argument("--engines", default="commitlog,segmented")
    parser.add_argument("--idle", type=int, default=1000, help="idle connections")
    parser.add_argument("--active", type=int, default=100, help="producers + consumers")
    parser.add_argument("--workers", type=int, default=2, help="client processes")
    parser.add_argument("--path", default=None, help="where the stores go (a temp dir)")
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16_384)), hard))
    loads = [load_sample()]
    engines: dict[str, Any] = {}
    rows = []
    for engine in args.engines.split(","):
        engines[engine] = run_engine(engine, args)
        loads.append(load_sample())
        rows += targets(engine, engines[engine])
        shown = {k: v for k, v in engines[engine].items() if k not in ("samples", "marks")}
        print(f"{engine}: {shown}", flush=True)
    for row in rows:
        print(f"{row['row']}: {row['value']} {row['unit']} (target {row['target']}): "
              f"{'met' if row['met'] else 'MISSED'}")  # fmt: skip
    write_results(
        args.output,
        {
            "machine": machine_info(),
            "load": loads,
            "command": "python -m bench.broker_soak " + " ".join(argv or sys.argv[1:]),
            "value_bytes": len(VALUE),
            "engines": engines,
            "targets": rows,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
