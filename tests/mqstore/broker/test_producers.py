"""The idempotent producer's sequence rules (Kafka's ProducerStateManager) and where
they persist: the state topic in the log (the CommitLog engine: rebuilt after a
restart and on a promoted follower) or the journal (replayed after a clean stop and
a SIGKILL, damaged tails ignored)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from kafka import KafkaProducer

from mqstore.broker import Broker, BrokerConfig
from mqstore.broker.producers import (
    BATCHES_REMEMBERED,
    JOURNAL_NAME,
    JOURNAL_RECORD,
    ProducerIds,
    ProducerState,
)
from mqstore.commitlog_engine import KEY_PROPERTY
from mqstore.internal_log import PRODUCERS_TOPIC
from mqstore.replication.leader import read_chunk
from tests.mqstore.broker.test_handlers import idempotent_batch, produce_answer, produce_frame
from tests.mqstore.engines import ENGINES, open_engine


def test_sequences_duplicates_and_epochs() -> None:
    state = ProducerState()
    assert state.check(5, 0, "t", 0, 0, 10).error == 0
    state.appended(5, 0, "t", 0, 0, 10, 100)
    assert state.check(5, 0, "t", 0, 10, 5).error == 0  # the next one
    state.appended(5, 0, "t", 0, 10, 5, 110)
    assert state.check(5, 0, "t", 0, 0, 10).duplicate_offset == 100
    assert state.check(5, 0, "t", 0, 10, 5).duplicate_offset == 110
    assert state.check(5, 0, "t", 0, 16, 1).error == 45  # a gap
    assert state.check(5, 0, "t", 1, 16, 1).error == 0  # another partition: its own state
    assert state.check(5, 1, "t", 0, 0, 1).error == 0  # a new epoch restarts at 0
    assert state.check(5, 1, "t", 0, 3, 1).error == 45
    state.appended(5, 1, "t", 0, 0, 1, 115)
    assert state.check(5, 0, "t", 0, 1, 1).error == 47  # the old epoch is fenced


def test_batches_behind_a_refused_one_are_refused_the_same_way() -> None:
    """A gap that starts at a batch refused unappended (NOT_ENOUGH_REPLICAS, 19) is
    answered 19 too, not OUT_OF_ORDER (45): librdkafka would bump its epoch and send
    an appended but unacknowledged batch again (see the module docstring)."""
    state = ProducerState()
    state.appended(5, 0, "t", 0, 0, 1, 100)
    state.refused(5, 0, "t", 0, 1, 19)
    assert state.check(5, 0, "t", 0, 2, 1).error == 19  # in flight behind the refused one
    assert state.check(5, 0, "t", 0, 0, 1).duplicate_offset == 100  # a retry before it
    assert state.check(5, 0, "t", 1, 2, 1).error == 0  # another partition: its own state
    assert state.check(5, 1, "t", 0, 2, 1).error == 45  # a newer epoch: a plain gap
    state.refused(5, 0, "t", 0, 2, 19)  # a later refusal does not move the gap's start
    assert state.check(5, 0, "t", 0, 1, 1).error == 0  # the refused one, retried
    state.appended(5, 0, "t", 0, 1, 1, 101)
    assert state.check(5, 0, "t", 0, 3, 1).error == 45  # appended: gaps are gaps again
    state.refused(7, 0, "t", 0, 4, 19)  # a producer unknown here: the same rule
    assert state.check(7, 0, "t", 0, 5, 1).error == 19
    assert state.check(7, 0, "t", 0, 4, 1).error == 0


def test_a_batch_appended_whose_sync_timed_out_is_remembered(tmp_path: Any) -> None:
    """Sync flush mode: a batch appended whose sync did not end in time is answered
    REQUEST_TIMED_OUT (7), appended but not acknowledged (FlushTimeoutError carries
    its first offset). The broker remembers it all the same, so the retry is a
    duplicate with the original offset, not a second copy."""
    from mqstore.commitlog.errors import FlushTimeoutError

    store = open_engine("commitlog", tmp_path / "store")
    store.create_topic("idem", partitions=1)
    try:
        with Broker(store, BrokerConfig(port=0)) as broker:
            assert broker.handlers is not None
            log = broker.handlers.log
            append = log.append

            def append_then_time_out(*args: Any, **kwargs: Any) -> Any:
                log.append = append  # once
                appended = append(*args, **kwargs)
                error = FlushTimeoutError("the sync did not end in time")
                error.first_queue_offset = appended.base_offset
                raise error

            log.append = append_then_time_out  # type: ignore[method-assign]
            batch = idempotent_batch(88, 0, 2, value=b"once")
            first = produce_answer(broker.port, produce_frame("idem", batch, 1))
            retry = produce_answer(broker.port, produce_frame("idem", batch, 2))
        assert first.error_code == 7
        assert (retry.error_code, retry.base_offset) == (0, 0)
        assert [bytes(m.body) for m in store.get("idem", 0, 0, 10)] == [b"once", b"once"]
    finally:
        store.close()


def test_only_the_last_five_batches_are_remembered() -> None:
    state = ProducerState()
    for n in range(BATCHES_REMEMBERED + 1):
        state.appended(9, 0, "t", 0, n, 1, 1_000 + n)
    assert state.check(9, 0, "t", 0, 0, 1).duplicate_offset is None
    assert state.check(9, 0, "t", 0, 0, 1).error == 45
    assert state.check(9, 0, "t", 0, 1, 1).duplicate_offset == 1_001


def test_sequences_wrap_at_int32() -> None:
    state = ProducerState()
    state.appended(3, 0, "t", 0, 2**31 - 2, 2, 0)
    assert state.check(3, 0, "t", 0, 0, 1).error == 0


def test_producer_ids_increase() -> None:
    ids = ProducerIds()
    drawn = [ids.next() for _ in range(1000)]
    assert drawn == sorted(set(drawn))
    assert 0 < drawn[0] < 2**63


# ---------------------------------------------------------------- the journal


def test_state_survives_a_reopen_of_its_journal(tmp_path: Any) -> None:
    state = ProducerState(str(tmp_path))
    state.appended(5, 0, "t", 0, 0, 10, 100)
    state.appended(5, 0, "t", 0, 10, 5, 110)
    state.appended(6, 2, "u", 3, 0, 1, 7)
    # no close: a SIGKILL leaves the appended records in the page cache
    again = ProducerState(str(tmp_path))
    assert again.check(5, 0, "t", 0, 0, 10).duplicate_offset == 100
    assert again.check(5, 0, "t", 0, 10, 5).duplicate_offset == 110
    assert again.check(5, 0, "t", 0, 16, 1).error == 45
    assert again.check(6, 1, "u", 3, 1, 1).error == 47  # epoch 2 is remembered
    again.close()
    third = ProducerState(str(tmp_path))  # from the compacted journal
    assert third.check(6, 2, "u", 3, 0, 1).duplicate_offset == 7
    third.close()


def test_only_the_last_five_survive_compaction(tmp_path: Any) -> None:
    state = ProducerState(str(tmp_path))
    for n in range(BATCHES_REMEMBERED + 3):
        state.appended(9, 0, "t", 0, n, 1, 1_000 + n)
    state.close()
    journal = tmp_path / JOURNAL_NAME
    assert journal.stat().st_size == BATCHES_REMEMBERED * (JOURNAL_RECORD.size + 1)
    again = ProducerState(str(tmp_path))
    assert again.check(9, 0, "t", 0, 2, 1).error == 45  # forgotten, as Kafka does
    assert again.check(9, 0, "t", 0, 3, 1).duplicate_offset == 1_003


@pytest.mark.parametrize("damage", ["torn", "flipped", "garbage"])
def test_a_damaged_tail_ends_the_replay_there(tmp_path: Any, damage: str) -> None:
    state = ProducerState(str(tmp_path))
    state.appended(5, 0, "t", 0, 0, 1, 100)
    state.appended(5, 0, "t", 0, 1, 1, 101)
    journal = tmp_path / JOURNAL_NAME
    data = bytearray(journal.read_bytes())
    record_bytes = JOURNAL_RECORD.size + 1
    assert len(data) == 2 * record_bytes
    if damage == "torn":
        data = data[: record_bytes + 7]
    elif damage == "flipped":
        data[record_bytes + 20] ^= 0x10
    else:
        data += os.urandom(3) + b"\xff" * 40
    journal.write_bytes(bytes(data))
    again = ProducerState(str(tmp_path))
    assert again.check(5, 0, "t", 0, 0, 1).duplicate_offset == 100
    if damage == "garbage":
        assert again.check(5, 0, "t", 0, 1, 1).duplicate_offset == 101
    else:  # the second batch is forgotten: its producer continues as it expects
        assert again.check(5, 0, "t", 0, 1, 1).duplicate_offset is None
    assert journal.stat().st_size == record_bytes * (2 if damage == "garbage" else 1)


def test_prune_forgets_batches_the_log_lost(tmp_path: Any) -> None:
    state = ProducerState(str(tmp_path))
    state.appended(5, 0, "t", 0, 0, 1, 100)
    state.appended(5, 0, "t", 0, 1, 1, 101)
    state.appended(6, 0, "gone", 0, 0, 1, 0)
    ends = {("t", 0): 101}
    assert state.prune(lambda topic, partition: ends.get((topic, partition))) == 2
    assert state.check(5, 0, "t", 0, 0, 1).duplicate_offset == 100
    assert state.check(5, 0, "t", 0, 1, 1).duplicate_offset is None
    assert state.check(6, 0, "gone", 0, 0, 1).duplicate_offset is None
    state.close()
    assert ProducerState(str(tmp_path)).check(5, 0, "t", 0, 1, 1).duplicate_offset is None


# ---------------------------------------------------------------- across restarts


def _kafka_python_batch(bootstrap: str, topic: str) -> tuple[int, int, int]:
    """One record from kafka-python 3's default (idempotent) producer: its producer
    id, epoch and the record's offset."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    try:
        metadata = producer.send(topic, b"once").get(timeout=30)
        manager = producer._transaction_manager
        assert manager is not None
        identity = manager.producer_id_and_epoch
    finally:
        producer.close()
    assert identity.producer_id >= 0
    return identity.producer_id, identity.epoch, metadata.offset


