"""The wire front against bad input, on a raw socket: malformed frames, unknown APIs
and versions, oversized and truncated requests, and a fuzz of the request decoder.
Each case checks that the broker answers or closes that connection, and keeps
serving others (never a crash)."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest

from mqstore.broker import Broker
from mqstore.broker.protocol import (
    APIS,
    ErrorCode,
    MalformedRequestError,
    decode_request,
    peek,
    served,
)
from tests.mqstore.broker.conftest import FRAME, raw_request, read_frame


def request_frame(request: Any, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="raw")
    return bytes(request.encode(header=True, framed=True))


def api_versions(port: int, version: int, correlation_id: int = 1) -> Any:
    frame = request_frame(ApiVersionsRequest(version=min(version, 3)), correlation_id)
    if version > 3:  # the v3 body with the version field raised: a newer client
        frame = frame[:6] + struct.pack(">h", version) + frame[8:]
    payload = raw_request(port, frame)
    assert payload is not None
    (correlation,) = struct.unpack_from(">i", payload)
    assert correlation == correlation_id
    # ApiVersions responses keep header v0 at every version.
    return ApiVersionsResponse.decode(payload[4:], version=min(version, 3))


def assert_serving(port: int) -> None:
    response = api_versions(port, 0, correlation_id=99)
    assert response.error_code == 0


def test_api_versions_lists_what_is_served(commitlog_broker: Broker) -> None:
    response = api_versions(commitlog_broker.port, 3)
    assert response.error_code == 0
    ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert ranges[0] == (0, 8)  # Produce: advertised from 0 for librdkafka, served 3+
    assert ranges[1] == (4, 11)
    assert ranges[18] == (0, 3)
    assert set(ranges) == set(APIS)


def test_api_versions_above_v3_is_answered_in_v0_with_error_35(commitlog_broker: Broker) -> None:
    response = api_versions(commitlog_broker.port, 4)
    assert response.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert [(k.api_key, k.max_version) for k in response.api_keys] == [(18, 3)]


def test_unknown_api_key_closes_the_connection(commitlog_broker: Broker) -> None:
    frame = request_frame(ApiVersionsRequest(version=0), 5)
    frame = frame[:4] + struct.pack(">h", 4242) + frame[6:]
    assert raw_request(commitlog_broker.port, frame) is None
    assert_serving(commitlog_broker.port)


def test_produce_v2_is_refused_though_advertised(commitlog_broker: Broker) -> None:
    frame = request_frame(ApiVersionsRequest(version=0), 5)
    frame = frame[:4] + struct.pack(">hh", 0, 2) + frame[8:]
    assert raw_request(commitlog_broker.port, frame) is None
    assert_serving(commitlog_broker.port)


def test_body_that_does_not_decode_closes_the_connection(commitlog_broker: Broker) -> None:
    frame = request_frame(MetadataRequest(version=8, topics=[]), 5)
    garbled = frame[:14] + b"\xff" * 7  # past the header: an array length of -1, cut short
    garbled = FRAME.pack(len(garbled) - 4) + garbled[4:]
    assert raw_request(commitlog_broker.port, garbled) is None
    assert_serving(commitlog_broker.port)


def test_oversized_and_negative_frames_close_unread(commitlog_broker: Broker) -> None:
    for size in (100 * 1024 * 1024 + 1, -5, 0):
        assert raw_request(commitlog_broker.port, FRAME.pack(size) + b"x" * 16) is None
    assert_serving(commitlog_broker.port)


def test_truncated_request_then_vanishing_client(commitlog_broker: Broker) -> None:
    frame = request_frame(ApiVersionsRequest(version=0), 5)
    with socket.create_connection(("127.0.0.1", commitlog_broker.port)) as conn:
        conn.sendall(frame[: len(frame) - 3])  # the frame is never completed
    assert_serving(commitlog_broker.port)


def test_idle_connection_is_closed(commitlog_broker: Broker) -> None:
    with socket.create_connection(("127.0.0.1", commitlog_broker.port), timeout=10) as conn:
        started = time.monotonic()
        assert read_frame(conn) is None  # idle_timeout_ms=1500 in the fixture
        assert time.monotonic() - started >= 1.0


def test_pipelined_requests_are_answered_in_order(commitlog_broker: Broker) -> None:
    frames = b"".join(
        request_frame(
            MetadataRequest(version=8, topics=None, allow_auto_topic_creation=False)
            if i % 2
            else ApiVersionsRequest(version=0),
            correlation_id=1000 + i,
        )
        for i in range(12)
    )
    with socket.create_connection(("127.0.0.1", commitlog_broker.port), timeout=5) as conn:
        conn.sendall(frames)  # all at once: more than are read ahead (16 in flight)
        ids = []
        for _ in range(12):
            payload = read_frame(conn)
            assert payload is not None
            ids.append(struct.unpack_from(">i", payload)[0])
    assert ids == [1000 + i for i in range(12)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    api_key=st.sampled_from(sorted(APIS)),
    version=st.integers(0, 12),
    body=st.binary(max_size=200),
)
def test_request_decoder_fuzz(api_key: int, version: int, body: bytes) -> None:
    """Any bytes after a served header either decode or raise MalformedRequestError."""
    payload = struct.pack(">hhi", api_key, version, 7) + body
    head = peek(payload)
    api = served(head)
    if api is None:
        return
    try:
        decode_request(api, head, payload)
    except MalformedRequestError:
        pass


def test_live_fuzz_keeps_the_broker_serving(commitlog_broker: Broker) -> None:
    """Random frames over real sockets: each is answered or its connection closed."""
    import random

    rng = random.Random(16)
    keys = sorted(APIS)
    for _ in range(60):
        body = rng.randbytes(rng.randrange(0, 64))
        header = struct.pack(">hhi", rng.choice(keys), rng.randrange(0, 12), 1)
        frame = header + body
        raw_request(commitlog_broker.port, FRAME.pack(len(frame)) + frame, timeout_s=10)
    assert_serving(commitlog_broker.port)
