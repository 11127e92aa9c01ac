"""One notion of a topic across every entry point (issue 14, item 4).

The rule: a topic exists once created, explicitly or, with ``auto_create_topics``
(the default), by the first write to it; ``put`` to queue q makes the topic have at
least q + 1 partitions; the Kafka-style producer refuses a partition past the count.
Reads never create a topic. With the switch off every write to an unknown topic (or
queue) is refused with UnknownTopicError.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import attrs
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
from mqstore.commitlog.errors import InvalidArgumentError, InvalidRecordError
from mqstore.segmented import SegmentedConfig, SegmentedStore
from mqstore.topics import PARTITIONS_MAX, TopicConfig, TopicRegistry
from tests.mqstore.conftest import SMALL

ROOT = Path(__file__).resolve().parents[2]


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


# ---------------------------------------------------------------- growth by put


def _on_disk(root) -> TopicRegistry:
    return TopicRegistry(str(root), read_only=True)


def test_a_growth_stays_in_memory_until_persisted_or_written_with_a_change(tmp_path, monkeypatch):
    registry = TopicRegistry(str(tmp_path), read_only=False)
    registry.put(TopicConfig(name="t", partitions=1))
    assert registry.grow("t", 5).partitions == 5
    assert registry.get("t").partitions == 5 and registry.pending
    assert _on_disk(tmp_path).get("t").partitions == 1  # the file has not followed yet
    assert registry.grow("t", 3).partitions == 5  # never shrinks
    registry.persist_pending()
    assert not registry.pending and _on_disk(tmp_path).get("t").partitions == 5
    registry.grow("t", 7)
    registry.put(TopicConfig(name="u", partitions=1))  # any write carries the growth
    on_disk = _on_disk(tmp_path)
    assert not registry.pending and on_disk.get("t").partitions == 7 and on_disk.get("u")
    with pytest.raises(InvalidArgumentError):
        registry.grow("t", PARTITIONS_MAX + 1)
    with pytest.raises(ReadOnlyStoreError):
        on_disk.grow("t", 9)
    with pytest.raises(KeyError):
        registry.grow("nope", 2)  # growth is of a topic that exists: creation is a put

    def full(*_args: object) -> None:
        raise OSError(28, "No space left on device (injected)")

    registry.grow("t", 8)
    monkeypatch.setattr("mqstore.topics.write_json_atomically", full)
    with pytest.raises(OSError):
        registry.persist_pending()
    assert registry.pending  # kept for the next try
    assert registry.try_persist_pending() is False  # logged, not raised
    assert registry.pending
    monkeypatch.undo()
    assert registry.try_persist_pending() is True
    assert _on_disk(tmp_path).get("t").partitions == 8


def test_a_growth_during_a_puts_write_stays_pending(tmp_path):
    registry = TopicRegistry(str(tmp_path), read_only=False)
    registry.put(TopicConfig(name="t", partitions=1))
    written = registry._write

    def write_while_growing(topics: dict) -> None:
        registry.grow("t", 3)  # another thread's put, between the snapshot and the write
        written(topics)

    registry._write = write_while_growing  # type: ignore[method-assign]
    registry.put(TopicConfig(name="u", partitions=1))
    registry._write = written  # type: ignore[method-assign]
    assert registry.get("t").partitions == 3
    assert registry.pending  # the file holds the snapshot from before the growth
    assert _on_disk(tmp_path).get("t").partitions == 1
    registry.persist_pending()
    assert _on_disk(tmp_path).get("t").partitions == 3


def test_a_change_written_while_puts_grow_the_topic_never_shrinks_it(tmp_path):
    registry = TopicRegistry(str(tmp_path), read_only=False)
    first = registry.put(TopicConfig(name="t", partitions=1))
    registry.grow("t", 4)
    assert registry.put(attrs.evolve(first, retention_ms=1_000)).partitions == 4

    def grower() -> None:
        for partitions in range(5, 2_005):
            registry.grow("t", partitions)

    thread = threading.Thread(target=grower)
    thread.start()
    for retention_ms in range(2_000, 2_040):  # each put copies a config from before
        registry.put(attrs.evolve(first, retention_ms=retention_ms))
        registry.persist_pending()  # as the dispatcher's rounds do meanwhile
    thread.join()
    registry.persist_pending()
    for seen in (registry, _on_disk(tmp_path)):
        topic = seen.get("t")
        assert (topic.partitions, topic.retention_ms) == (2_004, 2_039)


def test_a_reader_knows_every_partition_whose_records_it_can_read(tmp_path):
    """A put that grows a topic does not write the registry; the dispatch round that
    makes the new queue's record readable writes it first."""
    root = tmp_path / "store"
    with MessageStore.open(root, StoreConfig(**SMALL)) as writer:
        writer.create_topic("t", 1)
        with MessageStore.open(root, read_only=True) as reader:
            for queue_id in range(1, 120):
                writer.put("t", queue_id, b"x")
                assert writer.wait_for("t", queue_id, 0, 5000)
                assert reader.max_offset("t", queue_id) == 1  # UnknownTopicError otherwise


