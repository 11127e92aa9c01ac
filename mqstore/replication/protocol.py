"""ReplicaFetch: the follower's request for the leader's CommitLog bytes, on the
broker's Kafka framing under a private API key.

The key (``REPLICA_FETCH_API_KEY`` = 1000) is above every key Kafka assigns (they end
below 100), and the broker never advertises it in ApiVersions, so no Kafka client
sends it. Frames are Kafka's: a big-endian int32 size, then the payload.

Request payload (version 1)::

    api_key int16 (1000) | api_version int16 (1) | correlation_id int32
    | client_id int16 length + UTF-8 bytes (-1: null)     Kafka's request header v1
    | replica_id int32        the follower's id (>= 0)
    | leader_epoch int32      the leader's epoch as the follower knows it (-1: unknown);
                              older than the leader's: FENCED_LEADER_EPOCH; newer:
                              UNKNOWN_LEADER_EPOCH (the answering node is stale)
    | last_fetched_epoch int32  the epoch of the follower's last records (KIP-595's
                              lastFetchedEpoch): the divergence check
    | log_end int64           the follower's LEO: its CommitLog write position
    | max_bytes int32         at most this many log bytes (>= 1)
    | max_wait_ms int32       long poll: wait this long for bytes past log_end
    | topics_crc uint32       CRC-32 of the topic registry bytes the follower holds

Response payload::

    correlation_id int32
    | error_code int16        Kafka's codes: 0, OFFSET_OUT_OF_RANGE 1, ...
    | leader_epoch int32      the leader's current epoch
    | leader_node_id int32    the leader's node id (Metadata on a follower names it)
    | high_watermark int64    the leader's HW (its LEO until followers count in it)
    | log_end int64           the leader's replicable end (its LEO)
    | log_start int64         the leader's first position (retention moves it)
    | position int64          where ``data`` starts: the request's log_end
    | diverging_epoch int32   -1, or the follower diverged: the largest epoch both
    | diverging_end int64     may share and where it ends on the leader (no data then)
    | data_epoch int32        the epoch of every record in ``data`` (a chunk never
    | data_epoch_start int64  spans two epochs) and where that epoch starts
    | topics_length int32     -1: the follower's registry is current; else the
    | topics bytes            leader's registry file, to adopt before the data
    | data_length int32
    | data bytes              whole CommitLog records (blank records too) from
                              ``position``, within one file, at most max_bytes or
                              one record when the first is larger

Two control requests share the framing (never advertised either):

- Promote (``PROMOTE_API_KEY`` 1001, v0): ``unclean int8``. The response:
  ``correlation_id int32 | error_code int16 | leader_epoch int32 | message string``.
- LeaderChange (``LEADER_CHANGE_API_KEY`` 1002, v0), from a newly promoted leader to
  its former leader: ``leader_epoch int32 | leader_node_id int32 | host string |
  port int32``. The response: ``correlation_id int32 | error_code int16 |
  leader_epoch int32``.

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
REPLICA_FETCH_VERSION: Final = 1
PROMOTE_API_KEY: Final = 1001
LEADER_CHANGE_API_KEY: Final = 1002
#: The private API keys this module decodes.
PRIVATE_API_KEYS: Final = frozenset({1000, 1001, 1002})
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
#: replica_id, leader_epoch, last_fetched_epoch, log_end, max_bytes, max_wait_ms, topics_crc.
REQUEST_BODY: Final = struct.Struct(">iiiqiiI")
#: correlation_id, error_code, leader_epoch, leader_node_id, high_watermark, log_end,
#: log_start, position, diverging_epoch, diverging_end, data_epoch, data_epoch_start.
RESPONSE_HEAD: Final = struct.Struct(">ihiiqqqqiqiq")
LENGTH: Final = struct.Struct(">i")
FRAME_SIZE: Final = struct.Struct(">i")
assert HEADER.size == 10
assert REQUEST_BODY.size == 32
assert RESPONSE_HEAD.size == 70


class ReplicationProtocolError(InvalidArgumentError):
    """A ReplicaFetch frame that does not decode (or fields out of their bounds)."""


class ReplicaFetchRequest(NamedTuple):
    replica_id: int
    leader_epoch: int
    last_fetched_epoch: int
    log_end: int
    max_bytes: int
    max_wait_ms: int
    topics_crc: int


class ReplicaFetchResponse(NamedTuple):
    error_code: int
    leader_epoch: int
    leader_node_id: int
    high_watermark: int
    log_end: int
    log_start: int
    position: int
    diverging_epoch: int
    diverging_end: int
    data_epoch: int
    data_epoch_start: int
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
        raise ReplicationProtocolError("ReplicaFetch: the body is not 32 bytes after the header")
    request = ReplicaFetchRequest._make(REQUEST_BODY.unpack_from(payload, at))
    if (
        request.replica_id < 0
        or request.log_end < 0
        or request.leader_epoch < -1
        or request.last_fetched_epoch < -1
    ):
        raise ReplicationProtocolError(f"ReplicaFetch: negative field in {request}")
    if not 1 <= request.max_bytes <= REPLICA_FETCH_BYTES_MAX:
        raise ReplicationProtocolError(f"ReplicaFetch: max_bytes {request.max_bytes}")
    if not 0 <= request.max_wait_ms <= REPLICA_WAIT_MS_MAX:
        raise ReplicationProtocolError(f"ReplicaFetch: max_wait_ms {request.max_wait_ms}")
    return correlation_id, request


def encode_response(response: ReplicaFetchResponse, correlation_id: int) -> bytes:
    """The framed response."""
    head = RESPONSE_HEAD.pack(correlation_id, *response[: len(response) - 2])
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
    correlation_id, *fields = RESPONSE_HEAD.unpack_from(payload, 0)
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
    response = ReplicaFetchResponse._make([*fields, topics, data])
    if response.position < 0 or response.log_end < 0:
        raise ReplicationProtocolError("ReplicaFetch response: negative position")
    return correlation_id, response


# ---------------------------------------------------------------- control requests

PROMOTE_BODY: Final = struct.Struct(">b")
#: correlation_id, error_code, leader_epoch.
CONTROL_RESPONSE: Final = struct.Struct(">ihi")
#: leader_epoch, leader_node_id.
LEADER_CHANGE_HEAD: Final = struct.Struct(">ii")
STRING_LENGTH: Final = struct.Struct(">h")
PORT: Final = struct.Struct(">i")
#: The longest host name or message a control frame carries.
STRING_BYTES_MAX: Final = 1024


class LeaderChange(NamedTuple):
    """A newly promoted leader's notice to its former leader."""

    leader_epoch: int
    leader_node_id: int
    host: str
    port: int


