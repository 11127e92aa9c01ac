"""Bad input at every public entry point: a typed StoreError, and nothing changes.

Each case runs against one store holding known data; a snapshot of every message,
topic and committed offset is taken before and after. ``CASES`` is the count.
"""

from __future__ import annotations

import pytest

from mqstore import (
    KafkaConsumer,
    KafkaProducer,
    MessageStore,
    StoreConfig,
    StoreError,
    TopicPartition,
)
from tests.mqstore.conftest import SMALL

BAD_TOPICS = ["../x", "a/b", "", ".", "..", "a\x00b", "t" * 128, "x\\y", 5, None, b"t"]
BAD_OFFSETS = [-1, -(2**63), 2**63, 2**64, 10**30, "0", 1.5, None, True]
BAD_QUEUES = [-1, 2**31, 2**40, "0", 1.5, None]
HUGE = b"x" * (300 * 1024)  # over SMALL's max message size (and the 256 KiB file)


def _store_cases() -> list[tuple[str, object]]:
    cases: list[tuple[str, object]] = []
    for topic in BAD_TOPICS:
        cases += [
            (f"put topic={topic!r}", lambda s, t=topic: s.put(t, 0, b"x")),
            (f"put_batch topic={topic!r}", lambda s, t=topic: s.put_batch(t, 0, [b"x"])),
            (f"get topic={topic!r}", lambda s, t=topic: s.get(t, 0, 0, 1)),
            (f"query_by_key topic={topic!r}", lambda s, t=topic: s.query_by_key(t, "k")),
            (f"offset_for_time topic={topic!r}", lambda s, t=topic: s.offset_for_time(t, 0, 0)),
            (f"min_offset topic={topic!r}", lambda s, t=topic: s.min_offset(t, 0)),
            (f"create_topic {topic!r}", lambda s, t=topic: s.create_topic(t, 1)),
        ]
    for offset in BAD_OFFSETS:
        cases += [
            (f"get offset={offset!r}", lambda s, o=offset: s.get("t", 0, o, 1)),
            (f"offset_for_time ts={offset!r}", lambda s, o=offset: s.offset_for_time("t", 0, o)),
        ]
    for offset in [o for o in BAD_OFFSETS if not (isinstance(o, int) and o > 0)]:
        # a huge wait_for offset is a valid long poll: it times out (returns False)
        cases.append((f"wait_for offset={offset!r}", lambda s, o=offset: s.wait_for("t", 0, o, 0)))
    for queue in BAD_QUEUES:
        cases += [
            (f"put queue={queue!r}", lambda s, q=queue: s.put("t", q, b"x")),
            (f"get queue={queue!r}", lambda s, q=queue: s.get("t", q, 0, 1)),
            (f"max_offset queue={queue!r}", lambda s, q=queue: s.max_offset("t", q)),
        ]
    cases += [
        ("get past the end", lambda s: s.get("t", 0, 10**6, 1)),
        ("get max_messages=0", lambda s: s.get("t", 0, 0, 0)),
        ("get max_messages huge", lambda s: s.get("t", 0, 0, 10**9)),
        ("put body str", lambda s: s.put("t", 0, "text")),
        ("put body int", lambda s: s.put("t", 0, 5)),
        ("put body oversize", lambda s: s.put("t", 0, HUGE)),
        ("put_batch one oversize", lambda s: s.put_batch("t", 0, [b"ok", HUGE])),
        ("put_batch one bad type", lambda s: s.put_batch("t", 0, [b"ok", 7])),
        ("put_batch keys length", lambda s: s.put_batch("t", 0, [b"a"], keys=[["k"], ["j"]])),
        ("put keys not str", lambda s: s.put("t", 0, b"x", keys=[5])),
        ("put key with NUL", lambda s: s.put("t", 0, b"x", keys=["a\x00b"])),
        ("put key huge", lambda s: s.put("t", 0, b"x", keys=["k" * 70_000])),
        ("put tag int", lambda s: s.put("t", 0, b"x", tag=5)),
        ("put born negative", lambda s: s.put("t", 0, b"x", born_timestamp_ms=-1)),
        ("put born str", lambda s: s.put("t", 0, b"x", born_timestamp_ms="now")),
        ("put properties bad", lambda s: s.put("t", 0, b"x", properties=5)),
        ("query key int", lambda s: s.query_by_key("t", 5)),
        ("query max_results 0", lambda s: s.query_by_key("t", "k", 0, 1, 0)),
        ("query max_results huge", lambda s: s.query_by_key("t", "k", 0, 1, 10**9)),
        ("query begin negative", lambda s: s.query_by_key("t", "k", -1, 1, 1)),
        ("wait_for timeout negative", lambda s: s.wait_for("t", 0, 0, -1)),
        ("create_topic exists", lambda s: s.create_topic("k", 2)),
        ("create_topic partitions 0", lambda s: s.create_topic("n", 0)),
        ("create_topic partitions huge", lambda s: s.create_topic("n", 2**40)),
        ("create_topic partitions str", lambda s: s.create_topic("n", "2")),
        ("create_topic timestamp_type", lambda s: s.create_topic("n", 1, timestamp_type="X")),
        (
            "create_topic cleanup unknown",
            lambda s: s.create_topic("n", 1, cleanup_policy="compact,forever"),
        ),
        ("create_topic retention str", lambda s: s.create_topic("n", 1, retention_ms="1")),
        ("add_partitions shrink", lambda s: s.add_partitions("k", 1)),
        ("add_partitions unknown", lambda s: s.add_partitions("nope", 4)),
        ("describe unknown", lambda s: s.describe_topic("nope")),
        ("open config dict", lambda s: MessageStore.open(s.root, {"flush_mode": "sync"})),
        ("open second writer", lambda s: MessageStore.open(s.root, StoreConfig(**SMALL))),
    ]
    return cases


