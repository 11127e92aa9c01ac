"""The leader's side (mqstore/replication/leader.py) behind a real Broker on a real
socket: ReplicaFetch cuts whole records, long-polls, refuses a follower end the
leader never sent (and does not count it), and hostile frames close one connection."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from mqstore import MessageStore, StoreConfig
from mqstore.broker import Broker, BrokerConfig
from mqstore.commitlog.batch import Trailer
from mqstore.replication.fetcher import ReplicaFetcher
from mqstore.replication.leader import (
    OFFSET_OUT_OF_RANGE,
    ReplicaLeader,
    ReplicationConfig,
    read_chunk,
)
from mqstore.replication.protocol import (
    FRAME_SIZE,
    HEADER,
    REPLICA_FETCH_API_KEY,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    decode_response,
    encode_request,
)

FILE_BYTES = 64 * 1024


@pytest.fixture
def store(tmp_path: Any) -> Iterator[MessageStore]:
    opened = MessageStore.open(
        tmp_path / "leader",
        StoreConfig(commitlog_file_size_bytes=FILE_BYTES, prewarm=False),
    )
    yield opened
    opened.close()


@pytest.fixture
def broker(store: MessageStore) -> Iterator[Broker]:
    with Broker(store, BrokerConfig(port=0)) as running:
        yield running


def _request(log_end: int, max_bytes: int = 1 << 20, wait_ms: int = 0, crc: int = 0) -> Any:
    return ReplicaFetchRequest(7, -1, -1, log_end, max_bytes, wait_ms, crc)


def _ask(broker: Broker, request: ReplicaFetchRequest) -> ReplicaFetchResponse:
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as connection:
        connection.sendall(encode_request(request, 42))
        return _read_response(connection)


def _read_response(connection: socket.socket) -> ReplicaFetchResponse:
    (size,) = FRAME_SIZE.unpack(_exactly(connection, 4))
    correlation_id, response = decode_response(_exactly(connection, size))
    assert correlation_id == 42
    return response


def _exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def test_a_fetch_returns_whole_records_from_the_followers_end(store, broker):
    for i in range(50):
        store.put("t", 0, b"x" * 100, keys=f"k{i}")
    sizes = [m.size for m in store.get("t", 0, 0, 50)]
    response = _ask(broker, _request(0, max_bytes=sizes[0] * 3 + 1))
    assert response.error_code == 0
    assert len(response.data) == sum(sizes[:3])  # three whole records, not 3.x
    assert response.log_end == store.commitlog.write_position
    assert response.topics == store.replica_topics()  # crc 0: the follower has none
    one = _ask(broker, _request(sizes[0], max_bytes=1))  # smaller than a record: one whole
    assert len(one.data) == sizes[1]
    current = _ask(broker, _request(0, crc=zlib.crc32(store.replica_topics())))
    assert current.topics is None  # the follower's registry is the leader's


def test_every_record_below_a_snapshots_end_has_its_partition_in_its_topics(store, monkeypatch):
    """A put that grows its topic lands between the snapshot's two reads."""
    store.put("t", 0, b"first")
    leader = ReplicaLeader(store)
    real_topics = type(store).replica_topics
    real_end = type(store).replicable_end
    grown = iter(range(1, 5))

    def put_then(read: Any) -> Any:
        def between(self: Any) -> Any:
            value = read(self)
            queue_id = next(grown, None)
            if queue_id is not None:
                self.put("t", queue_id, b"grows")  # after this read, before the other
            return value

        return between

    monkeypatch.setattr(type(store), "replica_topics", put_then(real_topics))
    monkeypatch.setattr(type(store), "replicable_end", property(put_then(real_end.fget)))
    for _ in range(2):
        topics, end = leader._snapshot(_request(0))
        assert topics is not None
        partitions = json.loads(topics)["topics"]["t"]["partitions"]
        queues = {r.queue_id for r in store.commitlog.iter_records(0, end)}
        assert max(queues) < partitions


def test_a_follower_with_stale_topics_is_answered_at_once(store):
    store.put("t", 0, b"x")
    end = store.commitlog.write_position
    leader = ReplicaLeader(store)
    leader.activate()
    started = time.monotonic()
    response = leader.answer(_request(end, wait_ms=5_000, crc=0), wait=True)  # no registry
    assert time.monotonic() - started < 2.5  # not after its 5 s long poll
    assert response.topics is not None and response.data == b""
    current = zlib.crc32(response.topics)
    started = time.monotonic()
    response = leader.answer(_request(end, wait_ms=1_000, crc=current), wait=True)
    assert time.monotonic() - started >= 0.9  # current topics: a long poll as before
    assert response.topics is None


