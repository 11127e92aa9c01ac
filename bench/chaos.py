"""Issue 18's chaos suite: a Jepsen-style history check of replication on loopback.

    python -m bench.chaos --seconds 60 --seed 1 [2 ...] [--out bench/results/chaos.json]
        [--faults kill,pause,partition,powercut] [--failover | --no-failover] [--unclean]
        [--bootstrap both|leader] [--keep]

Two ``mqstore serve`` processes (bench.chaos_cluster): A leads, B follows it through
a proxy this process controls (bench.chaos_proxy). The workload: confluent-kafka
producers (acks=all, enable.idempotence, unique values, a fixed partition per value,
bootstrap = both nodes) record each send's outcome from its delivery callback, and
confluent-kafka consumers in one group record every record they poll, with their
assignment number (a new one after each rebalance callback). The nemesis follows a
schedule drawn from the seed: SIGKILL and restart a node, SIGSTOP/SIGCONT a node, cut
the replication link (refused or blackholed) and heal it, a power cut of one node
(its store on PowerFS), and, with ``--failover``, ``mqstore promote`` of the follower
(``--unclean`` lets the schedule force it; the values acked before a forced step may
then be lost, and are counted apart). One fault at a time, healed before the next.

After the run: everything healed, the producers flushed, the replicas left to
converge (the follower's watermarks equal the leader's on every partition), every
partition read from its earliest offset on the final leader, the history checked
(bench.chaos_checker), both brokers stopped cleanly and their CommitLog files
compared byte for byte. The JSON holds the operations, the outcomes, the faults by
kind and the anomalies by kind. Exit status 1 on any anomaly, on replicas that did not
converge, or on logs that differ.

``--bootstrap leader`` gives the clients node A alone: with both nodes, librdkafka
stalls for good after the leader's first restart, because the follower answers
Metadata as the leader (tests/mqstore/replication/test_follower_metadata.py).
Failover (``--failover``) is written against the contract of ``mqstore promote``
(exit 0 when promoted, non-zero when refused) and is off until that command exists.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Final

from bench.chaos_checker import History, Observation, Report, Send, check
from bench.chaos_cluster import Cluster
from bench.common import load_sample, machine_info, write_results
from bench.powerfs import available as powerfs_available

TOPIC: Final = "chaos"
PARTITIONS: Final = 3
GROUP: Final = "chaos-readers"
PRODUCERS: Final = 2
CONSUMERS: Final = 2
SEND_RATE_PER_S: Final = 150  # per producer: enough to fill the log, little CPU
FLUSH_TIMEOUT_S: Final = 90.0  # producers' last sends after the heal
CONVERGE_TIMEOUT_S: Final = 180.0
FINAL_READ_TIMEOUT_S: Final = 120.0
QUIET_S: Final = (1.0, 4.0)  # between two faults
FAULT_KINDS: Final = ("kill", "pause", "partition", "powercut", "failover")
#: librdkafka's syslog level: 3 logs every refused connection of every kill (noise); 0 none.
CLIENT_LOG_LEVEL: Final = int(os.environ.get("MQSTORE_CHAOS_CLIENT_LOG_LEVEL", "0"))
RESULTS: Final = os.path.join(os.path.dirname(__file__), "results", "chaos.json")


class Recorder:
    """The history, written by the workload's threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sends: dict[bytes, Send] = {}
        self.observations: list[Observation] = []
        self.errors: Counter[str] = Counter()
        self.loss_allowed: set[bytes] = set()
        self.crashed: list[str] = []  # workers an exception ended (see _guarded)

    def sent(self, send: Send) -> None:
        with self.lock:
            previous = self.sends.get(send.value)
            assert previous is None or previous.outcome == "unknown", (previous, send)
            self.sends[send.value] = send

    def observed(self, seen: Observation) -> None:
        with self.lock:
            self.observations.append(seen)

    def error(self, where: str, code: str) -> None:
        with self.lock:
            self.errors[f"{where}:{code}"] += 1

    def allow_loss_of_acked(self) -> int:
        """An unclean step: every value acked so far may be lost; how many."""
        with self.lock:
            acked = {v for v, s in self.sends.items() if s.outcome == "acked"}
            self.loss_allowed |= acked
            return len(acked)


