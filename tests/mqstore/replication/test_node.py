"""Failover (mqstore/replication/node.py) with real ``mqstore serve`` processes, real
kills and real clients: a promoted follower leads with a new epoch, the old leader
learns it, follows and truncates its divergent tail, and every acknowledged record
survives; promotion out of the in-sync set is refused unless unclean; fast leader
changes back and forth leave both logs equal to what was acknowledged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from mqstore import MessageStore, StoreConfig
from mqstore.broker import Broker, BrokerConfig
from mqstore.replication.epochs import EPOCH_NODES
from mqstore.replication.leader import ReplicationConfig
from mqstore.replication.node import INELIGIBLE_REPLICA, ReplicaNode

from .test_fetcher import (
    CATCH_UP_S,
    FILE_BYTES,
    PARTITIONS,
    TOPIC,
    Node,
    _assert_identical,
    _create_topic,
    _log_end,
    _read_store,
    nodes,  # noqa: F401 - the fixture
)

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer  # noqa: E402

REPLICATION = ("--min-insync-replicas", "2", "--replica-lag-time-max-ms", "2000")


def _node_a(tmp_path: Any, port: int = 0, *extra: str) -> Node:
    return Node(
        tmp_path / "a", "--replica-id", "0", "--replica-ids", "1", *REPLICATION, *extra,
        listen=f"127.0.0.1:{port}",
    )  # fmt: skip


def _node_b(tmp_path: Any, leader: str, port: int = 0) -> Node:
    return Node(
        tmp_path / "b", "--follow", leader, "--replica-id", "1", "--replica-ids", "0",
        *REPLICATION, listen=f"127.0.0.1:{port}",
    )  # fmt: skip


def _port(node: Node) -> int:
    return int(node.bootstrap.rpartition(":")[2])


def _promote(node: Node, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore", "promote", "--broker", node.bootstrap, *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _send(
    bootstrap: str, values: list[bytes], acks: str = "all", pad: int = 0
) -> dict[bytes, tuple[int, int]]:
    """Produce ``values`` (key = value, ``pad`` zeros after the value);
    {value: (partition, offset)} of the acked."""
    acked: dict[bytes, tuple[int, int]] = {}
    failed: list[Any] = []

    def done(error: Any, message: Any) -> None:
        if error is None:
            acked[message.key()] = (message.partition(), message.offset())
        else:
            failed.append(error)

    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": acks, "enable.idempotence": acks == "all",
        "linger.ms": 5, "message.timeout.ms": 60_000, "topic.metadata.refresh.interval.ms": 500,
    })  # fmt: skip
    for i, value in enumerate(values):
        producer.produce(
            TOPIC, value=value + bytes(pad), key=value, partition=i % PARTITIONS, on_delivery=done
        )
        producer.poll(0)
    assert producer.flush(90) == 0
    assert failed == [], failed[:3]
    return acked


def _wait_equal_ends(a: Node, b: Node) -> None:
    deadline = time.monotonic() + CATCH_UP_S
    while time.monotonic() < deadline:
        if _log_end(a.store) == _log_end(b.store):
            return
        time.sleep(0.2)
    raise AssertionError(f"ends {_log_end(a.store)} != {_log_end(b.store)}: {a.log()} {b.log()}")


def _assert_all_there(store: Any, acked: dict[bytes, tuple[int, int]]) -> None:
    found = {
        (partition, offset): value
        for partition, records in _read_store(store).items()
        for offset, _key, value in records
    }
    for value, place in acked.items():
        assert found.get(place, b"")[: len(value)] == value, (value, place, found.get(place))


def test_a_promoted_follower_leads_and_the_old_leader_truncates_its_tail(tmp_path, nodes):  # noqa: F811
    a = _node_a(tmp_path)
    nodes.append(a)
    b = _node_b(tmp_path, a.bootstrap)
    nodes.append(b)
    _create_topic(a.bootstrap)
    acked = _send(a.bootstrap, [b"first-%d" % i for i in range(3000)])
    _wait_equal_ends(a, b)
    b.process.send_signal(signal.SIGSTOP)  # the follower misses what comes next
    # 4 MiB of stale records: a fetch response already on its way (the stopped follower
    # reads it on SIGCONT) carries at most REPLICA_FETCH_BYTES_DEFAULT (1 MiB) of them.
    stale = _send(a.bootstrap, [b"stale-%d" % i for i in range(2000)], acks="1", pad=2048)
    a.stop(signal.SIGKILL)
    b.process.send_signal(signal.SIGCONT)
    promoted = _promote(b)
    assert promoted.returncode == 0, promoted.stderr
    assert "epoch" in promoted.stdout
    # The old leader comes back as it was started (a leader), on its port: it takes
    # a new epoch of its own, smaller than the promoted one, and follows on notice.
    a_port = _port(a)
    a = _node_a(tmp_path, a_port)
    nodes.append(a)
    acked |= _send(f"{a.bootstrap},{b.bootstrap}", [b"after-%d" % i for i in range(3000)])
    _wait_equal_ends(a, b)
    a.stop()
    b.stop()
    _assert_identical(b, a)
    _assert_all_there(b.store, acked)
    _assert_all_there(a.store, acked)
    # The new leader copied a prefix of the stale records before the kill (a response
    # may still be in flight when SIGSTOP lands); the rest were cut from the old one.
    kept = {key for records in _read_store(a.store).values() for _, key, _ in records}
    gone = [value for value in stale if value not in kept]
    assert gone, "the old leader's divergent tail was not truncated"
    with MessageStore.open(a.store, read_only=True) as reader:
        assert reader.query_by_key(TOPIC, gone[-1].decode()) == []
    epochs_a = _epochs(a.store)
    assert epochs_a == _epochs(b.store)
    assert epochs_a[-1][0] % EPOCH_NODES == 1  # node 1's epoch leads


def _epochs(store: Any) -> list[tuple[int, int]]:
    from mqstore.replication.epochs import LeaderEpochs

    return [tuple(entry) for entry in LeaderEpochs(str(store), read_only=True).entries]  # type: ignore[misc]


def test_fast_leader_changes_leave_both_ends_equal_to_what_was_acknowledged(tmp_path, nodes):  # noqa: F811
    a = _node_a(tmp_path)
    nodes.append(a)
    b = _node_b(tmp_path, a.bootstrap)
    nodes.append(b)
    _create_topic(a.bootstrap)
    both = f"{a.bootstrap},{b.bootstrap}"
    acked: dict[bytes, tuple[int, int]] = {}
    for round_ in range(4):
        acked |= _send(both, [b"round-%d-%d" % (round_, i) for i in range(500)], pad=600)
        _wait_equal_ends(a, b)
        target = b if round_ % 2 == 0 else a  # the follower of the moment
        promoted = _promote(target)
        assert promoted.returncode == 0, promoted.stderr
    acked |= _send(both, [b"last-%d" % i for i in range(500)])
    _wait_equal_ends(a, b)
    a.stop()
    b.stop()
    _assert_identical(a, b)
    _assert_all_there(a.store, acked)
    offsets = sorted(acked.values())
    assert len(set(offsets)) == len(offsets) == 2500  # one offset per acked value
    assert len(_epochs(a.store)) >= 5


def test_promotion_out_of_the_in_sync_set_is_refused_unless_unclean(tmp_path):
    config = StoreConfig(commitlog_file_size_bytes=FILE_BYTES, prewarm=False)
    with MessageStore.open(tmp_path / "leader", config) as leader:
        for i in range(4000):  # 8 MB: ~2,000 fetches of 4 KiB
            leader.put(TOPIC, 0, b"v" * 2000, keys=f"k{i}")
        with MessageStore.open(tmp_path / "follower", config) as follower:
            with Broker(leader, BrokerConfig(port=0)) as broker:
                lag = ReplicationConfig(replica_lag_time_max_ms=1)
                node = ReplicaNode(follower, lag, node_id=1)
                node._fetcher_max_bytes = 4096  # it cannot catch up within 1 ms
                node.start("127.0.0.1", 0, follow=broker.bootstrap)
                deadline = time.monotonic() + 30
                while follower.commitlog.write_position < 100_000:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                assert node.fetcher is not None
                node.fetcher.stop()  # the link is cut: it heard the leader's end, not more
            # The leader is gone, and the follower never reached its end.
            end = follower.commitlog.write_position
            assert end < leader.commitlog.write_position
            error, epoch, message = node.promote()
            assert error == INELIGIBLE_REPLICA
            assert "in-sync" in message
            assert follower.is_follower
            error, epoch, message = node.promote(unclean=True)
            assert error == 0
            assert epoch % EPOCH_NODES == 1
            assert "unclean" in message and "lost" in message
            assert not follower.is_follower
            follower.put(TOPIC, 0, b"after", keys="after")  # it takes writes now
            node.close()


def test_a_follower_refuses_a_promotion_to_what_it_already_is(tmp_path):
    with MessageStore.open(tmp_path / "s", StoreConfig(prewarm=False)) as store:
        node = ReplicaNode(store, node_id=0)
        node.start("127.0.0.1", 9)
        error, _epoch, message = node.promote()
        assert error != 0 and "leader already" in message
        node.close()


def test_a_node_id_outside_the_epoch_range_is_refused(tmp_path):
    from mqstore.commitlog.errors import ConfigError

    with (
        MessageStore.open(tmp_path / "s", StoreConfig(prewarm=False)) as store,
        pytest.raises(ConfigError),
    ):
        ReplicaNode(store, node_id=EPOCH_NODES)


def test_promote_cli_reports_an_unreachable_broker():
    promoted = subprocess.run(
        [sys.executable, "-m", "mqstore", "promote", "--broker", "127.0.0.1:1",
         "--timeout-ms", "2000"],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )  # fmt: skip
    assert promoted.returncode == 1
    assert "cannot reach 127.0.0.1:1" in promoted.stderr


def test_a_followers_readers_see_records_only_below_the_hw_it_heard(tmp_path):
    """The leader counts the follower for its HW, so the HW a response carries trails
    the follower's end by a round trip: what the follower exposes must stay below it."""
    config = StoreConfig(commitlog_file_size_bytes=FILE_BYTES, prewarm=False)
    with (
        MessageStore.open(tmp_path / "leader", config) as leader,
        MessageStore.open(tmp_path / "follower", config) as follower,
        Broker(
            leader, BrokerConfig(port=0), replication=ReplicationConfig(replica_ids=(1,))
        ) as broker,
    ):
        node = ReplicaNode(follower, node_id=1)
        node.start("127.0.0.1", 0, follow=broker.bootstrap)
        fetcher = node.fetcher
        assert fetcher is not None
        seen_above_end, written = 0, 0
        deadline = time.monotonic() + 60
        while written < 3000 or not seen_above_end:
            assert time.monotonic() < deadline
            for _ in range(50):
                leader.put(TOPIC, written % 2, b"x" * 200, keys=f"k{written}")
                written += 1
            for _ in range(20):  # sample while the follower copies
                exposed = follower.dispatched_position
                heard = fetcher.high_watermark
                assert exposed <= max(heard, 0) or exposed == 0, (exposed, heard)
                seen_above_end += follower.commitlog.write_position > max(heard, 0)
                time.sleep(0.0005)
        # The follower held records it was not allowed to show (so the check above
        # could fail): the HW it heard trails its own end.
        deadline = time.monotonic() + 30  # quiet: the HW reaches the end, all is shown
        while follower.dispatched_position < leader.commitlog.write_position:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert follower.max_offset(TOPIC, 0) == leader.max_offset(TOPIC, 0) == (written + 1) // 2
        node.close()


