"""librdkafka bootstrapped with a leader and its follower must find the leader again
after the leader restarts (found by the chaos suite, bench/chaos.py: with
``--bootstrap both`` every send after the first kill of the leader timed out).

It failed while both brokers answered Metadata as node 0 at their own address and
named node 0 the leader: librdkafka keeps one address per node id, so once a
Metadata answer from the follower moved node 0 there (the leader was down), every
Produce went to the follower and got NOT_LEADER_OR_FOLLOWER until
message.timeout.ms. A follower's Metadata now names its leader (node id and address)
and itself by its own id (mqstore.replication.node).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

from bench.chaos_cluster import Cluster  # noqa: E402

SENDS = 200
TIMEOUT_MS = 20_000


def _send(producer: Any, first: int) -> dict[str, int]:
    outcomes: dict[str, int] = {}

    def delivered(error: Any, _message: Any) -> None:
        name = "acked" if error is None else error.name()
        outcomes[name] = outcomes.get(name, 0) + 1

    for i in range(first, first + SENDS):
        producer.produce("meta", b"v%d" % i, partition=i % 3, on_delivery=delivered)
        producer.poll(0)
        time.sleep(0.005)
    producer.flush(TIMEOUT_MS / 1000 + 10)
    return outcomes


def test_a_client_of_both_nodes_finds_the_restarted_leader(tmp_path: Any) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster = Cluster(str(tmp_path), powerfs=False)
    try:
        cluster.start()
        admin = AdminClient({"bootstrap.servers": cluster.nodes["A"].address})
        admin.create_topics([NewTopic("meta", 3, 1)])["meta"].result(30)
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": TIMEOUT_MS,
                "log_level": 0,
            }
        )
        assert _send(producer, 0) == {"acked": SENDS}
        cluster.kill("A", 1.0)  # SIGKILL, then serve again on its port
        assert _send(producer, SENDS) == {"acked": SENDS}  # was: all _MSG_TIMED_OUT
    finally:
        cluster.close()
