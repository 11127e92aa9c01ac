"""Kafka's wire protocol, server side: frames, the served API versions, the codec.

Frame layout (big-endian), request and response alike::

    size int32 | payload (size bytes)

    request payload: api_key int16 | api_version int16 | correlation_id int32
                     | client_id ... | body      (header v1, or v2 for flexible versions)
    response payload: correlation_id int32 | body (header v0, or v1 for flexible ones;
                     ApiVersions keeps v0 at every version)

Requests are decoded and responses encoded by kafka-python 3's classes, which it
generates from Kafka's own JSON schemas (docs/BROKER.md section 2). Those classes
accept every version from 0, so ``peek`` and ``served`` check the version against
``APIS`` before anything is decoded (pitfall 4 there), and every decoding failure
becomes ``MalformedRequestError``: the connection that sent it is closed, the broker
and the store are untouched.

The served versions are the "plain max" column of notes/kafka-protocol.md: the last
non-flexible version of each API, except ApiVersions v3 (librdkafka and kafka-python 3
ask for it first). Produce advertises min 0 for librdkafka's sake (KAFKA-18659) and
serves v3+ only, as Kafka 4 does.
"""

from __future__ import annotations

import struct
from typing import Any, Final, NamedTuple

from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)

from mqstore.commitlog.errors import InvalidArgumentError

__all__ = [
    "API_VERSIONS",
    "APIS",
    "FRAME_BYTES_MAX",
    "FRAME_SIZE",
    "REQUEST_HEADER",
    "Api",
    "ErrorCode",
    "MalformedRequestError",
    "RequestHead",
    "decode_request",
    "encode_response",
    "peek",
    "unsupported_api_versions",
]

#: The frame's size prefix.
FRAME_SIZE: Final = struct.Struct(">i")
#: The request header's fixed start: api_key int16, api_version int16, correlation_id int32.
REQUEST_HEADER: Final = struct.Struct(">hhi")
#: Kafka's socket.request.max.bytes: a larger frame closes the connection unread.
FRAME_BYTES_MAX: Final = 100 << 20
assert REQUEST_HEADER.size == 8


class ErrorCode:
    """Kafka's error codes (org.apache.kafka.common.protocol.Errors) that we answer."""

    NONE: Final = 0
    OFFSET_OUT_OF_RANGE: Final = 1
    CORRUPT_MESSAGE: Final = 2
    UNKNOWN_TOPIC_OR_PARTITION: Final = 3
    LEADER_NOT_AVAILABLE: Final = 5
    NOT_LEADER_OR_FOLLOWER: Final = 6
    REQUEST_TIMED_OUT: Final = 7
    MESSAGE_TOO_LARGE: Final = 10
    OFFSET_METADATA_TOO_LARGE: Final = 12
    COORDINATOR_NOT_AVAILABLE: Final = 15
    INVALID_TOPIC_EXCEPTION: Final = 17
    RECORD_LIST_TOO_LARGE: Final = 18
    NOT_ENOUGH_REPLICAS: Final = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND: Final = 20
    INVALID_REQUIRED_ACKS: Final = 21
    ILLEGAL_GENERATION: Final = 22
    INCONSISTENT_GROUP_PROTOCOL: Final = 23
    INVALID_GROUP_ID: Final = 24
    UNKNOWN_MEMBER_ID: Final = 25
    INVALID_SESSION_TIMEOUT: Final = 26
    REBALANCE_IN_PROGRESS: Final = 27
    UNSUPPORTED_VERSION: Final = 35
    TOPIC_ALREADY_EXISTS: Final = 36
    INVALID_PARTITIONS: Final = 37
    INVALID_REPLICATION_FACTOR: Final = 38
    INVALID_REPLICA_ASSIGNMENT: Final = 39
    INVALID_CONFIG: Final = 40
    INVALID_REQUEST: Final = 42
    POLICY_VIOLATION: Final = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER: Final = 45
    DUPLICATE_SEQUENCE_NUMBER: Final = 46
    INVALID_PRODUCER_EPOCH: Final = 47
    KAFKA_STORAGE_ERROR: Final = 56
    UNKNOWN_PRODUCER_ID: Final = 59
    UNKNOWN_SERVER_ERROR: Final = -1
    TOPIC_DELETION_DISABLED: Final = 73
    MEMBER_ID_REQUIRED: Final = 79
    INVALID_RECORD: Final = 87


class MalformedRequestError(InvalidArgumentError):
    """A frame that is not a request we serve: the connection is closed."""


class Api(NamedTuple):
    """One served API: its classes and the versions advertised and served."""

    key: int
    request: Any
    response: Any
    advertised_min: int
    served_min: int
    served_max: int