def _resend(port: int, topic: str, producer_id: int, epoch: int) -> Any:
    batch = idempotent_batch(producer_id, 0, 1, epoch=epoch, value=b"once")
    return produce_answer(port, produce_frame(topic, batch, 9))


def test_duplicate_after_a_clean_restart(tmp_path: Any, engine_kind: str) -> None:
    engine = open_engine(engine_kind, tmp_path / "store")
    try:
        engine.create_topic("idem", 1)
        with Broker(engine, BrokerConfig(port=0)) as broker:
            pid, epoch, offset = _kafka_python_batch(broker.bootstrap, "idem")
    finally:
        engine.close()
    engine = open_engine(engine_kind, tmp_path / "store")
    try:
        with Broker(engine, BrokerConfig(port=0)) as broker:
            answer = _resend(broker.port, "idem", pid, epoch)
            assert (answer.error_code, answer.base_offset) == (0, offset)
            nxt = produce_answer(
                broker.port, produce_frame("idem", idempotent_batch(pid, 1, 1, epoch=epoch), 10)
            )
            assert (nxt.error_code, nxt.base_offset) == (0, offset + 1)
        assert engine.latest_offset("idem", 0) == offset + 2
        values = [r.value for r in engine.read_records("idem", 0, 0, 10)]
        assert values.count(b"once") == 1
    finally:
        engine.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_duplicate_after_a_sigkill(tmp_path: Any, engine: str) -> None:
    from tests.mqstore.broker.test_serve import reopen, start_serve

    store = tmp_path / "store"
    process, bootstrap = start_serve(store, engine)
    try:
        pid, epoch, offset = _kafka_python_batch(bootstrap, "idem")
    finally:
        process.kill()
        process.wait(30)
    process, bootstrap = start_serve(store, engine)
    try:
        port = int(bootstrap.rsplit(":", 1)[1])
        answer = _resend(port, "idem", pid, epoch)
        assert (answer.error_code, answer.base_offset) == (0, offset)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    reopened = reopen(engine, store)
    try:
        assert reopened.latest_offset("idem", 0) == offset + 1
        values = [r.value for r in reopened.read_records("idem", 0, 0, 10)]
        assert values.count(b"once") == 1
    finally:
        reopened.close()


