"""kafka-python 3's protocol classes on the server side, for docs/BROKER.md.

- ``capture_librdkafka``: a confluent-kafka (librdkafka) producer and consumer against
  the loopback harness (bench/broker_wire.py); keeps their batches and request frames.
- ``coverage``: every request and response class of the APIs the broker will serve,
  every version 0..max, filled with non-default values, encoded with its header and
  decoded again (``==``): what the generated classes can do server side.
- ``measure``: decode/encode cost per request of Produce and Fetch (plain and flexible
  versions) on the captured frames.
- ``compression_costs``: what stored compressed batches cost a reader (decompression
  per codec, kafka-python's reader).
- ``client_checks``: librdkafka and kafka-python produce into, and consume from, each
  mapping; every record must come back with its key and value.

Run through ``python -m bench.broker_mapping``.
"""

from __future__ import annotations

import importlib
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from bench.broker_wire import REQUEST_HEADER, Harness

__all__ = [
    "SERVED",
    "build_with_kafka_python",
    "capture_librdkafka",
    "client_checks",
    "codec_calls",
    "compression_calls",
    "coverage",
    "time_calls",
]

#: The APIs of the broker issue and the highest version to serve (docs/BROKER.md):
#: the "plain max" (last non-flexible) version, ApiVersions v3 (librdkafka's first).
SERVED: Final = {
    "Produce": (0, 8), "Fetch": (1, 11), "ListOffsets": (2, 5), "Metadata": (3, 8),
    "OffsetCommit": (8, 7), "OffsetFetch": (9, 5), "FindCoordinator": (10, 2),
    "JoinGroup": (11, 5), "Heartbeat": (12, 3), "LeaveGroup": (13, 3), "SyncGroup": (14, 3),
    "DescribeGroups": (15, 4), "ListGroups": (16, 2), "ApiVersions": (18, 3),
    "CreateTopics": (19, 4), "DeleteTopics": (20, 3), "DeleteRecords": (21, 1),
    "InitProducerId": (22, 1), "DescribeConfigs": (32, 3), "CreatePartitions": (37, 1),
}  # fmt: skip
KEY_BYTES: Final = 12  # b"key-%08d"
CAPTURE_SECONDS_MAX: Final = 30.0
_SIMPLE: Final = {
    "int8": 1, "int16": 7, "uint16": 7, "int32": 7, "int64": 7, "float64": 1.5, "bool": True,
    "string": "x", "bytes": b"ab", "records": b"rec", "uuid": uuid.UUID(int=5),
}  # fmt: skip


def _key(i: int) -> bytes:
    return b"key-%08d" % i


# ---------------------------------------------------------------------- workload