@pytest.mark.parametrize("behind", ["empty", "stale"])
def test_a_follower_behind_the_leaders_retention_starts_again_at_its_first_file(tmp_path, behind):
    """An empty follower, or one whose end the leader's retention removed, starts
    again at the leader's first file (Kafka's truncateFullyAndStartAt)."""
    config = StoreConfig(commitlog_file_size_bytes=64 * 1024, prewarm=False)
    with (
        MessageStore.open(tmp_path / "leader", config) as leader,
        MessageStore.open(tmp_path / "follower", config) as follower,
        Broker(leader, BrokerConfig(port=0)) as broker,
    ):

        def fill(count: int, start: int) -> None:
            for i in range(start, start + count):
                leader.put(TOPIC, i % 2, b"v%d-" % i + bytes(500), keys=f"k{i}")

        fill(300, 0)
        if behind == "stale":  # copies some, then falls behind the leader's retention
            node = ReplicaNode(follower, node_id=1)
            node.start("127.0.0.1", 0, follow=broker.bootstrap)
            deadline = time.monotonic() + 30
            while follower.commitlog.write_position < leader.commitlog.write_position:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            node.close()
        fill(600, 300)
        while leader.commitlog.min_position <= follower.commitlog.write_position:
            assert leader.commitlog.delete_oldest_file() is not None  # what retention does
        start = leader.commitlog.min_position
        leader.consume_queues.correct_min_offsets(start)
        node = ReplicaNode(follower, node_id=1)
        node.start("127.0.0.1", 0, follow=broker.bootstrap)
        deadline = time.monotonic() + 30
        while follower.commitlog.write_position < leader.commitlog.write_position:
            assert time.monotonic() < deadline, follower.commitlog.write_position
            time.sleep(0.02)
        assert follower.commitlog.min_position == start
        assert node.fetcher is not None and node.fetcher.truncations == 1
        for queue_id in (0, 1):
            first = leader.min_offset(TOPIC, queue_id)
            assert follower.min_offset(TOPIC, queue_id) == first > 0
            assert follower.max_offset(TOPIC, queue_id) == leader.max_offset(TOPIC, queue_id)
            mine = follower.get(TOPIC, queue_id, first, 1000)
            theirs = leader.get(TOPIC, queue_id, first, 1000)
            assert [(m.queue_offset, m.value) for m in mine] == [
                (m.queue_offset, m.value) for m in theirs
            ]
        assert follower.query_by_key(TOPIC, "k1") == []  # the stale copy is gone
        # The leader's retention goes on: the follower drops the same files.
        for _ in range(2):
            assert leader.commitlog.delete_oldest_file() is not None
        fill(1, 900)  # a fetch answer carries the new log start
        deadline = time.monotonic() + 30
        while follower.commitlog.min_position != leader.commitlog.min_position:
            assert time.monotonic() < deadline, follower.commitlog.min_position
            time.sleep(0.02)
        node.close()