# ---------------------------------------------------------------- through the log


def _append(store: Any, state: ProducerState, pid: int, epoch: int, topic: str,
            partition: int, first: int, count: int) -> int:  # fmt: skip
    """A batch of ``count`` records appended as the broker appends it: with the
    producer's state record as its trailer; its base offset."""
    trailer = state.trailer(pid, epoch, topic, partition, first, count)
    assert trailer is not None
    result = store.put_batch_arrays(topic, partition, [b"v"] * count, trailer=trailer)
    state.appended(pid, epoch, topic, partition, first, count, result.first_queue_offset)
    return int(result.first_queue_offset)


def test_state_through_the_log_survives_a_reopen(tmp_path: Any) -> None:
    store = open_engine("commitlog", tmp_path / "store")
    store.create_topic("t", 1)
    store.create_topic("u", 2)
    store.put_batch("t", 0, [b"before"] * 100)
    state = ProducerState(log=store.producer_log)
    for i in range(7):  # the last five are remembered
        assert _append(store, state, 5, 0, "t", 0, i, 1) == 100 + i
    assert _append(store, state, 6, 2, "u", 1, 0, 3) == 0
    assert not os.path.exists(tmp_path / "store" / JOURNAL_NAME)  # no side file
    assert PRODUCERS_TOPIC not in store.list_topics()  # internal
    store.close()
    store = open_engine("commitlog", tmp_path / "store")
    try:
        state = ProducerState(str(tmp_path / "store"), store.producer_log)
        assert state.check(5, 0, "t", 0, 6, 1).duplicate_offset == 106
        assert state.check(5, 0, "t", 0, 2, 1).duplicate_offset == 102
        assert state.check(5, 0, "t", 0, 1, 1).error == 45  # forgotten: out of order
        assert state.check(5, 0, "t", 0, 7, 1) == (0, None)  # the next one
        assert state.check(6, 2, "u", 1, 0, 3).duplicate_offset == 0
        assert state.check(6, 1, "u", 1, 3, 1).error == 47  # fenced epoch
    finally:
        store.close()


