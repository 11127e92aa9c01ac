"""The segmented engine's cleaner (segmented.cleaner) against a model of what Kafka
promises a compacted log: offsets never move, the latest record of every key
survives, tombstones live until their delete horizon, nothing past the cleaned
section changes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import InvalidArgumentError, InvalidRecordError
from mqstore.segmented import SegmentedConfig, SegmentedStore
from mqstore.segmented.record_batch import DELETE_HORIZON_MASK, HEADER, HEADER_SIZE

from .conftest import SMALL, FakeClock, record

KEYS = [b"k%d" % i for i in range(6)]  # a small key space: most records go obsolete
DAY_MS = 86_400_000
COMPACT = {"cleanup.policy": "compact"}


class Model:
    """What was produced, by offset: (timestamp, key, value)."""

    def __init__(self) -> None:
        self.produced: dict[int, tuple[int, bytes | None, bytes | None]] = {}

    def put(self, offset: int, timestamp_ms: int, key: bytes, value: bytes | None) -> None:
        assert offset not in self.produced
        self.produced[offset] = (timestamp_ms, key, value)

    def latest(self) -> dict[bytes | None, int]:
        found: dict[bytes | None, int] = {}
        for offset, (_, key, _) in sorted(self.produced.items()):
            found[key] = offset
        return found

    def check(
        self,
        store: SegmentedStore,
        topic: str,
        now_ms: int,
        retention_ms: int,
        pass_completed: bool = True,
    ) -> None:
        """Reading from the start: offsets increase, every record is the one produced
        at its offset, the latest of each key is there (a tombstone at least while
        younger than delete.retention.ms), and, once the last pass completed (no kill
        before it wrote its cleaner point), nothing past the cleaner point is gone
        and only the latest of each key is left below it."""
        got = _read_all(store, topic)
        offsets = [r.offset for r in got]
        assert offsets == sorted(set(offsets))
        for r in got:
            assert (r.timestamp_ms, r.key, r.value) == self.produced[r.offset]
        present = set(offsets)
        for key, offset in self.latest().items():
            timestamp_ms, _, value = self.produced[offset]
            if value is not None or now_ms < timestamp_ms + retention_ms:
                assert offset in present, (key, offset)
        if not pass_completed:
            return
        point = store.cleaner.checkpoint(topic, 0)
        assert {o for o in self.produced if o >= point} <= present
        # Below the cleaner point: only the latest record of each key among the
        # offsets below it (a later one past the point was not mapped yet).
        latest_below: dict[bytes | None, int] = {}
        for offset, (_, key, _) in sorted(self.produced.items()):
            if offset < point:
                latest_below[key] = offset
        assert {o for o in present if o < point} <= set(latest_below.values())


def _read_all(store: SegmentedStore, topic: str, partition: int = 0) -> list:
    offset = store.earliest_offset(topic, partition)
    found = []
    while True:
        got = store.read_records(topic, partition, offset, 1000)
        if not got:
            return found
        found += got
        offset = got[-1].offset + 1


def _config(**overrides: object) -> SegmentedConfig:
    values = {**SMALL, "segment_bytes": 1024, "index_interval_bytes": 64, **overrides}
    return SegmentedConfig(**values)  # type: ignore[arg-type]


def _put(store: SegmentedStore, model: Model, clock: FakeClock, key: bytes, value: bytes | None):
    appended = store.append_records("c", 0, [record(value, key)])
    model.put(appended[0].offset, clock.now_ms, key, value)


# ---------------------------------------------------------------------- the model

STEP_COUNT_MIN = 20  # steps per example: enough for puts, rolls and passes to interleave
STEP_COUNT_MAX = 60  # 60 examples -> 1,200 to 3,600 steps (measured: see the report)

steps = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(KEYS), st.none() | st.binary(max_size=60)),
        st.tuples(st.just("advance"), st.integers(1, 3 * DAY_MS // 2)),
        st.tuples(st.just("roll")),
        st.tuples(st.just("compact")),
        st.tuples(st.just("reopen")),
        st.tuples(st.just("crash")),
    ),
    min_size=STEP_COUNT_MIN,
    max_size=STEP_COUNT_MAX,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=steps)
def test_compaction_matches_the_model(tmp_path_factory, steps) -> None:
    root = tmp_path_factory.mktemp("model")
    clock = FakeClock()
    config = _config()
    store = SegmentedStore.open(root, config, clock_ms=clock)
    store.create_topic("c", topic_configs={**COMPACT, "min.cleanable.dirty.ratio": "0"})
    model = Model()
    try:
        for step in steps:
            if step[0] == "put":
                _put(store, model, clock, step[1], step[2])
            elif step[0] == "advance":
                clock.advance(step[1])
            elif step[0] == "roll":
                store._logs[("c", 0)].roll()
            elif step[0] == "compact":
                store.compact("c")
            elif step[0] == "reopen":
                store.close()
                store = SegmentedStore.open(root, config, clock_ms=clock)
            else:
                store.flush()
                store._crash()
                store = SegmentedStore.open(root, config, clock_ms=clock)
            model.check(store, "c", clock.now_ms, DAY_MS)
        store.compact("c")
        model.check(store, "c", clock.now_ms, DAY_MS)
    finally:
        store.close()


# ---------------------------------------------------------------------- kills


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from mqstore.segmented import SegmentedConfig, SegmentedStore
    from mqstore.engine import ProducerRecord
    root, stage = sys.argv[1], sys.argv[2]
    config = SegmentedConfig(segment_bytes=1024, index_interval_bytes=64,
                             index_max_bytes=4096, file_delete_delay_ms=0)
    store = SegmentedStore.open(root, config, clock_ms=lambda: 1_700_000_000_000)
    store.create_topic("c", topic_configs={"cleanup.policy": "compact"})
    for i in range(300):
        value = None if i % 17 == 0 else b"value-%d" % i
        store.append_records("c", 0, [ProducerRecord(b"k%d" % (i % 7), value, [], None)])
    store.flush()
    def hook(reached):
        if reached == stage:
            os.kill(os.getpid(), signal.SIGKILL)
    store.cleaner.cleaner.stage_hook = hook
    store.compact("c")
    print("no kill")
    """
)
STAGES = ["cleaned", "swap", "deleted", "swapped"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_sigkill_at_each_stage_of_a_pass_leaves_a_log_that_satisfies_the_model(
    tmp_path, stage
) -> None:
    root = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), stage], capture_output=True, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    model = Model()
    for i in range(300):
        value = None if i % 17 == 0 else b"value-%d" % i
        model.put(i, 1_700_000_000_000, b"k%d" % (i % 7), value)
    clock = FakeClock(1_700_000_000_000)
    config = _config(index_max_bytes=4096)
    with SegmentedStore.open(root, config, clock_ms=clock) as store:
        assert store.recovered_from_crash
        names = os.listdir(root / "c-0")
        assert not [n for n in names if n.endswith((".cleaned", ".swap"))], names
        model.check(store, "c", clock.now_ms, DAY_MS, pass_completed=stage == "cleaned")
        store.compact("c")  # the next pass completes the work
        model.check(store, "c", clock.now_ms, DAY_MS)
        assert len(_read_all(store, "c")) < 60


