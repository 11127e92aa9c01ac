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
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ReplicationProtocolError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

requests = st.builds(
    ReplicaFetchRequest,
    replica_id=st.integers(0, 2**31 - 1),
    leader_epoch=st.integers(-1, 2**31 - 1),
    log_end=st.integers(0, 2**63 - 1),
    max_bytes=st.integers(1, REPLICA_FETCH_BYTES_MAX),
    max_wait_ms=st.integers(0, 30_000),
    topics_crc=st.integers(0, 2**32 - 1),
)
responses = st.builds(
    ReplicaFetchResponse,
    error_code=st.integers(-(2**15), 2**15 - 1),
    leader_epoch=st.integers(-1, 2**31 - 1),
    high_watermark=st.integers(0, 2**63 - 1),
    log_end=st.integers(0, 2**63 - 1),
    position=st.integers(0, 2**63 - 1),
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