def _kafka_cases() -> list[tuple[str, object]]:
    tp = TopicPartition("k", 0)
    cases: list[tuple[str, object]] = [
        ("producer unknown config", lambda s: KafkaProducer(s, acks_all=True)),
        ("producer store not a store", lambda s: KafkaProducer(object())),
        # A send to an unknown topic creates it (auto_create_topics, the default): not
        # bad input; tests/mqstore/test_topics.py covers its refusal with the switch off.
        ("send unknown partition", lambda s: KafkaProducer(s).send("k", b"v", partition=9)),
        ("send negative partition", lambda s: KafkaProducer(s).send("k", b"v", partition=-1)),
        ("send partition str", lambda s: KafkaProducer(s).send("k", b"v", partition="0")),
        ("send value str", lambda s: KafkaProducer(s).send("k", "text")),
        ("send key int", lambda s: KafkaProducer(s).send("k", b"v", key=5)),
        ("send nothing", lambda s: KafkaProducer(s).send("k")),
        ("send oversize", lambda s: KafkaProducer(s).send("k", HUGE, partition=0)),
        ("send headers bad", lambda s: KafkaProducer(s).send("k", b"v", headers=[("h", 5)])),
        ("send headers shape", lambda s: KafkaProducer(s).send("k", b"v", headers=[1, 2])),
        ("send timestamp negative", lambda s: KafkaProducer(s).send("k", b"v", timestamp_ms=-5)),
        ("send timestamp str", lambda s: KafkaProducer(s).send("k", b"v", timestamp_ms="1")),
        ("send traversal topic", lambda s: KafkaProducer(s).send("../x", b"v")),
        (
            "send_batch keys length",
            lambda s: KafkaProducer(s).send_batch("k", 0, [b"a"], [b"1", b"2"]),
        ),
        ("send_batch one oversize", lambda s: KafkaProducer(s).send_batch("k", 0, [b"a", HUGE])),
        ("consumer unknown config", lambda s: KafkaConsumer(store=s, fetch_min=1)),
        ("consumer bad reset", lambda s: KafkaConsumer(store=s, auto_offset_reset="middle")),
        ("consumer traversal group", lambda s: KafkaConsumer(store=s, group_id="../g")),
        ("consumer empty group", lambda s: KafkaConsumer(store=s, group_id="")),
        ("consumer group int", lambda s: KafkaConsumer(store=s, group_id=5)),
        ("consumer store not a store", lambda s: KafkaConsumer(store=object())),
        ("subscribe unknown topic then assign", lambda s: _consumer(s, "k").assign([tp])),
        ("assign unknown partition", lambda s: _consumer(s).assign([TopicPartition("k", 9)])),
        ("assign unknown topic", lambda s: _consumer(s).assign([TopicPartition("nope", 0)])),
        ("assign traversal topic", lambda s: _consumer(s).assign([TopicPartition("..", 0)])),
        ("seek negative", lambda s: _assigned(s).seek(tp, -1)),
        ("seek str", lambda s: _assigned(s).seek(tp, "0")),
        ("seek unassigned", lambda s: _assigned(s).seek(TopicPartition("k", 1), 0)),
        ("poll max_records 0", lambda s: _assigned(s).poll(0, max_records=0)),
        ("commit negative", lambda s: _assigned(s, "g").commit({tp: -1})),
        ("commit str", lambda s: _assigned(s, "g").commit({tp: "5"})),
        (
            "commit unknown partition",
            lambda s: _assigned(s, "g").commit({TopicPartition("k", 9): 1}),
        ),
        ("commit unknown topic", lambda s: _assigned(s, "g").commit({TopicPartition("no", 0): 1})),
        ("commit without group", lambda s: _assigned(s).commit({tp: 1})),
        ("committed without group", lambda s: _assigned(s).committed(tp)),
        ("offsets_for_times negative", lambda s: _assigned(s).offsets_for_times({tp: -1})),
        ("position unassigned", lambda s: _assigned(s).position(TopicPartition("k", 1))),
    ]
    return cases