def test_an_older_journal_is_imported_into_the_log(tmp_path: Any) -> None:
    store_path = tmp_path / "store"
    store = open_engine("commitlog", store_path)
    try:
        journal = ProducerState(str(store_path))  # what an older broker kept
        journal.appended(5, 0, "t", 0, 0, 2, 100)
        journal.close()
        state = ProducerState(str(store_path), store.producer_log)
        assert not os.path.exists(store_path / JOURNAL_NAME)
        assert state.check(5, 0, "t", 0, 0, 2).duplicate_offset == 100
        assert ProducerState(log=store.producer_log).check(5, 0, "t", 0, 0, 2) == (0, 100)
    finally:
        store.close()


@pytest.mark.parametrize("batches", [1, 3, 4, 5, 6])
def test_each_state_record_holds_the_batches_remembered(tmp_path: Any, batches: int) -> None:
    """Reopened after any number of batches, the state answers every remembered one
    (each trailer carries the entry as ``appended`` leaves it)."""
    store = open_engine("commitlog", tmp_path / "store")
    store.create_topic("t", 1)
    state = ProducerState(log=store.producer_log)
    for i in range(batches):
        _append(store, state, 5, 0, "t", 0, i * 2, 2)
    store.close()
    store = open_engine("commitlog", tmp_path / "store")
    try:
        state = ProducerState(log=store.producer_log)
        remembered = range(max(0, batches - BATCHES_REMEMBERED), batches)
        for i in remembered:
            assert state.check(5, 0, "t", 0, i * 2, 2).duplicate_offset == i * 2
        assert state.check(5, 0, "t", 0, batches * 2, 1) == (0, None)
    finally:
        store.close()


def test_a_state_record_that_does_not_decode_is_skipped(tmp_path: Any) -> None:
    store = open_engine("commitlog", tmp_path / "store")
    try:
        state = ProducerState(log=store.producer_log)
        store.create_topic("t", 1)
        store.put_batch("t", 0, [b"before"] * 100)
        assert _append(store, state, 5, 0, "t", 0, 0, 1) == 100
        for key, value in ((b"short", b"x"), (b"\0" * 12 + b"t", b"\0\0\x02" + b"\0" * 5)):
            store.put(PRODUCERS_TOPIC, 0, value, properties=[(KEY_PROPERTY, key)])
        reloaded = ProducerState(log=store.producer_log)
        assert reloaded.malformed == 2
        assert reloaded.check(5, 0, "t", 0, 0, 1).duplicate_offset == 100
    finally:
        store.close()


def _copy_log(leader: Any, follower: Any) -> None:
    """The follower's CommitLog catches up (tests/mqstore/test_store_replica.py)."""
    follower.apply_replica_topics(leader.replica_topics())
    while follower.commitlog.write_position < leader.replicable_end:
        position = follower.commitlog.write_position
        follower.append_replica(position, read_chunk(leader, position, 1 << 20))