def test_a_restarted_follower_stays_one_and_shows_no_more_than_before(tmp_path):
    from mqstore.commitlog.errors import NotLeaderError

    config = StoreConfig(commitlog_file_size_bytes=FILE_BYTES, prewarm=False)
    with (
        MessageStore.open(tmp_path / "leader", config) as leader,
        Broker(
            leader, BrokerConfig(port=0), replication=ReplicationConfig(replica_ids=(1,))
        ) as broker,
    ):
        follower = MessageStore.open(tmp_path / "follower", config)
        node = ReplicaNode(follower, node_id=1)
        node.start("127.0.0.1", 0, follow=broker.bootstrap)
        fetcher = node.fetcher
        assert fetcher is not None
        deadline, written = time.monotonic() + 60, 0
        while True:  # until the follower holds records past the HW it heard
            assert time.monotonic() < deadline
            leader.put(TOPIC, 0, b"x" * 300, keys=f"k{written}")
            written += 1
            if follower.commitlog.write_position > max(fetcher.high_watermark, 0) > 0:
                break
        fetcher.stop()
        shown_before = follower.dispatched_position
        follower._write_checkpoint(derived=True)
        follower._crash()  # as a SIGKILL leaves it
        follower = MessageStore.open(tmp_path / "follower", config)
        try:
            assert follower.is_follower
            with pytest.raises(NotLeaderError):
                follower.put(TOPIC, 0, b"local", keys="local")
            assert follower.dispatched_position <= shown_before
            assert follower.dispatched_position < follower.commitlog.write_position
            node = ReplicaNode(follower, node_id=1)
            node.start("127.0.0.1", 0)  # the store records its leader: it follows it
            assert node.fetcher is not None
            deadline = time.monotonic() + 30
            while follower.dispatched_position < leader.commitlog.write_position:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert follower.max_offset(TOPIC, 0) == leader.max_offset(TOPIC, 0) == written
            node.close()
        finally:
            follower.close()