def _produce(name: str, bootstrap: str, stop: threading.Event, recorder: Recorder) -> None:
    """Send unique values at SEND_RATE_PER_S until ``stop``, then flush; a producer
    hit by a fatal error is replaced (its unanswered sends stay unknown)."""
    from confluent_kafka import KafkaException, Producer

    pending: dict[bytes, int] = {}  # value -> partition, sent and not yet answered
    fatal = threading.Event()

    def delivered(error: Any, message: Any) -> None:
        value = message.value()
        partition = pending.pop(value)
        if error is None:
            recorder.sent(
                Send(
                    value=value,
                    partition=message.partition(),
                    outcome="acked",
                    offset=message.offset(),  # None: acknowledged implicitly (see Send)
                )
            )
            assert message.partition() == partition
        else:
            recorder.sent(Send(value=value, partition=partition, outcome="unknown"))
            recorder.error("send", error.name())

    def on_error(error: Any) -> None:
        recorder.error("producer", error.name())
        if error.fatal():
            fatal.set()

    config = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "message.timeout.ms": 60_000,
        "request.timeout.ms": 10_000,
        "error_cb": on_error,
        "log_level": CLIENT_LOG_LEVEL,
    }
    producer = Producer(config)
    sequence = 0
    interval_s = 1.0 / SEND_RATE_PER_S
    next_at = time.monotonic()
    while not stop.is_set():
        if fatal.is_set():
            producer.flush(10)
            _give_up(pending, recorder)
            fatal.clear()
            producer = Producer(config)
        value = b"%s-%08d" % (name.encode(), sequence)
        partition = sequence % PARTITIONS
        sequence += 1
        try:
            pending[value] = partition
            producer.produce(TOPIC, value, partition=partition, on_delivery=delivered)
        except (BufferError, KafkaException) as error:
            pending.pop(value, None)
            recorder.sent(Send(value=value, partition=partition, outcome="failed"))
            recorder.error("produce", type(error).__name__)
        producer.poll(0)
        next_at += interval_s
        time.sleep(max(0.0, next_at - time.monotonic()))
    producer.flush(FLUSH_TIMEOUT_S)
    _give_up(pending, recorder)


def _guarded(
    work: Callable[[str, str, threading.Event, Recorder], None],
    name: str,
    bootstrap: str,
    stop: threading.Event,
    recorder: Recorder,
) -> None:
    """Run a worker; an exception that ends it is recorded (``crashed``), and the run
    fails on it: a producer or consumer that died early silently thins the history."""
    try:
        work(name, bootstrap, stop, recorder)
    except BaseException as error:
        recorder.crashed.append(f"{name}: {error!r}")
        raise


def _give_up(pending: dict[bytes, int], recorder: Recorder) -> None:
    for value, partition in list(pending.items()):
        recorder.sent(Send(value=value, partition=partition, outcome="unknown"))
    pending.clear()


def _consume(name: str, bootstrap: str, stop: threading.Event, recorder: Recorder) -> None:
    """Poll as a member of GROUP until ``stop``, recording every record."""
    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 1000,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "error_cb": lambda error: recorder.error("consumer", error.name()),
            "log_level": CLIENT_LOG_LEVEL,
        }
    )
    assignment = [0]

    def rebalanced(_consumer: Any, _partitions: Any) -> None:
        assignment[0] += 1  # a new continuous assignment starts

    consumer.subscribe([TOPIC], on_assign=rebalanced, on_revoke=rebalanced, on_lost=rebalanced)
    while not stop.is_set():
        for message in consumer.consume(500, 0.5):
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    recorder.error("fetch", error.name())
                continue
            partition, offset, value = _placed(message)
            recorder.observed(
                Observation(
                    consumer=name,
                    assignment=assignment[0],
                    partition=partition,
                    offset=offset,
                    value=value,
                )
            )
    consumer.close()