def _api(key: int, request: Any, response: Any, low: int, high: int, advertised: int = -1) -> Api:
    assert key == request.API_KEY
    assert key == response.API_KEY
    assert 0 <= low <= high
    return Api(key, request, response, low if advertised < 0 else advertised, low, high)


API_VERSIONS: Final = 18
#: What the broker serves, by api key. Transactions, SASL and the ACL APIs are not
#: advertised, so no client sends them.
APIS: Final[dict[int, Api]] = {
    api.key: api
    for api in (
        _api(0, ProduceRequest, ProduceResponse, 3, 8, advertised=0),
        _api(1, FetchRequest, FetchResponse, 4, 11),
        _api(2, ListOffsetsRequest, ListOffsetsResponse, 1, 5),
        _api(3, MetadataRequest, MetadataResponse, 0, 8),
        _api(8, OffsetCommitRequest, OffsetCommitResponse, 2, 7),
        _api(9, OffsetFetchRequest, OffsetFetchResponse, 1, 5),
        _api(10, FindCoordinatorRequest, FindCoordinatorResponse, 0, 2),
        _api(11, JoinGroupRequest, JoinGroupResponse, 0, 5),
        _api(12, HeartbeatRequest, HeartbeatResponse, 0, 3),
        _api(13, LeaveGroupRequest, LeaveGroupResponse, 0, 3),
        _api(14, SyncGroupRequest, SyncGroupResponse, 0, 3),
        _api(API_VERSIONS, ApiVersionsRequest, ApiVersionsResponse, 0, 3),
        _api(15, DescribeGroupsRequest, DescribeGroupsResponse, 0, 4),
        _api(16, ListGroupsRequest, ListGroupsResponse, 0, 2),
        _api(19, CreateTopicsRequest, CreateTopicsResponse, 2, 4),
        _api(20, DeleteTopicsRequest, DeleteTopicsResponse, 1, 3),
        _api(21, DeleteRecordsRequest, DeleteRecordsResponse, 0, 1),
        _api(22, InitProducerIdRequest, InitProducerIdResponse, 0, 1),
        _api(32, DescribeConfigsRequest, DescribeConfigsResponse, 1, 3),
        _api(37, CreatePartitionsRequest, CreatePartitionsResponse, 0, 1),
    )
}


class RequestHead(NamedTuple):
    """The fixed start of a request, read without decoding the rest."""

    api_key: int
    api_version: int
    correlation_id: int


def peek(payload: bytes | bytearray | memoryview) -> RequestHead:
    """The api key, version and correlation id of a request payload.

    Raises:
        MalformedRequestError: shorter than the 8-byte fixed header.
    """
    if len(payload) < REQUEST_HEADER.size:
        raise MalformedRequestError(f"a request of {len(payload)} bytes has no header")
    return RequestHead._make(REQUEST_HEADER.unpack_from(payload, 0))


def served(head: RequestHead) -> Api | None:
    """The API if ``head`` asks for a version we serve, else None."""
    api = APIS.get(head.api_key)
    if api is None or not api.served_min <= head.api_version <= api.served_max:
        return None
    return api


def decode_request(api: Api, head: RequestHead, payload: bytes) -> Any:
    """The request object (its ``header`` holds client_id).

    Raises:
        MalformedRequestError: the bytes do not decode as this request, or bytes are
            left over.
    """
    try:
        return api.request.decode(payload, version=head.api_version, header=True)
    except Exception as error:  # the codec raises ValueError, struct.error, IndexError...
        raise MalformedRequestError(
            f"api {head.api_key} v{head.api_version} does not decode: "
            f"{type(error).__name__}: {error}"
        ) from None


def encode_response(response: Any, correlation_id: int) -> bytes:
    """The framed response. The version must have been given to the constructor:
    ``encode(version=...)`` with a header raises in kafka-python 3.0.12."""
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


def api_versions_body(version: int) -> ApiVersionsResponse:
    """The ApiVersions answer: every served API with its advertised range."""
    keys = [
        ApiVersionsResponse.ApiVersion(
            api_key=api.key, min_version=api.advertised_min, max_version=api.served_max
        )
        for api in sorted(APIS.values())
    ]
    return ApiVersionsResponse(version=version, error_code=0, api_keys=keys, throttle_time_ms=0)


def unsupported_api_versions(correlation_id: int) -> bytes:
    """KIP-511: an ApiVersions request above v3 is answered in v0 with error 35 and
    our ApiVersions range, so the client retries at a version we serve."""
    api = APIS[API_VERSIONS]
    response = ApiVersionsResponse(
        version=0,
        error_code=ErrorCode.UNSUPPORTED_VERSION,
        api_keys=[
            ApiVersionsResponse.ApiVersion(
                api_key=API_VERSIONS, min_version=api.served_min, max_version=api.served_max
            )
        ],
    )
    return encode_response(response, correlation_id)
