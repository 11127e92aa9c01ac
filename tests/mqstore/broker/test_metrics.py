"""The Prometheus endpoint, scraped over HTTP after real client traffic (librdkafka),
and ``mqstore stats --broker`` reading it."""

from __future__ import annotations

import struct
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from prometheus_client.parser import text_string_to_metric_families

from mqstore.broker import Broker, BrokerConfig
from mqstore.broker.metrics import count_records, error_codes
from tests.mqstore.engines import ENGINES, open_engine

MESSAGES = 40


@pytest.fixture(params=ENGINES)
def metered(tmp_path: Any, request: pytest.FixtureRequest) -> Iterator[Broker]:
    store = open_engine(str(request.param), tmp_path / "store")
    with Broker(store, BrokerConfig(port=0, metrics_port=0)) as broker:
        yield broker
    store.close()


def scrape(broker: Broker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    server = broker.metrics_server
    assert server is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as page:
        text = page.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: dict[Any, float], name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


def test_counters_move_by_the_traffic(metered: Broker) -> None:
    before = scrape(metered)
    assert total(before, "mqstore_broker_produced_messages_total") == 0
    producer = Producer({"bootstrap.servers": metered.bootstrap, "linger.ms": 5})
    for i in range(MESSAGES):
        producer.produce("m", value=b"x" * 100, key=b"%d" % i)
    assert producer.flush(15) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": metered.bootstrap,
            "group.id": "lagging",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["m"])
    seen = 0
    last = None
    for _ in range(60):
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen, last = seen + 1, message
        if seen == 25:
            break
    assert last is not None
    consumer.commit(message=last, asynchronous=False)  # committed offset 25 of 40
    consumer.close()
    producer = None

    after = scrape(metered)
    assert total(after, "mqstore_broker_produced_messages_total") == MESSAGES
    assert total(after, "mqstore_broker_fetched_messages_total") >= 25
    assert total(after, "mqstore_broker_requests_total", api="Produce") >= 1
    assert total(after, "mqstore_broker_requests_total", api="Fetch") >= 1
    assert total(after, "mqstore_broker_request_seconds_count", api="Produce") == total(
        after, "mqstore_broker_requests_total", api="Produce"
    )
    # Each produced record carries at least its 100-byte value.
    assert total(after, "mqstore_broker_request_bytes_total", api="Produce") > 100 * MESSAGES
    assert total(after, "mqstore_broker_response_bytes_total", api="Fetch") > 100 * 25
    assert total(after, "mqstore_broker_connections_accepted_total") >= 2
    labels = {"group": "lagging", "topic": "m", "partition": "0"}
    assert total(after, "mqstore_broker_group_committed_offset", **labels) == 25
    assert total(after, "mqstore_broker_group_lag", **labels) == MESSAGES - 25
    assert any(name.startswith("mqstore_store_") for name, _ in after)


def test_error_codes_are_counted(tmp_path: Any) -> None:
    store = open_engine("commitlog", tmp_path / "store")
    config = BrokerConfig(port=0, metrics_port=0, auto_create_topics=False)
    with Broker(store, config) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 1500})
        producer.produce("absent", b"x")
        producer.flush(3)
        samples = scrape(broker)
    store.close()
    assert total(samples, "mqstore_broker_response_errors_total", code="3") >= 1


def test_stats_broker_prints_the_endpoint(metered: Broker) -> None:
    server = metered.metrics_server
    assert server is not None
    result = subprocess.run(
        [sys.executable, "-m", "mqstore", "stats", "--broker", f"127.0.0.1:{server.port}"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    out = result.stdout.decode()
    assert "mqstore_broker_connections_open{} 0" in out
    assert "_bucket" not in out


def test_stats_broker_unreachable_is_a_user_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mqstore", "stats", "--broker", "127.0.0.1:1"],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert b"cannot read" in result.stderr


def batch(records: int, length: int = 70) -> bytes:
    """A v2 batch header with ``records`` in its count (the rest is padding)."""
    body = bytearray(12 + length)
    struct.pack_into(">qi", body, 0, 0, length)
    struct.pack_into(">i", body, 57, records)
    return bytes(body)


def test_count_records() -> None:
    assert count_records(None) == 0
    assert count_records(batch(3) + batch(5)) == 8
    assert count_records([batch(2), batch(4)]) == 6
    assert count_records(batch(3) + batch(5)[:30]) == 3  # a partial tail is not counted
    assert count_records(b"\x00" * 10) == 0


def test_error_codes_walks_nested_fields() -> None:
    from kafka.protocol.producer import ProduceResponse

    part = ProduceResponse.TopicProduceResponse.PartitionProduceResponse
    response = ProduceResponse(
        version=8,
        responses=[
            ProduceResponse.TopicProduceResponse(
                name="t",
                partition_responses=[
                    part(index=0, error_code=3, base_offset=-1, record_errors=[]),
                    part(index=1, error_code=0, base_offset=5, record_errors=[]),
                ],
            )
        ],
        throttle_time_ms=0,
    )
    assert list(error_codes(response)) == [3]
