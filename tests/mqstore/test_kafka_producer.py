"""The Kafka-style producer (mqstore.kafka_producer): partitioning, linger mode's
per-partition order under concurrent drains, sends racing close(), the buffer_memory
bound with max_block_ms, and flush()/close(timeout).

Faults are injected behind the real engine interface: a test replaces the store's
``append_records`` (or ``describe_topic``) with one that waits on a gate, so a race
is forced at a chosen point rather than hoped for.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest

from mqstore import (
    ConfigError,
    InvalidArgumentError,
    KafkaProducer,
    LimitExceededError,
    StoreClosedError,
    StoreError,
)
from mqstore.kafka_producer import KafkaTimeoutError, murmur2
from tests.mqstore.engines import ENGINES, open_engine

#: How long a gate waits for a race that a correct producer never lets happen; a
#: test that relies on the wait running out stays short, one that fails shows why.
RACE_WAIT_S = 0.5


@pytest.fixture(params=ENGINES)
def engine(request, tmp_path):
    store = open_engine(request.param, tmp_path / "store")
    yield store
    store.close()


@pytest.fixture
def store(open_store):
    return open_store()


def _gate_appends(store, hold_first=1):
    """Make the first ``hold_first`` appends wait until ``release`` is set (or
    RACE_WAIT_S); ``entered`` is set when one waits, and every append is logged."""
    append = store.append_records
    entered, release = threading.Event(), threading.Event()
    calls = []

    def gated(topic, partition, records):
        calls.append([r.value for r in records])
        if len(calls) <= hold_first:
            entered.set()
            release.wait(RACE_WAIT_S)
        result = append(topic, partition, records)
        release.set()  # an append done: the one held, if any, may go on
        return result

    store.append_records = gated
    return entered, release, calls


# ---------------------------------------------------------------- partitioning


def test_the_producer_keeps_its_import_paths():
    import mqstore
    import mqstore.kafka
    import mqstore.kafka_producer

    assert mqstore.KafkaProducer is mqstore.kafka.KafkaProducer
    assert mqstore.kafka.KafkaProducer is mqstore.kafka_producer.KafkaProducer
    assert mqstore.TopicPartition is mqstore.kafka_producer.TopicPartition
    assert mqstore.kafka.murmur2 is murmur2


def test_murmur2_matches_kafkas_test_vectors():
    # From Kafka's UtilsTest.testMurmur2 (the Java client's partitioner hash).
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert murmur2(b"abc") == 479470107


def test_keys_go_to_stable_partitions(engine):
    engine.create_topic("keyed", 8)
    producer = KafkaProducer(engine)
    placed = {}
    for i in range(200):
        key = b"user-%d" % (i % 20)
        meta = producer.send("keyed", b"x", key=key).get()
        placed.setdefault(key, set()).add(meta.partition)
        assert meta.partition == (murmur2(key) & 0x7FFFFFFF) % 8
    assert all(len(parts) == 1 for parts in placed.values())
    assert len({p for parts in placed.values() for p in parts}) > 1


def test_keyless_records_spread_round_robin(engine):
    engine.create_topic("spread", 4)
    producer = KafkaProducer(engine)
    partitions = [producer.send("spread", b"x").get().partition for _ in range(8)]
    assert sorted(set(partitions)) == [0, 1, 2, 3]


# ---------------------------------------------------------------- linger: order


def test_linger_batches_through_one_append(engine):
    engine.create_topic("b", 1)
    producer = KafkaProducer(engine, linger_ms=10_000, batch_size=1 << 30)
    futures = [producer.send("b", b"%d" % i) for i in range(100)]
    assert not any(f.is_done for f in futures)
    producer.flush()
    assert [f.get(1).offset for f in futures] == list(range(100))
    assert producer.send_batch("b", 0, [b"x"] * 10)[-1].offset == 109
    producer.close()


def test_a_later_batch_never_overtakes_an_earlier_one(store):
    """flush() pops batch 1 and its append is held; batch 2 is sent meanwhile and
    the linger thread is woken to drain it. It must not be appended before batch 1."""
    store.create_topic("o", 1)
    producer = KafkaProducer(store, linger_ms=10_000, batch_size=1 << 30)
    entered, _release, calls = _gate_appends(store)
    first = [producer.send("o", b"a%d" % i, partition=0) for i in range(3)]
    flusher = threading.Thread(target=producer.flush)
    flusher.start()
    assert entered.wait(5)  # batch 1 is popped and its append waits
    second = [producer.send("o", b"b%d" % i, partition=0) for i in range(3)]
    producer._wake.set()  # the linger thread's tick
    flusher.join(5)
    offsets = [f.get(5).offset for f in first + second]
    producer.close()
    assert offsets == list(range(6)), f"appends in order {calls}"


def test_concurrent_senders_keep_their_order_per_partition(store):
    """Four threads send to two partitions while batches fill (inline drains) and the
    linger thread drains too. Every other append waits until a later append of its
    partition completes (or 20 ms): a later batch that can overtake, will."""
    store.create_topic("c", 2)
    append = store.append_records
    calls, completed = [0], [0, 0]  # appends begun; appends completed per partition
    changed = threading.Condition()

    def overtakable(topic, partition, records):
        with changed:
            calls[0] += 1
            if calls[0] % 2:
                seen = completed[partition]
                changed.wait_for(lambda: completed[partition] > seen, 0.02)
        result = append(topic, partition, records)
        with changed:
            completed[partition] += 1
            changed.notify_all()
        return result

    store.append_records = overtakable
    producer = KafkaProducer(store, linger_ms=1, batch_size=64)
    sent: dict[int, list] = {t: [] for t in range(4)}

    def sender(t):
        for i in range(150):
            sent[t].append(producer.send("c", b"%d:%04d" % (t, i), partition=i % 2))

    threads = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
    switch_interval_s = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # senders interleave within a batch, not batch by batch
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch_interval_s)
    producer.flush()
    for t, futures in sent.items():
        for partition in (0, 1):
            offsets = [f.get(5).offset for f in futures[partition::2]]
            assert offsets == sorted(offsets), f"thread {t} partition {partition} reordered"
    for partition in (0, 1):
        stored = store.read_records("c", partition, 0, 1000)
        assert len(stored) == 300
        for t in range(4):
            mine = [r.value for r in stored if r.value.startswith(b"%d:" % t)]
            assert mine == sorted(mine)
    producer.close()


def test_send_batch_lands_after_the_partitions_buffered_sends(store):
    store.create_topic("sb", 1)
    producer = KafkaProducer(store, linger_ms=10_000, batch_size=1 << 30)
    buffered = [producer.send("sb", b"s%d" % i) for i in range(5)]
    batch = producer.send_batch("sb", 0, [b"x"] * 3)
    assert [f.get(1).offset for f in buffered] == list(range(5))
    assert [m.offset for m in batch] == [5, 6, 7]
    producer.close()
    with pytest.raises(StoreClosedError):
        producer.send_batch("sb", 0, [b"y"])


# ---------------------------------------------------------------- close


@pytest.mark.parametrize("linger_ms", [0, 5])
def test_a_send_racing_close_is_appended_or_refused(store, linger_ms):
    """The send passes its closed check, then waits (in topic_for_write) until close()
    has returned: it must then be refused, or appended and resolved, never hang."""
    store.create_topic("r", 1)
    producer = KafkaProducer(store, linger_ms=linger_ms, batch_size=1 << 30)
    describe = store.topic_for_write
    in_send, closed = threading.Event(), threading.Event()

    def slow_describe(name):
        if threading.current_thread().name == "racer":
            in_send.set()
            closed.wait(5)
        return describe(name)

    store.topic_for_write = slow_describe
    outcome = {}

    def racer():
        try:
            outcome["future"] = producer.send("r", b"late")
        except StoreError as error:
            outcome["error"] = error

    thread = threading.Thread(target=racer, name="racer")
    thread.start()
    assert in_send.wait(5)
    producer.close()
    closed.set()
    thread.join(5)
    if "error" in outcome:
        assert isinstance(outcome["error"], StoreClosedError)
        assert store.latest_offset("r", 0) == 0
    else:
        assert outcome["future"].get(timeout=2).offset == 0  # appended, not lost
        assert store.latest_offset("r", 0) == 1


def test_many_sends_racing_close_all_settle(store):
    store.create_topic("m", 3)
    producer = KafkaProducer(store, linger_ms=2, batch_size=256)
    futures, refused = [], []

    def sender():
        for i in range(2000):
            try:
                futures.append(producer.send("m", b"%d" % i))
            except StoreClosedError:
                refused.append(i)
                return

    threads = [threading.Thread(target=sender) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.02)
    producer.close()
    for thread in threads:
        thread.join(10)
    assert all(f.get(timeout=2) for f in futures)  # none pending, none failed
    assert sum(store.latest_offset("m", p) for p in range(3)) == len(futures)
    with pytest.raises(StoreClosedError):
        producer.send("m", b"after")


def test_close_timeout_fails_what_it_could_not_append(store):
    store.create_topic("ct", 2)
    producer = KafkaProducer(store, linger_ms=10_000, batch_size=1 << 30)
    entered, release, _calls = _gate_appends(store)
    held = producer.send("ct", b"held", partition=0)
    threading.Thread(target=producer.flush).start()
    assert entered.wait(5)  # the flush holds the drain for partition 0
    waiting = producer.send("ct", b"waiting", partition=1)
    started = time.monotonic()
    producer.close(timeout=0.05)
    assert time.monotonic() - started < RACE_WAIT_S
    with pytest.raises(StoreClosedError):
        waiting.get(timeout=1)  # force-closed, not left pending
    release.set()
    assert held.get(timeout=2).offset == 0  # the append in flight completes
    with pytest.raises(InvalidArgumentError):
        KafkaProducer(store).close(timeout=-1)


def test_close_from_a_callback_appends_the_rest(store):
    """A callback runs in the draining thread: close() there must neither deadlock
    nor leave the other partition's buffered record behind."""
    store.create_topic("cb", 2)
    producer = KafkaProducer(store, linger_ms=10_000, batch_size=2)
    other = producer.send("cb", b"o", partition=1)
    first = producer.send("cb", b"1", partition=0).add_callback(lambda _: producer.close())
    producer.send("cb", b"2", partition=0)  # the batch is full: this thread drains it
    assert first.get(0).offset == 0
    assert other.get(0).offset == 0  # appended by the same drain, after the close
    assert producer._flusher is not None
    producer._flusher.join(2)
    assert not producer._flusher.is_alive()
    with pytest.raises(StoreClosedError):
        producer.send("cb", b"3")


