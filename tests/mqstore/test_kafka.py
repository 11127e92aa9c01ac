"""Conformance of the Kafka-style adapter, written against the engine interface only,
so that it runs unchanged against every engine (parametrized by ``engine``). The
producer's own behaviour (linger, order, buffer_memory, close) is tested in
test_kafka_producer.py."""

from __future__ import annotations

import gc
import json
import statistics
import threading
import time
import weakref

import pytest

from mqstore import (
    InvalidArgumentError,
    InvalidTypeError,
    KafkaConsumer,
    KafkaProducer,
    OffsetAndMetadata,
    OffsetOutOfRangeError,
    StoreClosedError,
    TopicPartition,
    UnknownTopicError,
)
from mqstore.commitlog.native import NATIVE
from mqstore.engine import NO_HEADERS
from tests.mqstore.engines import ENGINES, open_engine


@pytest.fixture(params=ENGINES)
def engine_factory(request, tmp_path):
    opened = []

    def factory(**kwargs):
        store = open_engine(request.param, tmp_path / "store", **kwargs)
        opened.append(store)
        return store

    factory.kind = request.param
    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def engine(engine_factory):
    return engine_factory()


def _drain(consumer, expected, timeout_s=5.0):
    records = []
    deadline = time.monotonic() + timeout_s
    while len(records) < expected and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=100).values():
            records.extend(batch)
    return records


def test_ordering_and_dense_offsets_within_a_partition(engine):
    engine.create_topic("orders", 3)
    producer = KafkaProducer(engine)
    sent = [producer.send("orders", b"v%d" % i, partition=1).get(timeout=5) for i in range(50)]
    assert [m.offset for m in sent] == list(range(50))
    assert all(m.topic == "orders" and m.partition == 1 for m in sent)
    assert sent[0].topic_partition == TopicPartition("orders", 1)
    consumer = KafkaConsumer(store=engine, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("orders", 1)])
    records = _drain(consumer, 50)
    assert [r.offset for r in records] == list(range(50))
    assert [r.value for r in records] == [b"v%d" % i for i in range(50)]
    assert consumer.position(TopicPartition("orders", 1)) == 50


def test_record_fields_round_trip(engine):
    engine.create_topic("fields", 1)
    producer = KafkaProducer(engine, key_serializer=str.encode, value_serializer=str.encode)
    meta = producer.send(
        "fields", "value", key="key", headers=[("h1", b"a"), ("h2", b"")], timestamp_ms=1234
    ).get()
    assert meta.timestamp == 1234
    assert meta.serialized_key_size == 3
    assert meta.serialized_value_size == 5
    tomb = producer.send("fields", None, key="gone").get()
    consumer = KafkaConsumer(
        store=engine, auto_offset_reset="earliest", value_deserializer=bytes.decode,
        key_deserializer=bytes.decode,
    )  # fmt: skip
    consumer.assign([TopicPartition("fields", 0)])
    first, second = _drain(consumer, 2)
    assert (first.key, first.value, first.timestamp) == ("key", "value", 1234)
    assert first.headers == [("h1", b"a"), ("h2", b"")]
    assert first.timestamp_type == 0
    assert (second.offset, second.key, second.value) == (tomb.offset, "gone", None)


def test_records_without_headers_share_read_only_empty_headers(engine):
    """A record read back without headers holds NO_HEADERS: it equals [] and is a
    list, as kafka-python's, refuses changes, and (C build) neither it nor the
    ConsumerRecord holding it is walked by the cyclic GC. A record with headers keeps
    a list of its own."""
    engine.create_topic("plain", 1)
    producer = KafkaProducer(engine)
    producer.send("plain", b"a", partition=0).get()
    producer.send("plain", b"b", partition=0, headers=[("h", b"x")]).get()
    consumer = KafkaConsumer(store=engine, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("plain", 0)])
    bare, headed = _drain(consumer, 2)
    assert bare.headers == [] and isinstance(bare.headers, list)
    assert bare.headers is NO_HEADERS
    with pytest.raises(TypeError):
        bare.headers.append(("h", b"y"))
    with pytest.raises(TypeError):
        bare.headers += [("h", b"y")]
    assert list(bare.headers) == [] and NO_HEADERS == []
    assert headed.headers == [("h", b"x")] and headed.headers is not NO_HEADERS
    headed.headers.append(("mine", b""))  # its own list
    if NATIVE is not None:
        assert not gc.is_tracked(NO_HEADERS)
        assert not gc.is_tracked(bare)
        assert gc.is_tracked(headed)


