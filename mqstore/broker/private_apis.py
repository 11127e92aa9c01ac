"""Replication's private APIs on the broker's loop (mqstore.replication.protocol):
ReplicaFetch, long-polled in slices so that a stop is prompt, and the control
requests Promote and LeaderChange. The work runs on the broker's replica threads;
a frame that does not decode raises MalformedRequestError, which closes the
connection as any malformed request does (mqstore.broker.server)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import Final

from mqstore.broker.protocol import MalformedRequestError
from mqstore.replication.node import ReplicaNode
from mqstore.replication.protocol import (
    PROMOTE_API_KEY,
    REPLICA_FETCH_API_KEY,
    ReplicationProtocolError,
    decode_leader_change,
    decode_promote,
    encode_control_response,
    encode_promote_response,
)
from mqstore.replication.protocol import decode_request as decode_replica_fetch
from mqstore.replication.protocol import encode_response as encode_replica_fetch

__all__ = ["LONG_POLL_SLICE_MS", "answer_private"]

#: A follower's ReplicaFetch waits in slices this long, so a stop is prompt.
LONG_POLL_SLICE_MS: Final = 500


async def answer_private(
    node: ReplicaNode,
    api_key: int,
    payload: bytes,
    pool: concurrent.futures.Executor,
    stopping: Callable[[], bool],
) -> bytes:
    """The framed answer to one private request (``stopping()``: the broker stops)."""
    if api_key == REPLICA_FETCH_API_KEY:
        return await _replica_fetch(node, payload, pool, stopping)
    loop = asyncio.get_running_loop()
    try:
        if api_key == PROMOTE_API_KEY:
            correlation_id, unclean = decode_promote(payload)
            error, epoch, message = await loop.run_in_executor(pool, node.promote, unclean)
            return encode_promote_response(error, epoch, message, correlation_id)
        correlation_id, change = decode_leader_change(payload)
    except ReplicationProtocolError as error_:
        raise MalformedRequestError(str(error_)) from None
    error, epoch = await loop.run_in_executor(pool, node.leader_change, change)
    return encode_control_response(error, epoch, correlation_id)


async def _replica_fetch(
    node: ReplicaNode,
    payload: bytes,
    pool: concurrent.futures.Executor,
    stopping: Callable[[], bool],
) -> bytes:
    """A follower's ReplicaFetch: long-polled in slices on the replica threads,
    answered in mqstore.replication.leader."""
    try:
        correlation_id, request = decode_replica_fetch(payload)
    except ReplicationProtocolError as error:
        raise MalformedRequestError(str(error)) from None
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + request.max_wait_ms / 1000
    first = True
    while True:
        left_ms = max(0, int((deadline - time.monotonic()) * 1000))
        stop = stopping()
        wait_ms = 0 if stop else min(left_ms, LONG_POLL_SLICE_MS)
        response = await loop.run_in_executor(
            pool, node.answer_fetch, request._replace(max_wait_ms=wait_ms), True, first
        )
        first = False
        if (
            response.data
            or response.error_code
            or response.topics is not None
            or response.diverging_end >= 0
        ):
            break
        if stop or left_ms == 0:
            break
    return encode_replica_fetch(response, correlation_id)