# ---------------------------------------------------------------------- bounds


def test_a_full_key_map_cleans_what_it_mapped_and_loses_nothing(tmp_path, clock) -> None:
    config = _config(cleaner_dedupe_buffer_bytes=1024)  # 5 keys (160 B each, 0.9 load)
    model = Model()
    with SegmentedStore.open(tmp_path, config, clock_ms=clock) as store:
        store.create_topic("c", topic_configs=COMPACT)
        for round_number in range(3):
            for i in range(20):
                _put(store, model, clock, b"key-%02d" % i, b"v%d" % round_number)
        store._logs[("c", 0)].roll()
        first = store.compact("c")[0]
        assert first.map_full and first.keys == 5
        assert first.end_offset < store.latest_offset("c", 0)
        model.check(store, "c", clock.now_ms, DAY_MS)
        passes = 1
        while store.cleaner.checkpoint("c", 0) < store.latest_offset("c", 0) and passes < 50:
            store.compact("c")
            passes += 1
            model.check(store, "c", clock.now_ms, DAY_MS)
        got = _read_all(store, "c")
        assert [r.value for r in got] == [b"v2"] * 20
        assert passes > 3


def test_the_active_segment_and_the_min_lag_head_are_left_alone(tmp_path, clock) -> None:
    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        store.create_topic("c", topic_configs={**COMPACT, "min.compaction.lag.ms": "60000"})
        model = Model()
        for i in range(40):  # old enough
            _put(store, model, clock, KEYS[i % 2], b"old-%d" % i)
        store._logs[("c", 0)].roll()
        clock.advance(120_000)
        young = store.latest_offset("c", 0)
        for i in range(40):  # younger than the lag, in their own segments
            _put(store, model, clock, KEYS[i % 2], b"young-%d" % i)
        store._logs[("c", 0)].roll()
        active = store.latest_offset("c", 0)
        for i in range(5):  # the active segment
            _put(store, model, clock, KEYS[i % 2], b"active-%d" % i)
        result = store.compact("c")[0]
        assert result.end_offset == young
        offsets = {r.offset for r in _read_all(store, "c")}
        assert set(range(young, store.latest_offset("c", 0))) <= offsets  # untouched
        assert len([o for o in offsets if o < young]) <= 2
        assert active > young
        model.check(store, "c", clock.now_ms, DAY_MS)