def _consumer(store: MessageStore, *topics: str, group: str | None = None) -> KafkaConsumer:
    return KafkaConsumer(*topics, store=store, group_id=group, enable_auto_commit=False)


def _assigned(store: MessageStore, group: str | None = None) -> KafkaConsumer:
    consumer = _consumer(store, group=group)
    consumer.assign([TopicPartition("k", 0)])
    return consumer


def _config_cases() -> list[tuple[str, object]]:
    bad = {
        "commitlog_file_size_bytes": [0, -1, 4097 * 16, 2**40, "1g", 1.5],
        "commitlog_prepare_next_percent": [-1, 100, "50", 50.0],
        "max_message_size_bytes": [0, -5, 2**40, None],
        "flush_mode": ["fast", None, 1],
        "flush_interval_ms": [0, -1, 10**9, "1"],
        "consumequeue_units_per_file": [0, 3, 2**40],
        "index_slot_count": [0, -1, 2**40],
        "retention_hours": [-1, "72"],
        "retention_bytes": [-2, "1"],
        "disk_reject_ratio_percent": [0, 101, -1],
        "default_timestamp_type": ["Now"],
        "prewarm": [1, "yes"],
    }
    cases: list[tuple[str, object]] = []
    for field, values in bad.items():
        for value in values:
            cases.append(
                (
                    f"StoreConfig {field}={value!r}",
                    lambda s, f=field, v=value: StoreConfig(**{f: v}),
                )
            )
    cases.append(("StoreConfig unknown field", lambda s: StoreConfig(color="red")))
    cases.append(
        ("StoreConfig watermarks order", lambda s: StoreConfig(disk_clean_ratio_percent=95.0))
    )
    return cases


ALL_CASES = _store_cases() + _kafka_cases() + _config_cases()
CASES = len(ALL_CASES)


def _snapshot(store: MessageStore) -> tuple[object, ...]:
    data = {}
    for topic, queues in (("t", 2), ("k", 2)):
        for queue in range(queues):
            low, high = store.min_offset(topic, queue), store.max_offset(topic, queue)
            data[(topic, queue)] = (
                low,
                [bytes(m.body) for m in store.get(topic, queue, low, 1000)] if high > low else [],
            )
    committed = store.offsets.load("g")
    topics = {name: (c.partitions, c.timestamp_type) for name, c in store.list_topics().items()}
    return data, committed, topics, store.commitlog.write_position


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad") / "s"
    store = MessageStore.open(path, StoreConfig(**SMALL))
    store.create_topic("k", partitions=2)
    for i in range(20):
        store.put("t", i % 2, b"t-%d" % i, keys=[f"key{i}"])
    producer = KafkaProducer(store)
    for i in range(10):
        producer.send("k", b"k-%d" % i, partition=i % 2)
    consumer = _assigned(store, "g")
    consumer.poll(0)
    consumer.commit()
    yield store
    store.close()


@pytest.mark.parametrize(("name", "call"), ALL_CASES, ids=[name for name, _ in ALL_CASES])
def test_bad_input_is_a_typed_error_and_changes_nothing(store, name, call):
    before = _snapshot(store)
    with pytest.raises(StoreError):
        result = call(store)
        if hasattr(result, "get") and not isinstance(result, dict):  # a producer future
            result.get()
    assert _snapshot(store) == before, name


def test_case_count():
    print(f"\nbad-input cases: {CASES}")
    assert CASES >= 150