def test_the_embedded_put_in_the_replicated_sync_mode_returns_once_the_follower_holds_it(
    tmp_path,
):
    from mqstore.commitlog.errors import NotEnoughReplicasError, ReplicationTimeoutError

    config = StoreConfig(commitlog_file_size_bytes=FILE_BYTES, prewarm=False)
    replication = ReplicationConfig(
        replica_ids=(1,), min_insync_replicas=2, replica_lag_time_max_ms=1500,
        embedded_acks="all", embedded_timeout_ms=500,
    )  # fmt: skip
    with (
        MessageStore.open(tmp_path / "leader", config) as leader,
        MessageStore.open(tmp_path / "follower", config) as follower,
        Broker(leader, BrokerConfig(port=0), replication=replication) as broker,
    ):
        with pytest.raises(NotEnoughReplicasError):  # no follower yet: refused
            leader.put(TOPIC, 0, b"alone", keys="alone")
        node = ReplicaNode(follower, node_id=1)
        node.start("127.0.0.1", 0, follow=broker.bootstrap)
        deadline = time.monotonic() + 30
        while True:  # in sync once it caught up
            try:
                leader.put(TOPIC, 0, b"first", keys="first")
                break
            except (NotEnoughReplicasError, ReplicationTimeoutError):
                assert time.monotonic() < deadline
        for i in range(20):
            leader.put(TOPIC, 0, b"v%d" % i, keys=f"k{i}")
            assert follower.commitlog.write_position >= leader.commitlog.write_position
        leader.put_batch(TOPIC, 1, [b"a", b"b"], keys=["a", "b"])
        assert follower.commitlog.write_position >= leader.commitlog.write_position
        assert node.fetcher is not None
        node.fetcher.stop()  # the follower stops copying: not acknowledged in time
        with pytest.raises(ReplicationTimeoutError):
            leader.put(TOPIC, 0, b"unacknowledged", keys="late")
        node.close()


