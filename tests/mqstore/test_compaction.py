"""Compaction on the CommitLog engine (mqstore.compaction): each compacted queue is
copied into a log of its own that the segmented engine's cleaner compacts, and read
from there. Checked against a model of Kafka's promises (offsets never move, the
latest record of every key survives, tombstones live until delete.retention.ms), and
against the bugs RocketMQ's compaction topics had: keys lost to CommitLog retention
(apache/rocketmq#7540), compaction stopping after a restart (#6587), tombstones with
no horizon."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mqstore import KafkaConsumer, MessageStore, StoreConfig
from mqstore.commitlog.errors import (
    InvalidArgumentError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
    UnknownTopicError,
)
from mqstore.engine import ProducerRecord
from tests.segmented.conftest import FakeClock

from .conftest import SMALL

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
START_MS = 1_700_000_000_000
KEYS = [f"k{i}" for i in range(6)]  # a small key space: most records go obsolete
COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0"}


def _config(**overrides: object) -> StoreConfig:
    values = {**SMALL, "commitlog_file_size_bytes": 64 * 1024, "retention_hours": 1.0}
    values.update(overrides)
    return StoreConfig(**values)  # type: ignore[arg-type]


def _read_all(store: MessageStore, topic: str = "c", queue_id: int = 0) -> list:
    offset = store.min_offset(topic, queue_id)
    found = []
    while True:
        got = store.get(topic, queue_id, offset, 100)
        if not got:
            return found
        found += got
        offset = got[-1].queue_offset + 1


class Model:
    """What was put, by queue offset: (store timestamp, key, body)."""

    def __init__(self) -> None:
        self.produced: dict[int, tuple[int, str, bytes | None]] = {}

    def put(self, offset: int, stamp_ms: int, key: str, body: bytes | None) -> None:
        assert offset not in self.produced
        self.produced[offset] = (stamp_ms, key, body)

    def check(self, store: MessageStore, now_ms: int, horizon_ms: int = DAY_MS) -> None:
        """Reading from the start: offsets increase, every message is the one put at
        its offset, and the latest of each key is there (a tombstone at least while
        younger than delete.retention.ms)."""
        got = _read_all(store)
        offsets = [m.queue_offset for m in got]
        assert offsets == sorted(set(offsets))
        for message in got:
            body = None if message.body is None else bytes(message.body)
            stamp, key, produced = self.produced[message.queue_offset]
            assert (message.store_timestamp_ms, message.keys, body) == (stamp, (key,), produced)
        present = set(offsets)
        latest: dict[str, int] = {}
        for offset, (_, key, _) in sorted(self.produced.items()):
            latest[key] = offset
        for key, offset in latest.items():
            stamp, _, body = self.produced[offset]
            if body is not None or now_ms < stamp + horizon_ms:
                assert offset in present, (key, offset, sorted(present))
        assert store.max_offset("c", 0) == len(self.produced)


def _put(store: MessageStore, model: Model, clock: FakeClock, key: str, body: bytes | None):
    result = store.put("c", 0, body, keys=key)
    model.put(result.queue_offset, result.store_timestamp_ms, key, body)


# ---------------------------------------------------------------------- the model

steps = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(KEYS), st.none() | st.binary(max_size=2000)),
        st.tuples(st.just("filler"), st.integers(20, 150)),  # 1 KB each, 64 KiB files
        st.tuples(st.just("advance"), st.integers(1, 3 * DAY_MS // 2)),
        st.tuples(st.just("compact")),
        st.tuples(st.just("retention")),
        st.tuples(st.just("retention")),
        st.tuples(st.just("reopen")),
        st.tuples(st.just("crash")),
    ),
    min_size=15,
    max_size=50,
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=steps)
def test_compaction_matches_the_model(tmp_path_factory, steps) -> None:
    """Puts, tombstones, another topic's traffic (so CommitLog files fill and
    retention deletes them), time, passes, reopens and crashes: after each step a
    read from the start agrees with the model."""
    root = tmp_path_factory.mktemp("model")
    clock = FakeClock()
    config = _config()
    store = MessageStore.open(root, config, clock_ms=clock)
    store.create_topic("c", topic_configs=COMPACT)
    model = Model()
    try:
        for step in steps:
            if step[0] == "put":
                _put(store, model, clock, step[1], step[2])
            elif step[0] == "filler":
                store.put_batch("other", 0, [bytes(1000)] * step[1])
            elif step[0] == "advance":
                clock.advance(step[1])
            elif step[0] == "compact":
                store.compact("c")
            elif step[0] == "retention":
                if store.run_retention().deleted_files:
                    event("retention deleted CommitLog files")
                if store.consume_queues.queue("c", 0).min_offset > 0:
                    event("the raw queue lost its start: reads rely on the copy")
            elif step[0] == "reopen":
                store.close()
                store = MessageStore.open(root, config, clock_ms=clock)
            else:
                store._crash()
                store = MessageStore.open(root, config, clock_ms=clock)
            model.check(store, clock.now_ms)
        store.compact("c")
        model.check(store, clock.now_ms)
    finally:
        store.close()


# ---------------------------------------------------------------------- RocketMQ's bugs


def test_commitlog_retention_never_loses_a_compacted_key(tmp_path) -> None:
    """apache/rocketmq#7540: the queue's first offset came from the raw ConsumeQueue,
    which CommitLog retention moves, so live keys vanished. Here the CommitLog's
    first files go, and every key's latest value is still read from offset 0."""
    clock = FakeClock()
    store = MessageStore.open(tmp_path / "s", _config(), clock_ms=clock)
    store.create_topic("c", topic_configs=COMPACT)
    for i in range(40):
        store.put("c", 0, b"v%d" % i, keys=KEYS[i % len(KEYS)])
    for _ in range(10):  # another topic fills several CommitLog files
        store.put_batch("other", 0, [bytes(1000)] * 60)
    clock.advance(2 * HOUR_MS)
    store.put("other", 0, b"after")
    report = store.run_retention()
    assert report.deleted_files > 0 and store.commitlog.min_position > 0
    raw_queue = store.consume_queues.queue("c", 0)
    assert raw_queue.min_offset > 0  # the raw queue lost its start...
    assert store.min_offset("c", 0) == 0  # ...the topic did not
    latest = {m.keys[0]: bytes(m.body) for m in _read_all(store)}
    assert latest == {KEYS[i % 6]: b"v%d" % i for i in range(34, 40)}
    # Key look-ups and time look-ups keep working on what the copy holds.
    hits = store.query_by_key("c", KEYS[3])
    assert [bytes(m.body) for m in hits][:1] == [b"v39"]
    assert store.offset_for_time("c", 0, 0) == 0
    store.close()


