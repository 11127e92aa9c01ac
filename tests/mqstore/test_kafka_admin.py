"""The Kafka-style admin client (mqstore.kafka_admin) on every engine."""

from __future__ import annotations

import pytest

from mqstore import (
    InvalidArgumentError,
    KafkaAdminClient,
    KafkaConsumer,
    NewPartitions,
    NewTopic,
    StoreError,
    TopicDeletionDisabledError,
    TopicPartition,
    UnknownTopicError,
)
from mqstore.kafka_admin import TopicAlreadyExistsError
from tests.mqstore.engines import ENGINES, open_engine


@pytest.fixture(params=ENGINES)
def engine(request, tmp_path):
    store = open_engine(request.param, tmp_path / "store")
    yield store
    store.close()


def test_create_describe_and_list_topics(engine):
    admin = KafkaAdminClient(store=engine, bootstrap_servers="ignored:9092")
    configs = {"retention.ms": "-1", "message.timestamp.type": "LogAppendTime"}
    created = admin.create_topics(
        [
            NewTopic("orders", num_partitions=3, replication_factor=1, topic_configs=configs),
            NewTopic("audit", 1, 1),
        ]
    )
    assert sorted(created) == ["audit", "orders"]
    assert admin.list_topics() == ["audit", "orders"]
    topic = engine.describe_topic("orders")
    assert (topic.partitions, topic.retention_ms, topic.timestamp_type) == (
        3,
        -1,
        "LogAppendTime",
    )
    (described,) = admin.describe_topics(["orders"])
    assert described["topic"] == "orders" and described["error_code"] == 0
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert described["partitions"][0]["replicas"] == [0]
    assert KafkaConsumer("orders", store=engine).assignment() == {
        TopicPartition("orders", p) for p in range(3)
    }


def test_create_refuses_what_a_single_store_cannot_honour(engine):
    admin = KafkaAdminClient(store=engine)
    admin.create_topics([NewTopic("t", 1, 1)])
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics([NewTopic("t", 1, 1)])
    with pytest.raises(InvalidArgumentError, match="replication_factor 3"):
        admin.create_topics([NewTopic("r", 1, 3)])
    with pytest.raises(InvalidArgumentError, match="not supported"):
        admin.create_topics([NewTopic("c", 1, 1, topic_configs={"compression.type": "lz4"})])
    admin.create_topics([NewTopic("v", 2, 1)], validate_only=True)
    assert admin.list_topics() == ["t"]  # nothing else was created


def test_create_partitions_grows_a_topic(engine):
    admin = KafkaAdminClient(store=engine)
    admin.create_topics([NewTopic("t", 2, 1)])
    admin.create_partitions({"t": NewPartitions(total_count=5)})
    assert engine.describe_topic("t").partitions == 5
    with pytest.raises(InvalidArgumentError):
        admin.create_partitions({"t": NewPartitions(total_count=5)})
    with pytest.raises(UnknownTopicError):
        admin.create_partitions({"nope": NewPartitions(total_count=2)})


def test_delete_topics_raises_one_clear_typed_error(engine):
    admin = KafkaAdminClient(store=engine)
    admin.create_topics([NewTopic("t", 1, 1)])
    with pytest.raises(TopicDeletionDisabledError, match="retention") as caught:
        admin.delete_topics(["t"])
    assert isinstance(caught.value, StoreError)
    assert admin.list_topics() == ["t"]


def test_describe_an_unknown_topic(engine):
    with pytest.raises(UnknownTopicError):
        KafkaAdminClient(store=engine).describe_topics(["nope"])