def test_a_blank_record_is_sent_whole_and_alone(store):
    while store.commitlog.write_position < FILE_BYTES:
        store.put("t", 0, b"y" * 1000)
    ends = [m.physical_offset + m.size for m in store.get("t", 0, 0, 1000)]
    last_in_file = max(end for end in ends if end <= FILE_BYTES)
    before = read_chunk(store, 0, last_in_file + 10)
    assert len(before) == last_in_file  # the blank does not fit the budget: next time
    blank = read_chunk(store, last_in_file, 1)
    assert len(blank) == FILE_BYTES - last_in_file
    assert len(read_chunk(store, FILE_BYTES, 1)) == ends[ends.index(last_in_file) + 1] - FILE_BYTES


def test_a_follower_end_past_the_leaders_is_refused_and_not_counted(store, broker):
    store.put("t", 0, b"z")
    end = store.commitlog.write_position
    response = _ask(broker, _request(end + 1))
    assert response.error_code == OFFSET_OUT_OF_RANGE
    assert response.data == b""
    assert broker.replicas is not None
    assert broker.replicas.followers() == {}  # apache/rocketmq#3015: never acknowledged
    assert _ask(broker, _request(end)).error_code == 0
    assert broker.replicas.followers()[7].log_end == end


def test_a_follower_at_the_end_long_polls_until_a_put(store, broker):
    store.put("t", 0, b"first")
    end = store.commitlog.write_position
    crc = zlib.crc32(store.replica_topics())  # its topics are current (else: at once)
    started = time.monotonic()
    assert _ask(broker, _request(end, wait_ms=300, crc=crc)).data == b""
    assert time.monotonic() - started >= 0.29
    timer = threading.Timer(0.3, store.put, args=("t", 0, b"second"))
    timer.start()
    started = time.monotonic()
    response = _ask(broker, _request(end, wait_ms=10_000, crc=crc))
    waited = time.monotonic() - started
    timer.join()
    assert response.data  # woken by the put, long before the 10 s
    assert 0.25 <= waited < 5.0


@pytest.mark.parametrize(
    "payload",
    [
        HEADER.pack(REPLICA_FETCH_API_KEY, 0, 42, -1),  # no body
        HEADER.pack(REPLICA_FETCH_API_KEY, 9, 42, -1) + bytes(28),  # unknown version
        HEADER.pack(REPLICA_FETCH_API_KEY, 0, 42, -1) + struct.pack(">iiqiiI", 1, -1, 0, 0, 0, 0),
        HEADER.pack(REPLICA_FETCH_API_KEY, 0, 42, -1)
        + struct.pack(">iiqiiI", 1, -1, -5, 100, 0, 0),  # negative end
        HEADER.pack(REPLICA_FETCH_API_KEY, 0, 42, 500) + bytes(28),  # client id past the end
        HEADER.pack(REPLICA_FETCH_API_KEY, 0, 42, -1)
        + struct.pack(">iiqiiI", 1, -1, 0, 1 << 30, 0, 0),  # max_bytes too large
    ],
)
def test_a_hostile_frame_closes_its_connection_only(store, broker, payload):
    store.put("t", 0, b"kept")
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as connection:
        connection.sendall(FRAME_SIZE.pack(len(payload)) + payload)
        assert connection.recv(1) == b""  # closed, unanswered
    assert _ask(broker, _request(0)).error_code == 0  # the broker still serves
    assert store.get("t", 0, 0, 1)[0].value == b"kept"


# ---------------------------------------------------------------- HW, ISR, acks=all

LAG_MS = 600


@pytest.fixture
def replicated(tmp_path: Any, store: MessageStore) -> Iterator[tuple[Broker, MessageStore]]:
    """A leader broker whose follower 1 counts (min.insync.replicas 2), and an
    empty follower store (no fetcher yet)."""
    config = ReplicationConfig(
        replica_ids=(1,), min_insync_replicas=2, replica_lag_time_max_ms=LAG_MS
    )
    follower = MessageStore.open(
        tmp_path / "follower",
        StoreConfig(commitlog_file_size_bytes=FILE_BYTES, prewarm=False),
    )
    follower.become_follower()
    with Broker(store, BrokerConfig(port=0), replication=config) as running:
        yield running, follower
    follower.close()


def _acks_all(broker: Broker, value: bytes) -> Any:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=f"127.0.0.1:{broker.port}", acks="all", retries=0,
        request_timeout_ms=10_000,
    )  # fmt: skip
    try:
        return producer.send("t", value, partition=0).get(timeout=30)
    finally:
        producer.close(timeout=5)


