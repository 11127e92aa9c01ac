"""The group coordinator: Kafka's classic consumer-group protocol, on the event loop.

States, as in Kafka's GroupMetadata: Empty -> PreparingRebalance -> CompletingRebalance
-> Stable, and back to PreparingRebalance when a member joins, leaves or expires.

- JoinGroup: from v4 a member without an id gets one with MEMBER_ID_REQUIRED (79)
  and joins again with it. A join starts (or joins) a rebalance, which completes when
  every known member has re-joined, or when the rebalance timeout passes (the
  members that did not re-join are removed). Then the generation goes up, the
  protocol is the first of the leader's that every member supports, the first
  member is the leader, and every pending join is answered (the leader with the
  members' metadata, opaque bytes).
- SyncGroup: the leader's assignment (opaque bytes) is kept and every member's is
  answered; followers that sync first wait for it.
- Heartbeat: REBALANCE_IN_PROGRESS (27) while a rebalance runs, so members re-join;
  ILLEGAL_GENERATION (22) and UNKNOWN_MEMBER_ID (25) as Kafka answers them.
- LeaveGroup and session expiry (no heartbeat for session_timeout_ms) remove a
  member and rebalance the rest.

ListGroups and DescribeGroups answer from the groups in memory and, for a group
known only by its committed offsets (after a restart, or an embedded consumer's),
as Kafka answers a group with no members: state Empty, protocol type "consumer".

Committed offsets are not kept here: OffsetCommit checks the member's generation
with ``commit_allowed`` and stores the offsets through the engine's ``offsets`` (on
the CommitLog engine, records of its internal ``__consumer_offsets`` topic:
mqstore.offsets_log), so embedded consumers and wire clients of a group see the same
ones, and a follower that copies the log has them too.

Crash policy: group membership lives in memory; after a restart members get
UNKNOWN_MEMBER_ID and re-join (committed offsets are in the log).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from typing import Any, Final

from kafka.protocol.admin import DescribeGroupsResponse, ListGroupsResponse
from kafka.protocol.consumer import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    SyncGroupResponse,
)

from mqstore.broker.config import BrokerConfig
from mqstore.broker.protocol import ErrorCode
from mqstore.commitlog.errors import StoreError
from mqstore.offsets import CommittedOffsets, validate_group

__all__ = ["GroupCoordinator"]

EXPIRY_CHECK_S: Final = 0.25  # how often sessions are checked
GROUPS_MAX: Final = 10_000  # groups held in memory; more are refused
MEMBERS_MAX: Final = 1_000  # members of one group
#: A member's protocol names and metadata, held for its session: past this a JoinGroup
#: is refused (INVALID_REQUEST). A consumer's subscription of thousands of topics fits.
MEMBER_METADATA_BYTES_MAX: Final = 1 << 20
JOIN, HEARTBEAT, LEAVE, SYNC, DESCRIBE, LIST = 11, 12, 13, 14, 15, 16
DEAD: Final = "Dead"  # DescribeGroups' state of a group nobody knows
CONSUMER: Final = "consumer"  # the protocol type of a group known by its offsets
EMPTY, PREPARING, COMPLETING, STABLE = (
    "Empty",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
)


class _Member:
    __slots__ = (
        "assignment",
        "client_id",
        "id",
        "join",
        "join_version",
        "last_seen",
        "protocols",
        "rebalance_timeout_s",
        "session_timeout_s",
        "sync",
    )

    def __init__(self, member_id: str) -> None:
        self.id = member_id
        self.client_id = ""
        self.protocols: list[tuple[str, bytes]] = []
        self.session_timeout_s = 10.0
        self.rebalance_timeout_s = 10.0
        self.join: asyncio.Future[Any] | None = None  # a pending JoinGroup answer
        self.join_version = 0  # the version that answer is encoded at
        self.sync: asyncio.Future[bytes] | None = None  # a pending SyncGroup answer
        self.assignment = b""
        self.last_seen = time.monotonic()


class _Group:
    def __init__(self, group_id: str) -> None:
        self.id = group_id
        self.state = EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, _Member] = {}
        # Ids handed out with MEMBER_ID_REQUIRED -> when they lapse (monotonic s): an id
        # not used within its session timeout is forgotten, and at most MEMBERS_MAX
        # are held (the oldest go first), so clients that never come back pin nothing.
        self.pending_ids: dict[str, float] = {}
        self.rebalance: asyncio.TimerHandle | None = None


class GroupCoordinator:
    """Every group of this broker (one broker: it coordinates them all)."""

    def __init__(
        self,
        config: BrokerConfig,
        offsets: CommittedOffsets | None = None,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        """``offsets``: where groups known only by committed offsets are listed (a
        directory listing: on ``executor``, the loop's default one when None, never on
        the loop itself)."""
        self.config = config
        self.offsets = offsets
        self.executor = executor
        self.groups: dict[str, _Group] = {}

    async def handle(self, api_key: int, request: Any, version: int) -> Any:
        if api_key in (LIST, DESCRIBE):
            loop = asyncio.get_running_loop()
            committed = await loop.run_in_executor(self.executor, self._committed_groups)
            if api_key == LIST:
                return self._list(version, committed)
            return self._describe(request, version, set(committed))
        if api_key == JOIN:
            return await self._join(request, version)
        if api_key == SYNC:
            return await self._sync(request, version)
        if api_key == HEARTBEAT:
            code = self._heartbeat(request)
            return HeartbeatResponse(version=version, throttle_time_ms=0, error_code=code)
        assert api_key == LEAVE
        return self._leave(request, version)

    def commit_allowed(self, group_id: str, generation: int, member_id: str) -> int:
        """OffsetCommit's check: 0, or the error for a member of a managed group."""
        group = self.groups.get(group_id)
        if generation < 0 or group is None or not group.members:
            return 0  # a simple consumer (assign) commits without a generation
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state == PREPARING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return 0

    # ------------------------------------------------------------------ join

    async def _join(self, request: Any, version: int) -> Any:
        def fail(code: int, member_id: str = "") -> Any:
            return JoinGroupResponse(
                version=version, throttle_time_ms=0, error_code=code, generation_id=-1,
                protocol_name="", leader="", member_id=member_id, members=[],
            )  # fmt: skip

        session_ms = request.session_timeout_ms
        if (
            not self.config.session_timeout_min_ms
            <= session_ms
            <= (self.config.session_timeout_max_ms)
        ):
            return fail(ErrorCode.INVALID_SESSION_TIMEOUT)
        if not request.group_id or not request.protocols:
            return fail(ErrorCode.INVALID_GROUP_ID if not request.group_id else 23)
        held = sum(len(p.name) + len(p.metadata) for p in request.protocols)
        if held > MEMBER_METADATA_BYTES_MAX:
            return fail(ErrorCode.INVALID_REQUEST, request.member_id)
        group = self.groups.get(request.group_id)
        if group is None:
            if len(self.groups) >= GROUPS_MAX:
                return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            group = self.groups[request.group_id] = _Group(request.group_id)
        if (
            group.protocol_type is not None
            and group.members
            and (request.protocol_type != group.protocol_type)
        ):
            return fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        member_id = request.member_id
        if not member_id:
            member_id = f"{request.header.client_id or 'member'}-{uuid.uuid4()}"
            if version >= 4:
                if len(group.pending_ids) >= MEMBERS_MAX:
                    del group.pending_ids[next(iter(group.pending_ids))]
                group.pending_ids[member_id] = time.monotonic() + session_ms / 1000
                return fail(ErrorCode.MEMBER_ID_REQUIRED, member_id)
        elif member_id not in group.members and member_id not in group.pending_ids:
            return fail(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        if member_id not in group.members and len(group.members) >= MEMBERS_MAX:
            return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        group.pending_ids.pop(member_id, None)
        member = group.members.get(member_id)
        if member is None:
            member = group.members[member_id] = _Member(member_id)
        if member.join is not None and not member.join.done():
            member.join.set_result(fail(ErrorCode.REBALANCE_IN_PROGRESS, member_id))
        member.protocols = [(p.name, bytes(p.metadata)) for p in request.protocols]
        member.client_id = request.header.client_id or ""
        member.session_timeout_s = session_ms / 1000
        rebalance_ms = getattr(request, "rebalance_timeout_ms", -1)
        member.rebalance_timeout_s = (rebalance_ms if rebalance_ms > 0 else session_ms) / 1000
        member.last_seen = time.monotonic()
        group.protocol_type = request.protocol_type
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        member.join = future
        member.join_version = version
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        return await future

    def _prepare_rebalance(self, group: _Group) -> None:
        if group.state == PREPARING:
            return
        for member in group.members.values():  # members waiting in sync re-join
            if member.sync is not None and not member.sync.done():
                member.sync.set_exception(_Rebalance())
        new_group = group.state == EMPTY
        group.state = PREPARING
        loop = asyncio.get_running_loop()
        timeout_s = max((m.rebalance_timeout_s for m in group.members.values()), default=1.0)
        if new_group:
            timeout_s = min(timeout_s, self.config.initial_rebalance_delay_ms / 1000)
        group.rebalance = loop.call_later(timeout_s, self._complete_join, group)

    def _maybe_complete_join(self, group: _Group) -> None:
        """Complete the join once every member has joined, unless the group is new
        (then the initial delay lets more members arrive)."""
        if group.state != PREPARING:
            return
        joined = all(m.join is not None and not m.join.done() for m in group.members.values())
        if joined and group.generation > 0:
            self._complete_join(group)

    def _complete_join(self, group: _Group) -> None:
        if group.state != PREPARING:
            return
        if group.rebalance is not None:
            group.rebalance.cancel()
            group.rebalance = None
        for member_id in [m.id for m in group.members.values() if m.join is None or m.join.done()]:
            del group.members[member_id]  # did not re-join in time
        if not group.members:
            group.state, group.leader, group.protocol = EMPTY, None, None
            group.generation += 1
            return
        group.generation += 1
        members = list(group.members.values())
        common = set.intersection(*({name for name, _ in m.protocols} for m in members))
        leader = members[0]
        group.leader = leader.id
        group.protocol = next((n for n, _ in leader.protocols if n in common), None)
        group.state = COMPLETING
        for member in members:
            assert member.join is not None
            response = JoinGroupResponse(
                version=member.join_version,
                throttle_time_ms=0,
                error_code=0,
                generation_id=group.generation,
                protocol_type=group.protocol_type,
                protocol_name=group.protocol or "",
                leader=leader.id,
                member_id=member.id,
                members=[
                    JoinGroupResponse.JoinGroupResponseMember(
                        member_id=m.id,
                        group_instance_id=None,
                        metadata=dict(m.protocols).get(group.protocol or "", b""),
                    )
                    for m in members
                ]
                if member.id == leader.id
                else [],
            )
            member.join.set_result(response)
            member.join = None
            member.last_seen = time.monotonic()

    # ------------------------------------------------------------------ sync

    async def _sync(self, request: Any, version: int) -> Any:
        def answer(code: int, assignment: bytes = b"") -> Any:
            return SyncGroupResponse(
                version=version, throttle_time_ms=0, error_code=code, assignment=assignment
            )

        group = self.groups.get(request.group_id)
        member = group.members.get(request.member_id) if group else None
        if group is None or member is None:
            return answer(ErrorCode.UNKNOWN_MEMBER_ID)
        if request.generation_id != group.generation:
            return answer(ErrorCode.ILLEGAL_GENERATION)
        if group.state == PREPARING:
            return answer(ErrorCode.REBALANCE_IN_PROGRESS)
        member.last_seen = time.monotonic()
        if group.state == STABLE:
            return answer(0, member.assignment)
        if request.member_id == group.leader:
            given = {a.member_id: bytes(a.assignment) for a in request.assignments}
            for each in group.members.values():
                each.assignment = given.get(each.id, b"")
                if each.sync is not None and not each.sync.done():
                    each.sync.set_result(each.assignment)
                each.sync = None
            group.state = STABLE
            return answer(0, member.assignment)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        member.sync = future
        try:
            return answer(0, await future)
        except _Rebalance:
            return answer(ErrorCode.REBALANCE_IN_PROGRESS)

    # ------------------------------------------------------------------ heartbeat, leave

    def _heartbeat(self, request: Any) -> int:
        group = self.groups.get(request.group_id)
        member = group.members.get(request.member_id) if group else None
        if group is None or member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        member.last_seen = time.monotonic()
        if request.generation_id != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state == PREPARING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return 0

    def _leave(self, request: Any, version: int) -> Any:
        group = self.groups.get(request.group_id)
        ids = [m.member_id for m in request.members] if version >= 3 else [request.member_id]
        results = []
        code = 0
        for member_id in ids:
            if group is None or member_id not in group.members:
                code = ErrorCode.UNKNOWN_MEMBER_ID
                results.append((member_id, code))
                continue
            self._remove(group, member_id)
            results.append((member_id, 0))
        members = [
            LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=None, error_code=c)
            for m, c in results
        ]
        error = code if version < 3 else 0
        return LeaveGroupResponse(
            version=version, throttle_time_ms=0, error_code=error, members=members
        )

    def _remove(self, group: _Group, member_id: str) -> None:
        member = group.members.pop(member_id)
        if member.join is not None and not member.join.done():
            member.join.cancel()
        if member.sync is not None and not member.sync.done():
            member.sync.set_exception(_Rebalance())
        if not group.members:
            if group.rebalance is not None:
                group.rebalance.cancel()
                group.rebalance = None
            group.state, group.leader, group.protocol = EMPTY, None, None
            return
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)

    # ------------------------------------------------------------------ list, describe

    def _committed_groups(self) -> list[str]:
        """The groups with committed offsets (lists a directory: off the loop)."""
        if self.offsets is None:
            return []
        try:
            return self.offsets.groups()
        except (StoreError, OSError):
            return []  # an unreadable offsets directory lists nothing more

    def _list(self, version: int, committed: list[str]) -> Any:
        listed = {
            group.id: group.protocol_type or CONSUMER
            for group in self.groups.values()
            if group.members or group.state != EMPTY
        }
        for group_id in committed:
            listed.setdefault(group_id, CONSUMER)
        groups = [
            ListGroupsResponse.ListedGroup(group_id=group_id, protocol_type=protocol_type)
            for group_id, protocol_type in sorted(listed.items())
        ]
        return ListGroupsResponse(version=version, throttle_time_ms=0, error_code=0, groups=groups)

    def _describe(self, request: Any, version: int, committed: set[str]) -> Any:
        described = [self._describe_one(group_id, committed) for group_id in request.groups]
        return DescribeGroupsResponse(version=version, throttle_time_ms=0, groups=described)

    def _describe_one(self, group_id: str, committed: set[str]) -> Any:
        def answer(code: int, state: str, protocol_type: str, members: list[Any]) -> Any:
            return DescribeGroupsResponse.DescribedGroup(
                error_code=code, group_id=group_id, group_state=state,
                protocol_type=protocol_type, protocol_data=protocol, members=members,
            )  # fmt: skip

        protocol = ""
        try:
            validate_group(group_id)
        except StoreError:
            return answer(ErrorCode.INVALID_GROUP_ID, DEAD, "", [])
        group = self.groups.get(group_id)
        if group is None or (not group.members and group.state == EMPTY):
            known = group_id in committed
            return answer(0, EMPTY if known else DEAD, CONSUMER if known else "", [])
        protocol = group.protocol or ""
        stable = group.state == STABLE
        member_class = DescribeGroupsResponse.DescribedGroup.DescribedGroupMember
        members = []
        for member in group.members.values():
            members.append(
                member_class(
                    member_id=member.id,
                    group_instance_id=None,
                    client_id=member.client_id,
                    client_host="",
                    member_metadata=dict(member.protocols).get(protocol, b""),
                    member_assignment=member.assignment if stable else b"",
                )
            )
        return answer(0, group.state, group.protocol_type or "", members)

    async def expire_loop(self) -> None:
        """Remove members whose session ran out (a task of the broker's loop)."""
        while True:
            await asyncio.sleep(EXPIRY_CHECK_S)
            now = time.monotonic()
            for group in list(self.groups.values()):
                for member in list(group.members.values()):
                    waiting = member.join is not None and not member.join.done()
                    if not waiting and now - member.last_seen > member.session_timeout_s:
                        self._remove(group, member.id)
                for member_id, lapses in list(group.pending_ids.items()):
                    if now > lapses:
                        del group.pending_ids[member_id]
                if group.state == EMPTY and not group.members and not group.pending_ids:
                    del self.groups[group.id]


class _Rebalance(Exception):
    """A pending SyncGroup is cut short by a new rebalance."""
