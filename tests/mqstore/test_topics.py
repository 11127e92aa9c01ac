"""One notion of a topic across every entry point (issue 14, item 4).

The rule: a topic exists once created, explicitly or, with ``auto_create_topics``
(the default), by the first write to it; ``put`` to queue q makes the topic have at
least q + 1 partitions; the Kafka-style producer refuses a partition past the count.
Reads never create a topic. With the switch off every write to an unknown topic (or
queue) is refused with UnknownTopicError.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from mqstore import (
    KafkaConsumer,
    KafkaProducer,
    MessageStore,
    ReadOnlyStoreError,
    StoreConfig,
    TopicPartition,
    UnknownTopicError,
)
from mqstore.segmented import SegmentedConfig, SegmentedStore
from tests.mqstore.conftest import SMALL


def _off() -> StoreConfig:
    return StoreConfig(**SMALL, auto_create_topics=False)


def _reads(store: MessageStore, topic: str, queue_id: int) -> list:
    return [
        lambda: store.get(topic, queue_id, 0, 1),
        lambda: store.min_offset(topic, queue_id),
        lambda: store.max_offset(topic, queue_id),
        lambda: store.offset_for_time(topic, queue_id, 0),
        lambda: store.query_by_key(topic, "k"),
    ]


# ---------------------------------------------------------------- switch on (default)


def test_a_put_to_a_new_topic_creates_it_for_every_entry_point(open_store):
    store = open_store()
    store.put("audit", 2, b"checked", keys=["audit-1"])
    topic = store.list_topics()["audit"]
    assert topic.partitions == 3  # put names its queue: at least q + 1 partitions
    assert store.describe_topic("audit").partitions == 3
    assert [m.value for m in store.query_by_key("audit", "audit-1")] == [b"checked"]
    consumer = KafkaConsumer(store=store, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("audit", 2)])
    (records,) = consumer.poll(timeout_ms=1000).values()
    assert [r.value for r in records] == [b"checked"]
    subscriber = KafkaConsumer("audit", store=store)
    assert subscriber.assignment() == {TopicPartition("audit", p) for p in range(3)}
    sent = KafkaProducer(store=store).send("audit", b"kafka", partition=2).get()
    assert sent.offset == 1


def test_a_put_past_the_partitions_grows_the_topic(open_store):
    store = open_store()
    store.create_topic("t", 2)
    store.put("t", 5, b"x")
    assert store.describe_topic("t").partitions == 6
    assert store.max_offset("t", 5) == 1
    assert store.max_offset("t", 4) == 0  # a partition now, empty


@pytest.mark.parametrize("how", ["put_batch", "put_batch_arrays", "put_batch_buffers"])
def test_batch_puts_create_the_topic(open_store, how):
    store = open_store()
    if how == "put_batch_buffers":
        store.put_batch_buffers("b", 1, np.array([0, 1, 2]), b"ab")
    else:
        getattr(store, how)("b", 1, [b"a", b"b"])
    assert store.describe_topic("b").partitions == 2
    assert [m.value for m in store.get("b", 1, 0, 5)] == [b"a", b"b"]


def test_the_producer_creates_a_topic_with_the_default_partitions(open_store):
    store = open_store(StoreConfig(**SMALL, auto_create_topic_partitions=3))
    producer = KafkaProducer(store=store)
    producer.send("events", b"v", key=b"k").get()
    assert store.describe_topic("events").partitions == 3
    with pytest.raises(UnknownTopicError, match="no partition 7"):
        producer.send("events", b"v", partition=7)  # as Kafka: no implicit growth
    store.put("fresh", 0, b"x")
    assert store.describe_topic("fresh").partitions == 3  # max(q + 1, default)


def test_reads_never_create_a_topic(open_store):
    store = open_store()
    store.put("t", 0, b"x")
    for read in _reads(store, "nope", 0):
        with pytest.raises(UnknownTopicError):
            read()
    with pytest.raises(UnknownTopicError, match="no partition 1"):
        store.get("t", 1, 0, 1)
    assert sorted(store.list_topics()) == ["t"]
    assert KafkaConsumer(store=store).partitions_for_topic("nope") is None
    with pytest.raises(UnknownTopicError):
        KafkaConsumer(store=store).assign([TopicPartition("nope", 0)])


def test_a_subscription_waits_for_a_topic_the_first_write_creates(open_store):
    store = open_store()
    consumer = KafkaConsumer("later", store=store, auto_offset_reset="earliest")
    assert consumer.assignment() == set()
    assert store.wait_for("later", 0, 0, 10) is False  # not there yet: waits, no error
    KafkaProducer(store=store).send("later", b"now").get()
    (records,) = consumer.poll(timeout_ms=1000).values()
    assert [r.value for r in records] == [b"now"]
    assert store.wait_for("later", 0, 0, 10) is True


def test_a_read_only_store_never_creates_and_sees_what_the_writer_created(tmp_path):
    root = tmp_path / "store"
    writer = MessageStore.open(root, StoreConfig(**SMALL))
    try:
        writer.put("t", 0, b"x")
        reader = MessageStore.open(root, read_only=True)
        try:
            with pytest.raises(ReadOnlyStoreError):
                reader.put("ro", 0, b"x")
            with pytest.raises(ReadOnlyStoreError):
                KafkaProducer(store=reader).send("ro", b"x")
            assert "ro" not in reader.list_topics()
            writer.put("made-later", 1, b"y")  # after the reader opened
            writer._dispatcher.dispatch_available()
            assert reader.max_offset("made-later", 1) == 1
        finally:
            reader.close()
    finally:
        writer.close()


def test_queues_written_before_topics_were_registered_are_adopted(tmp_path):
    root = tmp_path / "store"
    with MessageStore.open(root, StoreConfig(**SMALL)) as store:
        store.put("old", 3, b"x")
    os.remove(root / "topics")  # a store from before every put registered its topic
    with MessageStore.open(root, read_only=True) as reader:
        assert "old" not in reader.list_topics()  # a reader never writes the registry
    with MessageStore.open(root) as store:
        assert store.describe_topic("old").partitions == 4
        assert [m.value for m in store.get("old", 3, 0, 1)] == [b"x"]


def test_the_segmented_engine_auto_creates_too(tmp_path):
    config = SegmentedConfig(segment_bytes=256 * 1024, auto_create_topic_partitions=2)
    with SegmentedStore.open(tmp_path / "seg", config) as store:
        KafkaProducer(store=store).send("seg", b"v").get()
        assert store.describe_topic("seg").partitions == 2
        with pytest.raises(UnknownTopicError):
            store.read_records("nope", 0, 0, 1)
        assert "nope" not in store.list_topics()


# ---------------------------------------------------------------- switch off


@pytest.mark.parametrize(
    "write",
    [
        lambda s: s.put("nope", 0, b"x"),
        lambda s: s.put_batch("nope", 0, [b"x"]),
        lambda s: s.put_batch_arrays("nope", 0, [b"x"]),
        lambda s: s.put_batch_buffers("nope", 0, np.array([0, 1]), b"x"),
        lambda s: s.put("t", 1, b"past the partitions"),
        lambda s: s.put_batch("t", 1, [b"past the partitions"]),
        lambda s: KafkaProducer(store=s).send("nope", b"x"),
        lambda s: KafkaProducer(store=s, linger_ms=5).send("nope", b"x"),
        lambda s: KafkaConsumer("nope", store=s),
        lambda s: KafkaConsumer(store=s).subscribe(["t", "nope"]),
        lambda s: KafkaConsumer(store=s).assign([TopicPartition("nope", 0)]),
        lambda s: s.wait_for("nope", 0, 0, 10),
    ],
)
def test_with_the_switch_off_every_entry_point_refuses_an_unknown_topic(open_store, write):
    store = open_store(_off())
    store.create_topic("t", 1)
    with pytest.raises(UnknownTopicError):
        write(store)
    assert sorted(store.list_topics()) == ["t"]
    assert store.describe_topic("t").partitions == 1
    for read in _reads(store, "nope", 0):
        with pytest.raises(UnknownTopicError):
            read()


def test_with_the_switch_off_created_topics_work_as_before(open_store):
    store = open_store(_off())
    store.create_topic("t", 2)
    store.put("t", 1, b"x")
    assert KafkaProducer(store=store).send("t", b"y", partition=0).get().offset == 0
    assert KafkaConsumer("t", store=store).assignment() == {
        TopicPartition("t", 0),
        TopicPartition("t", 1),
    }


def test_the_segmented_engine_refuses_with_the_switch_off(tmp_path):
    config = SegmentedConfig(segment_bytes=256 * 1024, auto_create_topics=False)
    with SegmentedStore.open(tmp_path / "seg", config) as store:
        with pytest.raises(UnknownTopicError):
            KafkaProducer(store=store).send("seg", b"v")
        assert store.list_topics() == {}


def test_the_spark_sink_follows_the_rule(tmp_path):
    pytest.importorskip("pyarrow")
    from mqstore.spark.sink import _partitions_for_write

    root = tmp_path / "store"
    with MessageStore.open(root, StoreConfig(**SMALL, auto_create_topic_partitions=2)) as store:
        config = StoreConfig(**SMALL, auto_create_topic_partitions=2)
        with MessageStore.open(root, config, read_only=True) as reader:  # a spooling task
            assert _partitions_for_write(reader, "sunk") == 2  # the writer creates it
            assert "sunk" not in reader.list_topics()
        assert _partitions_for_write(store, "sunk") == 2  # the writer: created now
        assert store.describe_topic("sunk").partitions == 2
    with MessageStore.open(root, _off()) as store, pytest.raises(UnknownTopicError):
        _partitions_for_write(store, "other")


# ---------------------------------------------------------------- compaction settings


def test_compaction_settings_have_kafkas_defaults_and_persist_only_when_set(tmp_path):
    from mqstore.commitlog.errors import InvalidArgumentError

    with SegmentedStore.open(tmp_path / "k", SegmentedConfig()) as store:
        plain = store.create_topic("plain")
        assert (plain.min_cleanable_dirty_ratio, plain.min_compaction_lag_ms) == (0.5, 0)
        assert plain.max_compaction_lag_ms == 2**63 - 1
        assert plain.delete_retention_ms == 86_400_000
        assert "delete_retention_ms" not in plain.to_json()  # old topics files unchanged
        store.create_topic(
            "table",
            cleanup_policy="compact,delete",
            topic_configs={"delete.retention.ms": "1000", "min.cleanable.dirty.ratio": "0.1"},
        )
        with pytest.raises(InvalidArgumentError, match="not supported"):
            store.create_topic("bad", topic_configs={"segment.jitter.ms": "1"})
        with pytest.raises(InvalidArgumentError, match="not a number"):
            store.create_topic("bad", topic_configs={"max.compaction.lag.ms": "soon"})
        with pytest.raises(InvalidArgumentError, match="not in"):
            store.create_topic("bad", topic_configs={"min.cleanable.dirty.ratio": "1.5"})
        with pytest.raises(InvalidArgumentError, match="cleanup_policy"):
            store.create_topic("bad", cleanup_policy="delete,compact")
        altered = store.alter_topic("plain", {"cleanup.policy": "compact"})
        assert altered.compacted and not altered.deletes
    with SegmentedStore.open(tmp_path / "k", SegmentedConfig()) as store:
        table = store.describe_topic("table")
        assert table.compacted and table.deletes
        assert (table.delete_retention_ms, table.min_cleanable_dirty_ratio) == (1000, 0.1)
        assert store.describe_topic("plain").cleanup_policy == "compact"


def test_the_commitlog_engine_takes_the_compaction_settings(open_store):
    store = open_store()
    created = store.create_topic("c", 1, topic_configs={"cleanup.policy": "compact"})
    assert created.compacted and not created.deletes
    store.create_topic("t", 1, topic_configs={"retention.ms": "-1", "delete.retention.ms": "5"})
    altered = store.alter_topic("t", {"cleanup.policy": "compact,delete"})
    assert altered.compacted and altered.deletes and altered.delete_retention_ms == 5
    assert store.alter_topic("t", {"retention.ms": "1000"}).retention_ms == 1000
    assert store.describe_topic("t").cleanup_policy == "compact,delete"
    copy = store._compaction.store.describe_topic("t")  # the copy has the same settings
    assert (copy.cleanup_policy, copy.delete_retention_ms, copy.retention_ms) == (
        "compact,delete",
        5,
        1000,
    )
