"""A loopback wire harness for the broker mapping study (not the broker).

It answers the few requests a producer and an assign()-ing consumer need (ApiVersions,
Metadata, Produce, InitProducerId, ListOffsets, Fetch), decoding every request and
encoding every response with kafka-python 3's generated classes, over a ``Backend``
(the two mappings of docs/BROKER.md). bench/broker_mapping.py uses it to:

- capture what a real librdkafka producer sends (the Produce frames and their record
  batches), so the mapping figures run on real batches, not hand-made ones;
- check that real clients (librdkafka through confluent-kafka, kafka-python) consume
  what each mapping serves, byte for byte the records that were produced.

One thread per connection, blocking sockets, 127.0.0.1 only; every wait is bounded.
No group coordination, no sessions, no long polling beyond a short sleep: enough for
a measurement, nothing the server should copy but the codec calls.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)

__all__ = ["ADVERTISED", "Backend", "Harness", "REQUEST_HEADER"]

#: The request header's fixed start: api_key i16, api_version i16, correlation_id i32.
REQUEST_HEADER: Final = struct.Struct(">hhi")
FRAME_SIZE: Final = struct.Struct(">i")
FRAME_BYTES_MAX: Final = 100 << 20  # Kafka's socket.request.max.bytes (100 MiB)
UNSUPPORTED_VERSION: Final = 35
UNKNOWN_TOPIC_OR_PARTITION: Final = 3
OFFSET_OUT_OF_RANGE: Final = 1
EMPTY_FETCH_WAIT_S_MAX: Final = 0.05  # an empty fetch waits at most this (or MaxWaitMs)
NODE_ID: Final = 0

#: What the harness serves: api key -> (request class, response class, min, max). The
#: maxima are the "plain max" column of notes/kafka-protocol.md, so no client picks a
#: flexible version except ApiVersions v3; Produce advertises min 0 for librdkafka
#: (KAFKA-18659) and the harness, like Kafka 4, serves v3+ (batch v2) only.
ADVERTISED: Final[dict[int, tuple[Any, Any, int, int]]] = {
    0: (ProduceRequest, ProduceResponse, 0, 8),
    1: (FetchRequest, FetchResponse, 4, 11),
    2: (ListOffsetsRequest, ListOffsetsResponse, 1, 5),
    3: (MetadataRequest, MetadataResponse, 0, 8),
    18: (ApiVersionsRequest, ApiVersionsResponse, 0, 3),
    22: (InitProducerIdRequest, InitProducerIdResponse, 0, 1),
}


class Backend(Protocol):
    """One mapping of Kafka partitions onto a store (docs/BROKER.md options)."""

    def produce(self, topic: str, partition: int, records: bytes) -> int: ...

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int) -> Sequence[Any]: ...

    def end_offset(self, topic: str, partition: int) -> int: ...


class Harness:
    """A listening socket on 127.0.0.1 and one thread per accepted connection."""

    def __init__(self, backend: Backend, partitions: int = 1) -> None:
        self.backend = backend
        self.partitions = partitions
        self.topics: set[str] = set()
        self.frames: list[tuple[int, int, bytes]] = []  # (api key, version, payload)
        self.errors: list[str] = []
        self._lock = threading.Lock()  # one request at a time: the backend is not shared
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port: int = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._producer_ids = 1000

    def __enter__(self) -> Harness:
        thread = threading.Thread(target=self._accept, name="harness-accept", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._server.close()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ network

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        with conn:
            while not self._stop.is_set():
                try:
                    size_bytes = _recv_exact(conn, FRAME_SIZE.size, self._stop)
                    if size_bytes is None:
                        return
                    (size,) = FRAME_SIZE.unpack(size_bytes)
                    if not 0 < size <= FRAME_BYTES_MAX:
                        self.errors.append(f"frame of {size} bytes")
                        return
                    payload = _recv_exact(conn, size, self._stop)
                    if payload is None:
                        return
                    with self._lock:
                        response = self.handle(payload)
                    if response is not None:
                        conn.sendall(response)
                except OSError:
                    return
                except Exception as error:  # a harness bug: record it, drop the client
                    self.errors.append(f"{type(error).__name__}: {error}")
                    return

    # ------------------------------------------------------------------ requests

    def handle(self, payload: bytes) -> bytes | None:
        """One request frame (without its size) -> the framed response, or None."""
        api_key, version, correlation_id = REQUEST_HEADER.unpack_from(payload)
        self.frames.append((api_key, version, payload))
        entry = ADVERTISED.get(api_key)
        if api_key == 18 and (entry is None or version > entry[3]):
            return self._unsupported_api_versions(correlation_id)
        if entry is None or not entry[2] <= version <= entry[3]:
            self.errors.append(f"request {api_key} v{version} not served")
            return None
        request_class, _, _, _ = entry
        request = request_class.decode(payload, version=version, header=True)
        handler: Callable[[Any, int], Any] = getattr(self, f"_on_{api_key}")
        response = handler(request, version)
        if response is None:
            return None
        # The version is set at construction: encode(version=...) on a response with a
        # header raises AttributeError in kafka-python 3.0.12 (the API_VERSION setter
        # writes request_api_version into the ResponseHeader).
        response.with_header(correlation_id=correlation_id)
        return bytes(response.encode(header=True, framed=True))

    def _unsupported_api_versions(self, correlation_id: int) -> bytes:
        """KIP-511: answer in v0 with error 35 and our ApiVersions range."""
        response = ApiVersionsResponse(
            version=0,
            error_code=UNSUPPORTED_VERSION,
            api_keys=[ApiVersionsResponse.ApiVersion(api_key=18, min_version=0, max_version=3)],
        )
        response.with_header(correlation_id=correlation_id)
        return bytes(response.encode(header=True, framed=True))

    def _on_18(self, request: Any, version: int) -> Any:
        keys = [
            ApiVersionsResponse.ApiVersion(api_key=key, min_version=low, max_version=high)
            for key, (_, _, low, high) in sorted(ADVERTISED.items())
        ]
        return ApiVersionsResponse(version=version, error_code=0, api_keys=keys, throttle_time_ms=0)

    def _on_3(self, request: Any, version: int) -> Any:
        names = [t.name for t in request.topics] if request.topics else sorted(self.topics)
        self.topics.update(names)  # auto-create, as a broker with auto.create.topics.enable
        Topic = MetadataResponse.MetadataResponseTopic
        Partition = Topic.MetadataResponsePartition
        topics = [
            Topic(
                error_code=0,
                name=name,
                is_internal=False,
                partitions=[
                    Partition(
                        error_code=0,
                        partition_index=p,
                        leader_id=NODE_ID,
                        leader_epoch=0,
                        replica_nodes=[NODE_ID],
                        isr_nodes=[NODE_ID],
                        offline_replicas=[],
                    )
                    for p in range(self.partitions)
                ],
            )
            for name in names
        ]
        broker = MetadataResponse.MetadataResponseBroker(
            node_id=NODE_ID, host="127.0.0.1", port=self.port, rack=None
        )
        return MetadataResponse(
            version=version, throttle_time_ms=0, brokers=[broker], cluster_id="mqstore-harness",
            controller_id=NODE_ID, topics=topics,
        )  # fmt: skip

    def _on_22(self, request: Any, version: int) -> Any:
        self._producer_ids += 1
        return InitProducerIdResponse(
            version=version, throttle_time_ms=0, error_code=0,
            producer_id=self._producer_ids, producer_epoch=0,
        )  # fmt: skip

    def _on_0(self, request: Any, version: int) -> Any:
        Topic = ProduceResponse.TopicProduceResponse
        Partition = Topic.PartitionProduceResponse
        responses = []
        for topic in request.topic_data:
            parts = []
            for data in topic.partition_data:
                base = self.backend.produce(topic.name, data.index, data.records)
                parts.append(
                    Partition(index=data.index, error_code=0, base_offset=base,
                              log_append_time_ms=-1, log_start_offset=0)
                )  # fmt: skip
            responses.append(Topic(name=topic.name, partition_responses=parts))
        if request.acks == 0:
            return None  # Kafka sends no response for acks=0
        return ProduceResponse(version=version, responses=responses, throttle_time_ms=0)

    def _on_2(self, request: Any, version: int) -> Any:
        Topic = ListOffsetsResponse.ListOffsetsTopicResponse
        Partition = Topic.ListOffsetsPartitionResponse
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                end = self.backend.end_offset(topic.name, p.partition_index)
                offset = end if p.timestamp == -1 else 0  # LATEST, else EARLIEST (harness)
                parts.append(
                    Partition(partition_index=p.partition_index, error_code=0, timestamp=-1,
                              offset=offset, leader_epoch=0)
                )  # fmt: skip
            topics.append(Topic(name=topic.name, partitions=parts))
        return ListOffsetsResponse(version=version, throttle_time_ms=0, topics=topics)

    def _on_1(self, request: Any, version: int) -> Any:
        wanted = [(t.topic, p) for t in request.topics for p in t.partitions]
        if all(p.fetch_offset >= self.backend.end_offset(t, p.partition) for t, p in wanted):
            self._lock.release()  # let producers in while this fetch waits
            try:
                time.sleep(min(request.max_wait_ms / 1000, EMPTY_FETCH_WAIT_S_MAX))
            finally:
                self._lock.acquire()
        Topic = FetchResponse.FetchableTopicResponse
        Partition = Topic.PartitionData
        responses = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                end = self.backend.end_offset(topic.topic, p.partition)
                error, records = 0, b""
                if p.fetch_offset > end:
                    error = OFFSET_OUT_OF_RANGE
                elif p.fetch_offset < end:
                    views = self.backend.fetch(
                        topic.topic, p.partition, p.fetch_offset, p.partition_max_bytes
                    )
                    records = b"".join(views)  # kafka-python's Records field is one buffer
                parts.append(
                    Partition(partition_index=p.partition, error_code=error, high_watermark=end,
                              last_stable_offset=end, log_start_offset=0,
                              aborted_transactions=[], preferred_read_replica=-1,
                              records=records)
                )  # fmt: skip
            responses.append(Topic(topic=topic.topic, partitions=parts))
        return FetchResponse(
            version=version, throttle_time_ms=0, error_code=0, session_id=0, responses=responses
        )


def _recv_exact(conn: socket.socket, size: int, stop: threading.Event) -> bytes | None:
    """``size`` bytes, or None when the peer closed or the harness stops."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        if stop.is_set():
            return None
        try:
            n = conn.recv_into(view[got:])
        except TimeoutError:
            continue
        if n == 0:
            return None
        got += n
    return bytes(buffer)
