"""Zero-copy Fetch on the segmented engine (mqstore.broker.zero_copy): producers'
batches stored as they are and sent back by sendfile from the segment files, to
real clients (librdkafka, kafka-python) and raw sockets; pins held while a response
is in flight, released when the client goes; TLS and the CommitLog engine copy."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.protocol.consumer import FetchRequest, FetchResponse

from mqstore.broker import Broker, BrokerConfig
from mqstore.broker.protocol import encode_response
from mqstore.broker.zero_copy import ZERO_COPY_VERSIONS, encode_fetch
from mqstore.engine import ProducerRecord
from mqstore.segmented import SegmentedConfig, SegmentedStore
from mqstore.segmented.compression import CODEC_NAMES
from mqstore.segmented.record_batch import HEADER, BatchHeader
from tests.mqstore.broker.conftest import librdkafka_read, read_frame
from tests.mqstore.broker.test_protocol import request_frame
from tests.mqstore.broker.test_sasl import certificate as certificate  # a fixture
from tests.mqstore.engines import open_engine

BIG = 50 << 20
TIMEOUT_S = 30.0


@pytest.fixture
def store(tmp_path: Any) -> Iterator[SegmentedStore]:
    opened = SegmentedStore.open(
        tmp_path / "store",
        SegmentedConfig(segment_bytes=1 << 20, file_delete_delay_ms=0),
    )
    yield opened
    opened.close()


@pytest.fixture
def broker(store: SegmentedStore) -> Iterator[Broker]:
    with Broker(store, BrokerConfig(port=0)) as running:
        assert running.zero_copy
        yield running


def sendfile_bytes(broker: Broker) -> float:
    return broker.metrics.sendfile_bytes._value.get()  # type: ignore[no-any-return]


def fetch_frame(topic: str, offset: int, max_bytes: int = BIG, version: int = 11) -> bytes:
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, fetch_offset=offset, partition_max_bytes=max_bytes, log_start_offset=-1,
        current_leader_epoch=-1,
    )  # fmt: skip
    request = FetchRequest(
        version=version, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=BIG,
        isolation_level=0, session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip
    return request_frame(request, 7)


def raw_fetch(port: int, topic: str, offset: int, max_bytes: int = BIG) -> Any:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as conn:
        conn.sendall(fetch_frame(topic, offset, max_bytes))
        payload = read_frame(conn)
    assert payload is not None and payload[:4] == b"\x00\x00\x00\x07"
    return FetchResponse.decode(payload[4:], version=11).responses[0].partitions[0]


def log_bytes(store: SegmentedStore, topic: str) -> bytes:
    directory = os.path.join(store.root, f"{topic}-0")
    names = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
    return b"".join(open(os.path.join(directory, n), "rb").read() for n in names)


def batches(data: bytes) -> list[BatchHeader]:
    found, position = [], 0
    while position < len(data):
        header = BatchHeader._make(HEADER.unpack_from(data, position))
        found.append(header)
        position += header.size
    assert position == len(data)
    return found


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# ---------------------------------------------------------------------- framing


def _response(version: int, records: list[bytes | None]) -> Any:
    topic_class = FetchResponse.FetchableTopicResponse
    partition_class = topic_class.PartitionData
    aborted = partition_class.AbortedTransaction(producer_id=5, first_offset=9)
    parts = []
    for i, data in enumerate(records):
        part = partition_class(
            partition_index=i, error_code=i % 2, high_watermark=100 + i, last_stable_offset=90,
            log_start_offset=3, aborted_transactions=[aborted] if i == 1 else None,
            preferred_read_replica=-1, records=data,
        )  # fmt: skip
        parts.append(part)
    topics = [topic_class(topic="t\u00e9", partitions=parts), topic_class(topic="u", partitions=[])]
    return FetchResponse(
        version=version, throttle_time_ms=0, error_code=0, session_id=0, responses=topics
    )


@pytest.mark.parametrize("version", list(ZERO_COPY_VERSIONS))
def test_the_framing_is_kafka_pythons_with_file_ranges_for_records(
    store: SegmentedStore, version: int
) -> None:
    store.create_topic("t", 1)
    for i in range(5):
        store.append_records("t", 0, [ProducerRecord(b"k", b"v%d" % i, [], None)])
    slices = store.read_slices("t", 0, 1, BIG)
    on_file = b"".join(os.pread(s.fileno(), s.size_bytes, s.position) for s in slices.slices)
    expected = _response(version, [b"abc", on_file, None])
    framed = encode_fetch(_response(version, [b"abc", b"", None]), 42, {(0, 1): slices})
    sent = b"".join(
        p if isinstance(p, bytes) else os.pread(p.fileno(), p.size_bytes, p.position)
        for p in framed.parts
    )
    assert sent == encode_response(expected, 42)
    assert framed.size_bytes == len(sent) and framed.records_count == 4
    framed.release()
    assert slices.released


# ---------------------------------------------------------------------- real clients


@pytest.mark.parametrize("codec", CODEC_NAMES)
def test_librdkafka_batches_come_back_byte_identical_by_sendfile(
    broker: Broker, store: SegmentedStore, codec: str
) -> None:
    store.create_topic("z", 1)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 20,
         "enable.idempotence": True}
    )  # fmt: skip
    values = [b"value-%d-" % i * 8 for i in range(300)]
    for i, value in enumerate(values):
        producer.produce("z", value=value, key=b"k%d" % (i % 7))
    assert producer.flush(TIMEOUT_S) == 0
    stored = log_bytes(store, "z")
    headers = batches(stored)
    # The producer's batches as it built them: its codec, its producer id, its CRC.
    assert all(h.attributes & 0x07 == CODEC_NAMES.index(codec) for h in headers)
    assert all(h.producer_id >= 0 and h.base_sequence >= 0 for h in headers)
    assert raw_fetch(broker.port, "z", 0).records == stored
    wait_until(lambda: sendfile_bytes(broker) == len(stored), "counted once sent")
    got = librdkafka_read(broker.bootstrap, "z", 0, len(values), TIMEOUT_S)
    assert [message.value() for message in got] == values
    wait_until(lambda: sendfile_bytes(broker) >= 2 * len(stored), "all by sendfile")


def test_kafka_python_reads_a_compacted_topic_mid_batch_and_past_max_bytes(
    broker: Broker, store: SegmentedStore
) -> None:
    store.create_topic("c", 1, topic_configs={"cleanup.policy": "compact"})
    for i in range(100):  # batches of 4: every third one's keys come again (gaps)
        keys = [b"d%d" % j if i % 3 == 1 else b"u%d" % (4 * i + j) for j in range(4)]
        store.append_records("c", 0, [ProducerRecord(key, b"x" * 50, [], None) for key in keys])
        if i % 25 == 24:
            store._logs[("c", 0)].roll()  # four segments
    assert store.compact("c")
    kept = [r.offset for r in store.read_records("c", 0, 0, 1000)]
    assert len(kept) < 300 and kept != list(range(kept[0], kept[-1] + 1))  # gaps
    first_batch = batches(log_bytes(store, "c"))[0]
    inside = first_batch.base_offset + first_batch.last_offset_delta  # the last of the batch
    for start, fetch_bytes in ((0, BIG), (inside, BIG), (kept[5], 100)):  # 100 < a batch
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap, check_crcs=True, enable_auto_commit=False,
            max_partition_fetch_bytes=fetch_bytes, fetch_max_bytes=max(fetch_bytes, 1024),
            consumer_timeout_ms=3_000,
        )  # fmt: skip
        partition = TopicPartition("c", 0)
        consumer.assign([partition])
        consumer.seek(partition, start)
        offsets = [message.offset for message in consumer]
        consumer.close()
        assert offsets == [o for o in kept if o >= start], (start, fetch_bytes)
    before = sendfile_bytes(broker)
    assert len(raw_fetch(broker.port, "c", kept[5], 100).records) > 100  # a whole batch
    wait_until(lambda: sendfile_bytes(broker) - before > 100, "sent by sendfile")


# ---------------------------------------------------------------------- pins


def _fill(store: SegmentedStore, topic: str, megabytes: int) -> None:
    store.create_topic(topic, 1)
    for _ in range(megabytes * 16):
        store.append_records(topic, 0, [ProducerRecord(None, os.urandom(64 << 10), [], None)])


def _slow_reader(port: int, topic: str) -> socket.socket:
    """A connection that asked for everything and reads nothing yet."""
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect
    conn.settimeout(TIMEOUT_S)
    conn.connect(("127.0.0.1", port))
    conn.sendall(fetch_frame(topic, 0))
    return conn


def _deleted(store: SegmentedStore, topic: str) -> list[str]:
    directory = os.path.join(store.root, f"{topic}-0")
    return [n for n in os.listdir(directory) if n.endswith(".deleted")]


def test_retention_during_a_fetch_in_flight_waits_for_its_pins(
    broker: Broker, store: SegmentedStore
) -> None:
    _fill(store, "r", 24)  # more than the socket buffers hold
    expected = log_bytes(store, "r")
    conn = _slow_reader(broker.port, "r")
    try:
        wait_until(lambda: sendfile_bytes(broker) > 0, "sendfile started")
        store.delete_records("r", 0, store.latest_offset("r", 0))
        assert store.enforce_retention() >= 20
        assert store.delete_expired_files() == 0  # pinned by the response in flight
        assert _deleted(store, "r")
        payload = read_frame(conn)
    finally:
        conn.close()
    assert payload is not None
    response = FetchResponse.decode(payload[4:], version=11)
    assert response.responses[0].partitions[0].records == expected
    # Released: this call or the store's periodic job removes them.
    wait_until(lambda: store.delete_expired_files() >= 0 and not _deleted(store, "r"), "gone")


def test_a_client_gone_mid_response_releases_its_pins(
    broker: Broker, store: SegmentedStore
) -> None:
    _fill(store, "g", 24)
    segments = list(store._logs[("g", 0)].segments)
    for _ in range(3):
        conn = _slow_reader(broker.port, "g")
        wait_until(lambda: sendfile_bytes(broker) > 0, "sendfile started")
        assert any(s._pins for s in segments)
        conn.recv(1000)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # a reset, mid-sendfile
        wait_until(lambda: not any(s._pins for s in segments), "the pins released")
        broker.metrics.sendfile_bytes._value.set(0)
    assert raw_fetch(broker.port, "g", 0, 1000).records  # the broker serves on
    store.delete_records("g", 0, store.latest_offset("g", 0))
    assert store.enforce_retention() >= 20  # and removed at once: no pin left
    assert not _deleted(store, "g")


# ---------------------------------------------------------------------- other paths


def test_tls_and_the_commitlog_engine_copy(
    tmp_path: Any, store: SegmentedStore, certificate: tuple[str, str]
) -> None:
    store.create_topic("s", 1)
    store.append_records("s", 0, [ProducerRecord(None, b"v%d" % i, [], None) for i in range(5)])
    config = BrokerConfig(port=0, tls_cert_path=certificate[0], tls_key_path=certificate[1])
    with Broker(store, config) as tls_broker:
        assert not tls_broker.zero_copy
        consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": tls_broker.bootstrap, "security.protocol": "SSL",
             "ssl.ca.location": certificate[0], "group.id": "g"}
        )  # fmt: skip
        consumer.assign([confluent_kafka.TopicPartition("s", 0, 0)])
        got = [m.value() for m in consumer.consume(5, TIMEOUT_S)]
        consumer.close()
        assert got == [b"v%d" % i for i in range(5)]
        assert sendfile_bytes(tls_broker) == 0
    commitlog = open_engine("commitlog", tmp_path / "commitlog")
    commitlog.create_topic("s", 1)
    commitlog.append_records("s", 0, [ProducerRecord(None, b"v", [], None)])
    with Broker(commitlog, BrokerConfig(port=0)) as copying:
        assert not copying.zero_copy
        assert raw_fetch(copying.port, "s", 0).records
        time.sleep(0.1)  # a sendfile would be counted by now
        assert sendfile_bytes(copying) == 0
    commitlog.close()


def test_the_copying_path_sends_the_stored_batches_as_they_are(store: SegmentedStore) -> None:
    """``zero_copy_fetch`` off (what TLS takes): the same file ranges, read with pread,
    not decoded and rebuilt; a fetch inside a batch gets the whole batch, as Kafka's."""
    store.create_topic("c", 1)
    with Broker(store, BrokerConfig(port=0, zero_copy_fetch=False)) as copying:
        assert not copying.zero_copy
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": copying.bootstrap, "compression.type": "lz4",
             "linger.ms": 20, "enable.idempotence": True}
        )  # fmt: skip
        values = [b"value-%d" % i for i in range(400)]
        for i, value in enumerate(values):
            producer.produce("c", value=value)
            if i % 100 == 99:
                assert producer.flush(TIMEOUT_S) == 0  # one batch or more each time
        stored = log_bytes(store, "c")
        assert len(batches(stored)) > 1
        assert raw_fetch(copying.port, "c", 0).records == stored
        first = batches(stored)[0]
        inside = raw_fetch(copying.port, "c", first.last_offset_delta).records
        assert inside == stored  # from the batch that holds the offset
        after_first = raw_fetch(copying.port, "c", first.last_offset_delta + 1).records
        assert after_first == stored[first.size :]
        got = librdkafka_read(copying.bootstrap, "c", 3, len(values) - 3, TIMEOUT_S)
        assert [message.value() for message in got] == values[3:]
        assert sendfile_bytes(copying) == 0