def test_compaction_goes_on_after_a_restart(tmp_path) -> None:
    """apache/rocketmq#6587: compaction stopped after a broker restart."""
    path = tmp_path / "s"
    with MessageStore.open(path, _config()) as store:
        store.create_topic("c", topic_configs=COMPACT)
        for i in range(30):
            store.put("c", 0, b"a%d" % i, keys=KEYS[i % 3])
        store.compact("c")
        assert len(_read_all(store)) == 3
    with MessageStore.open(path, _config()) as store:
        for i in range(30):
            store.put("c", 0, b"b%d" % i, keys=KEYS[i % 3])
        results = store.compact("c")
        assert results and results[0].keys == 3
        assert [bytes(m.body) for m in _read_all(store)] == [b"b27", b"b28", b"b29"]
        assert [m.queue_offset for m in _read_all(store)] == [57, 58, 59]


def test_tombstones_live_until_delete_retention_then_go(tmp_path) -> None:
    """RocketMQ drops an empty body in the first pass (no horizon); Kafka keeps a
    tombstone for delete.retention.ms after its first cleaning (KIP-534)."""
    clock = FakeClock()
    store = MessageStore.open(tmp_path / "s", _config(), clock_ms=clock)
    store.create_topic("c", topic_configs={**COMPACT, "delete.retention.ms": str(HOUR_MS)})
    store.put("c", 0, b"value", keys="gone")
    store.put("c", 0, None, keys="gone")
    store.put("c", 0, b"kept", keys="other")
    store.compact("c")
    assert [(m.queue_offset, m.body) for m in _read_all(store)][:1] == [(1, None)]
    clock.advance(HOUR_MS // 2)
    store.compact("c")
    assert 1 in [m.queue_offset for m in _read_all(store)]
    clock.advance(HOUR_MS)
    store.put("c", 0, b"later", keys="third")
    store.compact("c")
    assert [m.queue_offset for m in _read_all(store)] == [2, 3]
    store.close()


# ---------------------------------------------------------------------- semantics


def test_a_read_at_a_compacted_away_offset_returns_the_next_record(tmp_path) -> None:
    with MessageStore.open(tmp_path / "s", _config()) as store:
        store.create_topic("c", topic_configs=COMPACT)
        for i in range(10):
            store.put("c", 0, b"v%d" % i, keys=KEYS[i % 2])
        store.compact("c")
        assert [m.queue_offset for m in store.get("c", 0, 0, 10)] == [8, 9]
        assert [m.queue_offset for m in store.get("c", 0, 5, 10)] == [8, 9]
        batch = store.get_batch("c", 0, 3)
        assert batch.queue_offsets.tolist() == [8, 9]
        store.put("c", 0, b"v10", keys="new")
        assert [m.queue_offset for m in store.get("c", 0, 10, 10)] == [10]
        with pytest.raises(OffsetOutOfRangeError):
            store.get("c", 0, 12, 10)


def test_an_embedded_kafka_consumer_reads_a_compacted_topic_across_its_gaps(tmp_path) -> None:
    with MessageStore.open(tmp_path / "s", _config()) as store:
        store.create_topic("c", topic_configs=COMPACT)
        for i in range(50):
            store.append_records("c", 0, [ProducerRecord(b"k%d" % (i % 4), b"%d" % i, [], None)])
        store.compact("c")
        consumer = KafkaConsumer("c", store=store, auto_offset_reset="earliest")
        seen = []
        for _ in range(5):
            for records in consumer.poll(timeout_ms=100).values():
                seen += [(r.offset, r.key, r.value) for r in records]
        consumer.close()
        assert seen == [(46 + i, b"k%d" % ((46 + i) % 4), b"%d" % (46 + i)) for i in range(4)]


def test_a_message_without_a_key_is_refused_and_nothing_is_appended(tmp_path) -> None:
    with MessageStore.open(tmp_path / "s", _config()) as store:
        store.create_topic("c", topic_configs=COMPACT)
        store.put("c", 0, b"keyed", keys="k")
        with pytest.raises(InvalidRecordError, match="without a key"):
            store.put("c", 0, b"no key")
        with pytest.raises(InvalidRecordError):
            store.put_batch("c", 0, [b"a", b"b"], keys=["k", None])
        offsets = np.array([0, 1, 2], dtype=np.int64)
        with pytest.raises(InvalidRecordError):
            store.put_batch_buffers("c", 0, offsets, b"ab")
        with pytest.raises(InvalidRecordError):
            store.append_records("c", 0, [ProducerRecord(None, b"v", [], None)])
        assert store.max_offset("c", 0) == 1
        # A Kafka key alone, or message keys alone, is a key.
        store.append_records("c", 0, [ProducerRecord(b"\xff", b"v", [], None)])
        store.put_batch("c", 0, [b"a", b"b"], keys=["x", ["y", "z"]])
        assert store.max_offset("c", 0) == 4


def test_only_what_the_commitlog_made_durable_is_copied(tmp_path) -> None:
    """After a power cut the CommitLog may lose its unflushed tail: a copy holding it
    would give one offset two records. So the copy waits for the flush."""
    config = _config(flush_interval_ms=60_000)
    with MessageStore.open(tmp_path / "s", config) as store:
        store.create_topic("c", topic_configs=COMPACT)
        store.put("c", 0, b"v", keys="k")
        assert store.max_offset("c", 0) == 1  # dispatched: in its ConsumeQueue
        compaction = store._compaction
        assert compaction is not None
        assert store.commitlog.flushed_position < store.commitlog.write_position
        assert compaction.copy_all() == 0
        store.commitlog.flush_to(store.commitlog.write_position)
        assert compaction.copy_all() == 1
        assert compaction.copy_end("c", 0) == 1


def test_altering_a_topic_to_compact_copies_from_its_first_offset(tmp_path) -> None:
    clock = FakeClock()
    store = MessageStore.open(tmp_path / "s", _config(), clock_ms=clock)
    for i in range(20):
        store.put("c", 0, b"v%d" % i, keys=KEYS[i % 2])
    for _ in range(10):
        store.put_batch("other", 0, [bytes(1000)] * 60)
    clock.advance(2 * HOUR_MS)
    store.put("other", 0, b"x")
    for i in range(20, 24):
        store.put("c", 0, b"v%d" % i, keys=KEYS[i % 2])
    store.run_retention()
    first = store.min_offset("c", 0)
    assert first == 20  # retention took the first 20 under "delete"
    store.alter_topic("c", {"cleanup.policy": "compact"})
    store.compact("c")
    assert store.min_offset("c", 0) == 20
    assert [m.queue_offset for m in _read_all(store)] == [22, 23]
    with pytest.raises(OffsetOutOfRangeError):
        store.get("c", 0, 5)
    store.close()


def test_compact_refuses_a_delete_topic_and_a_read_only_store(tmp_path) -> None:
    path = tmp_path / "s"
    with MessageStore.open(path, _config()) as store:
        store.create_topic("plain")
        with pytest.raises(InvalidArgumentError, match="nothing to compact"):
            store.compact("plain")
        store.create_topic("c", topic_configs=COMPACT)
        store.put("c", 0, b"v", keys="k")
        reader = MessageStore.open(path, _config(), read_only=True)
        try:
            with pytest.raises(ReadOnlyStoreError):
                reader.compact("c")
        finally:
            reader.close()
        with pytest.raises(UnknownTopicError):
            store.compact("absent")
    with MessageStore.open(path, _config()) as store:  # nothing was compacted or lost
        assert [bytes(m.body) for m in store.get("c", 0, 0, 10)] == [b"v"]


# ---------------------------------------------------------------------- kills

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from mqstore import MessageStore, StoreConfig
    root, stage = sys.argv[1], sys.argv[2]
    config = StoreConfig(commitlog_file_size_bytes=64 * 1024, prewarm=False)
    store = MessageStore.open(root, config, clock_ms=lambda: 1_700_000_000_000)
    store.create_topic("c", topic_configs={"cleanup.policy": "compact"})
    for i in range(300):
        body = None if i % 17 == 0 else b"value-%d" % i
        store.put("c", 0, body, keys="k%d" % (i % 7))
    cleaner = store._open_compaction().store.cleaner.cleaner
    def hook(reached):
        if reached == stage:
            os.kill(os.getpid(), signal.SIGKILL)
    cleaner.stage_hook = hook
    store.compact("c")
    print("no kill")
    """
)
STAGES = ["cleaned", "swap", "deleted", "swapped"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_sigkill_at_each_stage_of_a_pass_loses_nothing(tmp_path, stage) -> None:
    root = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), stage], capture_output=True, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    model = Model()
    for i in range(300):
        body = None if i % 17 == 0 else b"value-%d" % i
        model.put(i, START_MS, f"k{i % 7}", body)
    clock = FakeClock()
    config = StoreConfig(commitlog_file_size_bytes=64 * 1024, prewarm=False)
    with MessageStore.open(root, config, clock_ms=clock) as store:
        assert store.recovered_from_crash
        names = os.listdir(root / "compaction" / "c-0")
        assert not [n for n in names if n.endswith((".cleaned", ".swap"))], names
        model.check(store, clock.now_ms)
        store.compact("c")  # the next pass completes the work
        model.check(store, clock.now_ms)
        assert len(_read_all(store)) <= 7


def _fill_and_age(store: MessageStore, clock: FakeClock) -> None:
    for _ in range(10):  # another topic fills several CommitLog files
        store.put_batch("other", 0, [bytes(1000)] * 60)
    clock.advance(2 * HOUR_MS)
    store.put("other", 0, b"after")


def test_retention_waits_for_a_stalled_copy(tmp_path, monkeypatch) -> None:
    """A CommitLog file holding records no copy has made durable is kept, however
    old: deleting it would lose them for good."""
    clock = FakeClock()
    store = MessageStore.open(tmp_path / "s", _config(), clock_ms=clock)
    store.create_topic("c", topic_configs=COMPACT)
    compaction = store._compaction
    assert compaction is not None
    monkeypatch.setattr(compaction, "copy_all", lambda: 0)  # the copy is stuck
    for i in range(12):
        store.put("c", 0, b"v%d" % i, keys=KEYS[i % 6])
    _fill_and_age(store, clock)
    assert store.run_retention().deleted_files == 0
    monkeypatch.undo()
    assert store.run_retention().deleted_files > 0  # copied and durable: now it may go
    assert [bytes(m.body) for m in _read_all(store)][-6:] == [b"v%d" % i for i in range(6, 12)]
    store.close()


def test_a_read_only_store_reads_the_writers_copies(tmp_path) -> None:
    clock = FakeClock()
    path = tmp_path / "s"
    writer = MessageStore.open(path, _config(), clock_ms=clock)
    writer.create_topic("c", topic_configs=COMPACT)
    for i in range(30):
        writer.put("c", 0, b"v%d" % i, keys=KEYS[i % 3])
    writer.compact("c")
    _fill_and_age(writer, clock)
    writer.run_retention()
    assert writer.consume_queues.queue("c", 0).min_offset > 0
    writer.put("c", 0, b"tail", keys=KEYS[0])
    deadline = time.monotonic() + 10
    while writer.max_offset("c", 0) < 31:  # async: readers see it once dispatched
        assert time.monotonic() < deadline
        time.sleep(0.01)
    reader = MessageStore.open(path, _config(), read_only=True)
    try:
        got = [(m.queue_offset, bytes(m.body)) for m in _read_all(reader)]
        assert got == [(27, b"v27"), (28, b"v28"), (29, b"v29"), (30, b"tail")]
    finally:
        reader.close()
        writer.close()


def test_a_compacted_topic_kept_forever_does_not_hold_commitlog_files(tmp_path) -> None:
    """retention.ms=-1 on a compacted topic (a changelog) would keep every CommitLog
    file if it counted: its copy keeps its records, so it does not count."""
    clock = FakeClock()
    store = MessageStore.open(tmp_path / "s", _config(), clock_ms=clock)
    store.create_topic("c", topic_configs={**COMPACT, "retention.ms": "-1"})
    for i in range(12):
        store.put("c", 0, b"v%d" % i, keys=KEYS[i % 6])
    _fill_and_age(store, clock)
    assert store.run_retention().deleted_files > 0
    assert [bytes(m.body) for m in _read_all(store)][-6:] == [b"v%d" % i for i in range(6, 12)]
    store.close()


def test_bad_read_arguments_on_a_store_with_copies_are_typed_errors(tmp_path) -> None:
    """The copy's check comes first on every read: it must leave wrong types to the
    ordinary checks (InvalidTypeError), never raise a bare TypeError itself."""
    from mqstore.commitlog.errors import InvalidTypeError

    with MessageStore.open(tmp_path / "s", _config()) as store:
        store.create_topic("c", topic_configs=COMPACT)
        store.put("c", 0, b"v", keys="k")
        for topic, queue_id in ((["c"], 0), ("c", "0"), ("c", 1.0), (b"c", 0)):
            with pytest.raises(InvalidTypeError):
                store.get(topic, queue_id, 0)  # type: ignore[arg-type]
            with pytest.raises(InvalidTypeError):
                store.get_batch(topic, queue_id, 0)  # type: ignore[arg-type]