def test_start_following_copies_without_a_broker_of_its_own(tmp_path):
    from mqstore.broker.serve import start_following

    config = StoreConfig(commitlog_file_size_bytes=FILE_BYTES, prewarm=False)
    with (
        MessageStore.open(tmp_path / "leader", config) as leader,
        MessageStore.open(tmp_path / "follower", config) as follower,
        Broker(leader, BrokerConfig(port=0)) as broker,
    ):
        for i in range(100):
            leader.put(TOPIC, 0, b"v%d" % i, keys=f"k{i}")
        node = start_following(follower, broker.bootstrap, replica_id=3)
        deadline = time.monotonic() + 30
        while follower.topics.get(TOPIC) is None or follower.max_offset(TOPIC, 0) < 100:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert [m.value for m in follower.get(TOPIC, 0, 98, 5)] == [b"v98", b"v99"]
        node.close()


def test_a_promoted_follower_drops_the_group_it_holds_only_half_of(tmp_path):
    """A follower that copied half of an append group (a producer's batch without its
    state record: the link went down between two chunks of a group that spans two
    files) drops it when promoted, so the producer's retry is appended once, whole,
    and the queue offsets go on from the group's start."""
    from mqstore.commitlog.batch import Trailer
    from mqstore.replication.leader import read_chunk

    config = StoreConfig(commitlog_file_size_bytes=FILE_BYTES, prewarm=False)
    with (
        MessageStore.open(tmp_path / "leader", config) as leader,
        MessageStore.open(tmp_path / "follower", config) as follower,
    ):
        leader.create_topic("s", 1)
        leader.put(TOPIC, 0, b"before", keys="b")
        start = leader.commitlog.write_position
        trailer = Trailer("s", 0, lambda first: (b"state of %d" % first, []))
        result = leader.put_batch_arrays(TOPIC, 0, [b"g" * 100] * 10, trailer=trailer)
        node = ReplicaNode(follower, node_id=1)
        node.start("127.0.0.1", 0, follow="127.0.0.1:1")  # a leader it cannot reach
        follower.apply_replica_topics(leader.replica_topics())
        follower.append_replica(0, read_chunk(leader, 0, 1 << 20, end=start))
        middle = int(result.physical_offsets[6])
        follower.append_replica(start, read_chunk(leader, start, 1 << 20, end=middle))
        assert follower.commitlog.open_group_start == start
        error, _epoch, _message = node.promote(unclean=True)
        assert error == 0 and not follower.is_follower
        assert follower.commitlog.write_position == start
        assert follower.commitlog.open_group_start is None
        again = follower.put_batch_arrays(TOPIC, 0, [b"r"] * 10, trailer=trailer)
        assert again.first_queue_offset == 1
        assert [m.value for m in follower.get(TOPIC, 0, 0, 20)] == [b"before"] + [b"r"] * 10
        node.close()


@pytest.mark.parametrize("followers", [(), (1,)])
def test_a_restarted_leader_shows_more_only_as_its_followers_confirm_it(tmp_path, followers):
    """Opened held (``replicated=True``), a leader's HW starts where the hold is: with
    followers configured readers see no more until the followers confirm it; without
    any, the hold goes when it starts leading."""
    config = StoreConfig(commitlog_file_size_bytes=FILE_BYTES, prewarm=False)
    with MessageStore.open(tmp_path / "leader", config) as store:
        for i in range(5):
            store.put(TOPIC, 0, b"acked-%d" % i)
        high_watermark = store.commitlog.write_position
        store.set_commit_limit(lambda: high_watermark)
        for i in range(5):
            store.put(TOPIC, 0, b"only-here-%d" % i)
    with MessageStore.open(tmp_path / "leader", config, replicated=True) as store:
        node = ReplicaNode(store, ReplicationConfig(replica_ids=followers), node_id=0)
        node.start("127.0.0.1", 9)
        try:
            assert node.leader.high_watermark() >= high_watermark
            store.put(TOPIC, 0, b"after")
            deadline = time.monotonic() + 10
            want = 5 if followers else 11
            while store.max_offset(TOPIC, 0) != want:
                assert time.monotonic() < deadline, store.max_offset(TOPIC, 0)
                time.sleep(0.01)
            time.sleep(0.2)  # and it stays there
            assert store.max_offset(TOPIC, 0) == want
        finally:
            node.close()