def test_acks_all_needs_the_in_sync_set_and_waits_for_the_follower(replicated):
    from kafka.errors import NotEnoughReplicasError

    broker, follower = replicated
    leader = broker.engine
    leader.create_topic("t", partitions=1)
    with pytest.raises(NotEnoughReplicasError):  # follower 1 never fetched
        _acks_all(broker, b"refused")
    assert leader.max_offset("t", 0) == 0  # refused before the append
    fetcher = ReplicaFetcher(follower, "127.0.0.1", broker.port, replica_id=1).start()
    try:
        deadline = time.monotonic() + 30
        while broker.replicas.in_sync() != [1] and time.monotonic() < deadline:
            time.sleep(0.01)
        for i in range(20):
            metadata = _acks_all(broker, b"acked-%d" % i)
            # The ack came after the HW passed it: the follower holds the record.
            record = leader.get("t", 0, metadata.offset, 1)[0]
            assert follower.commitlog.write_position >= record.physical_offset + record.size
        assert broker.replicas.high_watermark() == leader.commitlog.write_position
        deadline = time.monotonic() + 10
        while fetcher.high_watermark < leader.commitlog.write_position:
            assert time.monotonic() < deadline  # the HW reaches the follower a fetch later
            time.sleep(0.01)
    finally:
        fetcher.stop()
    time.sleep(LAG_MS / 1000 + 0.3)  # replica.lag.time.max.ms passes: 1 leaves the set
    assert broker.replicas.in_sync() == []
    with pytest.raises(NotEnoughReplicasError):
        _acks_all(broker, b"refused again")


def test_a_retry_after_the_in_sync_set_shrank_is_not_appended_twice(replicated):
    """The chaos suite's duplicate, replayed with raw frames: batch 0 is appended and
    its acks=all wait ends NOT_ENOUGH_REPLICAS_AFTER_APPEND (20) when the follower
    leaves the in-sync set; batch 1 is refused unappended (19); the follower catches up
    and batch 2, in flight behind 1, arrives. Answered OUT_OF_ORDER (45), librdkafka
    would bump its epoch and send batch 0 again under it: appended twice. Answered 19,
    the retries in order find batch 0 a duplicate."""
    from tests.mqstore.broker.test_handlers import (
        idempotent_batch,
        produce_answer,
        produce_frame,
    )

    broker, follower = replicated
    leader = broker.engine
    leader.create_topic("t", partitions=1)

    def send(sequence: int, correlation_id: int) -> Any:
        batch = idempotent_batch(55, sequence, 1, value=b"b%d" % sequence)
        return produce_answer(broker.port, produce_frame("t", batch, correlation_id))

    def follow() -> ReplicaFetcher:
        fetcher = ReplicaFetcher(follower, "127.0.0.1", broker.port, replica_id=1).start()
        deadline = time.monotonic() + 30
        while broker.replicas.in_sync() != [1]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return fetcher

    follow().stop()  # in sync, then silent: it leaves the set LAG_MS later
    first = send(0, 1)  # appended; its wait ends when 1 leaves the set
    assert (first.error_code, first.base_offset) == (20, 0)
    assert send(1, 2).error_code == 19  # refused before the append
    fetcher = follow()  # caught up: back in the set
    try:
        assert send(2, 3).error_code == 19  # behind the refused batch: refused alike
        retried = [send(sequence, 4 + sequence) for sequence in (0, 1, 2)]
    finally:
        fetcher.stop()
    assert [(r.error_code, r.base_offset) for r in retried] == [(0, 0), (0, 1), (0, 2)]
    assert [bytes(m.body) for m in leader.get("t", 0, 0, 10)] == [b"b0", b"b1", b"b2"]


def test_a_lagging_follower_leaves_the_set_and_the_hw_moves_on(tmp_path, store):
    config = ReplicationConfig(
        replica_ids=(1,), min_insync_replicas=1, replica_lag_time_max_ms=LAG_MS
    )
    with Broker(store, BrokerConfig(port=0), replication=config) as broker:
        store.put("t", 0, b"first")
        first_end = store.commitlog.write_position
        assert _ask_as(broker, 1, first_end).error_code == 0  # 1 is caught up
        assert broker.replicas.in_sync() == [1]
        store.put("t", 0, b"second")
        assert broker.replicas.high_watermark() == first_end  # held back by 1's LEO
        time.sleep(LAG_MS / 1000 + 0.3)
        assert broker.replicas.in_sync() == []
        assert broker.replicas.high_watermark() == store.commitlog.write_position
        assert _acks_all(broker, b"third").offset == 2  # min.insync.replicas 1: the leader