def _frame(api_key: int, correlation_id: int, body: bytes, client_id: str) -> bytes:
    client = client_id.encode()
    payload = HEADER.pack(api_key, 0, correlation_id, len(client)) + client + body
    return FRAME_SIZE.pack(len(payload)) + payload


def _body(payload: bytes, api_key: int) -> tuple[int, int]:
    """(correlation id, where the body starts) of a v0 control request."""
    if len(payload) < HEADER.size:
        raise ReplicationProtocolError("control request: no header")
    key, version, correlation_id, client_len = HEADER.unpack_from(payload, 0)
    if key != api_key or version != 0 or client_len < -1:
        raise ReplicationProtocolError(f"control request: api {key} v{version} is not served")
    at = HEADER.size + max(client_len, 0)
    if at > len(payload):
        raise ReplicationProtocolError("control request: cut off in the header")
    return correlation_id, at


def _string(payload: bytes | bytearray, at: int) -> tuple[str, int]:
    if at + STRING_LENGTH.size > len(payload):
        raise ReplicationProtocolError("control frame: cut off before a string")
    (length,) = STRING_LENGTH.unpack_from(payload, at)
    at += STRING_LENGTH.size
    if not 0 <= length <= STRING_BYTES_MAX or at + length > len(payload):
        raise ReplicationProtocolError(f"control frame: a string of {length} bytes")
    try:
        return bytes(payload[at : at + length]).decode(), at + length
    except UnicodeDecodeError:
        raise ReplicationProtocolError("control frame: a string that is not UTF-8") from None


