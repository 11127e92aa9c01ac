"""A follower store (mqstore/store_replica.py): fed the leader's CommitLog bytes, its
dispatcher builds ConsumeQueues and the index, so its reads answer as the leader's;
local writes are refused with NotLeaderError."""

from __future__ import annotations

import os
import time

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


# ---------------------------------------------------------------- truncation (issue 18)


def _diverge(tmp_path, open_store, config=None):
    """A leads and B copies a common prefix; A then writes a tail B never gets, and B
    (promoted) writes its own. Returns (A, B, the common end)."""
    a = open_store(config, path=tmp_path / "a")
    b = open_store(config, path=tmp_path / "b")
    b.become_follower()
    _fill(a, 300)
    _catch_up(a, b, 1 << 20)
    common = a.commitlog.write_position
    for i in range(400):  # A's tail, lost to everyone else: past a file boundary
        a.put("orders", i % 2, b"stale-%d" % i + bytes(300), keys=[f"stale{i}"])
    b.commitlog.set_follower(False)
    for i in range(50):
        b.put("orders", i % 2, b"fresh-%d" % i, keys=[f"fresh{i}"])
    return a, b, common


def _log_bytes(store) -> bytes:
    return b"".join(bytes(f.mapping[:]) for f in store.commitlog.files())


def test_a_truncated_follower_ends_byte_identical_with_its_new_leader(tmp_path, open_store):
    a, b, common = _diverge(tmp_path, open_store)
    assert a.commitlog.file_count > b.commitlog.file_count  # the tail spans a roll
    a.become_follower()
    end = a.commitlog.write_position
    assert a.truncate_replica(common) == end - common  # all of the tail
    assert a.commitlog.write_position == common
    assert a.query_by_key("orders", "stale5") == []
    assert a.max_offset("orders", 0) == b.max_offset("orders", 0) - 25  # rolled back
    _catch_up(b, a, 4096)
    assert _log_bytes(a) == _log_bytes(b)
    for topic in TOPICS:
        for queue_id in (0, 1):
            assert a.max_offset(topic, queue_id) == b.max_offset(topic, queue_id)
            assert _answers(a, topic, queue_id) == _answers(b, topic, queue_id)
    assert [m.value for m in a.query_by_key("orders", "fresh7")] == [b"fresh-7"]
    # Promoted again, A continues every queue's offsets where B's records left them.
    a.commitlog.set_follower(False)
    result = a.put("orders", 1, b"after", keys=["after"])
    assert result.queue_offset == b.max_offset("orders", 1)


def test_a_truncation_survives_a_crash_and_the_stale_tail_stays_gone(tmp_path, open_store):
    a, b, common = _diverge(tmp_path, open_store)
    a.become_follower()
    a.truncate_replica(common)
    _catch_up(b, a, 1 << 20)
    a._crash()
    a = open_store(path=tmp_path / "a")
    assert a.commitlog.write_position == b.commitlog.write_position
    assert _log_bytes(a) == _log_bytes(b)
    assert a.query_by_key("orders", "stale5") == []
    assert _answers(a, "orders", 0) == _answers(b, "orders", 0)


def test_a_crash_inside_a_truncation_leaves_a_prefix_that_truncates_again(
    tmp_path, open_store, monkeypatch
):
    a, b, common = _diverge(tmp_path, open_store)
    a.become_follower()
    end = a.commitlog.write_position

    def crash(*args):
        raise OSError("power went out here")

    monkeypatch.setattr(type(a.commitlog), "truncate_replica", crash)
    with pytest.raises(OSError):
        a.truncate_replica(common)
    monkeypatch.undo()
    a._crash()
    a = open_store(path=tmp_path / "a")
    # The checkpoint was lowered first: recovery scanned the tail again, whole.
    assert a.commitlog.write_position == end
    a.become_follower()
    a.truncate_replica(common)
    _catch_up(b, a, 1 << 20)
    assert _log_bytes(a) == _log_bytes(b)


def test_truncation_refuses_a_leader_and_a_position_outside_the_log(tmp_path, open_store):
    from mqstore.commitlog.errors import IllegalStateError, OffsetOutOfRangeError

    store = open_store()
    _fill(store, 10)
    with pytest.raises(IllegalStateError):
        store.truncate_replica(0)
    store.become_follower()
    with pytest.raises(OffsetOutOfRangeError):
        store.truncate_replica(store.commitlog.write_position + 1)
    assert store.max_offset("orders", 0) == 5  # nothing cut


