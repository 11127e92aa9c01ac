"""Leader epochs (mqstore/replication/epochs.py): the file's rules, and a model check of
the divergence protocol: whatever history of appends, copies, crashes that lose a
tail and leader changes (clean or not) three replicas go through, a follower that runs
the protocol against the leader ends with a log that is a prefix of the leader's, in
a bounded number of rounds (KIP-101's two scenarios are among the histories)."""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import CorruptDataError, IllegalStateError
from mqstore.replication.epochs import (
    EPOCH_FILE,
    EPOCH_NODES,
    UNDEFINED,
    LeaderEpochs,
    diverging,
    next_epoch,
    truncation_point,
)


def test_a_store_without_the_file_is_at_epoch_0(tmp_path):
    epochs = LeaderEpochs(str(tmp_path))
    assert epochs.entries == [(0, 0)]
    assert epochs.current_epoch == 0
    assert epochs.role == "leader"
    assert not os.path.exists(tmp_path / EPOCH_FILE)  # nothing written until a change


def test_leadership_takes_a_new_epoch_of_its_own_durably(tmp_path):
    epochs = LeaderEpochs(str(tmp_path))
    assert epochs.begin_leadership(100, node_id=3) == EPOCH_NODES + 3
    epochs.see_epoch(5 * EPOCH_NODES + 1)  # another node led meanwhile
    assert epochs.begin_leadership(100, node_id=3) == 6 * EPOCH_NODES + 3
    again = LeaderEpochs(str(tmp_path))
    assert again.entries == [(0, 0), (EPOCH_NODES + 3, 100), (6 * EPOCH_NODES + 3, 100)]
    assert again.current_epoch == 6 * EPOCH_NODES + 3


def test_two_nodes_starting_from_one_epoch_never_take_the_same_one():
    for current, (a, b) in itertools.product(
        (0, 5, EPOCH_NODES, 7 * EPOCH_NODES + 2), itertools.combinations(range(8), 2)
    ):
        assert next_epoch(current, a) != next_epoch(current, b)
        assert min(next_epoch(current, a), next_epoch(current, b)) > current


def test_end_offsets_follow_kafkas_rule(tmp_path):
    epochs = LeaderEpochs(str(tmp_path))
    epochs.learn(3, 100)
    epochs.learn(7, 100)  # epoch 3 wrote nothing
    epochs.learn(9, 250)
    assert epochs.end_offset_for(0, 400) == (0, 100)
    assert epochs.end_offset_for(2, 400) == (0, 100)
    assert epochs.end_offset_for(3, 400) == (3, 100)
    assert epochs.end_offset_for(8, 400) == (7, 250)
    assert epochs.end_offset_for(9, 400) == (9, 400)
    assert epochs.end_offset_for(50, 400) == (9, 400)
    assert epochs.end_offset_for(-1, 400) == (UNDEFINED, UNDEFINED)
    assert epochs.epoch_at(100) == (7, 100)
    assert epochs.epoch_at(99) == (0, 0)
    assert epochs.next_start_after(100) == 250
    assert epochs.next_start_after(250) is None


def test_older_epochs_and_backward_starts_are_refused(tmp_path):
    epochs = LeaderEpochs(str(tmp_path))
    epochs.learn(4, 50)
    with pytest.raises(IllegalStateError):
        epochs.learn(2, 60)
    with pytest.raises(IllegalStateError):
        epochs.learn(6, 40)
    assert epochs.entries == [(0, 0), (4, 50)]


def test_truncation_drops_entries_at_or_past_the_cut_and_open_drops_those_past_the_end(
    tmp_path,
):
    epochs = LeaderEpochs(str(tmp_path))
    for epoch, start in ((2, 10), (4, 20), (6, 30)):
        epochs.learn(epoch, start)
    epochs.truncate_from(20)
    assert epochs.entries == [(0, 0), (2, 10)]
    assert epochs.current_epoch == 6  # the largest epoch seen is kept
    epochs.learn(8, 25)
    reopened = LeaderEpochs(str(tmp_path))
    reopened.drop_past(24)  # the log lost its tail in a crash
    assert reopened.entries == [(0, 0), (2, 10)]
    assert LeaderEpochs(str(tmp_path)).entries == [(0, 0), (2, 10)]


def test_the_role_survives_a_restart(tmp_path):
    epochs = LeaderEpochs(str(tmp_path))
    epochs.follow("127.0.0.1:9092", epoch=9)
    again = LeaderEpochs(str(tmp_path))
    assert (again.role, again.leader, again.current_epoch) == ("follower", "127.0.0.1:9092", 9)
    again.begin_leadership(0, node_id=1)
    assert LeaderEpochs(str(tmp_path)).role == "leader"


