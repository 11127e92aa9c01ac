"""Fetch long polls (mqstore.broker.longpoll) over a live broker, both engines: many
parked polls never delay another Fetch's wake-up, a parked poll is answered at its
deadline or at the first append past its offset, and nothing stays parked once its
connection goes."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from kafka.protocol.consumer import FetchRequest, FetchResponse

from mqstore.broker import Broker
from mqstore.engine import ProducerRecord
from tests.mqstore.broker.conftest import read_frame
from tests.mqstore.broker.test_protocol import request_frame

FETCH_VERSION = 11


def fetch_frame(topic: str, offset: int, max_wait_ms: int, correlation_id: int) -> bytes:
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, fetch_offset=offset, partition_max_bytes=1 << 20
    )
    request = FetchRequest(
        version=FETCH_VERSION, replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1,
        max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip
    return request_frame(request, correlation_id)


def records_of(payload: bytes | None) -> bytes:
    assert payload is not None, "the broker closed the connection"
    response = FetchResponse.decode(payload[4:], version=FETCH_VERSION)
    part = response.responses[0].partitions[0]
    assert part.error_code == 0
    return bytes(part.records or b"")


def append(engine: Any, topic: str, value: bytes) -> None:
    engine.append_records(topic, 0, [ProducerRecord(None, value, (), None)])


def wait_read(
    broker: Broker, frames: list[bytes], settle_s: float = 0.3, timeout_s: float = 30.0
) -> None:
    """Until the broker has read ``frames`` and not answered them (its queued request
    bytes), and ``settle_s`` more for their first pass to find nothing and park."""
    expected = sum(len(frame) - 4 for frame in frames)
    deadline = time.monotonic() + timeout_s
    while broker._queued_bytes != expected:
        assert time.monotonic() < deadline, (broker._queued_bytes, expected)
        time.sleep(0.05)
    time.sleep(settle_s)


def wait_gone(broker: Broker, timeout_s: float) -> None:
    """Until no request bytes are held and no connection is open."""
    deadline = time.monotonic() + timeout_s
    while broker._queued_bytes or broker._connections:
        assert time.monotonic() < deadline, (broker._queued_bytes, len(broker._connections))
        time.sleep(0.05)


def test_many_parked_polls_do_not_delay_another_wake_up(broker: Broker) -> None:
    """A Fetch parks on one topic, then 1,024 pipelined long polls (64 connections x
    16 in flight) park on a topic that gets no data; the first Fetch is answered as
    soon as its record is appended. With a thread per parked poll (a pool of 32
    waiting in 500 ms slices) the first Fetch's next slice queued behind the 1,024
    others' (about 16 s)."""
    engine = broker.engine
    engine.create_topic("quiet", 1)
    engine.create_topic("hot", 1)
    port = broker.port
    idle = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(64)]
    hot = socket.create_connection(("127.0.0.1", port), timeout=60)
    quiet = [fetch_frame("quiet", 0, 25_000, i) for i in range(16)]
    wake = fetch_frame("hot", 0, 25_000, 99)
    try:
        hot.sendall(wake)
        wait_read(broker, [wake], settle_s=0.5)
        for conn in idle:
            conn.sendall(b"".join(quiet))
        wait_read(broker, quiet * 64 + [wake], settle_s=2.0)
        answers: list[bytes | None] = []
        reader = threading.Thread(target=lambda: answers.append(read_frame(hot)))
        reader.start()
        appended = time.monotonic()
        append(engine, "hot", b"wake up")
        reader.join(20)
        waited_s = time.monotonic() - appended
        assert answers, "the Fetch was not answered within 20 s of its record"
        assert b"wake up" in records_of(answers[0])
        assert waited_s < 5.0, f"answered {waited_s:.1f} s after the append"
    finally:
        for conn in idle:
            conn.close()
        hot.close()


def test_a_closed_connections_long_polls_are_dropped_at_once(broker: Broker) -> None:
    """Nobody reads their answers: pipelined polls of a connection the client closed
    stop at once, and do not hold request bytes, the connection's slot (counted
    against the bounds per address and in all) and a parked entry until their
    deadline, 25 s here (they did: the slot for 10 s, the bytes for 25)."""
    broker.engine.create_topic("quiet", 1)
    quiet = [fetch_frame("quiet", 0, 25_000, i) for i in range(16)]
    conns = [socket.create_connection(("127.0.0.1", broker.port), timeout=60) for _ in range(8)]
    for conn in conns:
        conn.sendall(b"".join(quiet))
    wait_read(broker, quiet * 8)
    assert broker._long_polls is not None and broker._long_polls.parked == 8 * 16
    for conn in conns:
        conn.close()
    wait_gone(broker, 5.0)
    assert broker._long_polls.parked == 0


def test_a_parked_poll_is_answered_at_its_deadline(broker: Broker) -> None:
    broker.engine.create_topic("quiet", 1)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as conn:
        started = time.monotonic()
        conn.sendall(fetch_frame("quiet", 0, 600, 1))
        assert records_of(read_frame(conn)) == b""
        waited_s = time.monotonic() - started
    assert 0.55 <= waited_s < 10.0, waited_s


def test_a_poll_re_parked_on_a_recent_partition_wakes_on_the_next_append(
    broker: Broker,
) -> None:
    """The consumer's loop: answered, it polls again at the new end; each append
    after that wakes it (the partition stays watched between its polls)."""
    engine = broker.engine
    engine.create_topic("stream", 1)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as conn:
        for offset in range(5):
            frame = fetch_frame("stream", offset, 20_000, offset)
            conn.sendall(frame)
            wait_read(broker, [frame])
            appended = time.monotonic()
            append(engine, "stream", b"record %d" % offset)
            assert b"record %d" % offset in records_of(read_frame(conn))
            assert time.monotonic() - appended < 5.0