def test_max_compaction_lag_forces_a_roll_and_a_clean(tmp_path, clock) -> None:
    with SegmentedStore.open(tmp_path, _config(segment_bytes=1 << 20), clock_ms=clock) as store:
        store.create_topic(
            "c",
            topic_configs={
                **COMPACT, "max.compaction.lag.ms": "2000", "min.cleanable.dirty.ratio": "0.99",
            },
        )  # fmt: skip
        for i in range(30):
            store.append_records("c", 0, [record(b"v%d" % i, b"same")])
        assert store.cleaner.run() == []  # one active segment: nothing cleanable
        clock.advance(2_001)
        store.append_records("c", 0, [record(b"last", b"same")])  # rolls: max lag < segment.ms
        assert len(store._logs[("c", 0)].segments) == 2
        clock.advance(2_001)
        results = store.cleaner.run()  # the scheduled path: due by max lag, not by ratio
        assert len(results) == 1
        assert [r.offset for r in _read_all(store, "c")] == [29, 30]


# ---------------------------------------------------------------------- semantics


def test_tombstones_live_until_their_delete_horizon_stamped_in_the_header(tmp_path, clock) -> None:
    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        store.create_topic("c", topic_configs={**COMPACT, "delete.retention.ms": "5000"})
        for i in range(10):
            store.append_records("c", 0, [record(b"v%d" % i, b"gone")])
        store.append_records("c", 0, [record(None, b"gone")])  # offset 10
        store.append_records("c", 0, [record(b"x", b"kept")])
        store._logs[("c", 0)].roll()
        store.compact("c")
        assert [(r.offset, r.value) for r in _read_all(store, "c")] == [(10, None), (11, b"x")]
        headers = _headers(store._logs[("c", 0)].segments[0].log_path)
        tombstone = next(h for h in headers if h.base_offset == 10)
        assert tombstone.attributes & DELETE_HORIZON_MASK
        assert tombstone.base_timestamp == clock.now_ms + 5000
        assert store.read_records("c", 0, 3, 1)[0].offset == 10  # the next record
        clock.advance(4_999)
        store.compact("c")
        assert [r.offset for r in _read_all(store, "c")] == [10, 11]
        clock.advance(1)
        store.compact("c")
        assert [r.offset for r in _read_all(store, "c")] == [11]
        assert store.latest_offset("c", 0) == 12  # offsets never move


def _headers(path: str) -> list:
    with open(path, "rb") as handle:
        data = handle.read()
    position, found = 0, []
    while position < len(data):
        header = HEADER.unpack_from(data, position)
        found.append(_Header(header[0], header[5], header[7]))
        position += header[1] + 12
    assert HEADER_SIZE == 61
    return found


class _Header:
    def __init__(self, base_offset: int, attributes: int, base_timestamp: int) -> None:
        self.base_offset = base_offset
        self.attributes = attributes
        self.base_timestamp = base_timestamp


def test_a_record_without_a_key_is_refused_on_a_compacted_topic(tmp_path, clock) -> None:
    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        store.create_topic("c", topic_configs=COMPACT)
        store.create_topic("d")
        with pytest.raises(InvalidRecordError, match="without a key"):
            store.append_records("c", 0, [record(b"a", b"k"), record(b"b", None)])
        assert store.latest_offset("c", 0) == 0  # nothing of the batch
        store.append_records("d", 0, [record(b"b", None)])  # delete topics take it
        assert issubclass(InvalidRecordError, InvalidArgumentError)


def test_compact_refuses_a_delete_topic(tmp_path, clock) -> None:
    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        store.create_topic("d")
        with pytest.raises(InvalidArgumentError, match="nothing to compact"):
            store.compact("d")


def test_a_kafka_consumer_reads_a_compacted_topic_across_its_gaps(tmp_path, clock) -> None:
    from mqstore import KafkaConsumer, TopicPartition

    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        store.create_topic("c", topic_configs=COMPACT)
        for i in range(100):
            store.append_records("c", 0, [record(b"v%d" % i, KEYS[i % 3])])
        store._logs[("c", 0)].roll()
        store.compact("c")
        consumer = KafkaConsumer(store=store, auto_offset_reset="earliest")
        consumer.assign([TopicPartition("c", 0)])
        (records,) = consumer.poll(timeout_ms=1000).values()
        assert [(r.offset, r.value) for r in records] == [(97, b"v97"), (98, b"v98"), (99, b"v99")]
        consumer.seek(TopicPartition("c", 0), 5)  # a compacted-away offset: the next record
        (records,) = consumer.poll(timeout_ms=1000).values()
        assert records[0].offset == 97
