"""The whole store against a dict-and-list model (hypothesis stateful testing).

Rules: put, put_batch, get, query by key, offset for time, close and reopen, and
crash and reopen (services stopped as a SIGKILL would, no checkpoint, abort left).
The topic rule is modelled too: a put to queue q makes its topic have at least q + 1
partitions; a read of a queue that is not a partition raises UnknownTopicError.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mqstore import MessageStore, StoreConfig, UnknownTopicError
from tests.mqstore.conftest import SMALL

TOPICS = ("alpha", "beta")
QUEUES = (0, 1, 2)
KEYS = ("k0", "k1", "k2", "k3")

topic_st = st.sampled_from(TOPICS)
queue_st = st.sampled_from(QUEUES)
body_st = st.binary(max_size=300)
keys_st = st.lists(st.sampled_from(KEYS), max_size=2, unique=True)


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.path = tempfile.mkdtemp(prefix="mqstore-model-")
        # Tiny index slots force collisions; small files force rolling; a queue's
        # first 5 units go to its topic's shared log, the rest to files of its own.
        self.config = StoreConfig(
            **{
                **SMALL,
                "index_slot_count": 3,
                "commitlog_file_size_bytes": 64 * 1024,
                "consumequeue_shared_units_max": 5,
            }
        )
        self.clock = 1_000_000
        self.store = MessageStore.open(self.path, self.config, clock_ms=self.now)
        # (topic, queue) -> list of (body, keys, store_ts)
        self.model: dict[tuple[str, int], list[tuple[bytes, tuple[str, ...], int]]] = {}

    def now(self) -> int:
        return self.clock

    def _is_partition(self, topic: str, queue_id: int) -> bool:
        """The model's topic rule: partitions = 1 + the largest queue put to."""
        return any(t == topic and q >= queue_id for t, q in self.model)

    def _settle(self, topic: str, queue_id: int) -> None:
        expected = len(self.model.get((topic, queue_id), []))
        if expected:
            assert self.store.wait_for(topic, queue_id, expected - 1, 5000)

    @rule(topic=topic_st, queue_id=queue_st, body=body_st, keys=keys_st, tick=st.integers(0, 3))
    def put(self, topic, queue_id, body, keys, tick):
        self.clock += tick
        result = self.store.put(topic, queue_id, body, keys=keys)
        entries = self.model.setdefault((topic, queue_id), [])
        assert result.queue_offset == len(entries)
        entries.append((body, tuple(keys), result.store_timestamp_ms))

    @rule(topic=topic_st, queue_id=queue_st, bodies=st.lists(body_st, min_size=1, max_size=20))
    def put_batch(self, topic, queue_id, bodies):
        self.clock += 1
        results = self.store.put_batch(topic, queue_id, bodies, keys=[["k0"]] * len(bodies))
        entries = self.model.setdefault((topic, queue_id), [])
        assert [r.queue_offset for r in results] == list(
            range(len(entries), len(entries) + len(bodies))
        )
        entries.extend(
            (body, ("k0",), r.store_timestamp_ms) for body, r in zip(bodies, results, strict=True)
        )

    @rule(topic=topic_st, queue_id=queue_st, data=st.data())
    def get(self, topic, queue_id, data):
        if not self._is_partition(topic, queue_id):
            with pytest.raises(UnknownTopicError):
                self.store.get(topic, queue_id, 0, 1)
            return
        self._settle(topic, queue_id)
        entries = self.model.get((topic, queue_id), [])
        offset = data.draw(st.integers(0, len(entries)))
        count = data.draw(st.integers(1, 50))
        got = self.store.get(topic, queue_id, offset, count)
        expected = entries[offset : offset + count]
        assert [bytes(m.body) for m in got] == [body for body, _, _ in expected]
        assert [m.queue_offset for m in got] == list(range(offset, offset + len(expected)))
        assert [m.keys for m in got] == [keys for _, keys, _ in expected]

    @rule(topic=topic_st, key=st.sampled_from(KEYS), limit=st.integers(1, 10))
    def query(self, topic, key, limit):
        if not self._is_partition(topic, 0):
            with pytest.raises(UnknownTopicError):
                self.store.query_by_key(topic, key, 0, 2**62, limit)
            return
        for queue_id in QUEUES:
            self._settle(topic, queue_id)
        hits = self.store.query_by_key(topic, key, 0, 2**62, limit)
        expected = [
            (queue_id, offset)
            for queue_id in QUEUES
            for offset, (_, keys, _) in enumerate(self.model.get((topic, queue_id), []))
            if key in keys
        ]
        assert len(hits) == min(limit, len(expected))
        assert {(m.queue_id, m.queue_offset) for m in hits} <= set(expected)
        stamps = [m.store_timestamp_ms for m in hits]
        assert stamps == sorted(stamps, reverse=True)  # newest first
        assert all(key in m.keys and m.topic == topic for m in hits)

    @rule(topic=topic_st, queue_id=queue_st, delta=st.integers(-2, 5))
    def offset_for_time(self, topic, queue_id, delta):
        if not self._is_partition(topic, queue_id):
            with pytest.raises(UnknownTopicError):
                self.store.offset_for_time(topic, queue_id, self.clock)
            return
        self._settle(topic, queue_id)
        entries = self.model.get((topic, queue_id), [])
        target = self.clock - delta
        expected = next((i for i, (_, _, ts) in enumerate(entries) if ts >= target), None)
        assert self.store.offset_for_time(topic, queue_id, target) == expected

    @rule()
    def close_and_reopen(self):
        self.store.close()
        self.store = MessageStore.open(self.path, self.config, clock_ms=self.now)
        assert not self.store.recovered_from_crash

    @rule()
    def crash_and_reopen(self):
        self.store._crash()
        self.store = MessageStore.open(self.path, self.config, clock_ms=self.now)
        assert self.store.recovered_from_crash

    @precondition(lambda self: bool(self.model))
    @invariant()
    def offsets_match_the_model(self):
        for (topic, queue_id), entries in self.model.items():
            self._settle(topic, queue_id)
            assert self.store.max_offset(topic, queue_id) == len(entries)
            assert self.store.min_offset(topic, queue_id) == 0

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)


StoreModel.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreModel = StoreModel.TestCase