@pytest.mark.parametrize(
    "damage",
    [
        lambda doc: doc.update(current_epoch=doc["current_epoch"] + 1),  # checksum
        lambda doc: doc.update(format="other"),
        lambda doc: doc.update(version=2),
    ],
)
def test_a_damaged_file_is_refused_naming_it(tmp_path, damage):
    LeaderEpochs(str(tmp_path)).begin_leadership(10, node_id=0)
    path = tmp_path / EPOCH_FILE
    document = json.loads(path.read_text())
    damage(document)
    path.write_text(json.dumps(document))
    with pytest.raises(CorruptDataError) as refused:
        LeaderEpochs(str(tmp_path))
    assert str(path) in str(refused.value)


@given(st.binary(max_size=200))
def test_any_bytes_load_or_raise_corrupt_data(raw):
    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, EPOCH_FILE), "wb") as handle:
            handle.write(raw)
        try:
            LeaderEpochs(root)
        except CorruptDataError:
            pass


# ---------------------------------------------------------------- the model check


class Replica:
    """A replica in the model: its log is a list of record ids; positions are indexes."""

    def __init__(self, root: str, node_id: int) -> None:
        self.node_id = node_id
        self.log: list[int] = []
        self.epochs = LeaderEpochs(root)


def _sync(leader: Replica, follower: Replica, copy: int) -> int:
    """Run the protocol as the fetcher and the leader do; returns the rounds taken."""
    for rounds in itertools.count(1):
        assert rounds <= 2 * len(leader.epochs.entries) + 4, "the divergence loop did not end"
        follower.epochs.see_epoch(leader.epochs.current_epoch)
        found = diverging(
            leader.epochs, len(leader.log), follower.epochs.latest_epoch, len(follower.log)
        )
        if found is None:
            break
        cut = truncation_point(follower.epochs, len(follower.log), *found)
        assert cut <= len(follower.log)
        follower.epochs.truncate_from(cut)
        del follower.log[cut:]
    start = len(follower.log)
    for position in range(start, min(len(leader.log), start + copy)):
        entry = leader.epochs.epoch_at(position)
        follower.epochs.learn(entry.epoch, entry.start)
        follower.log.append(leader.log[position])
    return rounds


events = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 5)),
        st.tuples(st.just("copy"), st.integers(0, 2), st.integers(0, 8)),
        st.tuples(st.just("lose_tail"), st.integers(0, 2), st.integers(1, 6)),
        st.tuples(st.just("elect"), st.integers(0, 2)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(events)
# A follower that led briefly (epoch E) under a leader whose log is longer: the ends
# alone say "prefix"; only the epochs tell the logs apart (KIP-279).
@example([("append", 5), ("copy", 2, 8), ("elect", 1), ("append", 3), ("elect", 2)])
# KIP-101 scenario 2: the leader loses its tail, restarts and writes past the
# follower's end at the same offsets.
@example([("append", 4), ("copy", 1, 8), ("lose_tail", 0, 2), ("append", 6)])
# KIP-101 scenario 1: the follower lost its tail; the leader has everything.
@example([("append", 6), ("copy", 1, 8), ("lose_tail", 1, 3), ("append", 2)])
def test_the_protocol_leaves_every_follower_a_prefix_of_its_leader(history: list[Any]):
    with tempfile.TemporaryDirectory() as root:
        replicas = []
        for node_id in range(3):
            os.mkdir(os.path.join(root, str(node_id)))
            replicas.append(Replica(os.path.join(root, str(node_id)), node_id))
        leader = replicas[0]
        leader.epochs.begin_leadership(0, node_id=0)
        ids = itertools.count()
        for event in history:
            if event[0] == "append":
                leader.log += [next(ids) for _ in range(event[1])]
            elif event[0] == "copy":
                if replicas[event[1]] is not leader:
                    _sync(leader, replicas[event[1]], event[2])
            elif event[0] == "lose_tail":  # a power cut: the unflushed tail is gone
                victim = replicas[event[1]]
                del victim.log[max(0, len(victim.log) - event[2]) :]
                victim.epochs.drop_past(len(victim.log))
                if victim is leader:  # it restarts and leads again, with a new epoch
                    leader.epochs.begin_leadership(len(leader.log), leader.node_id)
            else:  # any replica may be elected: clean or unclean, the logs converge
                leader = replicas[event[1]]
                for other in replicas:
                    leader.epochs.see_epoch(other.epochs.current_epoch)  # the operator's view
                leader.epochs.begin_leadership(len(leader.log), leader.node_id)
        leader.log += [next(ids) for _ in range(3)]
        for replica in replicas:
            if replica is not leader:
                _sync(leader, replica, 10_000)
                assert replica.log == leader.log
                assert replica.epochs.entries[-1] == leader.epochs.entries[-1]