def test_headers_changed_around_their_refusals_do_not_reach_other_records(engine):
    """``list.append(NO_HEADERS, ...)`` and ``NO_HEADERS.__init__(...)`` go around (or
    are) the refusals: the next poll's records still show no headers, and a JSON value
    (a dict) keeps its record under the cyclic GC, so a cycle through it is collected."""
    engine.create_topic("plain", 1)
    producer = KafkaProducer(engine)
    producer.send("plain", b'{"a": 1}', partition=0).get()
    with pytest.raises(TypeError):
        NO_HEADERS.__init__([("h", b"x")])
    list.append(NO_HEADERS, ("injected", b"x"))
    consumer = KafkaConsumer(
        store=engine, auto_offset_reset="earliest", value_deserializer=json.loads
    )
    consumer.assign([TopicPartition("plain", 0)])
    (record,) = _drain(consumer, 1)
    assert record.headers == [] and NO_HEADERS == []

    class Marker:
        pass

    marker = Marker()
    probe = weakref.ref(marker)
    record.value["context"] = {"record": record, "marker": marker}
    del record, marker
    gc.collect()
    assert probe() is None


def test_seek_commit_and_committed_across_reopen(engine_factory):
    engine = engine_factory()
    engine.create_topic("t", 2)
    producer = KafkaProducer(engine)
    for i in range(20):
        producer.send("t", b"%d" % i, partition=i % 2)
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    consumer = KafkaConsumer("t", store=engine, group_id="g1", auto_offset_reset="earliest",
                             enable_auto_commit=False)  # fmt: skip
    assert consumer.assignment() == {tp0, tp1}
    records = _drain(consumer, 20)
    assert len(records) == 20
    consumer.commit({tp0: OffsetAndMetadata(7, "half", -1)})
    consumer.commit({tp1: 10})
    assert consumer.committed(tp0) == 7
    assert consumer.committed(tp0, metadata=True) == OffsetAndMetadata(7, "half", -1)
    consumer.seek(tp0, 3)
    assert consumer.position(tp0) == 3
    assert [r.offset for r in consumer.poll(timeout_ms=500)[tp0]][:1] == [3]
    consumer.close()
    engine.close()
    engine = engine_factory()
    again = KafkaConsumer("t", store=engine, group_id="g1", auto_offset_reset="latest")
    assert again.committed(tp0) == 7
    assert again.position(tp0) == 7  # resumes from the commit, not from the reset
    assert again.position(tp1) == 10
    other = KafkaConsumer("t", store=engine, group_id="g2", auto_offset_reset="latest")
    assert other.committed(tp0) is None
    assert other.position(tp0) == 10  # no commit: latest


def test_offsets_for_times_edge_cases(engine):
    engine.create_topic("times", 1)
    producer = KafkaProducer(engine)
    for ts in (100, 200, 200, 300, 150, 400):
        producer.send("times", b"x", timestamp_ms=ts)
    tp = TopicPartition("times", 0)
    consumer = KafkaConsumer(store=engine)
    found = consumer.offsets_for_times({tp: 0})
    assert (found[tp].offset, found[tp].timestamp) == (0, 100)
    assert consumer.offsets_for_times({tp: 200})[tp].offset == 1  # first of equals
    assert consumer.offsets_for_times({tp: 201})[tp].offset == 3
    assert consumer.offsets_for_times({tp: 150})[tp].offset == 1  # offset order
    assert consumer.offsets_for_times({tp: 400})[tp].offset == 5
    assert consumer.offsets_for_times({tp: 401})[tp] is None
    with pytest.raises(ValueError):
        consumer.offsets_for_times({tp: -1})
    assert consumer.beginning_offsets([tp]) == {tp: 0}
    assert consumer.end_offsets([tp]) == {tp: 6}