def test_a_crash_after_the_log_is_cut_recovers_to_the_cut_not_to_the_old_checkpoint(
    tmp_path, open_store, monkeypatch
):
    import shutil

    a, b, common = _diverge(tmp_path, open_store)
    a.commitlog.flush_to(a.commitlog.write_position)
    a._dispatcher.dispatch_available()
    a._write_checkpoint(derived=True)  # the checkpoint vouches for the whole stale tail
    assert a._checkpoint.dispatched_position > common
    a.become_follower()

    def crash(*args):  # what a SIGKILL here leaves: the files as they are now
        shutil.copytree(tmp_path / "a", tmp_path / "crashed")
        raise OSError("killed here")

    monkeypatch.setattr(type(a.consume_queues), "truncate_beyond", crash)
    with pytest.raises(OSError):
        a.truncate_replica(common)
    monkeypatch.undo()
    a = open_store(path=tmp_path / "crashed")
    assert a.recovered_from_crash
    assert a.commitlog.write_position == common
    assert a.query_by_key("orders", "stale5") == []
    a.become_follower()
    _catch_up(b, a, 1 << 20)
    assert _log_bytes(a) == _log_bytes(b)
    assert _answers(a, "orders", 1) == _answers(b, "orders", 1)


def test_a_cut_at_the_end_drops_an_epoch_that_wrote_nothing(tmp_path, open_store):
    """A leader restarted (a new epoch at its end), wrote nothing and was demoted: the
    leader it follows answers "your epoch ends here" with its own end; the cut moves
    no byte but must drop that epoch, else the same answer comes back for ever (the
    chaos suite saw the loop)."""
    store = open_store()
    _fill(store, 5)
    end = store.commitlog.write_position
    epoch = store.epochs.begin_leadership(end, node_id=0)
    store.become_follower()
    assert store.epochs.latest_epoch == epoch
    assert store.truncate_replica(end) == 0
    assert store.epochs.latest_epoch == 0
    assert store.commitlog.write_position == end


def _held_leader(open_store, path) -> int:
    """A leader whose readers saw 5 of its 10 records (its HW: the rest was not on
    its followers yet), stopped; returns the HW position."""
    store = open_store(path=path)
    for i in range(5):
        store.put("orders", 0, b"acked-%d" % i)
    high_watermark = store.commitlog.write_position
    store.set_commit_limit(lambda: high_watermark)
    for i in range(5):
        store.put("orders", 0, b"only-here-%d" % i)
    store.close()
    return high_watermark


def test_a_store_opened_to_lead_followers_shows_no_more_than_its_last_hw(tmp_path, open_store):
    """Restarted to lead followers (serve --replica-ids), a store shows readers what
    the last checkpoint recorded as readable (at most the HW then), not its whole
    recovered log: a follower promoted meanwhile may lack that tail and cut it."""
    path = tmp_path / "leader"
    high_watermark = _held_leader(open_store, path)
    held = open_store(path=path, replicated=True)
    assert held.held_at_open == high_watermark
    assert held.max_offset("orders", 0) == 5
    assert not held.is_follower  # it takes writes: the replication node leads
    held.close()
    plain = open_store(path=path)  # embedded, no followers: everything is readable
    assert plain.held_at_open is None
    assert plain.max_offset("orders", 0) == 10


def test_appends_to_a_held_store_take_offsets_after_the_records_it_holds(tmp_path, open_store):
    """Held at open, an append takes its queue offset after the held records, not
    after what the queue shows, and the dispatcher later puts both in order. The
    store here was closed cleanly, and this test passes without
    CommitLog.count_queues_from too. (The long chaos run's stalled dispatcher had
    another cause: test_powerloss.py's
    test_a_queue_directory_made_before_a_kill_survives_a_later_power_cut.)"""
    path = tmp_path / "leader"
    _held_leader(open_store, path)
    held = open_store(path=path, replicated=True)
    assert held.max_offset("orders", 0) == 5
    assert held.put("orders", 0, b"after").queue_offset == 10
    held.set_commit_limit(None)  # the HW passes everything
    deadline = time.monotonic() + 10
    while held.max_offset("orders", 0) < 11:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert [bytes(m.body) for m in held.get("orders", 0, 9, 5)] == [b"only-here-4", b"after"]