def test_a_raising_callback_does_not_stop_the_batch(store):
    store.create_topic("rc", 1)
    producer = KafkaProducer(store, linger_ms=10_000, batch_size=1 << 30)
    futures = [producer.send("rc", b"%d" % i) for i in range(3)]
    futures[0].add_callback(lambda _: 1 / 0)
    producer.flush()
    assert [f.get(0).offset for f in futures] == [0, 1, 2]
    producer.close()


# ---------------------------------------------------------------- buffer_memory


def test_buffer_memory_and_max_block_defaults_are_kafka_pythons(store):
    producer = KafkaProducer(store)
    assert producer.config["buffer_memory"] == 32 * 1024 * 1024
    assert producer.config["max_block_ms"] == 60_000
    for bad in ({"buffer_memory": 0}, {"max_block_ms": -1}, {"batch_size": "1"},
                {"linger_ms": -5}, {"buffer_memory": True}):  # fmt: skip
        with pytest.raises(ConfigError):
            KafkaProducer(store, **bad)


def test_a_full_buffer_blocks_send_for_max_block_ms_then_times_out(store):
    store.create_topic("bm", 1)
    producer = KafkaProducer(
        store, linger_ms=10_000, batch_size=1 << 30, buffer_memory=1000, max_block_ms=100
    )
    _entered, release, _calls = _gate_appends(store)
    release.clear()
    accepted = [producer.send("bm", b"v" * 100) for _ in range(10)]  # 1000 bytes
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError) as caught:
        producer.send("bm", b"v" * 100)
    waited_s = time.monotonic() - started
    assert isinstance(caught.value, StoreError)
    assert isinstance(caught.value, TimeoutError)
    assert 0.09 <= waited_s < RACE_WAIT_S
    assert producer._buffered_bytes <= 1000
    with pytest.raises(LimitExceededError):
        producer.send("bm", b"v" * 1001)  # could never fit
    release.set()
    producer.flush()
    assert [f.get(1).offset for f in accepted] == list(range(10))
    assert producer._buffered_bytes == 0
    producer.close()