def _crash_after_growing_puts(root, partitions: int) -> None:
    """A writer grows topic t from 1 to ``partitions`` by puts (one record each to
    queues 1 and up) and dies before any dispatch round writes its registry."""
    store = MessageStore.open(root, StoreConfig(**SMALL))
    store.create_topic("t", 1)

    def crash_first() -> None:  # the process dies before its rounds write anything
        raise OSError(5, "Input/output error (injected)")

    assert store._dispatcher is not None
    store._dispatcher.set_before_publish(crash_first)
    for queue_id in range(1, partitions):
        store.put("t", queue_id, b"v%d" % queue_id)
    store._crash()
    assert _on_disk(root).get("t").partitions == 1  # the growths never reached the file


def test_a_crash_before_the_registry_follows_loses_no_partition(tmp_path):
    root = tmp_path / "store"
    _crash_after_growing_puts(root, 40)
    with MessageStore.open(root, StoreConfig(**SMALL)) as reopened:
        assert reopened.describe_topic("t").partitions == 40
        for queue_id in range(1, 40):
            assert [m.value for m in reopened.get("t", queue_id, 0, 2)] == [b"v%d" % queue_id]
    assert _on_disk(root).get("t").partitions == 40


def test_a_replicated_reopen_registers_the_queues_it_holds_back(tmp_path):
    """A leader reopened with ``replicated=True`` after a crash holds its readers at
    the last checkpoint: the records past it are not in any ConsumeQueue yet, and
    their queues are registered from the CommitLog's count."""
    root = tmp_path / "store"
    _crash_after_growing_puts(root, 12)
    with MessageStore.open(root, StoreConfig(**SMALL), replicated=True) as reopened:
        assert reopened.held_at_open is not None
        assert reopened.describe_topic("t").partitions == 12
    assert _on_disk(root).get("t").partitions == 12


@pytest.mark.parametrize("how", ["put", "put_batch_arrays", "put_batch_buffers"])
def test_a_put_that_fails_after_growing_its_topic_keeps_the_growth_through_a_crash(tmp_path, how):
    root = tmp_path / "store"
    store = MessageStore.open(root, StoreConfig(**SMALL))
    store.create_topic("c", 1, cleanup_policy="compact")
    with pytest.raises(InvalidRecordError):  # a compacted topic's record needs a key
        if how == "put":
            store.put("c", 5, b"no key")
        elif how == "put_batch_arrays":
            store.put_batch_arrays("c", 5, [b"no key"])
        else:
            store.put_batch_buffers("c", 5, np.array([0, 6]), b"no key")
    assert store.describe_topic("c").partitions == 6  # grown, as Kafka's auto-create
    store._crash()
    with MessageStore.open(root, StoreConfig(**SMALL)) as reopened:
        assert reopened.describe_topic("c").partitions == 6  # never shrinks


def test_a_registry_that_cannot_be_written_holds_back_no_record(tmp_path, monkeypatch, caplog):
    root = tmp_path / "store"
    with MessageStore.open(root, StoreConfig(**SMALL)) as store:
        store.create_topic("t", 1)

        def full(*_args: object) -> None:
            raise OSError(28, "No space left on device (injected)")

        monkeypatch.setattr("mqstore.topics.write_json_atomically", full)
        with caplog.at_level("WARNING", logger="mqstore.topics"):
            store.put("t", 3, b"x")
            assert store.wait_for("t", 3, 0, 5000)  # dispatched all the same
            store.put("t", 0, b"y")
            assert store.wait_for("t", 0, 0, 5000)  # other queues too
        assert store.topics.pending
        assert sum("could not follow" in r.getMessage() for r in caplog.records) == 1
        assert _on_disk(root).get("t").partitions == 1
        monkeypatch.undo()
        store.put("t", 1, b"z")
        assert store.wait_for("t", 1, 0, 5000)
        assert _on_disk(root).get("t").partitions == 4  # the next round wrote it
        store.topics.grow("t", 9)  # a growth no record follows: close writes it
    assert _on_disk(root).get("t").partitions == 9


KILLED_WRITER = f"""
import os, signal, sys
from mqstore import MessageStore, StoreConfig
store = MessageStore.open(sys.argv[1], StoreConfig(**{SMALL!r}))
store.create_topic("t", 1)
for queue_id in range(1, 3000):
    store.put("t", queue_id, b"v%d" % queue_id)
os.kill(os.getpid(), signal.SIGKILL)  # at once: the last growths are likely in memory only
"""


def test_a_writer_killed_right_after_growing_puts_loses_no_partition(tmp_path):
    root = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(root)], cwd=ROOT, timeout=120, check=False
    )
    assert child.returncode == -signal.SIGKILL
    with MessageStore.open(root, StoreConfig(**SMALL)) as reopened:
        assert reopened.describe_topic("t").partitions == 3000
        for queue_id in (1, 1500, 2999):
            assert [m.value for m in reopened.get("t", queue_id, 0, 2)] == [b"v%d" % queue_id]
        assert all(reopened.max_offset("t", q) == 1 for q in range(1, 3000))


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