class MemoryBackend:
    """Batches kept as produced (base offset patched): the capture's backend."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.produced: list[bytes] = []  # as the client sent them (base offset 0)
        self._bases: list[int] = []
        self._end = 0

    def produce(self, topic: str, partition: int, records: bytes) -> int:
        from bench.broker_proto.wire_batch import check_produced, set_base_offset

        header = check_produced(records)
        self.produced.append(bytes(records))
        batch = bytearray(records)
        base = self._end
        set_base_offset(batch, base)
        self.batches.append(bytes(batch))
        self._bases.append(base)
        self._end += header.records_count
        return base

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int) -> list[bytes]:
        out: list[bytes] = []
        size = 0
        for base, batch in zip(self._bases, self.batches, strict=True):
            if base + check_count(batch) <= offset:
                continue
            if out and size + len(batch) > max_bytes:
                break
            out.append(batch)
            size += len(batch)
        return out

    def end_offset(self, topic: str, partition: int) -> int:
        return self._end


def check_count(batch: bytes) -> int:
    return int.from_bytes(batch[57:61], "big")  # records_count at 57 (segmented HEADER)


def capture_librdkafka(records: int, value: Callable[[int], bytes]) -> dict[str, Any] | None:
    """Produce ``records`` with librdkafka (batch.size 16384, linger 20 ms), consume
    them back; None when confluent-kafka is not installed."""
    try:
        confluent = importlib.import_module("confluent_kafka")
    except ImportError:
        return None
    backend = MemoryBackend()
    with Harness(backend) as harness:
        producer = confluent.Producer({
            "bootstrap.servers": harness.bootstrap, "linger.ms": 20, "batch.size": 16384,
            "acks": 1, "compression.type": "none", "log_level": 3,
        })  # fmt: skip
        for i in range(records):
            while True:
                try:
                    producer.produce("t", value=value(i), key=_key(i), partition=0)
                    break
                except BufferError:
                    producer.poll(0.01)
        if producer.flush(CAPTURE_SECONDS_MAX) != 0:
            raise RuntimeError(f"librdkafka did not deliver: {harness.errors}")
        del producer  # librdkafka's threads go with it, not into the timings
        consumed = _consume_librdkafka(confluent, harness.bootstrap, records, value)
    frames = {}
    for api_key, version, payload in harness.frames:
        if api_key in (0, 1) and api_key not in frames:
            frames[api_key] = (version, payload)
    if 0 not in frames or 1 not in frames or harness.errors:
        raise RuntimeError(f"capture incomplete: {sorted(frames)} {harness.errors}")
    return {
        "source": (
            f"librdkafka {confluent.libversion()[0]} (confluent-kafka {confluent.version()[0]})"
        ),
        "batches": backend.produced,
        "frames": frames,
        "versions_seen": sorted({(k, v) for k, v, _ in harness.frames}),
        "consumed_back": consumed,
    }


def _consume_librdkafka(
    confluent: Any, bootstrap: str, records: int, value: Callable[[int], bytes]
) -> int:
    consumer = confluent.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
        "log_level": 3,
    })  # fmt: skip
    consumer.assign([confluent.TopicPartition("t", 0, 0)])
    got = 0
    deadline = time.monotonic() + CAPTURE_SECONDS_MAX
    try:
        while got < records and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            if message.key() != _key(message.offset()) or message.value() != value(
                message.offset()
            ):
                raise RuntimeError(f"librdkafka read back a wrong record at {message.offset()}")
            got += 1
    finally:
        consumer.close()
    return got


def build_with_kafka_python(records: int, value: Callable[[int], bytes]) -> dict[str, Any]:
    """The fallback workload: kafka-python's batch builder at 16 KiB batches, and
    request frames encoded with kafka-python's client classes."""
    batches = []
    builder = None
    now = int(time.time() * 1000)
    for i in range(records):
        if builder is None:
            builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 16384)
            offset = 0
        if builder.append(offset, now, _key(i), value(i), []) is None:
            batches.append(bytes(builder.build()))
            builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 16384)
            offset = 0
            builder.append(offset, now, _key(i), value(i), [])
        offset += 1
    partition_data = ProduceRequest.TopicProduceData.PartitionProduceData(
        index=0, records=batches[0]
    )
    topic_data = ProduceRequest.TopicProduceData(name="t", partition_data=[partition_data])
    request = ProduceRequest[8](acks=1, timeout_ms=30000, topic_data=[topic_data])
    request.with_header(correlation_id=5, client_id="bench")
    fetch = FetchRequest[11](replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=52428800,
        isolation_level=1, session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(
            topic="t", partitions=[FetchRequest.FetchTopic.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id="")  # fmt: skip
    fetch.with_header(correlation_id=6, client_id="bench")
    frames = {
        0: (8, bytes(request.encode(header=True))),
        1: (11, bytes(fetch.encode(header=True))),
    }
    return {
        "source": "kafka-python DefaultRecordBatchBuilder (confluent-kafka not installed)",
        "batches": batches,
        "frames": frames,
    }


# ---------------------------------------------------------------------- coverage


def _sample(field: Any, version: int) -> Any:
    kind = field.type_str
    if field.is_struct_array():
        return [_fill(field.data_class, field, version)]
    if field.is_struct():
        return _fill(field.data_class, field, version)
    if kind.startswith("[]"):
        return [_SIMPLE[kind[2:]]]
    if kind == "bitfield":
        return field.default
    if field.name == "error_code":
        return 0  # ApiVersionsResponse decodes as v0 on any error: keep the version
    return _SIMPLE[kind]


def _fill(data_class: Any, struct: Any, version: int) -> Any:
    values = {f.name: _sample(f, version) for f in struct.untagged_fields(version)}
    return data_class(version=version, **values)


def _message_classes() -> dict[tuple[int, str], Any]:
    found: dict[tuple[int, str], Any] = {}
    pending = list(ApiMessage.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls._class_version is None:
            found[(cls.API_KEY, cls.type)] = cls
    return found


def coverage() -> dict[str, Any]:
    """Per API: the versions whose filled request and response survive
    encode(header, framed) -> decode -> ==, and the class's own maximum."""
    classes = _message_classes()
    out: dict[str, Any] = {}
    for name, (api_key, served_max) in SERVED.items():
        failures = []
        request_class = classes[(api_key, "request")]
        for version in range(request_class.max_version + 1):
            for kind in ("request", "response"):
                cls = classes[(api_key, kind)]
                try:
                    message = _fill(cls, cls._struct, version)
                    if kind == "request":
                        message.with_header(correlation_id=3, client_id="c")
                    else:
                        message.with_header(correlation_id=3)
                    data = message.encode(header=True, framed=True)
                    if cls.decode(data, version=version, header=True, framed=True) != message:
                        failures.append(f"{kind} v{version}: differs after the round trip")
                except Exception as error:  # report, do not stop: this is the survey
                    failures.append(f"{kind} v{version}: {type(error).__name__}: {error}")
        out[name] = {
            "api_key": api_key,
            "serve_max": served_max,
            "class_max": request_class.max_version,
            "flexible_from": request_class._flexible_versions[0],
            "failures": failures,
        }
    return out


# ---------------------------------------------------------------------- timings


def _per_call_us(fn: Callable[[], Any], seconds: float = 0.1) -> float:
    """The mean µs per call of ``fn`` over about ``seconds``."""
    calls, started = 0, time.perf_counter()
    while True:
        for _ in range(20):
            fn()
        calls += 20
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return elapsed / calls * 1e6


def _fetch_response(version: int, records: bytes) -> Any:
    partition = FetchResponse.FetchableTopicResponse.PartitionData(
        partition_index=0, error_code=0, high_watermark=10, last_stable_offset=10,
        log_start_offset=0, aborted_transactions=[], preferred_read_replica=-1, records=records,
    )  # fmt: skip
    topic = FetchResponse.FetchableTopicResponse(topic="t", partitions=[partition])
    response = FetchResponse(
        version=version, throttle_time_ms=0, error_code=0, session_id=0, responses=[topic]
    )
    response.with_header(correlation_id=5)
    return response


def _produce_response(version: int) -> bytes:
    topic_class = ProduceResponse.TopicProduceResponse
    partition = topic_class.PartitionProduceResponse(
        index=0, error_code=0, base_offset=5, log_append_time_ms=-1, log_start_offset=0
    )
    response = ProduceResponse(
        version=version, throttle_time_ms=0,
        responses=[topic_class(name="t", partition_responses=[partition])],
    )  # fmt: skip
    response.with_header(correlation_id=5)
    return bytes(response.encode(header=True, framed=True))


def _reencode(cls: Any, payload: bytes, version: int, to_version: int) -> bytes:
    """The same request at another version (for the flexible-version timings)."""
    message = cls.decode(payload, version=version, header=True)
    header = message.header
    message.with_header(correlation_id=header.correlation_id, client_id=header.client_id)
    data = bytes(message.encode(version=to_version, header=True))
    assert cls.decode(data, version=to_version, header=True).header.client_id == header.client_id
    return data


def codec_calls(work: dict[str, Any]) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """The Produce and Fetch codec calls a broker makes, on the captured frames, as
    name -> call (timed by the caller, interleaved with the mapping rounds); and facts
    about the frames."""
    produce_version, produce = work["frames"][0]
    fetch_version, fetch = work["frames"][1]
    produce_flex = _reencode(ProduceRequest, produce, produce_version, 9)
    fetch_flex = _reencode(FetchRequest, fetch, fetch_version, 12)
    megabyte = b"".join(work["batches"])[: 1 << 20]
    batches_per_mib = [
        bytes(b) for b in work["batches"][: max(1, (1 << 20) // len(work["batches"][0]))]
    ]
    calls = {
        "header_only_struct": lambda: REQUEST_HEADER.unpack_from(produce),
        f"produce_request_decode_v{produce_version}": lambda: ProduceRequest.decode(
            produce, version=produce_version, header=True),
        "produce_request_decode_v9_flexible": lambda: ProduceRequest.decode(
            produce_flex, version=9, header=True),
        "produce_response_build_encode_v8": lambda: _produce_response(8),
        "produce_response_build_encode_v9_flexible": lambda: _produce_response(9),
        f"fetch_request_decode_v{fetch_version}": lambda: FetchRequest.decode(
            fetch, version=fetch_version, header=True),
        "fetch_request_decode_v12_flexible": lambda: FetchRequest.decode(
            fetch_flex, version=12, header=True),
        "fetch_response_encode_v11_1MiB": lambda: _fetch_response(11, megabyte).encode(
            header=True, framed=True),
        "fetch_response_encode_v12_1MiB_flexible": lambda: _fetch_response(12, megabyte).encode(
            header=True, framed=True),
        "fetch_response_join_views_1MiB": lambda: b"".join(batches_per_mib),
    }  # fmt: skip
    info = {
        "produce_frame_bytes": len(produce),
        "fetch_frame_bytes": len(fetch),
        "fetch_response_records_bytes": len(megabyte),
        "coverage": coverage(),
    }
    return calls, info


def time_calls(calls: dict[str, Callable[[], Any]], shift: int) -> dict[str, float]:
    """One sample (µs per call) of every call, in an order rotated by ``shift``; and
    of ``loopback_1MiB``, what handing 1 MiB to a 127.0.0.1 socket and reading it back
    costs this process (the copy any Fetch path pays, whatever the mapping)."""
    names = list(calls)
    shift %= len(names)
    out = {name: _per_call_us(calls[name], 0.05) for name in names[shift:] + names[:shift]}
    out["loopback_1MiB_send_and_receive"] = loopback_us_per_mib()
    return out


LOOPBACK_MIB: Final = 64  # sent per sample: 64 x 1 MiB sendall, read by a second thread


def loopback_us_per_mib() -> float:
    """µs per MiB through a loopback TCP connection (sendall of 1 MiB buffers, a
    reader thread draining with recv_into): the kernel copies both ways."""
    server = socket.create_server(("127.0.0.1", 0))
    payload = bytes(1 << 20)

    def drain() -> None:
        conn, _ = server.accept()
        with conn:
            buffer = bytearray(1 << 20)
            got = 0
            while got < LOOPBACK_MIB << 20:
                n = conn.recv_into(buffer)
                if n == 0:
                    return
                got += n

    reader = threading.Thread(target=drain)
    reader.start()
    with server, socket.create_connection(server.getsockname(), timeout=30) as sender:
        started = time.perf_counter()
        for _ in range(LOOPBACK_MIB):
            sender.sendall(payload)
        reader.join(timeout=30)
        elapsed = time.perf_counter() - started
    return elapsed / LOOPBACK_MIB * 1e6


# ---------------------------------------------------------------------- compression


CODECS: Final = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_DECODERS: Final = {"gzip": "gzip_decode", "snappy": "snappy_decode", "lz4": "lz4_decode",
                    "zstd": "zstd_decode"}  # fmt: skip


def compression_calls(
    value: Callable[[int], bytes],
) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """Per codec, one ~16 KiB batch of the workload's records (kafka-python's builder)
    and a call that decompresses its records section with the codec kafka-python uses:
    what get(), query_by_key and a key-indexing dispatcher would pay per stored
    compressed batch (on top of decoding its records), and what option A pays on every
    produce. Returns (name -> call, name -> {records, batch_bytes} or {error})."""
    codec_module = importlib.import_module("kafka.codec")
    calls: dict[str, Callable[[], Any]] = {}
    info: dict[str, Any] = {}
    now = int(time.time() * 1000)
    for name, codec in {"none": 0, **CODECS}.items():
        builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 20)
        count = 0
        while builder.size() < 16384 - 200:
            builder.append(count, now, _key(count), value(count), [])
            count += 1
        try:
            batch = bytes(builder.build())
        except Exception as error:  # the codec's library is missing
            info[name] = {"error": f"{type(error).__name__}: {error}"}
            continue
        info[name] = {"records": count, "batch_bytes": len(batch)}
        if name != "none":
            decode = getattr(codec_module, _DECODERS[name])
            payload = batch[61:]  # the records section (segmented HEADER_SIZE)

            def decompress(decode: Any = decode, payload: bytes = payload) -> Any:
                return decode(payload)

            calls[name + "_decompress"] = decompress
    return calls, info


# ---------------------------------------------------------------------- real clients


def client_checks(
    factories: dict[str, Callable[[], tuple[Any, Callable[[], None]]]],
    value: Callable[[int], bytes],
) -> dict[str, Any]:
    """Real clients against each mapping (``factories``: name -> () -> (backend,
    close)): librdkafka produces 3,000 records; librdkafka and kafka-python consume
    them; each must get every key and value back."""
    results: dict[str, Any] = {}
    try:
        importlib.import_module("confluent_kafka")
    except ImportError:
        return {"skipped": "confluent-kafka is not installed"}
    for name, make in factories.items():
        backend, close = make()
        try:
            results[name] = _check_one(backend, value)
        except Exception as error:  # report the mapping that failed, check the others
            results[name] = {"error": f"{type(error).__name__}: {error}"}
        finally:
            close()
    return results


def _check_one(backend: Any, value: Callable[[int], bytes]) -> dict[str, Any]:
    """librdkafka produces records 0..2999, then kafka-python (idempotent by default:
    InitProducerId, batches with a producer id and sequences) 3000..3999; both
    clients then consume all 4000 from offset 0."""
    from kafka import KafkaProducer

    first = 3000
    records = 4000
    result: dict[str, Any] = {}
    with Harness(backend) as harness:
        confluent = importlib.import_module("confluent_kafka")
        producer = confluent.Producer({
            "bootstrap.servers": harness.bootstrap, "linger.ms": 5, "batch.size": 16384,
            "log_level": 3,
        })  # fmt: skip
        for i in range(first):
            producer.produce("t", value=value(i), key=_key(i), partition=0)
        if producer.flush(CAPTURE_SECONDS_MAX) != 0:
            raise RuntimeError("librdkafka did not deliver")
        del producer
        python_producer = KafkaProducer(
            bootstrap_servers=harness.bootstrap, linger_ms=5, batch_size=16384
        )
        for i in range(first, records):
            python_producer.send("t", value=value(i), key=_key(i), partition=0)
        python_producer.flush(CAPTURE_SECONDS_MAX)
        python_producer.close(CAPTURE_SECONDS_MAX)
        result["librdkafka_consumed"] = _consume_librdkafka(
            confluent, harness.bootstrap, records, value
        )
        result["kafka_python_consumed"] = _consume_kafka_python(harness.bootstrap, records, value)
        result["harness_errors"] = harness.errors
        result["versions_seen"] = sorted({(k, v) for k, v, _ in harness.frames})
    result["ok"] = (
        result["librdkafka_consumed"] == records
        and result["kafka_python_consumed"] == records
        and not result["harness_errors"]
    )
    return result


def _consume_kafka_python(bootstrap: str, records: int, value: Callable[[int], bytes]) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000
    )
    partition = TopicPartition("t", 0)
    consumer.assign([partition])
    consumer.seek(partition, 0)
    got = 0
    try:
        for message in consumer:
            if message.key != _key(message.offset) or message.value != value(message.offset):
                raise RuntimeError(f"kafka-python read back a wrong record at {message.offset}")
            got += 1
            if got == records:
                break
    finally:
        consumer.close()
    return got
