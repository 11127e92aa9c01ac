"""Replication's private APIs as the broker's loop answers them
(mqstore/broker/private_apis.py), over a real store and its ReplicaNode: a
ReplicaFetch long-polls in slices and returns at once when the broker stops, and a
frame that does not decode is a MalformedRequestError (the connection closes)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import zlib
from collections.abc import Iterator

import pytest

from mqstore import MessageStore, StoreConfig
from mqstore.broker.private_apis import LONG_POLL_SLICE_MS, answer_private
from mqstore.broker.protocol import MalformedRequestError
from mqstore.replication.node import ReplicaNode
from mqstore.replication.protocol import (
    FRAME_SIZE,
    LEADER_CHANGE_API_KEY,
    PROMOTE_API_KEY,
    REPLICA_FETCH_API_KEY,
    ReplicaFetchRequest,
    decode_response,
    encode_request,
)


@pytest.fixture
def node(tmp_path) -> Iterator[ReplicaNode]:
    with MessageStore.open(tmp_path / "s", StoreConfig(prewarm=False)) as store:
        store.put("t", 0, b"x" * 100)
        leader = ReplicaNode(store, node_id=0)
        leader.start("127.0.0.1", 9)
        yield leader
        leader.close()


def _fetch_payload(log_end: int, wait_ms: int, topics_crc: int = 0) -> bytes:
    request = ReplicaFetchRequest(7, -1, -1, log_end, 1 << 20, wait_ms, topics_crc)
    return encode_request(request, 42)[FRAME_SIZE.size :]


def _answer(node: ReplicaNode, api_key: int, payload: bytes, stopping: bool) -> bytes:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return asyncio.run(answer_private(node, api_key, payload, pool, lambda: stopping))


def test_a_fetch_from_the_start_returns_the_leaders_records(node):
    correlation_id, response = decode_response(
        _answer(node, REPLICA_FETCH_API_KEY, _fetch_payload(0, 0), stopping=False)[4:]
    )
    assert correlation_id == 42
    assert response.error_code == 0 and len(response.data) > 100


def test_a_fetch_at_the_end_waits_in_slices_but_not_once_stopping(node):
    end = node.store.commitlog.write_position
    crc = zlib.crc32(node.store.replica_topics())  # the follower's topics are current
    started = time.monotonic()
    _answer(node, REPLICA_FETCH_API_KEY, _fetch_payload(end, 1_500, crc), stopping=False)
    waited_s = time.monotonic() - started
    assert waited_s >= 1.4  # the whole wait, in slices of LONG_POLL_SLICE_MS
    started = time.monotonic()
    _, response = decode_response(
        _answer(node, REPLICA_FETCH_API_KEY, _fetch_payload(end, 30_000, crc), stopping=True)[4:]
    )
    assert time.monotonic() - started < LONG_POLL_SLICE_MS / 1000  # one pass, no wait
    assert response.data == b""


@pytest.mark.parametrize("api_key", [REPLICA_FETCH_API_KEY, PROMOTE_API_KEY, LEADER_CHANGE_API_KEY])
@pytest.mark.parametrize("payload", [b"", b"\x00\x01", b"\xff" * 64])
def test_a_frame_that_does_not_decode_is_malformed(node, api_key, payload):
    with pytest.raises(MalformedRequestError):
        _answer(node, api_key, payload, stopping=False)
