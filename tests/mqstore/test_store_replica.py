"""A follower store (mqstore/store_replica.py): fed the leader's CommitLog bytes, its
dispatcher builds ConsumeQueues and the index, so its reads answer as the leader's;
local writes are refused with NotLeaderError."""

from __future__ import annotations

import os

import pytest

from mqstore import StoreConfig
from mqstore.commitlog.errors import CorruptDataError, NotLeaderError, ReplicaPositionError
from mqstore.replication.leader import read_chunk

from .conftest import SMALL

TOPICS = ("orders", "events")


def _fill(store, count: int) -> None:
    if store.topics.get("events") is None:
        store.create_topic("events", partitions=2, timestamp_type="LogAppendTime")
    for i in range(count):
        store.put("orders", i % 2, b"order-%d" % i + bytes(300), keys=[f"o{i}"], tag="t",
                  born_timestamp_ms=1_000_000 + i * 10)  # fmt: skip
        store.put("events", i % 2, b"event-%d" % i, keys=f"e{i % 7}")


def _catch_up(leader, follower, max_bytes: int) -> int:
    """Copy until the follower's end is the leader's; returns the chunks copied."""
    follower.apply_replica_topics(leader.replica_topics())
    chunks = 0
    while follower.commitlog.write_position < leader.replicable_end:
        position = follower.commitlog.write_position
        follower.append_replica(position, read_chunk(leader, position, max_bytes))
        chunks += 1
    return chunks


def _answers(store, topic: str, queue_id: int) -> list:
    messages = store.get(topic, queue_id, 0, 1000)
    return [
        (m.queue_offset, m.physical_offset, m.store_timestamp_ms, m.keys, m.value) for m in messages
    ]


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
@pytest.mark.parametrize("max_bytes", [1, 4096, 1 << 20])
def test_a_follower_answers_reads_as_its_leader(tmp_path, open_store, flush_mode, max_bytes):
    config = StoreConfig(**{**SMALL, "flush_mode": flush_mode})
    leader = open_store(config, path=tmp_path / "leader")
    follower = open_store(config, path=tmp_path / "follower")
    follower.become_follower()
    _fill(leader, 600)  # several 256 KiB CommitLog files
    assert leader.commitlog.file_count >= 2
    chunks = _catch_up(leader, follower, max_bytes)
    assert chunks >= 1 if max_bytes > 1 << 19 else chunks > 1
    for topic in TOPICS:
        for queue_id in (0, 1):
            assert follower.max_offset(topic, queue_id) == leader.max_offset(topic, queue_id)
            assert _answers(follower, topic, queue_id) == _answers(leader, topic, queue_id)
            for stamp in (0, 1_000_050, 1_003_000, 2**40):
                assert follower.offset_for_time(topic, queue_id, stamp) == (
                    leader.offset_for_time(topic, queue_id, stamp)
                )
    for key in ("o5", "o599", "e3", "missing"):
        for topic in TOPICS:
            got = [m.physical_offset for m in follower.query_by_key(topic, key)]
            assert got == [m.physical_offset for m in leader.query_by_key(topic, key)]
    assert follower.topics.all() == leader.topics.all()


def test_the_followers_files_equal_the_leaders_after_a_restart(tmp_path, open_store):
    leader = open_store(path=tmp_path / "leader")
    follower = open_store(path=tmp_path / "follower")
    follower.become_follower()
    _fill(leader, 300)
    _catch_up(leader, follower, 10_000)
    follower.close()
    follower = open_store(path=tmp_path / "follower")  # reopened: a follower again
    follower.become_follower()
    _fill(leader, 300)
    _catch_up(leader, follower, 10_000)
    assert _answers(follower, "orders", 1) == _answers(leader, "orders", 1)
    leader.close()
    follower.close()
    names = sorted(os.listdir(tmp_path / "leader" / "commitlog"))
    assert names == sorted(os.listdir(tmp_path / "follower" / "commitlog"))
    for name in names:
        mine = (tmp_path / "leader" / "commitlog" / name).read_bytes()
        assert mine == (tmp_path / "follower" / "commitlog" / name).read_bytes(), name


def test_local_writes_to_a_follower_are_refused(tmp_path, open_store):
    follower = open_store(path=tmp_path / "follower")
    follower.put("orders", 0, b"before")  # a leader until told otherwise
    follower.become_follower()
    with pytest.raises(NotLeaderError):
        follower.put("orders", 0, b"x")  # a topic put's fast path knew
    with pytest.raises(NotLeaderError):
        follower.put("fresh", 0, b"x")  # and one it would have created
    with pytest.raises(NotLeaderError):
        follower.put_batch("orders", 0, [b"x", b"y"])
    with pytest.raises(NotLeaderError):
        follower.create_topic("other", partitions=1)
    assert follower.topics.get("fresh") is None
    assert follower.max_offset("orders", 0) == 1


def test_bad_chunks_leave_the_follower_unchanged(tmp_path, open_store):
    leader = open_store(path=tmp_path / "leader")
    follower = open_store(path=tmp_path / "follower")
    follower.become_follower()
    _fill(leader, 20)
    follower.apply_replica_topics(leader.replica_topics())
    chunk = bytearray(read_chunk(leader, 0, 1 << 20))
    with pytest.raises(ReplicaPositionError):
        follower.append_replica(7, bytes(chunk))
    chunk[len(chunk) // 2] ^= 1
    with pytest.raises(CorruptDataError):
        follower.append_replica(0, bytes(chunk))
    assert follower.commitlog.write_position == 0
    assert follower.max_offset("orders", 0) == 0


def test_the_leaders_topics_are_adopted_whole(tmp_path, open_store):
    leader = open_store(path=tmp_path / "leader")
    follower = open_store(path=tmp_path / "follower")
    follower.become_follower()
    leader.create_topic("events", partitions=3, timestamp_type="LogAppendTime")
    follower.apply_replica_topics(leader.replica_topics())
    assert follower.topics.get("events") == leader.topics.get("events")
    before = follower.topics.all()
    with pytest.raises(CorruptDataError):
        follower.apply_replica_topics(b'{"format": "nonsense"}')
    with pytest.raises(CorruptDataError):
        follower.apply_replica_topics(leader.replica_topics()[:-9])  # torn
    assert follower.topics.all() == before
    assert follower.replica_topics() == leader.replica_topics()  # same bytes: same CRC