def _placed(message: Any) -> tuple[int, int, bytes]:
    """(partition, offset, value) of a fetched record (never None for a record)."""
    partition, offset, value = message.partition(), message.offset(), message.value()
    assert partition is not None and offset is not None and value is not None, message
    return int(partition), int(offset), bytes(value)


def _watermarks(bootstrap: str) -> list[int] | None:
    """The high watermark of every partition as ``bootstrap`` alone answers, or None."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-watermarks"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=5)[1]
            for p in range(PARTITIONS)
        ]
    except KafkaException:
        return None
    finally:
        consumer.close()


def _converge(cluster: Cluster) -> tuple[bool, list[int] | None]:
    """Wait until the follower's watermarks equal the leader's, twice in a row."""
    leader = cluster.nodes[cluster.leader].address
    follower = cluster.nodes[cluster.follower].address
    deadline = time.monotonic() + CONVERGE_TIMEOUT_S
    agreed: list[int] | None = None
    while time.monotonic() < deadline:
        mine, theirs = _watermarks(leader), _watermarks(follower)
        if mine is not None and mine == theirs:
            if agreed == mine:
                return True, mine
            agreed = mine
        else:
            agreed = None
        time.sleep(1.0)
    return False, agreed


def _final_read(bootstrap: str, ends: list[int]) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of every partition, from the earliest offset to ``ends``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-final",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    final: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
    done = {p for p in range(PARTITIONS) if ends[p] == 0}
    deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
    while len(done) < PARTITIONS and time.monotonic() < deadline:
        for message in consumer.consume(1000, 1.0):
            if message.error() is not None:
                continue
            partition, offset, value = _placed(message)
            final[partition].append((offset, value))
            if offset + 1 >= ends[partition]:
                done.add(partition)
    consumer.close()
    if len(done) < PARTITIONS:
        raise RuntimeError(f"the final read stopped short: {done} of {ends}")
    return final


def schedule(seed: int, seconds: float, kinds: list[str], *, unclean: bool) -> list[dict[str, Any]]:
    """The nemesis's steps drawn from ``seed``: each {kind, node, wait_s, ...} (a pure
    function: the same seed gives the same schedule)."""
    rng = random.Random(seed)
    steps: list[dict[str, Any]] = []
    planned_s = 0.0
    while True:
        step: dict[str, Any] = {
            "kind": rng.choice(kinds),
            "node": rng.choice(["leader", "follower"]),
            "wait_s": round(rng.uniform(*QUIET_S), 2),
        }
        if step["kind"] == "kill":
            step["down_s"] = round(rng.uniform(0.2, 3.0), 2)
        elif step["kind"] == "pause":
            step["paused_s"] = round(rng.uniform(0.5, 5.0), 2)
        elif step["kind"] == "partition":
            step["mode"] = rng.choice(["refuse", "blackhole"])
            step["cut_s"] = round(rng.uniform(1.0, 6.0), 2)
        elif step["kind"] == "powercut":
            step["cut_seed"] = rng.randrange(1 << 30)
        elif step["kind"] == "failover":
            step["unclean"] = unclean and rng.random() < 0.3
        planned_s += step["wait_s"] + max(step.get(k, 1.0) for k in ("down_s", "paused_s", "cut_s"))
        if planned_s > seconds:
            return steps
        steps.append(step)


def _apply(
    cluster: Cluster, step: dict[str, Any], recorder: Recorder, started: float
) -> dict[str, Any]:
    """Run one step; what happened (for the JSON; ``at_s`` from ``started``)."""
    name = cluster.leader if step["node"] == "leader" else cluster.follower
    kind = step["kind"]
    began = time.monotonic()
    done: dict[str, Any] = {"kind": kind, "node": name, "at_s": round(began - started, 2)}
    if kind == "kill":
        cluster.kill(name, step["down_s"])
    elif kind == "pause":
        cluster.pause(name, step["paused_s"])
    elif kind == "partition":
        cluster.partition(step["mode"], step["cut_s"])
        done["node"] = "link"
        done["mode"] = step["mode"]
    elif kind == "powercut":
        done["cut"] = cluster.power_cut(name, step["cut_seed"])
    elif kind == "failover":
        done["node"] = cluster.follower
        if step["unclean"]:
            done["loss_allowed"] = recorder.allow_loss_of_acked()
        done["accepted"], done["said"] = cluster.promote(unclean=step["unclean"])
        done["unclean"] = step["unclean"]
    done["took_s"] = round(time.monotonic() - began, 2)
    return done


def run(
    seconds: float,
    seed: int,
    kinds: list[str],
    *,
    unclean: bool,
    workdir: str,
    bootstrap: str = "both",
) -> dict[str, Any]:
    """One chaos run; its results (see the module docstring)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster = Cluster(workdir, powerfs="powercut" in kinds)
    recorder = Recorder()
    operations: list[dict[str, Any]] = []
    stop = threading.Event()
    try:
        cluster.start()
        admin = AdminClient({"bootstrap.servers": cluster.nodes["A"].address})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
        clients = cluster.bootstrap if bootstrap == "both" else cluster.nodes["A"].address
        workers = [
            threading.Thread(
                target=_guarded, args=(_produce, f"p{i}", clients, stop, recorder), daemon=True
            )
            for i in range(PRODUCERS)
        ]
        workers += [
            threading.Thread(
                target=_guarded, args=(_consume, f"c{i}", clients, stop, recorder), daemon=True
            )
            for i in range(CONSUMERS)
        ]
        for worker in workers:
            worker.start()
        started = time.monotonic()
        for step in schedule(seed, seconds, kinds, unclean=unclean):
            time.sleep(step["wait_s"])
            if time.monotonic() - started > seconds:
                break
            operations.append(_apply(cluster, step, recorder, started))
            print(f"chaos: {operations[-1]}", flush=True)
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        cluster.heal_all()
        stop.set()
        for worker in workers:
            worker.join(FLUSH_TIMEOUT_S + 30)
            assert not worker.is_alive(), f"{worker.name} did not stop"
        print("chaos: workload stopped; waiting for the replicas to converge", flush=True)
        converged, ends = _converge(cluster)
        final: dict[int, list[tuple[int, bytes]]] = {}
        if converged and ends is not None:
            final = _final_read(cluster.nodes[cluster.leader].address, ends)
        report = check(
            History(
                sends=list(recorder.sends.values()),
                observations=recorder.observations,
                final=final,
                loss_allowed=frozenset(recorder.loss_allowed),
            )
        )
        statuses = {name: node.stop() for name, node in cluster.nodes.items()}
        identical = converged and cluster.commitlog_files("A") == cluster.commitlog_files("B")
        logs = {name: node.log_tail(1500) for name, node in cluster.nodes.items()}
    finally:
        stop.set()
        cluster.close()
    return _results(
        seconds,
        seed,
        kinds,
        bootstrap,
        operations,
        recorder,
        report,
        converged,
        identical,
        statuses,
        logs,
        cluster,
    )