def test_log_append_time_topic(engine):
    engine.create_topic("lat", 1, timestamp_type="LogAppendTime")
    producer = KafkaProducer(engine)
    meta = producer.send("lat", b"x", timestamp_ms=5).get()
    assert meta.timestamp > 1_000_000_000_000  # the append time, not 5
    consumer = KafkaConsumer(store=engine, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("lat", 0)])
    (record,) = _drain(consumer, 1)
    assert record.timestamp == meta.timestamp
    assert record.timestamp_type == 1


def test_reset_on_out_of_range_positions(engine):
    engine.create_topic("r", 1)
    producer = KafkaProducer(engine)
    for i in range(5):
        producer.send("r", b"%d" % i)
    tp = TopicPartition("r", 0)
    earliest = KafkaConsumer(store=engine, auto_offset_reset="earliest")
    earliest.assign([tp])
    earliest.seek(tp, 99)  # beyond the log end
    assert earliest.position(tp) == 0
    latest = KafkaConsumer(store=engine, auto_offset_reset="latest")
    latest.assign([tp])
    latest.seek(tp, 99)
    assert latest.position(tp) == 5
    strict = KafkaConsumer(store=engine, auto_offset_reset="none")
    strict.assign([tp])
    with pytest.raises(OffsetOutOfRangeError):
        strict.position(tp)  # no commit and no reset policy
    strict.seek(tp, 99)
    with pytest.raises(OffsetOutOfRangeError):
        strict.poll(timeout_ms=0)


def test_pause_resume_and_seek_to_end(engine):
    engine.create_topic("p", 2)
    producer = KafkaProducer(engine)
    for i in range(10):
        producer.send("p", b"x", partition=i % 2)
    tp0, tp1 = TopicPartition("p", 0), TopicPartition("p", 1)
    consumer = KafkaConsumer(store=engine, auto_offset_reset="earliest")
    consumer.assign([tp0, tp1])
    consumer.pause(tp1)
    assert consumer.paused() == {tp1}
    got = consumer.poll(timeout_ms=200)
    assert set(got) == {tp0}
    consumer.resume(tp1)
    consumer.seek_to_end(tp0)
    assert consumer.position(tp0) == 5
    assert consumer.highwater(tp1) == 5
    records = _drain(consumer, 5)
    assert len(records) == 5
    assert {TopicPartition(r.topic, r.partition) for r in records} == {tp1}


def test_long_poll_wakes_within_10_ms_of_a_produce(engine):
    engine.create_topic("lp", 1)
    producer = KafkaProducer(engine)
    consumer = KafkaConsumer(store=engine, auto_offset_reset="latest")
    tp = TopicPartition("lp", 0)
    consumer.assign([tp])
    consumer.position(tp)
    delays_ms = []
    for i in range(7):
        sent_at: dict[str, float] = {}

        def produce(i: int = i, sent_at: dict[str, float] = sent_at) -> None:
            time.sleep(0.03)
            sent_at["t"] = time.monotonic()
            producer.send("lp", b"%d" % i)

        thread = threading.Thread(target=produce)
        thread.start()
        records = consumer.poll(timeout_ms=5000)
        woke = time.monotonic()
        thread.join()
        assert [r.value for r in records[tp]] == [b"%d" % i]
        delays_ms.append((woke - sent_at["t"]) * 1000)
    assert statistics.median(delays_ms) < 10, delays_ms


def test_poll_times_out_empty(engine):
    engine.create_topic("empty", 1)
    consumer = KafkaConsumer("empty", store=engine, auto_offset_reset="earliest")
    started = time.monotonic()
    assert consumer.poll(timeout_ms=50) == {}
    assert time.monotonic() - started >= 0.045


