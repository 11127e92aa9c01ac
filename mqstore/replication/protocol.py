"""ReplicaFetch: the follower's request for the leader's CommitLog bytes, on the
broker's Kafka framing under a private API key.

The key (``REPLICA_FETCH_API_KEY`` = 1000) is above every key Kafka assigns (they end
below 100), and the broker never advertises it in ApiVersions, so no Kafka client
sends it. Frames are Kafka's: a big-endian int32 size, then the payload.

Request payload (version 0)::

    api_key int16 (1000) | api_version int16 (0) | correlation_id int32
    | client_id int16 length + UTF-8 bytes (-1: null)     Kafka's request header v1
    | replica_id int32        the follower's id (>= 0)
    | leader_epoch int32      the epoch the follower believes current (-1: none yet)
    | log_end int64           the follower's LEO: its CommitLog write position
    | max_bytes int32         at most this many log bytes (>= 1)
    | max_wait_ms int32       long poll: wait this long for bytes past log_end
    | topics_crc uint32       CRC-32 of the topic registry bytes the follower holds

Response payload::

    correlation_id int32
    | error_code int16        Kafka's codes: 0, OFFSET_OUT_OF_RANGE 1, ...
    | leader_epoch int32      the leader's epoch (0 until epochs are built)
    | high_watermark int64    the leader's HW (its LEO until followers count in it)
    | log_end int64           the leader's replicable end (its LEO)
    | position int64          where ``data`` starts: the request's log_end
    | topics_length int32     -1: the follower's registry is current; else the
    | topics bytes            leader's registry file, to adopt before the data
    | data_length int32
    | data bytes              whole CommitLog records (blank records too) from
                              ``position``, within one file, at most max_bytes or
                              one record when the first is larger

Every length is checked against the frame before a byte is taken; a frame that does
not decode is a ``ReplicationProtocolError`` (a StoreError), never a crash.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from mqstore.commitlog.errors import InvalidArgumentError

__all__ = [
    "REPLICA_FETCH_API_KEY",
    "REPLICA_FETCH_BYTES_DEFAULT",
    "REPLICA_FETCH_BYTES_MAX",
    "ReplicaFetchRequest",
    "ReplicaFetchResponse",
    "ReplicationProtocolError",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
]

REPLICA_FETCH_API_KEY: Final = 1000
REPLICA_FETCH_VERSION: Final = 0
#: Log bytes per response by default: 1 MiB. RocketMQ's 32 KiB transfer costs a round
#: trip per 32 KiB (about 10x slower catch-up); 4 MiB measured no faster than 1 MiB
#: (bench/replication.py, docs/REPLICATION.md section 6) and holds 4x the memory.
REPLICA_FETCH_BYTES_DEFAULT: Final = 1 << 20
#: The most a request may ask for: a response stays well under the broker's 100 MiB
#: frame limit (a blank record or one record may pass max_bytes by its size).
REPLICA_FETCH_BYTES_MAX: Final = 64 << 20
#: The longest long poll a request may ask for.
REPLICA_WAIT_MS_MAX: Final = 30_000

#: api_key, api_version, correlation_id, client_id length (Kafka's header v1 start).
HEADER: Final = struct.Struct(">hhih")
#: replica_id, leader_epoch, log_end, max_bytes, max_wait_ms, topics_crc.
REQUEST_BODY: Final = struct.Struct(">iiqiiI")
#: correlation_id, error_code, leader_epoch, high_watermark, log_end, position.
RESPONSE_HEAD: Final = struct.Struct(">ihiqqq")
LENGTH: Final = struct.Struct(">i")
FRAME_SIZE: Final = struct.Struct(">i")
assert HEADER.size == 10
assert REQUEST_BODY.size == 28
assert RESPONSE_HEAD.size == 34


class ReplicationProtocolError(InvalidArgumentError):
    """A ReplicaFetch frame that does not decode (or fields out of their bounds)."""


class ReplicaFetchRequest(NamedTuple):
    replica_id: int
    leader_epoch: int
    log_end: int
    max_bytes: int
    max_wait_ms: int
    topics_crc: int


class ReplicaFetchResponse(NamedTuple):
    error_code: int
    leader_epoch: int
    high_watermark: int
    log_end: int
    position: int
    topics: bytes | None  # None: the follower's registry is current
    data: bytes | memoryview  # decode_response: a view into the frame, not a copy


def encode_request(
    request: ReplicaFetchRequest, correlation_id: int, client_id: str = "mqstore-replica"
) -> bytes:
    """The framed request."""
    client = client_id.encode()
    payload = (
        HEADER.pack(REPLICA_FETCH_API_KEY, REPLICA_FETCH_VERSION, correlation_id, len(client))
        + client
        + REQUEST_BODY.pack(*request)
    )
    return FRAME_SIZE.pack(len(payload)) + payload


def decode_request(payload: bytes) -> tuple[int, ReplicaFetchRequest]:
    """(correlation id, request) of a ReplicaFetch payload (without its size prefix).

    Raises:
        ReplicationProtocolError: not a v0 ReplicaFetch, bytes left over or missing,
            or a field out of its bounds.
    """
    if len(payload) < HEADER.size:
        raise ReplicationProtocolError("ReplicaFetch: no header")
    api_key, version, correlation_id, client_len = HEADER.unpack_from(payload, 0)
    if api_key != REPLICA_FETCH_API_KEY or version != REPLICA_FETCH_VERSION:
        raise ReplicationProtocolError(f"ReplicaFetch: api {api_key} v{version} is not served")
    at = HEADER.size + max(client_len, 0)
    if client_len < -1 or len(payload) != at + REQUEST_BODY.size:
        raise ReplicationProtocolError("ReplicaFetch: the body is not 28 bytes after the header")
    request = ReplicaFetchRequest._make(REQUEST_BODY.unpack_from(payload, at))
    if request.replica_id < 0 or request.log_end < 0 or request.leader_epoch < -1:
        raise ReplicationProtocolError(f"ReplicaFetch: negative field in {request}")
    if not 1 <= request.max_bytes <= REPLICA_FETCH_BYTES_MAX:
        raise ReplicationProtocolError(f"ReplicaFetch: max_bytes {request.max_bytes}")
    if not 0 <= request.max_wait_ms <= REPLICA_WAIT_MS_MAX:
        raise ReplicationProtocolError(f"ReplicaFetch: max_wait_ms {request.max_wait_ms}")
    return correlation_id, request


def encode_response(response: ReplicaFetchResponse, correlation_id: int) -> bytes:
    """The framed response."""
    head = RESPONSE_HEAD.pack(
        correlation_id, response.error_code, response.leader_epoch, response.high_watermark,
        response.log_end, response.position,
    )  # fmt: skip
    topics = response.topics
    parts: list[bytes | memoryview] = [head]
    if topics is None:
        parts.append(LENGTH.pack(-1))
    else:
        parts += [LENGTH.pack(len(topics)), topics]
    parts += [LENGTH.pack(len(response.data)), response.data]
    size = sum(map(len, parts))
    return FRAME_SIZE.pack(size) + b"".join(parts)


def decode_response(payload: bytes | bytearray) -> tuple[int, ReplicaFetchResponse]:
    """(correlation id, response) of a response payload (without its size prefix).

    Raises:
        ReplicationProtocolError: lengths that do not add up to the frame.
    """
    if len(payload) < RESPONSE_HEAD.size + 2 * LENGTH.size:
        raise ReplicationProtocolError("ReplicaFetch response: too short")
    correlation_id, error, epoch, high_watermark, log_end, position = RESPONSE_HEAD.unpack_from(
        payload, 0
    )
    at = RESPONSE_HEAD.size
    (topics_len,) = LENGTH.unpack_from(payload, at)
    at += LENGTH.size
    topics = None
    if topics_len >= 0:
        topics = bytes(payload[at : at + topics_len])
        at += topics_len
    elif topics_len != -1:
        raise ReplicationProtocolError(f"ReplicaFetch response: topics length {topics_len}")
    if at + LENGTH.size > len(payload):
        raise ReplicationProtocolError("ReplicaFetch response: cut off before the data")
    (data_len,) = LENGTH.unpack_from(payload, at)
    at += LENGTH.size
    if data_len < 0 or at + data_len != len(payload):
        raise ReplicationProtocolError("ReplicaFetch response: data length does not match")
    data = memoryview(payload)[at:]
    if position < 0 or log_end < 0:
        raise ReplicationProtocolError("ReplicaFetch response: negative position")
    response = ReplicaFetchResponse(error, epoch, high_watermark, log_end, position, topics, data)
    return correlation_id, response
