"""The idempotent producer's sequence rules (Kafka's ProducerStateManager)."""

from __future__ import annotations

from mqstore.broker.producers import BATCHES_REMEMBERED, ProducerIds, ProducerState


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
