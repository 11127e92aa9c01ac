"""The admin APIs through clients nobody here wrote: kafka-python 3's
KafkaAdminClient and confluent-kafka's AdminClient, on both engines."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions
from kafka.errors import InvalidPartitionsError, PolicyViolationError, TopicDeletionDisabledError

from mqstore.broker import Broker
from tests.mqstore.broker.test_handlers import produce_kp

confluent_kafka = pytest.importorskip("confluent_kafka")
confluent_admin = pytest.importorskip("confluent_kafka.admin")


def kp_admin(broker: Broker) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)


def ck_admin(broker: Broker) -> Any:
    return confluent_admin.AdminClient({"bootstrap.servers": broker.bootstrap})


def test_create_partitions(broker: Broker) -> None:
    broker.engine.create_topic("grow", 1)
    admin = kp_admin(broker)
    try:
        admin.create_partitions({"grow": NewPartitions(3)})
        assert broker.engine.describe_topic("grow").partitions == 3
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({"grow": NewPartitions(2)})  # never shrink
    finally:
        admin.close()
    client = ck_admin(broker)  # held: a collected client fails its futures
    futures = client.create_partitions([confluent_admin.NewPartitions("grow", 5)])
    futures["grow"].result(timeout=30)
    assert broker.engine.describe_topic("grow").partitions == 5
    futures = client.create_partitions([confluent_admin.NewPartitions("absent", 2)])
    with pytest.raises(confluent_kafka.KafkaException, match="UNKNOWN_TOPIC"):
        futures["absent"].result(timeout=30)


def test_delete_topics_is_refused_and_nothing_lost(broker: Broker) -> None:
    broker.engine.create_topic("kept", 1)
    produce_kp(broker, "kept", 3)
    admin = kp_admin(broker)
    try:
        with pytest.raises(TopicDeletionDisabledError):
            admin.delete_topics(["kept"])
    finally:
        admin.close()
    client = ck_admin(broker)
    futures = client.delete_topics(["kept"], operation_timeout=10)
    with pytest.raises(confluent_kafka.KafkaException, match="TOPIC_DELETION_DISABLED"):
        futures["kept"].result(timeout=30)
    assert "kept" in broker.engine.list_topics()
    assert broker.engine.latest_offset("kept", 0) == 3


def test_delete_records(broker: Broker, engine_kind: str) -> None:
    broker.engine.create_topic("trim", 1)
    produce_kp(broker, "trim", 10)
    admin = kp_admin(broker)
    try:
        if engine_kind == "commitlog":  # its queues start where retention left them
            with pytest.raises(PolicyViolationError):
                admin.delete_records({TopicPartition("trim", 0): 4})
            assert broker.engine.earliest_offset("trim", 0) == 0
            return
        result = admin.delete_records({TopicPartition("trim", 0): 4})
        assert result[TopicPartition("trim", 0)]["low_watermark"] == 4
    finally:
        admin.close()
    assert broker.engine.earliest_offset("trim", 0) == 4
    client = ck_admin(broker)
    futures = client.delete_records([confluent_kafka.TopicPartition("trim", 0, 6)])
    deleted = futures[confluent_kafka.TopicPartition("trim", 0)].result(timeout=30)
    assert deleted.low_watermark == 6
    futures = client.delete_records([confluent_kafka.TopicPartition("trim", 0, 99)])
    with pytest.raises(confluent_kafka.KafkaException, match="OFFSET_OUT_OF_RANGE"):
        futures[confluent_kafka.TopicPartition("trim", 0)].result(timeout=30)
    assert broker.engine.earliest_offset("trim", 0) == 6
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "trim", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition("trim", 0)])
        message = None
        deadline = time.monotonic() + 30
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(1.0)
        assert message is not None and message.error() is None
        assert message.offset() == 6
    finally:
        consumer.close()


def test_describe_configs(broker: Broker) -> None:
    broker.engine.create_topic("conf", 2, timestamp_type="LogAppendTime", retention_ms=60_000)
    admin = kp_admin(broker)
    try:
        described = admin.describe_configs(
            [
                ConfigResource(ConfigResourceType.TOPIC, "conf"),
                ConfigResource(ConfigResourceType.BROKER, "0"),
            ],
            config_filter="all",
        )
    finally:
        admin.close()
    topic = described["topic"]["conf"]
    assert topic["retention.ms"]["value"] == "60000"
    assert topic["message.timestamp.type"]["value"] == "LogAppendTime"
    assert topic["cleanup.policy"]["value"] == "delete"
    assert described["broker"]["0"]["auto.create.topics.enable"]["value"] == "true"
    assert described["broker"]["0"]["socket.request.max.bytes"]["value"] == str(100 << 20)
    resources = [
        confluent_admin.ConfigResource(confluent_admin.ResourceType.TOPIC, "conf"),
        confluent_admin.ConfigResource(confluent_admin.ResourceType.TOPIC, "absent"),
    ]
    client = ck_admin(broker)
    futures = client.describe_configs(resources)
    entries = futures[resources[0]].result(timeout=30)
    assert entries["retention.ms"].value == "60000"
    with pytest.raises(confluent_kafka.KafkaException, match="UNKNOWN_TOPIC"):
        futures[resources[1]].result(timeout=30)


def test_list_and_describe_groups(broker: Broker) -> None:
    broker.engine.create_topic("grp", 1)
    produce_kp(broker, "grp", 3)
    consumer = KafkaConsumer(
        "grp", bootstrap_servers=broker.bootstrap, group_id="live",
        auto_offset_reset="earliest", client_id="the-live-one",
    )  # fmt: skip
    broker.engine.offsets.commit("embedded", {("grp", 0): (2, "")})
    admin = kp_admin(broker)
    try:
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(500)
        assert consumer.assignment() == {TopicPartition("grp", 0)}
        listed = {g["group_id"]: g["protocol_type"] for g in admin.list_groups()}
        assert listed == {"live": "consumer", "embedded": "consumer"}
        described = admin.describe_groups(["live", "embedded", "nobody"])
        live = described["live"]
        assert live["group_state"] == "Stable"
        assert live["protocol_data"] == "range"
        assert [m["client_id"] for m in live["members"]] == ["the-live-one"]
        partitions = live["members"][0]["member_assignment"]["assigned_partitions"]
        assert partitions == [{"topic": "grp", "partitions": [0]}]
        assert described["embedded"]["group_state"] == "Empty"
        assert described["nobody"]["group_state"] == "Dead"
        client = ck_admin(broker)
        groups = client.list_consumer_groups().result(timeout=30)
        assert {g.group_id for g in groups.valid} == {"live", "embedded"}
        futures = client.describe_consumer_groups(["live"])
        group = futures["live"].result(timeout=30)
        assert [m.client_id for m in group.members] == ["the-live-one"]
        assert str(group.state).endswith("STABLE")
    finally:
        consumer.close()
        admin.close()


def test_a_compacted_topic_over_the_wire(broker: Broker) -> None:
    """confluent-kafka's AdminClient creates a compacted topic; its producer's keyless
    record is refused with INVALID_RECORD; after a pass, a consumer from the earliest
    offset reads the latest value of each key at its original offset."""
    client = ck_admin(broker)
    new = confluent_admin.NewTopic(
        "table", 1, config={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
    )
    client.create_topics([new])["table"].result(timeout=30)
    assert broker.engine.describe_topic("table").compacted
    bad = confluent_admin.NewTopic("bad", 1, config={"cleanup.policy": "forever"})
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_CONFIG"):
        client.create_topics([bad])["bad"].result(timeout=30)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "enable.idempotence": False}
    )
    errors: list[Any] = []
    for i in range(40):
        producer.produce("table", key=b"k%d" % (i % 4), value=b"v%d" % i)
    producer.flush(30)
    producer.produce("table", value=b"no key", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    assert [e.code() for e in errors] == [confluent_kafka.KafkaError.INVALID_RECORD]
    engine = broker.engine
    if hasattr(engine, "roll"):  # segmented: the active segment is never cleaned
        engine.roll("table", 0)
    (result,) = engine.compact("table")
    assert result.keys == 4
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "g", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe(["table"])
    seen: list[tuple[int, bytes, bytes]] = []
    deadline = time.monotonic() + 30
    while len(seen) < 4 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.append((message.offset(), message.key(), message.value()))
    consumer.close()
    assert seen == [(36 + i, b"k%d" % i, b"v%d" % (36 + i)) for i in range(4)]