def _results(
    seconds: float,
    seed: int,
    kinds: list[str],
    bootstrap: str,
    operations: list[dict[str, Any]],
    recorder: Recorder,
    report: Report,
    converged: bool,
    identical: bool,
    statuses: dict[str, int],
    logs: dict[str, str],
    cluster: Cluster,
) -> dict[str, Any]:
    faults = Counter(op["kind"] for op in operations)
    anomalies = report.anomalies
    return {
        "seconds": seconds,
        "seed": seed,
        "fault_kinds": kinds,
        "bootstrap": bootstrap,
        "operations": len(recorder.sends) + len(recorder.observations) + len(operations),
        "sends": {
            "acked": report.acked,
            "failed": report.failed,
            "unknown": report.unknown,
            "acked_without_offset": report.acked_without_offset,
        },
        "observed": report.observed,
        "final_records": report.final_records,
        "faults": dict(faults),
        "steps": operations,
        "anomalies": report.counts,
        "anomaly_examples": [
            {"kind": a.kind, "partition": a.partition, "offset": a.offset, "detail": a.detail}
            for a in report.examples
        ],
        "allowed": {"lost": report.allowed_lost, "inconsistent": report.allowed_inconsistent},
        "errors": dict(recorder.errors.most_common(30)),
        "workers_crashed": recorder.crashed,
        "converged": converged,
        "logs_identical": identical,
        "exit_statuses": statuses,
        "final_leader": cluster.leader,
        "promotions": cluster.promotions,
        "proxy": {"connections": cluster.proxy.connections_total, "cuts": cluster.proxy.cuts_total},
        "node_logs": logs if anomalies or not identical else {},
        "targets": [
            {
                "row": f"chaos anomalies ({seconds:.0f} s, seed {seed})",
                "value": float(anomalies),
                "unit": "anomalies",
                "peer": None,
                "peer_value": None,
                "ratio": None,
                "target": "0",
                "met": anomalies == 0,
            },
            {
                "row": f"chaos workers that crashed ({seconds:.0f} s, seed {seed})",
                "value": float(len(recorder.crashed)),
                "unit": "workers",
                "peer": None,
                "peer_value": None,
                "ratio": None,
                "target": "0",
                "met": not recorder.crashed,
            },
            {
                "row": f"chaos replicas byte-identical ({seconds:.0f} s, seed {seed})",
                "value": float(identical),
                "unit": "bool",
                "peer": None,
                "peer_value": None,
                "ratio": None,
                "target": "1",
                "met": identical,
            },
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, nargs="+", default=[1], help="one run per seed")
    parser.add_argument(
        "--faults",
        default="kill,pause,partition,powercut",
        help=f"comma-separated, from {','.join(FAULT_KINDS)}",
    )
    parser.add_argument(
        "--failover",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="promote the follower in the schedule (needs mqstore promote)",
    )
    parser.add_argument("--unclean", action="store_true", help="some promotions forced")
    parser.add_argument(
        "--bootstrap",
        choices=["both", "leader"],
        default="both",
        help="the clients' bootstrap: both nodes, or node A alone (see the "
        "docstring: librdkafka stalls with both today)",
    )
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--keep", action="store_true", help="keep the stores and node logs")
    args = parser.parse_args(argv)
    kinds = [k for k in args.faults.split(",") if k]
    unknown = set(kinds) - set(FAULT_KINDS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}")
    if args.failover and "failover" not in kinds:
        kinds.append("failover")
    if "powercut" in kinds and powerfs_available() is not None:
        print(f"chaos: no power cuts: {powerfs_available()}", file=sys.stderr)
        kinds.remove("powercut")
    runs = []
    for seed in args.seed:
        workdir = tempfile.mkdtemp(prefix="mqstore-chaos-")
        try:
            results = run(
                args.seconds,
                seed,
                kinds,
                unclean=args.unclean,
                workdir=workdir,
                bootstrap=args.bootstrap,
            )
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        print(
            f"chaos seed {seed} in {workdir}: sends {results['sends']}, "
            f"faults {results['faults']}, anomalies {results['anomalies']}, "
            f"converged {results['converged']}, "
            f"identical {results['logs_identical']}, "
            f"workers crashed {results['workers_crashed']}",
            flush=True,
        )
        runs.append(results)
    bad = [
        r["seed"]
        for r in runs
        if sum(r["anomalies"].values())
        or not r["converged"]
        or not r["logs_identical"]
        or r["workers_crashed"]
    ]
    write_results(
        args.out,
        {
            "benchmark": "chaos",
            "command": " ".join(["python -m bench.chaos", *(argv or sys.argv[1:])]),
            "machine": machine_info(),
            "load": load_sample(),
            "runs": runs,
            "targets": [row for r in runs for row in r["targets"]],
        },
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