def _ask_as(broker: Broker, replica_id: int, log_end: int) -> ReplicaFetchResponse:
    return _ask(broker, ReplicaFetchRequest(replica_id, -1, -1, log_end, 1 << 20, 0, 0))


def _eventually(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.005)


def test_readers_see_only_what_the_in_sync_set_holds(tmp_path, store):
    config = ReplicationConfig(replica_ids=(1,), replica_lag_time_max_ms=LAG_MS)
    with Broker(store, BrokerConfig(port=0), replication=config) as broker:
        store.put("t", 0, b"first")
        first_end = store.commitlog.write_position
        assert store.max_offset("t", 0) == 1  # 1 never fetched: out of the set
        assert _ask_as(broker, 1, first_end).error_code == 0  # now 1 is in, at first_end
        store.put("t", 0, b"second")
        time.sleep(0.05)
        assert store.max_offset("t", 0) == 1  # above the HW: held back from readers
        response = _ask_as(broker, 1, first_end)  # 1 copies "second" ...
        assert response.high_watermark == first_end
        assert response.data  # ... a follower copies past the HW, or it never moves
        _ask_as(broker, 1, first_end + len(response.data))  # ... and says so
        _eventually(lambda: store.max_offset("t", 0) == 2)
        store.put("t", 0, b"third")  # 1 stops fetching: it leaves after the lag
        _eventually(lambda: store.max_offset("t", 0) == 3, timeout_s=LAG_MS / 1000 + 5)
        store.put("t", 0, b"fourth")
    assert store.max_offset("t", 0) == 4  # the broker stopped: no limit any more


def test_an_ack_waiting_when_the_follower_leaves_the_set_is_not_an_ack(tmp_path, store):
    """The HW moves to the leader's end when the last follower leaves the in-sync
    set; a batch waiting for acks=all is then on one replica, below
    min.insync.replicas 2: NOT_ENOUGH_REPLICAS_AFTER_APPEND, never a success (Kafka's
    checkEnoughReplicasReachOffset). The chaos suite lost such acks before."""
    from kafka.errors import NotEnoughReplicasAfterAppendError

    config = ReplicationConfig(
        replica_ids=(1,), min_insync_replicas=2, replica_lag_time_max_ms=LAG_MS
    )
    with Broker(store, BrokerConfig(port=0), replication=config) as broker:
        store.create_topic("t", partitions=1)
        assert _ask_as(broker, 1, store.commitlog.write_position).error_code == 0
        assert broker.replicas.in_sync() == [1]  # then it stops fetching
        hw = broker.replicas.high_watermark()
        with pytest.raises(NotEnoughReplicasAfterAppendError):
            _acks_all(broker, b"on the leader alone")
        # Below min.insync.replicas the HW stands: readers never see what only the
        # leader holds (a follower promoted later would not have it).
        assert broker.replicas.high_watermark() == hw < store.commitlog.write_position
        assert store.max_offset("t", 0) == 0


def _state(first: int) -> tuple[bytes, list]:
    return b"state of %d" % first, []


def test_a_chunk_never_ends_inside_an_append_group(store):
    """A producer's batch and its state record (one append group) reach a follower
    together, whatever the budget: a chunk ends where a group ends, and a group
    larger than the budget goes whole (the follower's end, so the HW, never splits
    one)."""
    store.create_topic("s", 1)
    ends = set()
    for i in range(100):
        store.put("t", 0, b"p" * 50)
        ends.add(store.commitlog.write_position)
        store.put_batch_arrays("t", 0, [b"g" * 100] * (1 + i % 9), trailer=Trailer("s", 0, _state))
        ends.add(store.commitlog.write_position)
    assert store.commitlog.write_position > FILE_BYTES  # a roll in between
    for max_bytes in (1, 150, 700, 2000, 10_000):
        position, chunks = 0, 0
        while position < store.replicable_end:
            chunk = read_chunk(store, position, max_bytes)
            assert chunk
            position += len(chunk)
            chunks += 1
            assert position in ends or position % FILE_BYTES == 0, (max_bytes, position)
        assert chunks > 2


def test_a_chunk_up_to_an_end_inside_a_group_stops_there(store):
    """Bytes past the end asked for are never sent, so a group not whole below it
    goes only in part (the follower's open_group_start then names it)."""
    store.create_topic("s", 1)
    store.put("t", 0, b"before")
    start = store.commitlog.write_position
    result = store.put_batch_arrays("t", 0, [b"g" * 100] * 10, trailer=Trailer("s", 0, _state))
    middle = int(result.physical_offsets[5])
    assert len(read_chunk(store, start, 1 << 20, end=middle)) == middle - start
    assert len(read_chunk(store, start, 1)) == store.commitlog.write_position - start