def test_subscribe_pattern_and_topic_admin(engine):
    engine.create_topic("logs.a", 2)
    engine.create_topic("logs.b", 1)
    engine.create_topic("other", 1)
    consumer = KafkaConsumer(store=engine)
    consumer.subscribe(pattern=r"logs\..*")
    assert consumer.assignment() == {
        TopicPartition("logs.a", 0),
        TopicPartition("logs.a", 1),
        TopicPartition("logs.b", 0),
    }
    assert set(engine.list_topics()) == {"logs.a", "logs.b", "other"}
    engine.add_partitions("logs.b", 3)
    assert engine.describe_topic("logs.b").partitions == 3
    consumer.poll(timeout_ms=0)
    assert TopicPartition("logs.b", 2) in consumer.assignment()
    assert KafkaProducer(engine).partitions_for("logs.b") == {0, 1, 2}


def test_bad_input_to_the_adapter(engine_factory):
    engine = engine_factory(auto_create_topics=False)  # "missing" stays unknown
    engine.create_topic("ok", 2)
    producer = KafkaProducer(engine)
    with pytest.raises(UnknownTopicError):
        producer.send("missing", b"x")
    with pytest.raises(UnknownTopicError):
        producer.send("ok", b"x", partition=2)
    with pytest.raises(InvalidTypeError):
        producer.send("ok", "not bytes")
    with pytest.raises(InvalidArgumentError):
        producer.send("ok")
    with pytest.raises(InvalidArgumentError):
        engine.create_topic("ok", 1)
    with pytest.raises(InvalidArgumentError):
        engine.create_topic("../etc", 1)
    with pytest.raises(InvalidArgumentError):
        engine.create_topic("zero", 0)
    with pytest.raises(InvalidArgumentError):
        engine.add_partitions("ok", 1)  # never shrinks
    with pytest.raises(InvalidArgumentError):
        KafkaConsumer(store=engine, auto_offset_reset="sometimes")
    with pytest.raises(InvalidArgumentError):
        KafkaConsumer(store=engine, group_id="a/b")
    consumer = KafkaConsumer(store=engine, group_id="g")
    with pytest.raises(UnknownTopicError):
        consumer.assign([TopicPartition("ok", 5)])
    with pytest.raises(InvalidArgumentError):
        consumer.commit({TopicPartition("ok", 0): -3})
    producer.close()
    with pytest.raises(StoreClosedError):
        producer.send("ok", b"x")
    assert engine.latest_offset("ok", 0) == 0  # nothing was written by any of it


def test_auto_commit_on_poll_and_close(engine):
    engine.create_topic("ac", 1)
    producer = KafkaProducer(engine)
    for i in range(5):
        producer.send("ac", b"%d" % i)
    tp = TopicPartition("ac", 0)
    consumer = KafkaConsumer("ac", store=engine, group_id="auto", auto_offset_reset="earliest",
                             auto_commit_interval_ms=0)  # fmt: skip
    assert len(_drain(consumer, 5)) == 5
    consumer.poll(timeout_ms=0)  # the interval has passed: this poll commits the positions
    assert consumer.committed(tp) == 5
    producer.send("ac", b"5")
    assert len(_drain(consumer, 1)) == 1
    consumer.close()  # commits on close
    assert KafkaConsumer(store=engine, group_id="auto").committed(tp) == 6
    manual = KafkaConsumer("ac", store=engine, group_id="manual", enable_auto_commit=False,
                           auto_offset_reset="earliest")  # fmt: skip
    _drain(manual, 6)
    manual.close()
    assert KafkaConsumer(store=engine, group_id="manual").committed(tp) is None


def test_kafka_python_configs_are_accepted_and_unknown_ones_refused(engine):
    engine.create_topic("cfg", 1)
    KafkaProducer(engine, bootstrap_servers="ignored:9092", acks="all", retries=3,
                  compression_type=None, ssl_cafile=None).close()  # fmt: skip
    KafkaConsumer("cfg", store=engine, session_timeout_ms=10_000, fetch_max_bytes=1 << 20,
                  security_protocol="PLAINTEXT").close()  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="unrecognized"):
        KafkaConsumer(store=engine, no_such_setting=1)
    with pytest.raises(InvalidArgumentError, match="unrecognized"):
        KafkaProducer(engine, lingerms=5)


