"""The APIs against clients nobody here wrote, on both engines: kafka-python 3 (its
default idempotent producer, a consumer with assign, by timestamp, commit and
resume) and confluent-kafka (librdkafka: compressed produce, consume, admin)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from mqstore.broker import Broker

confluent_kafka = pytest.importorskip("confluent_kafka")
confluent_admin = pytest.importorskip("confluent_kafka.admin")

RECORDS = 300
WAIT_S = 20.0


def kp_producer(broker: Broker, **extra: Any) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=broker.bootstrap, **extra)  # idempotent by default


def kp_consumer(broker: Broker, **extra: Any) -> KafkaConsumer:
    settings: dict[str, Any] = dict(
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=2_000,
    )
    settings.update(extra)
    return KafkaConsumer(**settings)


def poll_all(consumer: Any, count: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            got.extend(records)
    return got


def produce_kp(broker: Broker, topic: str, count: int, **extra: Any) -> list[Any]:
    producer = kp_producer(broker, **extra)
    try:
        futures = [
            producer.send(
                topic, key=b"key-%d" % i, value=b"value-%d" % i, headers=[("h", b"%d" % i)]
            )
            for i in range(count)
        ]
        producer.flush(timeout=WAIT_S)
        return [future.get(timeout=WAIT_S) for future in futures]
    finally:
        producer.close(timeout=5)


def test_kafka_python_idempotent_produce_and_assign_consume(broker: Broker) -> None:
    metadata = produce_kp(broker, "orders", RECORDS)
    assert [m.offset for m in metadata] == list(range(RECORDS))
    consumer = kp_consumer(broker)
    try:
        consumer.assign([TopicPartition("orders", 0)])
        records = poll_all(consumer, RECORDS)
    finally:
        consumer.close()
    assert [r.offset for r in records] == list(range(RECORDS))
    assert records[7].key == b"key-7"
    assert records[7].value == b"value-7"
    assert records[7].headers == [("h", b"7")]
    assert records[7].timestamp == metadata[7].timestamp


def test_consume_from_a_timestamp_and_the_end(broker: Broker) -> None:
    first = produce_kp(broker, "times", 50)
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    produce_kp(broker, "times", 50)
    partition = TopicPartition("times", 0)
    consumer = kp_consumer(broker)
    try:
        found = consumer.offsets_for_times({partition: middle_ms})[partition]
        assert found is not None
        assert found.offset == 50
        assert found.timestamp >= middle_ms
        assert consumer.offsets_for_times({partition: 2**62})[partition] is None
        assert consumer.beginning_offsets([partition])[partition] == 0
        assert consumer.end_offsets([partition])[partition] == 100
        consumer.assign([partition])
        consumer.seek(partition, found.offset)
        records = poll_all(consumer, 50)
    finally:
        consumer.close()
    assert [r.offset for r in records] == list(range(50, 100))
    assert first[0].timestamp < middle_ms


def test_commit_and_resume(broker: Broker) -> None:
    produce_kp(broker, "resume", 100)
    partition = TopicPartition("resume", 0)
    consumer = kp_consumer(broker, group_id="resumers")
    try:
        consumer.assign([partition])
        records = poll_all(consumer, 40)[:40]
        consumer.commit({partition: _offset_and_metadata(records[-1].offset + 1)})
    finally:
        consumer.close()
    assert broker.engine.offsets.load("resumers")[("resume", 0)][0] == 40
    again = kp_consumer(broker, group_id="resumers")
    try:
        again.assign([partition])
        assert again.committed(partition) == 40
        rest = poll_all(again, 60)
    finally:
        again.close()
    assert [r.offset for r in rest] == list(range(40, 100))


def test_the_offsets_topic_is_internal(commitlog_broker: Broker) -> None:
    """__consumer_offsets holds the commits: Metadata answers it when named (internal)
    but never lists it, and a client's Produce to it is refused, nothing stored."""
    broker = commitlog_broker
    produce_kp(broker, "resume", 5)
    consumer = kp_consumer(broker, group_id="resumers")
    try:
        partition = TopicPartition("resume", 0)
        consumer.assign([partition])
        consumer.commit({partition: _offset_and_metadata(3)})
        assert "__consumer_offsets" not in consumer.topics()
    finally:
        consumer.close()
    assert [(t.name, t.is_internal) for t in _metadata(broker.port, None)] == [("resume", False)]
    [named] = _metadata(broker.port, ["__consumer_offsets"])
    assert (named.error_code, named.is_internal, len(named.partitions)) == (0, True, 1)
    written = broker.engine.latest_offset("__consumer_offsets", 0)
    answer = produce_answer(
        broker.port, produce_frame("__consumer_offsets", idempotent_batch(-1, -1, 1), 3)
    )
    assert answer.error_code != 0
    assert broker.engine.latest_offset("__consumer_offsets", 0) == written == 1
    assert broker.engine.offsets.load("resumers") == {("resume", 0): (3, "")}


