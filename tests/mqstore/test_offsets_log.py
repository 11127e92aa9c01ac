"""Committed offsets through the log (mqstore/offsets_log.py): records of the
internal compacted topic ``__consumer_offsets``, rebuilt at open, copied by a
follower with the rest of the CommitLog, and imported from the old side files."""

from __future__ import annotations

import os
import struct
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore import KafkaConsumer, MessageStore, StoreConfig, TopicPartition
from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    InvalidRecordError,
    LimitExceededError,
    NotLeaderError,
    ReadOnlyStoreError,
)
from mqstore.commitlog_engine import KEY_PROPERTY
from mqstore.engine import ProducerRecord
from mqstore.internal_log import OFFSETS_TOPIC
from mqstore.offsets import OffsetStore
from mqstore.offsets_log import (
    IMPORTED_DIR,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from mqstore.replication.leader import read_chunk

from .conftest import SMALL


def _catch_up(leader: MessageStore, follower: MessageStore) -> None:
    """Copy the leader's log to the follower (tests/mqstore/test_store_replica.py)."""
    follower.apply_replica_topics(leader.replica_topics())
    while follower.commitlog.write_position < leader.replicable_end:
        position = follower.commitlog.write_position
        follower.append_replica(position, read_chunk(leader, position, 1 << 20))


def _consume_and_commit(store: MessageStore, group: str, count: int) -> None:
    """An embedded KafkaConsumer reads ``count`` records of "t" and commits."""
    consumer = KafkaConsumer(
        "t", store=store, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
    )
    read = 0
    while read < count:
        read += sum(
            len(r) for r in consumer.poll(timeout_ms=200, max_records=count - read).values()
        )
    consumer.commit()
    consumer.close(autocommit=False)


def _eventually(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.005)


# ------------------------------------------------------------------ the record formats


@given(
    group=st.text(min_size=1, max_size=40),
    topic=st.text(min_size=1, max_size=40),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
    metadata=st.text(max_size=100),
    stamp=st.integers(0, 2**62),
)
def test_keys_and_values_round_trip(group, topic, partition, offset, metadata, stamp):
    assert decode_key(encode_key(group, topic, partition)) == (group, topic, partition)
    assert decode_value(encode_value(offset, metadata, stamp)) == (offset, metadata, stamp)


def test_the_formats_are_kafkas():
    """OffsetCommitKey v1 and OffsetCommitValue v3, byte for byte."""
    assert encode_key("g", "t", 3) == b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x03"
    value = encode_value(7, "m", 9)
    assert value == struct.pack(">hqih1sq", 3, 7, -1, 1, b"m", 9)
    assert decode_key(b"\x00\x02\x00\x01g") is None  # group metadata: not a commit


@pytest.mark.parametrize("cut", [0, 1, 3, 8])
def test_short_or_long_records_are_refused(cut):
    key = encode_key("g", "t", 0)
    value = encode_value(5, "meta", 1)
    with pytest.raises((ValueError, struct.error)):
        decode_key(key[:cut])
    with pytest.raises((ValueError, struct.error)):
        decode_value(value[:cut])
    with pytest.raises(ValueError):
        decode_key(key + b"x")


def test_commits_out_of_kafkas_range_are_refused_and_nothing_is_written(open_store):
    store = open_store()
    store.offsets.commit("g", {("t", 0): (1, "")})
    for bad in ({("t", 0): (2**63, "")}, {("t", 2**31): (1, "")}, {("t", 0): (1, "m" * 40_000)}):
        with pytest.raises((InvalidArgumentError, LimitExceededError)):
            store.offsets.commit("g", bad)
    assert store.max_offset(OFFSETS_TOPIC, 0) == 1
    assert store.offsets.load("g") == {("t", 0): (1, "")}


# ------------------------------------------------------------------ one store


def test_commits_are_records_and_survive_a_restart(tmp_path, open_store):
    store = open_store()
    store.put("t", 0, b"a")
    store.put("t", 0, b"b")
    _consume_and_commit(store, "g", 2)
    store.offsets.commit("h", {("t", 0): (1, "meta")})
    store.offsets.commit("h", {("t", 0): (2, "newer")})
    assert store.max_offset(OFFSETS_TOPIC, 0) == 3  # one record per commit of a partition
    assert not os.path.exists(tmp_path / "store" / "offsets")  # no side file
    assert OFFSETS_TOPIC not in store.list_topics()  # internal, as in Kafka
    assert store.topics.get(OFFSETS_TOPIC).compacted
    store.close()
    reopened = open_store()
    assert reopened.offsets.load("g") == {("t", 0): (2, "")}
    assert reopened.offsets.load("h") == {("t", 0): (2, "newer")}
    assert reopened.offsets.groups() == ["g", "h"]
    consumer = KafkaConsumer(store=reopened, group_id="h", enable_auto_commit=False)
    assert consumer.committed(TopicPartition("t", 0)) == 2


def test_a_killed_writers_commits_are_rebuilt(tmp_path):
    """A commit returns when its record is durable; a writer that dies without
    closing (no clean shutdown) loses none."""
    config = StoreConfig(**SMALL)
    store = MessageStore.open(tmp_path / "s", config)
    for i in range(50):
        store.offsets.commit(f"g{i % 5}", {("t", i % 3): (i, f"m{i}")})
    expected = {f"g{g}": store.offsets.load(f"g{g}") for g in range(5)}
    store._crash()  # as a SIGKILL leaves it: no close, no checkpoint
    with MessageStore.open(tmp_path / "s", config) as reopened:
        assert reopened.recovered_from_crash
        assert {g: reopened.offsets.load(g) for g in expected} == expected


def test_compaction_bounds_the_rebuild(tmp_path, open_store):
    store = open_store()
    for i in range(300):
        store.offsets.commit("g", {("t", i % 3): (i, "")})
    store.compact(OFFSETS_TOPIC)
    assert store.offsets.reload() <= 3 + 3  # the head of the copy may stay uncleaned
    assert store.offsets.load("g") == {
        ("t", 0): (297, ""),
        ("t", 1): (298, ""),
        ("t", 2): (299, ""),
    }


def test_the_internal_topic_takes_no_client_records(open_store):
    store = open_store()
    store.offsets.commit("g", {("t", 0): (1, "")})
    with pytest.raises(InvalidRecordError):
        store.append_records(OFFSETS_TOPIC, 0, [ProducerRecord(b"k", b"v", (), None)])
    assert store.offsets.load("g") == {("t", 0): (1, "")}


def test_a_record_that_does_not_decode_is_skipped(open_store):
    store = open_store()
    store.offsets.commit("g", {("t", 0): (1, "")})
    key = encode_key("g", "t", 1)
    store.put(OFFSETS_TOPIC, 0, b"\x00\x03garbage", properties=[(KEY_PROPERTY, key)])
    store.put(OFFSETS_TOPIC, 0, b"x", properties=[(KEY_PROPERTY, b"\x00")])
    store.offsets.commit("g", {("t", 2): (5, "")})
    assert store.offsets.reload() == 4
    assert store.offsets.malformed == 2
    assert store.offsets.load("g") == {("t", 0): (1, ""), ("t", 2): (5, "")}


def test_a_tombstone_deletes_a_commit(open_store):
    store = open_store()
    store.offsets.commit("g", {("t", 0): (1, ""), ("t", 1): (2, "")})
    store.put(OFFSETS_TOPIC, 0, None, properties=[(KEY_PROPERTY, encode_key("g", "t", 0))])
    store.offsets.reload()
    assert store.offsets.load("g") == {("t", 1): (2, "")}


def test_a_read_only_store_sees_the_writers_commits(tmp_path, open_store):
    writer = open_store()
    writer.offsets.commit("g", {("t", 0): (3, "")})
    reader = open_store(read_only=True)
    _eventually(lambda: reader.offsets.load("g") == {("t", 0): (3, "")})
    writer.offsets.commit("g", {("t", 0): (4, "")})
    # folded as the writer's dispatcher exposes them (within its 1 ms rounds)
    _eventually(lambda: reader.offsets.load("g") == {("t", 0): (4, "")})
    with pytest.raises(ReadOnlyStoreError):
        reader.offsets.commit("g", {("t", 0): (5, "")})


# ------------------------------------------------------------------ the old side files


def _old_store(path, small_config) -> None:
    """A store whose offsets are side files (written as before this format)."""
    MessageStore.open(path, small_config).close()
    OffsetStore(str(path), read_only=False).commit("old", {("t", 0): (7, "m"), ("t", 1): (9, "")})
    OffsetStore(str(path), read_only=False).commit("bad", {("t", 0): (1, "")})
    with open(os.path.join(path, "offsets", "bad"), "r+b") as handle:
        handle.write(b"X")  # no longer valid JSON


def test_side_files_are_imported_once(tmp_path, open_store, small_config):
    path = tmp_path / "store"
    _old_store(path, small_config)
    reader = open_store(read_only=True)  # not imported yet: the files are read
    assert reader.offsets.load("old") == {("t", 0): (7, "m"), ("t", 1): (9, "")}
    store = open_store()
    assert store.offsets.load("old") == {("t", 0): (7, "m"), ("t", 1): (9, "")}
    assert os.listdir(path / IMPORTED_DIR) == ["old"]
    assert os.listdir(path / "offsets") == ["bad"]  # refused, left for an operator
    with pytest.raises(CorruptDataError):
        store.offsets.load("bad")
    with pytest.raises(CorruptDataError):
        store.offsets.commit("bad", {("t", 0): (2, "")})
    store.offsets.commit("old", {("t", 0): (8, "")})
    store.close()
    reopened = open_store()
    assert reopened.offsets.load("old") == {("t", 0): (8, ""), ("t", 1): (9, "")}
    assert reopened.max_offset(OFFSETS_TOPIC, 0) == 3  # two imported, one commit: once
    assert reopened.offsets.groups() == ["bad", "old"]


# ------------------------------------------------------------------ a follower


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
def test_a_follower_has_the_leaders_offsets(tmp_path, open_store, flush_mode):
    """Fails before offsets went through the log: the follower had none."""
    config = StoreConfig(**{**SMALL, "flush_mode": flush_mode})
    leader = open_store(config, path=tmp_path / "leader")
    follower = open_store(config, path=tmp_path / "follower")
    follower.become_follower()
    for i in range(10):
        leader.put("t", i % 2, b"%d" % i)
    _consume_and_commit(leader, "g", 10)
    leader.offsets.commit("h", {("t", 1): (3, "meta")})
    _catch_up(leader, follower)
    assert follower.offsets.groups() == ["g", "h"]  # a follower's OffsetFetch answers
    for group in ("g", "h"):
        assert follower.offsets.load(group) == leader.offsets.load(group)
    with pytest.raises(NotLeaderError):
        follower.offsets.commit("g", {("t", 0): (1, "")})
    leader.offsets.commit("h", {("t", 1): (4, "")})  # folded as it is copied
    _catch_up(leader, follower)
    assert follower.offsets.load("h") == {("t", 1): (4, "")}

    follower.commitlog.set_follower(False)  # promoted
    assert follower.reload_offsets() == leader.max_offset(OFFSETS_TOPIC, 0)
    assert follower.offsets.load("g") == leader.offsets.load("g")
    follower.offsets.commit("g", {("t", 0): (1, "")})
    follower.close()
    reopened = open_store(config, path=tmp_path / "follower")
    assert reopened.offsets.load("g") == {("t", 0): (1, ""), ("t", 1): (5, "")}
    assert reopened.offsets.load("h") == {("t", 1): (4, "")}


def test_a_promoted_follower_rebuilds_without_being_told(tmp_path, open_store):
    """The table is rebuilt when the store's role changes, so a promotion that
    forgets ``reload_offsets`` still commits over the replicated offsets."""
    leader = open_store(path=tmp_path / "leader")
    follower = open_store(path=tmp_path / "follower")
    follower.become_follower()
    leader.offsets.commit("g", {("t", 0): (1, ""), ("t", 1): (2, "")})
    assert follower.offsets.load("g") == {}  # read before anything was copied
    _catch_up(leader, follower)
    follower.commitlog.set_follower(False)
    follower.offsets.commit("g", {("t", 0): (3, "")})
    assert follower.offsets.load("g") == {("t", 0): (3, ""), ("t", 1): (2, "")}


def test_a_leader_restarted_held_knows_the_commits_past_what_readers_see(tmp_path, open_store):
    """Restarted to lead followers (``replicated=True``), readers see what the
    followers confirmed, but the committed offsets are those of the whole log."""
    store = open_store()
    store.put("t", 0, b"a")
    store.offsets.commit("g", {("t", 0): (1, "old")})
    high_watermark = store.commitlog.write_position
    store.set_commit_limit(lambda: high_watermark)
    store.offsets.commit("g", {("t", 0): (5, "past the hw")})
    store.close()
    held = open_store(replicated=True)
    assert held.max_offset(OFFSETS_TOPIC, 0) == 1
    assert held.offsets.load("g") == {("t", 0): (5, "past the hw")}
