"""The server's lifecycle and bounds: start/stop around an embedded store, bind
failures, connection limits, and in-flight requests drained by stop."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
from kafka import KafkaProducer

from mqstore.broker import Broker, BrokerConfig
from mqstore.commitlog.errors import ConfigError
from tests.mqstore.broker.conftest import read_frame
from tests.mqstore.broker.test_protocol import api_versions, assert_serving, request_frame
from tests.mqstore.engines import open_engine


@pytest.mark.parametrize("engine", ["commitlog", "segmented"])
def test_a_store_closed_under_the_broker_gets_storage_errors_not_a_dead_broker(
    tmp_path: Any, engine: str
) -> None:
    """The embedding service closes the store while the broker serves: requests get
    KAFKA_STORAGE_ERROR (56), the broker stays up and stops cleanly."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    store = open_engine(engine, tmp_path / "store")
    store.create_topic("t", partitions=1)
    broker = Broker(store, BrokerConfig(port=0)).start()
    try:
        store.close()
        consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": "g"}
        )
        try:
            with pytest.raises(confluent_kafka.KafkaException) as refused:
                consumer.get_watermark_offsets(confluent_kafka.TopicPartition("t", 0), timeout=10)
            assert refused.value.args[0].code() == confluent_kafka.KafkaError.KAFKA_STORAGE_ERROR
        finally:
            consumer.close()
        assert_serving(broker.port)  # it still answers
    finally:
        broker.stop()


def test_embedded_api_keeps_working_while_serving(tmp_path: Any) -> None:
    store = open_engine("commitlog", tmp_path / "store")
    try:
        with Broker(store, BrokerConfig(port=0)) as broker:
            producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
            producer.send("both", value=b"wire").get(timeout=20)
            producer.close(timeout=5)
            store.put("both", 0, b"embedded")
            assert [bytes(m.body) for m in store.get("both", 0, 0, 2)] == [b"wire", b"embedded"]
        assert store.put("both", 0, b"after stop").queue_offset == 2  # the store stays open
    finally:
        store.close()


def test_a_port_in_use_fails_start(tmp_path: Any) -> None:
    store = open_engine("commitlog", tmp_path / "store")
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        broker = Broker(store, BrokerConfig(port=taken.getsockname()[1]))
        with pytest.raises(OSError):
            broker.start()
        broker.stop()
    finally:
        taken.close()
        store.close()


def test_connections_beyond_the_bound_are_closed(tmp_path: Any) -> None:
    store = open_engine("commitlog", tmp_path / "store")
    config = BrokerConfig(port=0, connections_max=2)
    try:
        with Broker(store, config) as broker:
            held = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(2)]
            time.sleep(0.3)  # both accepted
            with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as third:
                third.sendall(request_frame(_api_versions_request(), 1))
                assert read_frame(third) is None  # refused
            for conn in held:
                conn.close()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # freed slots serve again
                try:
                    assert api_versions(broker.port, 0).error_code == 0
                    break
                except AssertionError:
                    time.sleep(0.1)
            else:
                raise AssertionError("no connection served after the others closed")
    finally:
        store.close()


def _api_versions_request() -> Any:
    from kafka.protocol.metadata import ApiVersionsRequest

    return ApiVersionsRequest(version=0)


def test_stop_answers_a_long_poll_in_flight(tmp_path: Any) -> None:
    """A Fetch waiting for data when stop() is called is answered, not dropped."""
    from kafka.protocol.consumer import FetchRequest, FetchResponse

    store = open_engine("commitlog", tmp_path / "store")
    store.create_topic("idle", 1)
    broker = Broker(store, BrokerConfig(port=0)).start()
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, fetch_offset=0, partition_max_bytes=1 << 20
    )
    fetch = FetchRequest(
        version=11, replica_id=-1, max_wait_ms=20_000, min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic="idle", partitions=[partition])],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip
    answers: list[Any] = []
    conn = socket.create_connection(("127.0.0.1", broker.port), timeout=30)
    try:
        conn.sendall(request_frame(fetch, 5))
        reader = threading.Thread(target=lambda: answers.append(read_frame(conn)))
        reader.start()
        time.sleep(0.5)  # the fetch is waiting
        started = time.monotonic()
        broker.stop()
        reader.join(10)
        assert time.monotonic() - started < 10
    finally:
        conn.close()
        store.close()
    assert answers and answers[0] is not None
    response = FetchResponse.decode(answers[0][4:], version=11)
    assert response.responses[0].partitions[0].error_code == 0


def test_config_bounds() -> None:
    with pytest.raises(ConfigError):
        BrokerConfig(frame_bytes_max=0)
    with pytest.raises(ConfigError):
        BrokerConfig(session_timeout_min_ms=10, session_timeout_max_ms=5)
    assert BrokerConfig(host="0.0.0.0").advertised == "127.0.0.1"