def _metadata(port: int, topics: list[str] | None) -> Any:
    """The topics of a raw Metadata v1 answer (``topics`` None: all)."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    from tests.mqstore.broker.conftest import raw_request

    request = MetadataRequest(version=1, topics=topics)
    request.with_header(correlation_id=1, client_id="raw")
    payload = raw_request(port, bytes(request.encode(header=True, framed=True)))
    assert payload is not None
    return MetadataResponse.decode(payload[4:], version=1).topics


def _offset_and_metadata(offset: int) -> Any:
    from kafka.structs import OffsetAndMetadata

    return OffsetAndMetadata(offset, "", -1)


def produce_frame(topic: str, batch: bytes, correlation_id: int, acks: int = -1) -> bytes:
    from kafka.protocol.producer import ProduceRequest

    data = ProduceRequest.TopicProduceData(
        name=topic,
        partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)
        ],
    )
    request = ProduceRequest(version=8, acks=acks, timeout_ms=5000, topic_data=[data])
    request.with_header(correlation_id=correlation_id, client_id="raw")
    return bytes(request.encode(header=True, framed=True))


def idempotent_batch(
    producer_id: int, sequence: int, count: int, *, epoch: int = 0, value: bytes | None = None
) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
        producer_epoch=epoch, base_sequence=sequence, batch_size=1 << 20,
    )  # fmt: skip
    for i in range(count):
        body = b"v%d" % i if value is None else value
        builder.append(i, timestamp=None, key=None, value=body, headers=[])
    return bytes(builder.build())


def produce_answer(port: int, frame: bytes) -> Any:
    from kafka.protocol.producer import ProduceResponse

    from tests.mqstore.broker.conftest import raw_request

    payload = raw_request(port, frame)
    assert payload is not None
    response = ProduceResponse.decode(payload[4:], version=8)
    return response.responses[0].partition_responses[0]


def test_duplicate_batch_gets_its_original_offset(broker: Broker) -> None:
    """A retried batch (same producer id, epoch and sequences) is not appended again;
    a gap in the sequences is OUT_OF_ORDER_SEQUENCE_NUMBER (45)."""
    broker.engine.create_topic("dups", 1)
    produce_kp(broker, "dups", 2)  # offsets 0-1 from another producer
    first = produce_answer(broker.port, produce_frame("dups", idempotent_batch(77, 0, 3), 1))
    again = produce_answer(broker.port, produce_frame("dups", idempotent_batch(77, 0, 3), 2))
    assert (first.error_code, first.base_offset) == (0, 2)
    assert (again.error_code, again.base_offset) == (0, 2)
    assert broker.engine.latest_offset("dups", 0) == 5
    gap = produce_answer(broker.port, produce_frame("dups", idempotent_batch(77, 9, 1), 3))
    assert gap.error_code == 45
    nxt = produce_answer(broker.port, produce_frame("dups", idempotent_batch(77, 3, 1), 4))
    assert (nxt.error_code, nxt.base_offset) == (0, 5)


def test_corrupt_batch_is_refused_and_nothing_stored(broker: Broker) -> None:
    broker.engine.create_topic("bad", 1)
    batch = bytearray(idempotent_batch(-1, -1, 2))
    batch[-1] ^= 0xFF  # under the CRC-32C
    answer = produce_answer(broker.port, produce_frame("bad", bytes(batch), 1))
    assert answer.error_code == 2  # CORRUPT_MESSAGE
    assert broker.engine.latest_offset("bad", 0) == 0
    unknown = produce_answer(broker.port, produce_frame("nope", idempotent_batch(-1, -1, 1), 2))
    assert unknown.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION: Produce creates no topic


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_compressed_produce_and_consume(broker: Broker, codec: str) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 5}
    )
    failures: list[Any] = []
    for i in range(RECORDS):
        producer.produce(
            "zipped", key=b"k%d" % i, value=b"x" * 100 + b"%d" % i,
            on_delivery=lambda error, _m: error and failures.append(error),
        )  # fmt: skip
    assert producer.flush(WAIT_S) == 0
    assert failures == []
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "zip-readers",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition("zipped", 0, 0)])
        got: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message)
    finally:
        consumer.close()
    assert [m.offset() for m in got] == list(range(RECORDS))
    assert got[12].key() == b"k12"
    assert got[12].value() == b"x" * 100 + b"12"


def test_admin_create_topics_and_list_offsets(broker: Broker) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic("made", num_partitions=3, replication_factor=1)])
        assert broker.engine.describe_topic("made").partitions == 3
        with pytest.raises(Exception, match="TopicAlreadyExists"):
            admin.create_topics([NewTopic("made", num_partitions=3, replication_factor=1)])
    finally:
        admin.close()
    librdkafka_admin = confluent_admin.AdminClient({"bootstrap.servers": broker.bootstrap})
    partition = confluent_kafka.TopicPartition("made", 2)
    futures = librdkafka_admin.list_offsets({partition: confluent_admin.OffsetSpec.latest()})
    assert futures[partition].result(WAIT_S).offset == 0


def test_fetch_out_of_range_resets_by_policy(broker: Broker) -> None:
    produce_kp(broker, "ranges", 10)
    partition = TopicPartition("ranges", 0)
    consumer = kp_consumer(broker, auto_offset_reset="earliest")
    try:
        consumer.assign([partition])
        consumer.seek(partition, 500)  # past the end: OFFSET_OUT_OF_RANGE, then reset
        records = poll_all(consumer, 10)
    finally:
        consumer.close()
    assert [r.offset for r in records] == list(range(10))


def test_long_poll_is_woken_by_a_produce(broker: Broker) -> None:
    import threading

    broker.engine.create_topic("wake", 1)
    consumer = kp_consumer(broker, fetch_max_wait_ms=5_000)
    consumer.assign([TopicPartition("wake", 0)])
    consumer.poll(timeout_ms=200)  # positioned at the end, a long poll is in flight
    timer = threading.Timer(0.5, produce_kp, (broker, "wake", 1))
    timer.start()
    try:
        started = time.monotonic()
        records = poll_all(consumer, 1)
        waited = time.monotonic() - started
    finally:
        timer.join()
        consumer.close()
    assert len(records) == 1
    assert waited < 4.5  # woken, not the 5 s max wait


def test_acks_0_gets_no_response_and_is_stored(broker: Broker) -> None:
    import socket
    import struct

    from kafka.protocol.metadata import ApiVersionsRequest

    from tests.mqstore.broker.conftest import read_frame
    from tests.mqstore.broker.test_protocol import request_frame

    broker.engine.create_topic("fire", 1)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as conn:
        conn.sendall(produce_frame("fire", idempotent_batch(-1, -1, 4), 41, acks=0))
        conn.sendall(request_frame(ApiVersionsRequest(version=0), 42))
        payload = read_frame(conn)
    assert payload is not None
    assert struct.unpack_from(">i", payload)[0] == 42  # the next response is the next request's
    assert broker.engine.latest_offset("fire", 0) == 4


def test_log_append_time_topic(broker: Broker) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics(
            [
                NewTopic(
                    "stamped",
                    num_partitions=1,
                    replication_factor=1,
                    topic_configs={"message.timestamp.type": "LogAppendTime"},
                )
            ]
        )
    finally:
        admin.close()
    before = int(time.time() * 1000)
    metadata = produce_kp(broker, "stamped", 3)
    after = int(time.time() * 1000)
    assert broker.engine.describe_topic("stamped").timestamp_type == "LogAppendTime"
    assert all(before - 5 <= m.timestamp <= after + 5 for m in metadata)
    consumer = kp_consumer(broker)
    try:
        consumer.assign([TopicPartition("stamped", 0)])
        records = poll_all(consumer, 3)
    finally:
        consumer.close()
    assert [r.timestamp_type for r in records] == [1, 1, 1]
    assert all(before - 5 <= r.timestamp <= after + 5 for r in records)


def test_offset_metadata_past_kafkas_bound_is_refused(broker: Broker) -> None:
    """Committed metadata is stored in the group's offsets file, which every commit
    rewrites and every OffsetFetch reads: Kafka bounds it (offset.metadata.max.bytes,
    4096) and answers OFFSET_METADATA_TOO_LARGE (12), else one client's commits of
    ~100 MiB frames grow a file without bound."""
    from kafka.protocol.consumer import OffsetCommitRequest, OffsetCommitResponse

    from mqstore.broker.handlers import OFFSET_METADATA_BYTES_MAX
    from tests.mqstore.broker.conftest import raw_request
    from tests.mqstore.broker.test_protocol import request_frame

    broker.engine.create_topic("meta", 2)
    topic_class = OffsetCommitRequest[7].OffsetCommitRequestTopic
    partition_class = topic_class.OffsetCommitRequestPartition

    def commit(metadata: list[str]) -> list[int]:
        parts = [
            partition_class(partition_index=index, committed_offset=5,
                            committed_leader_epoch=-1, committed_metadata=text)
            for index, text in enumerate(metadata)
        ]  # fmt: skip
        request = OffsetCommitRequest(
            version=7, group_id="meta-group", generation_id_or_member_epoch=-1, member_id="",
            group_instance_id=None, topics=[topic_class(name="meta", partitions=parts)],
        )  # fmt: skip
        payload = raw_request(broker.port, request_frame(request, 3))
        assert payload is not None
        answer = OffsetCommitResponse.decode(payload[4:], version=7)
        return [p.error_code for p in answer.topics[0].partitions]

    fits, too_large = "m" * OFFSET_METADATA_BYTES_MAX, "é" * (OFFSET_METADATA_BYTES_MAX // 2 + 1)
    assert commit([fits, too_large]) == [0, 12]
    assert broker.engine.offsets.load("meta-group") == {("meta", 0): (5, fits)}


def _raw(port: int, request: Any, correlation_id: int = 9) -> Any:
    from tests.mqstore.broker.conftest import raw_request

    request.with_header(correlation_id=correlation_id, client_id="raw")
    payload = raw_request(port, bytes(request.encode(header=True, framed=True)))
    assert payload is not None
    return payload[4:]


def test_a_follower_refuses_every_write_with_not_leader(tmp_path: Any) -> None:
    from kafka.protocol.admin import (
        CreatePartitionsRequest,
        CreatePartitionsResponse,
        CreateTopicsRequest,
        CreateTopicsResponse,
    )
    from kafka.protocol.consumer import OffsetCommitRequest, OffsetCommitResponse

    from mqstore.broker import BrokerConfig
    from tests.mqstore.engines import open_engine

    store = open_engine("commitlog", tmp_path / "store")
    store.create_topic("kept", partitions=1)
    try:  # a follower of a leader that is not there: the node makes the store one
        with Broker(store, BrokerConfig(port=0), follow="127.0.0.1:1") as broker:
            assert store.is_follower
            port = broker.port
            frame = produce_frame("kept", idempotent_batch(-1, -1, 2), 1, acks=1)
            assert produce_answer(port, frame).error_code == 6  # NOT_LEADER_OR_FOLLOWER
            creatable = CreateTopicsRequest.CreatableTopic(
                name="fresh", num_partitions=1, replication_factor=1, assignments=[], configs=[]
            )
            created = CreateTopicsResponse.decode(
                _raw(port, CreateTopicsRequest(version=2, topics=[creatable], timeout_ms=5000,
                                               validate_only=False)), version=2,
            )  # fmt: skip
            assert [t.error_code for t in created.topics] == [6]
            grow = CreatePartitionsRequest.CreatePartitionsTopic(
                name="kept", count=2, assignments=None
            )
            grown = CreatePartitionsResponse.decode(
                _raw(port, CreatePartitionsRequest(version=0, topics=[grow], timeout_ms=5000,
                                                   validate_only=False)), version=0,
            )  # fmt: skip
            assert [r.error_code for r in grown.results] == [6]
            part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=0, committed_metadata=""
            )
            topic = OffsetCommitRequest.OffsetCommitRequestTopic(name="kept", partitions=[part])
            committed = OffsetCommitResponse.decode(
                _raw(port, OffsetCommitRequest(
                    version=2, group_id="g", generation_id_or_member_epoch=-1, member_id="",
                    retention_time_ms=-1, topics=[topic],
                )), version=2,
            )  # fmt: skip
            assert [p.error_code for p in committed.topics[0].partitions] == [6]
    finally:
        store.close()
    assert store.topics.get("fresh") is None
    assert store.offsets.load("g") == {}


def test_a_fetch_between_the_high_watermark_and_the_log_end_waits(tmp_path: Any) -> None:
    """Kafka answers OFFSET_OUT_OF_RANGE only past the log end: a consumer whose
    position is past the high watermark (a leader restarted with its HW below what
    consumers read before) waits for the HW instead of being reset to the earliest
    offset (which the chaos checker saw as offsets going backwards)."""
    from mqstore.broker import BrokerConfig
    from tests.mqstore.engines import open_engine

    store = open_engine("commitlog", tmp_path / "store")
    try:
        with Broker(store, BrokerConfig(port=0)) as broker:
            produce_kp(broker, "held", 5)
            high_watermark = store.commitlog.write_position
            store.set_commit_limit(lambda: high_watermark)  # readers see offsets 0-4
            produce_kp(broker, "held", 5)
            consumer = kp_consumer(broker, auto_offset_reset="earliest")
            partition = TopicPartition("held", 0)
            try:
                consumer.assign([partition])
                consumer.seek(partition, 8)  # past the HW (5), before the log end (10)
                assert poll_all_for(consumer, 1.5) == []
                assert consumer.position(partition) == 8  # not reset to 0
                store.set_commit_limit(None)
                store.wake_dispatch()
                records = poll_all(consumer, 2)
            finally:
                consumer.close()
            assert [r.offset for r in records] == [8, 9]
            consumer = kp_consumer(broker, auto_offset_reset="earliest")
            try:  # past the log end: out of range, reset by the policy
                consumer.assign([partition])
                consumer.seek(partition, 11)
                assert [r.offset for r in poll_all(consumer, 10)] == list(range(10))
            finally:
                consumer.close()
    finally:
        store.close()


def poll_all_for(consumer: Any, seconds: float) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            got.extend(records)
    return got