def test_a_blocked_send_goes_on_once_appends_free_memory(store):
    store.create_topic("bf", 1)
    producer = KafkaProducer(
        store, linger_ms=10_000, batch_size=1 << 30, buffer_memory=500, max_block_ms=5000
    )
    entered, release, _calls = _gate_appends(store)
    release.clear()
    first = [producer.send("bf", b"v" * 100) for _ in range(5)]
    result = {}
    blocked = threading.Thread(target=lambda: result.update(f=producer.send("bf", b"w" * 100)))
    blocked.start()
    assert entered.wait(5)  # the full buffer woke the linger thread; its append is held
    blocked.join(0.05)
    assert blocked.is_alive()  # still waiting for memory
    release.set()
    blocked.join(5)
    producer.flush()
    assert [f.get(1).offset for f in [*first, result["f"]]] == list(range(6))
    producer.close()


def test_close_wakes_a_send_blocked_on_memory(store):
    store.create_topic("cw", 1)
    producer = KafkaProducer(
        store, linger_ms=10_000, batch_size=1 << 30, buffer_memory=100, max_block_ms=10_000
    )
    entered, release, _calls = _gate_appends(store)
    release.clear()
    held = producer.send("cw", b"v" * 100)
    errors = []

    def blocked_send():
        try:
            producer.send("cw", b"w" * 100)
        except StoreError as error:
            errors.append(error)

    thread = threading.Thread(target=blocked_send)
    thread.start()
    assert entered.wait(5)
    started = time.monotonic()
    producer.close(timeout=0.05)
    thread.join(2)
    assert time.monotonic() - started < 1.0
    assert [type(e) for e in errors] == [StoreClosedError]
    release.set()
    assert held.get(2).offset == 0


# ---------------------------------------------------------------- flush


def test_flush_timeout_raises_while_another_drain_holds_on(store):
    store.create_topic("ft", 1)
    producer = KafkaProducer(store, linger_ms=10_000, batch_size=1 << 30)
    entered, release, _calls = _gate_appends(store)
    release.clear()
    producer.send("ft", b"a")
    threading.Thread(target=producer.flush).start()
    assert entered.wait(5)
    later = producer.send("ft", b"b")
    with pytest.raises(KafkaTimeoutError):
        producer.flush(timeout=0.02)
    assert not later.is_done  # still buffered, appended by the next drain
    release.set()
    producer.flush()
    assert later.get(0).offset == 1  # post-condition of flush(): done
    producer.close()
    lingering = KafkaProducer(store, linger_ms=10_000)
    with pytest.raises(KafkaTimeoutError):
        lingering.send("ft", b"c").get(timeout=0.01)
    lingering.close()