def _pack_string(text: str) -> bytes:
    raw = text.encode()[:STRING_BYTES_MAX]
    return STRING_LENGTH.pack(len(raw)) + raw


def encode_promote(unclean: bool, correlation_id: int, client_id: str = "mqstore-cli") -> bytes:
    return _frame(PROMOTE_API_KEY, correlation_id, PROMOTE_BODY.pack(int(unclean)), client_id)


def decode_promote(payload: bytes) -> tuple[int, bool]:
    """(correlation id, unclean) of a Promote request payload."""
    correlation_id, at = _body(payload, PROMOTE_API_KEY)
    if len(payload) != at + PROMOTE_BODY.size:
        raise ReplicationProtocolError("Promote: the body is not 1 byte")
    (unclean,) = PROMOTE_BODY.unpack_from(payload, at)
    if unclean not in (0, 1):
        raise ReplicationProtocolError(f"Promote: unclean {unclean}")
    return correlation_id, bool(unclean)


def encode_promote_response(error: int, epoch: int, message: str, correlation_id: int) -> bytes:
    payload = CONTROL_RESPONSE.pack(correlation_id, error, epoch) + _pack_string(message)
    return FRAME_SIZE.pack(len(payload)) + payload


def decode_promote_response(payload: bytes | bytearray) -> tuple[int, int, int, str]:
    """(correlation id, error code, leader epoch, message)."""
    if len(payload) < CONTROL_RESPONSE.size:
        raise ReplicationProtocolError("Promote response: too short")
    correlation_id, error, epoch = CONTROL_RESPONSE.unpack_from(payload, 0)
    message, at = _string(payload, CONTROL_RESPONSE.size)
    if at != len(payload):
        raise ReplicationProtocolError("Promote response: bytes left over")
    return correlation_id, error, epoch, message


def encode_leader_change(
    change: LeaderChange, correlation_id: int, client_id: str = "mqstore-replica"
) -> bytes:
    body = (
        LEADER_CHANGE_HEAD.pack(change.leader_epoch, change.leader_node_id)
        + _pack_string(change.host)
        + PORT.pack(change.port)
    )
    return _frame(LEADER_CHANGE_API_KEY, correlation_id, body, client_id)


def decode_leader_change(payload: bytes) -> tuple[int, LeaderChange]:
    correlation_id, at = _body(payload, LEADER_CHANGE_API_KEY)
    if at + LEADER_CHANGE_HEAD.size > len(payload):
        raise ReplicationProtocolError("LeaderChange: cut off")
    epoch, node_id = LEADER_CHANGE_HEAD.unpack_from(payload, at)
    host, at = _string(payload, at + LEADER_CHANGE_HEAD.size)
    if at + PORT.size != len(payload):
        raise ReplicationProtocolError("LeaderChange: the port is not the last 4 bytes")
    (port,) = PORT.unpack_from(payload, at)
    if epoch < 0 or node_id < 0 or not host or not 0 < port <= 65_535:
        raise ReplicationProtocolError(f"LeaderChange: fields out of bounds ({epoch}, {port})")
    return correlation_id, LeaderChange(epoch, node_id, host, port)


def encode_control_response(error: int, epoch: int, correlation_id: int) -> bytes:
    payload = CONTROL_RESPONSE.pack(correlation_id, error, epoch)
    return FRAME_SIZE.pack(len(payload)) + payload


def decode_control_response(payload: bytes | bytearray) -> tuple[int, int, int]:
    """(correlation id, error code, leader epoch) of a LeaderChange response."""
    if len(payload) != CONTROL_RESPONSE.size:
        raise ReplicationProtocolError("control response: not 10 bytes")
    correlation_id, error, epoch = CONTROL_RESPONSE.unpack_from(payload, 0)
    return correlation_id, error, epoch