def test_a_promoted_follower_answers_a_retry_as_its_leader(tmp_path: Any) -> None:
    """kafka-python's idempotent producer writes through the leader; the follower,
    fed the leader's CommitLog bytes, is promoted and answers a retry of that batch
    with its original offset (before the state went through the log, the follower
    had none and appended it again), and the same committed offsets."""
    leader = open_engine("commitlog", tmp_path / "leader")
    follower = open_engine("commitlog", tmp_path / "follower")
    try:
        leader.create_topic("idem", 1)
        # Serving as a follower (of a leader it cannot reach: the test copies the log).
        with Broker(follower, BrokerConfig(port=0), follow="127.0.0.1:1") as standby:
            assert follower.is_follower
            with Broker(leader, BrokerConfig(port=0)) as broker:
                pid, epoch, offset = _kafka_python_batch(broker.bootstrap, "idem")
            leader.offsets.commit("g", {("idem", 0): (offset + 1, "")})
            _copy_log(leader, follower)
            assert standby.node is not None
            error, _epoch, _said = standby.node.promote(unclean=True)  # rebuilds the state
            assert error == 0 and not follower.is_follower
            answer = _resend(standby.port, "idem", pid, epoch)
            assert (answer.error_code, answer.base_offset) == (0, offset)
            nxt = produce_answer(
                standby.port, produce_frame("idem", idempotent_batch(pid, 1, 1, epoch=epoch), 10)
            )
            assert (nxt.error_code, nxt.base_offset) == (0, offset + 1)
        assert [r.value for r in follower.read_records("idem", 0, 0, 10)].count(b"once") == 1
        assert follower.offsets.load("g") == leader.offsets.load("g")
    finally:
        follower.close()
        leader.close()


def test_a_leader_restarted_held_folds_the_state_past_what_readers_see(tmp_path: Any) -> None:
    """Restarted to lead followers, a store shows readers only what they confirmed
    (MessageStore.open(replicated=True)), but its producer state covers its whole log:
    a retry of a batch past the hold is answered with its offset, not appended again
    (the chaos suite's duplicate after a leader's restart)."""
    from mqstore import MessageStore

    store = MessageStore.open(tmp_path / "store")
    store.create_topic("t", 1)
    state = ProducerState(log=store.producer_log)
    assert _append(store, state, 5, 0, "t", 0, 0, 2) == 0
    high_watermark = store.commitlog.write_position
    store.set_commit_limit(lambda: high_watermark)  # the followers hold this much
    assert _append(store, state, 5, 0, "t", 0, 2, 2) == 2
    store.close()
    with MessageStore.open(tmp_path / "store", replicated=True) as held:
        assert held.max_offset("t", 0) == 2  # readers see what the followers held
        reloaded = ProducerState(log=held.producer_log)
        # The broker prunes with the log's end (a journal or a compacted copy may name
        # lost batches), not the end readers see: nothing is forgotten here.
        assert held.max_offset("t", 0) < held.commitlog.next_queue_offset("t", 0) == 4
        assert reloaded.prune(held.commitlog.next_queue_offset) == 0
        assert reloaded.check(5, 0, "t", 0, 2, 2).duplicate_offset == 2
        assert reloaded.check(5, 0, "t", 0, 4, 1) == (0, None)


def test_state_naming_a_batch_past_the_logs_end_is_pruned(tmp_path: Any) -> None:
    """A state record can name a batch the log no longer holds (a compacted copy of
    the state topic is not cut by a truncation): pruned by the log's end, its retry
    is appended, not answered with an offset nothing is at."""
    from mqstore.broker.producers import STATE_KEY, _state_value

    store = open_engine("commitlog", tmp_path / "store")
    try:
        store.create_topic("t", 1)
        state = ProducerState(log=store.producer_log)
        assert _append(store, state, 5, 0, "t", 0, 0, 2) == 0
        stale = _state_value(0, [(0, 1, 0), (2, 3, 2)])  # batch 2-3 at offset 2: not there
        store.producer_log.append([(STATE_KEY.pack(5, 0) + b"t", stale)])
        reloaded = ProducerState(log=store.producer_log)
        assert reloaded.check(5, 0, "t", 0, 2, 2).duplicate_offset == 2
        assert reloaded.prune(store.commitlog.next_queue_offset) == 1
        assert reloaded.check(5, 0, "t", 0, 2, 2) == (0, None)
        assert reloaded.check(5, 0, "t", 0, 0, 2).duplicate_offset == 0
    finally:
        store.close()
