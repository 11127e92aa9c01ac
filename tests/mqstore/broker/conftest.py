"""A broker started by the test on a free loopback port, over either engine."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from mqstore.broker import Broker, BrokerConfig
from tests.mqstore.engines import ENGINES, open_engine

FRAME = struct.Struct(">i")


@pytest.fixture(params=ENGINES)
def engine_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def engine(tmp_path: Any, engine_kind: str) -> Iterator[Any]:
    store = open_engine(engine_kind, tmp_path / "store")
    yield store
    store.close()


@pytest.fixture
def broker(engine: Any) -> Iterator[Broker]:
    with Broker(engine, BrokerConfig(port=0)) as running:
        yield running


@pytest.fixture
def commitlog_broker(tmp_path: Any) -> Iterator[Broker]:
    """A broker over the CommitLog engine only (tests of protocol, not engines)."""
    store = open_engine("commitlog", tmp_path / "store")
    with Broker(store, BrokerConfig(port=0, idle_timeout_ms=1_500)) as running:
        yield running
    store.close()


def raw_request(port: int, frame: bytes, timeout_s: float = 5.0) -> bytes | None:
    """Send one frame on a new connection; the response payload, or None when the
    broker closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
        conn.sendall(frame)
        return read_frame(conn)


def read_frame(conn: socket.socket) -> bytes | None:
    head = _read_exactly(conn, FRAME.size)
    if head is None:
        return None
    (size,) = FRAME.unpack(head)
    return _read_exactly(conn, size)


def _read_exactly(conn: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        try:
            chunk = conn.recv(size - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def librdkafka_read(
    bootstrap: str, topic: str, offset: int, count: int, timeout_s: float = 30.0
) -> list[Any]:
    """Up to ``count`` messages of ``topic``'s partition 0 from ``offset``, read by a
    librdkafka consumer that checks CRCs (assign, no commits); each without error."""
    import time

    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "g", "check.crcs": True,
         "enable.auto.commit": False}
    )  # fmt: skip
    got: list[Any] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + timeout_s
        while len(got) < count and time.monotonic() < deadline:
            for message in consumer.consume(min(1_000, count - len(got)), 0.5):
                assert message.error() is None, message.error()
                got.append(message)
    finally:
        consumer.close()
    return got
