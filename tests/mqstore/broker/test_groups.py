"""Consumer groups over the wire: real rebalancing with librdkafka consumers and a
kafka-python group consumer, committed offsets in the store's own OffsetStore."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer

from mqstore.broker import Broker

confluent_kafka = pytest.importorskip("confluent_kafka")

WAIT_S = 30.0


def group_consumer(broker: Broker, group: str) -> Any:
    return confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 300,
        }
    )


def wait_for_assignment(consumers: list[Any], sizes: list[int]) -> list[set[int]]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for consumer in consumers:
            consumer.poll(0.1)
        owned = [{tp.partition for tp in c.assignment()} for c in consumers]
        if [len(o) for o in owned] == sizes:
            return owned
    raise AssertionError(f"assignments {[c.assignment() for c in consumers]}, wanted {sizes}")


def test_rebalance_when_a_consumer_joins_and_one_leaves(commitlog_broker: Broker) -> None:
    commitlog_broker.engine.create_topic("work", 4)
    first = group_consumer(commitlog_broker, "workers")
    first.subscribe(["work"])
    assert wait_for_assignment([first], [4]) == [{0, 1, 2, 3}]
    second = group_consumer(commitlog_broker, "workers")
    second.subscribe(["work"])
    owned = wait_for_assignment([first, second], [2, 2])
    assert owned[0] | owned[1] == {0, 1, 2, 3}
    second.close()  # LeaveGroup: the first takes everything back
    assert wait_for_assignment([first], [4]) == [{0, 1, 2, 3}]
    first.close()
    group = commitlog_broker.groups.groups.get("workers") if commitlog_broker.groups else None
    assert group is None or not group.members


def test_group_consumer_commits_and_resumes(broker: Broker) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(30):
        producer.send("jobs", value=b"job-%d" % i)
    producer.flush(timeout=WAIT_S)
    producer.close(timeout=5)

    def consume(count: int) -> list[Any]:
        consumer = KafkaConsumer(
            "jobs", bootstrap_servers=broker.bootstrap, group_id="jobbers",
            auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=count,
        )  # fmt: skip
        got: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        try:
            while len(got) < count and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=300, max_records=count - len(got)).values():
                    got.extend(records)
            consumer.commit()
        finally:
            consumer.close()
        return got

    first = consume(10)
    assert [r.offset for r in first] == list(range(10))
    assert broker.engine.offsets.load("jobbers")[("jobs", 0)][0] == 10
    rest = consume(20)
    assert [r.offset for r in rest] == list(range(10, 30))


def test_a_silent_member_expires(commitlog_broker: Broker) -> None:
    """A member that stops heartbeating is removed after its session timeout."""
    import asyncio

    from kafka.protocol.consumer import JoinGroupRequest

    groups = commitlog_broker.groups
    loop = commitlog_broker._loop
    assert groups is not None and loop is not None
    request = JoinGroupRequest(
        version=3, group_id="quiet", session_timeout_ms=1_000, rebalance_timeout_ms=1_000,
        member_id="", protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")],
    )  # fmt: skip
    request.with_header(correlation_id=1, client_id="quiet-client")
    answer = asyncio.run_coroutine_threadsafe(groups.handle(11, request, 3), loop).result(10)
    assert answer.error_code == 0
    assert answer.leader == answer.member_id
    assert groups.groups["quiet"].members
    deadline = time.monotonic() + 10
    while "quiet" in groups.groups and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "quiet" not in groups.groups


def _join_without_member_id(group_id: str, session_timeout_ms: int) -> Any:
    from kafka.protocol.consumer import JoinGroupRequest

    request = JoinGroupRequest(
        version=5, group_id=group_id, session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=session_timeout_ms, member_id="", group_instance_id=None,
        protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")],
    )  # fmt: skip
    request.with_header(correlation_id=1, client_id="flood")
    return request


def test_member_ids_handed_out_and_never_used_expire(commitlog_broker: Broker) -> None:
    """JoinGroup v4+ without a member id gets MEMBER_ID_REQUIRED and a pending id. A
    client that never comes back with it must not pin the group (and its memory) for
    good: else GROUPS_MAX such requests refuse every new group until a restart."""
    import asyncio

    groups = commitlog_broker.groups
    loop = commitlog_broker._loop
    assert groups is not None and loop is not None
    for group_id in ("flood-a", "flood-b"):
        request = _join_without_member_id(group_id, 1_000)
        answer = asyncio.run_coroutine_threadsafe(groups.handle(11, request, 5), loop).result(10)
        assert answer.error_code == 79  # MEMBER_ID_REQUIRED
    assert {"flood-a", "flood-b"} <= set(groups.groups)
    deadline = time.monotonic() + 10
    while {"flood-a", "flood-b"} & set(groups.groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not {"flood-a", "flood-b"} & set(groups.groups)


def test_pending_member_ids_of_one_group_are_bounded(commitlog_broker: Broker) -> None:
    """A flood of JoinGroup v4+ without a member id to one group keeps at most
    MEMBERS_MAX pending ids (the oldest go first), and a client that comes back with
    its fresh id still joins."""
    import asyncio

    from mqstore.broker.groups import MEMBERS_MAX

    groups = commitlog_broker.groups
    loop = commitlog_broker._loop
    assert groups is not None and loop is not None

    async def flood() -> str:
        member_id = ""
        for _ in range(MEMBERS_MAX + 50):
            answer = await groups.handle(11, _join_without_member_id("crowd", 30_000), 5)
            assert answer.error_code == 79
            member_id = answer.member_id
        return member_id

    last = asyncio.run_coroutine_threadsafe(flood(), loop).result(30)
    assert len(groups.groups["crowd"].pending_ids) <= MEMBERS_MAX
    request = _join_without_member_id("crowd", 30_000)
    request.member_id = last
    answer = asyncio.run_coroutine_threadsafe(groups.handle(11, request, 5), loop).result(30)
    assert (answer.error_code, answer.member_id) == (0, last)


def test_a_members_protocol_metadata_is_bounded(commitlog_broker: Broker) -> None:
    """A member's protocol metadata is held for its whole session (up to MEMBERS_MAX
    members in GROUPS_MAX groups): past MEMBER_METADATA_BYTES_MAX a JoinGroup is
    refused with INVALID_REQUEST and nothing is kept; a normal one still joins."""
    import asyncio

    from kafka.protocol.consumer import JoinGroupRequest

    from mqstore.broker.groups import MEMBER_METADATA_BYTES_MAX

    groups = commitlog_broker.groups
    loop = commitlog_broker._loop
    assert groups is not None and loop is not None

    def join(metadata: bytes) -> Any:
        request = JoinGroupRequest(
            version=3,
            group_id="bulky",
            session_timeout_ms=30_000,
            rebalance_timeout_ms=30_000,
            member_id="",
            protocol_type="consumer",
            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=metadata)],
        )  # fmt: skip  (v3: no MEMBER_ID_REQUIRED round trip)
        request.with_header(correlation_id=1, client_id="bulky")
        return asyncio.run_coroutine_threadsafe(groups.handle(11, request, 3), loop).result(30)

    answer = join(b"x" * (MEMBER_METADATA_BYTES_MAX + 1))
    assert answer.error_code == 42  # INVALID_REQUEST
    assert not groups.groups.get("bulky") or not groups.groups["bulky"].members
    answer = join(b"x" * 100)
    assert answer.error_code == 0 and answer.member_id


def test_list_and_describe_groups_read_the_offsets_directory_off_the_loop(
    commitlog_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ListGroups and DescribeGroups list the committed groups' directory (one
    listdir, as slow as the disk): on a read thread, never on the event loop that
    every connection waits for."""
    import threading

    from confluent_kafka.admin import AdminClient

    offsets = commitlog_broker.engine.offsets
    offsets.commit("embedded", {("grp", 0): (2, "")})
    threads: list[str] = []
    listing = offsets.groups

    def recording_groups() -> list[str]:
        threads.append(threading.current_thread().name)
        return listing()

    monkeypatch.setattr(offsets, "groups", recording_groups)
    admin = AdminClient({"bootstrap.servers": commitlog_broker.bootstrap})
    listed = admin.list_consumer_groups().result(timeout=30)
    assert {group.group_id for group in listed.valid} == {"embedded"}
    described = admin.describe_consumer_groups(["embedded"])["embedded"].result(timeout=30)
    assert str(described.state).endswith("EMPTY")
    assert len(threads) >= 2, threads  # one listing per request
    assert "broker-loop" not in threads, threads
