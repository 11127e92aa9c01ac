"""ReplicaFetch's codec (mqstore/replication/protocol.py): round trips, and frames whose
lengths or fields do not add up are a ReplicationProtocolError, never a crash."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.commitlog.errors import StoreError
from mqstore.replication.protocol import (
    FRAME_SIZE,
    REPLICA_FETCH_BYTES_MAX,
    LeaderChange,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ReplicationProtocolError,
    decode_control_response,
    decode_leader_change,
    decode_promote,
    decode_promote_response,
    decode_request,
    decode_response,
    encode_control_response,
    encode_leader_change,
    encode_promote,
    encode_promote_response,
    encode_request,
    encode_response,
)

requests = st.builds(
    ReplicaFetchRequest,
    replica_id=st.integers(0, 2**31 - 1),
    leader_epoch=st.integers(-1, 2**31 - 1),
    last_fetched_epoch=st.integers(-1, 2**31 - 1),
    log_end=st.integers(0, 2**63 - 1),
    max_bytes=st.integers(1, REPLICA_FETCH_BYTES_MAX),
    max_wait_ms=st.integers(0, 30_000),
    topics_crc=st.integers(0, 2**32 - 1),
)
responses = st.builds(
    ReplicaFetchResponse,
    error_code=st.integers(-(2**15), 2**15 - 1),
    leader_epoch=st.integers(-1, 2**31 - 1),
    leader_node_id=st.integers(-1, 2**31 - 1),
    high_watermark=st.integers(0, 2**63 - 1),
    log_end=st.integers(0, 2**63 - 1),
    log_start=st.integers(0, 2**63 - 1),
    position=st.integers(0, 2**63 - 1),
    diverging_epoch=st.integers(-1, 2**31 - 1),
    diverging_end=st.integers(-1, 2**63 - 1),
    data_epoch=st.integers(0, 2**31 - 1),
    data_epoch_start=st.integers(0, 2**63 - 1),
    topics=st.none() | st.binary(max_size=64),
    data=st.binary(max_size=256),
)


@given(requests, st.integers(0, 2**31 - 1), st.text(max_size=20))
def test_requests_round_trip(request, correlation_id, client_id):
    framed = encode_request(request, correlation_id, client_id)
    assert FRAME_SIZE.unpack_from(framed)[0] == len(framed) - 4
    assert decode_request(framed[4:]) == (correlation_id, request)


@given(responses, st.integers(0, 2**31 - 1))
def test_responses_round_trip(response, correlation_id):
    framed = encode_response(response, correlation_id)
    assert FRAME_SIZE.unpack_from(framed)[0] == len(framed) - 4
    assert decode_response(framed[4:]) == (correlation_id, response)


@given(responses, st.data())
def test_a_cut_or_padded_response_is_refused(response, data):
    payload = encode_response(response, 1)[4:]
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(ReplicationProtocolError):
        decode_response(payload[:cut])
    with pytest.raises(ReplicationProtocolError):
        decode_response(payload + b"\0")


@given(st.binary(max_size=80))
def test_any_bytes_decode_or_raise_a_store_error(payload):
    for decode in (decode_request, decode_response):
        try:
            decode(payload)
        except StoreError:
            pass


changes = st.builds(
    LeaderChange,
    leader_epoch=st.integers(0, 2**31 - 1),
    leader_node_id=st.integers(0, 2**31 - 1),
    host=st.text(min_size=1, max_size=60).filter(lambda h: len(h.encode()) <= 1024),
    port=st.integers(1, 65_535),
)


@given(changes, st.integers(0, 2**31 - 1), st.booleans(), st.text(max_size=200))
def test_control_requests_round_trip(change, correlation_id, unclean, message):
    framed = encode_leader_change(change, correlation_id)
    assert decode_leader_change(framed[4:]) == (correlation_id, change)
    assert decode_promote(encode_promote(unclean, correlation_id)[4:]) == (correlation_id, unclean)
    answer = encode_promote_response(74, 3, message, correlation_id)[4:]
    assert decode_promote_response(answer) == (correlation_id, 74, 3, message)
    assert decode_control_response(encode_control_response(0, 9, correlation_id)[4:]) == (
        correlation_id, 0, 9,
    )  # fmt: skip


@given(changes, st.data())
def test_a_cut_or_padded_control_request_is_refused(change, data):
    pairs = (
        (decode_leader_change, encode_leader_change(change, 1)[4:]),
        (decode_promote, encode_promote(True, 1)[4:]),
    )
    for decode, payload in pairs:
        decode(payload)  # whole: it decodes
        cut = data.draw(st.integers(0, len(payload) - 1))
        with pytest.raises(ReplicationProtocolError):
            decode(payload[:cut])
        with pytest.raises(ReplicationProtocolError):
            decode(payload + b"\0")


@given(st.binary(max_size=80))
def test_any_bytes_decode_control_frames_or_raise_a_store_error(payload):
    for decode in (decode_leader_change, decode_promote, decode_promote_response,
                   decode_control_response):  # fmt: skip
        try:
            decode(payload)
        except StoreError:
            pass