def test_polls_go_on_after_the_last_partition_read(engine):
    """Each poll starts after the partition where the previous one stopped, so a
    consumer of many partitions reads each drained partition about once, in order."""
    engine.create_topic("rr", 8)
    producer = KafkaProducer(engine)
    for i in range(40):
        producer.send("rr", b"%d" % i, partition=i // 5)  # partition p holds 5p .. 5p+4
    consumer = KafkaConsumer(store=engine, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("rr", p) for p in range(8)])
    calls = []
    read = engine.read_batch  # what poll reads through

    def counting(topic, partition, offset, max_records):
        calls.append(partition)
        return read(topic, partition, offset, max_records)

    engine.read_batch = counting
    order = []
    for _ in range(4):  # each poll takes two whole partitions
        for tp, records in consumer.poll(timeout_ms=0, max_records=10).items():
            order += [(tp.partition, int(r.value)) for r in records]
    assert order == [(i // 5, i) for i in range(40)]
    assert calls == list(range(8))  # no re-read of a drained partition


# ---------------------------------------------------------------- kafka-python habits


def test_assign_and_subscribe_are_exclusive_with_illegal_state_error(engine):
    from mqstore import IllegalStateError, StoreError

    engine.create_topic("t", 2)
    subscribed = KafkaConsumer("t", store=engine)
    with pytest.raises(IllegalStateError):
        subscribed.assign([TopicPartition("t", 0)])
    assigned = KafkaConsumer(store=engine)
    assigned.assign([TopicPartition("t", 0)])
    with pytest.raises(IllegalStateError) as caught:
        assigned.subscribe(["t"])
    assert isinstance(caught.value, StoreError)
    assigned.unsubscribe()  # then either is allowed again, as in kafka-python
    assigned.subscribe(["t"])
    assert assigned.assignment() == {TopicPartition("t", 0), TopicPartition("t", 1)}


def test_a_rebalance_listener_hears_of_every_assignment_change(engine):
    from mqstore import ConsumerRebalanceListener

    calls = []

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            calls.append(("revoked", revoked))

        def on_partitions_assigned(self, assigned):
            calls.append(("assigned", assigned))

    engine.create_topic("t", 2)
    consumer = KafkaConsumer(store=engine)
    consumer.subscribe(["t"], listener=Listener())
    both = {TopicPartition("t", 0), TopicPartition("t", 1)}
    assert calls == [("assigned", both)]
    engine.add_partitions("t", 3)
    consumer.poll(timeout_ms=0)  # the next poll sees the new partition
    assert calls[1:] == [("revoked", both), ("assigned", both | {TopicPartition("t", 2)})]
    consumer.unsubscribe()
    assert calls[-1][0] == "revoked"
    with pytest.raises(InvalidTypeError):
        consumer.subscribe(["t"], listener=lambda *a: None)


def test_metrics_have_kafka_pythons_shape_and_true_counts(engine):
    engine.create_topic("t", 1)
    producer = KafkaProducer(store=engine)  # store as a keyword, like the consumer
    for i in range(5):
        producer.send("t", b"v%d" % i)
    sent = producer.metrics()["producer-metrics"]
    assert sent["record-send-total"] == 5
    assert sent["record-error-total"] == 0
    assert sent["buffer-available-bytes"] == sent["buffer-total-bytes"]
    consumer = KafkaConsumer("t", store=engine, group_id="g", auto_offset_reset="earliest")
    assert len(_drain(consumer, 5)) == 5
    consumer.commit()
    metrics = consumer.metrics()
    assert metrics["consumer-fetch-manager-metrics"]["records-consumed-total"] == 5
    assert metrics["consumer-coordinator-metrics"] == {"assigned-partitions": 1, "commit-total": 1}