def test_queued_request_bytes_are_bounded_and_given_back(tmp_path: Any) -> None:
    """With room for about one request, pipelined requests still all get answered
    in order, and the bytes come back when connections go (even unanswered ones)."""
    import struct

    from kafka.protocol.metadata import ApiVersionsRequest

    store = open_engine("commitlog", tmp_path / "store")
    try:
        with Broker(store, BrokerConfig(port=0, queued_request_bytes_max=64)) as broker:
            frames = b"".join(
                request_frame(ApiVersionsRequest(version=0), 500 + i) for i in range(20)
            )
            with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as conn:
                conn.sendall(frames)
                ids = []
                for _ in range(20):
                    payload = read_frame(conn)
                    assert payload is not None
                    ids.append(struct.unpack_from(">i", payload)[0])
            assert ids == [500 + i for i in range(20)]
            with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as conn:
                conn.sendall(frames)  # and vanish without reading a response
            deadline = time.monotonic() + 5
            while broker._queued_bytes and time.monotonic() < deadline:
                time.sleep(0.05)
            assert broker._queued_bytes == 0
    finally:
        store.close()


def test_a_frame_announced_and_never_sent_does_not_hold_the_queue(tmp_path: Any) -> None:
    """Regression (review): a client that sends a frame's size and then nothing held
    its reserved request bytes until the idle timeout (10 min by default), so every
    other connection's requests waited behind it. The body has its own deadline."""
    import struct

    from kafka.protocol.metadata import ApiVersionsRequest

    store = open_engine("commitlog", tmp_path / "store")
    config = BrokerConfig(
        port=0, queued_request_bytes_max=1024, frame_bytes_max=1024, request_body_timeout_ms=500
    )
    try:
        with (
            Broker(store, config) as broker,
            socket.create_connection(("127.0.0.1", broker.port), timeout=30) as stalled,
        ):
            stalled.sendall(struct.pack(">i", 1000))  # the size, and no body
            time.sleep(0.1)
            with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as conn:
                started = time.monotonic()
                conn.sendall(request_frame(ApiVersionsRequest(version=0), 77))
                payload = read_frame(conn)
                waited = time.monotonic() - started
            assert payload is not None and struct.unpack_from(">i", payload)[0] == 77
            assert waited < 10, waited  # before: the idle timeout (600 s)
            assert read_frame(stalled) is None  # the stalled one was closed
    finally:
        store.close()


def test_connections_closed_for_cause_are_logged_with_the_client_address(
    tmp_path: Any, caplog: Any
) -> None:
    """A frame too large, a request that does not decode, and idling each close the
    connection with a log line naming the client's host:port."""
    import logging
    import struct

    caplog.set_level(logging.INFO, logger="mqstore.broker.server")
    store = open_engine("commitlog", tmp_path / "store")
    config = BrokerConfig(port=0, frame_bytes_max=1024, idle_timeout_ms=300)
    frames = {
        "frame of": struct.pack(">i", 4096),
        "does not decode": struct.pack(">ihhi", 8, 3, 8, 1),  # Metadata v8, body missing
        "idle": b"",
    }
    with Broker(store, config) as broker:
        for cause, frame in frames.items():
            with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as conn:
                conn.sendall(frame)
                assert read_frame(conn) is None
                client = f"127.0.0.1:{conn.getsockname()[1]}"
            time.sleep(0.05)
            assert any(
                client in r.getMessage() and cause in r.getMessage() for r in caplog.records
            ), (cause, [r.getMessage() for r in caplog.records])
    store.close()


def test_a_large_fetch_is_decoded_and_encoded_off_the_event_loop(
    commitlog_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Fetch frame of many partitions takes the CPU for its size (0.3 s for 8 MiB
    measured here): decoding and encoding it on the loop would stall every other
    connection meanwhile, so a large one goes to a worker thread. A small one may stay."""
    from kafka.protocol.consumer import FetchRequest

    import mqstore.broker.server as server

    threads: dict[str, list[str]] = {"decode": [], "encode": []}
    decode, encode = server.decode_request, server.encode_response

    def recording_decode(*args: Any) -> Any:
        threads["decode"].append(threading.current_thread().name)
        return decode(*args)

    def recording_encode(*args: Any) -> Any:
        threads["encode"].append(threading.current_thread().name)
        return encode(*args)

    monkeypatch.setattr(server, "decode_request", recording_decode)
    monkeypatch.setattr(server, "encode_response", recording_encode)
    commitlog_broker.engine.create_topic("wide", 1)
    partition = FetchRequest.FetchTopic.FetchPartition
    request = FetchRequest(
        version=11, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[],
        rack_id="", topics=[FetchRequest.FetchTopic(topic="wide", partitions=[
            partition(partition=0, current_leader_epoch=-1, fetch_offset=0,
                      last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1)
            for _ in range(20_000)
        ])],
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", commitlog_broker.port), timeout=30) as conn:
        conn.sendall(request_frame(request, 7))
        payload = read_frame(conn)
    assert payload is not None and len(payload) > 20_000 * 20
    assert threads["decode"] and threads["encode"]
    assert "broker-loop" not in threads["decode"] + threads["encode"], threads
