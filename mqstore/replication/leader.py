"""The leader's side of replication: answering ReplicaFetch and tracking followers.

``read_chunk`` cuts the bytes a follower gets: from its end (``log_end``, a record
boundary of this log), whole records within one file, up to the replicable end (the
readable end: in sync-flush mode only durable bytes), at most ``max_bytes`` or the
first record whole when it is larger. A chunk ends where an append group ends
(record.py's FLAG_GROUP_OPEN: a producer's batch and its state record), as Kafka
sends whole batches: a group larger than ``max_bytes`` goes whole, so a follower's
end, and the HW taken from it, never splits a group (a group that spans two files
goes in two chunks). An end-of-file blank record goes whole, so the
follower rolls where the leader rolled. Record boundaries come from the dispatcher's
header scan (commitlog/header_scan.py, C when built), with no checksum work: the
follower verifies every record it takes.

``ReplicaLeader.answer`` validates the follower's end before anything counts: an end
past this log's replicable end names bytes this leader never sent, so it is refused
(OFFSET_OUT_OF_RANGE) and never recorded as acknowledged (apache/rocketmq#3015, where
any client could ack an arbitrary offset); an end before the log's first file
(removed by retention) is refused the same way. A valid end is recorded per replica
id, once per request (not per long-poll slice).

High watermark (Kafka's rule, ``ReplicationConfig``): a configured follower is in
sync while its last catch-up (a fetch whose end reached the leader's end as of the
previous response to it) is within ``replica_lag_time_max_ms``; HW = min LEO over the
in-sync set, the leader's end included, and it never moves back. acks=all
(mqstore.broker.handlers) is refused with NOT_ENOUGH_REPLICAS while the set (the
leader included) is below ``min_insync_replicas`` and otherwise returns once the HW
passes the batch. With followers configured, the leader's readers see only records
below the HW: the store's dispatcher is limited to it (``set_commit_limit``, RocketMQ
5's confirmOffset) and woken when a follower's fetch moves it.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Iterable
from typing import Any, Final, NamedTuple, Protocol

import attrs
import numpy as np

from mqstore.commitlog.errors import CorruptDataError, OffsetOutOfRangeError
from mqstore.commitlog.header_scan import (
    DISPATCH_BLANK,
    DISPATCH_FLAGS,
    DISPATCH_FULL,
    DISPATCH_INVALID,
    DISPATCH_PHYSICAL,
    DISPATCH_SIZE,
    dispatch_columns,
    new_columns,
)
from mqstore.commitlog.record import FLAG_GROUP_OPEN
from mqstore.replication.epochs import UNDEFINED, LeaderEpochs, diverging
from mqstore.replication.protocol import ReplicaFetchRequest, ReplicaFetchResponse

__all__ = ["FollowerState", "ReplicaLeader", "ReplicaSource", "ReplicationConfig", "read_chunk"]

log = logging.getLogger(__name__)

#: Record boundaries found per header-scan call; a chunk takes several calls.
SCAN_ROWS: Final = 4096
#: Kafka's error codes this side answers.
NONE: Final = 0
OFFSET_OUT_OF_RANGE: Final = 1
NOT_LEADER_OR_FOLLOWER: Final = 6
KAFKA_STORAGE_ERROR: Final = 56
FENCED_LEADER_EPOCH: Final = 74
UNKNOWN_LEADER_EPOCH: Final = 76
#: Replicas tracked at most: a client inventing replica ids cannot grow the table.
REPLICAS_MAX: Final = 64


#: How often a waiter for the HW re-checks the in-sync set (a follower may leave it
#: by the clock alone, which moves the HW with no fetch to announce it).
HW_RECHECK_S: Final = 0.1


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True)
class ReplicationConfig:
    """The leader's replication settings (Kafka's names).

    ``replica_ids``: the followers that count for the high watermark; none (the
    default): the leader alone, HW = its end. ``min_insync_replicas``: acks=all is
    refused with NOT_ENOUGH_REPLICAS while fewer replicas (the leader included) are in
    sync. ``replica_lag_time_max_ms``: a follower that has not reached the leader's
    end (as of its previous fetch) for this long leaves the in-sync set.
    """

    replica_ids: tuple[int, ...] = attrs.field(
        default=(), converter=_int_tuple, validator=attrs.validators.deep_iterable(
            attrs.validators.and_(attrs.validators.instance_of(int), attrs.validators.ge(0))
        ),
    )  # fmt: skip
    min_insync_replicas: int = attrs.field(
        default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)]
    )
    replica_lag_time_max_ms: int = attrs.field(
        default=30_000, validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)]
    )
    #: The embedded ``put`` in the leader's process: "leader" (returns after the local
    #: append) or "all" (returns once the in-sync set holds it, as acks=all).
    embedded_acks: str = attrs.field(
        default="leader", validator=attrs.validators.in_(("leader", "all"))
    )
    #: How long an embedded put waits for the in-sync set in the "all" mode.
    embedded_timeout_ms: int = attrs.field(
        default=30_000, validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)]
    )


class ReplicaSource(Protocol):
    """What the leader needs of its store (MessageStore with mqstore.store_replica)."""

    commitlog: Any

    @property
    def epochs(self) -> LeaderEpochs: ...

    @property
    def is_follower(self) -> bool: ...

    @property
    def replicable_end(self) -> int: ...

    def replica_topics(self) -> bytes: ...

    def wait_for_position(self, position: int, timeout_ms: int) -> bool: ...

    def set_commit_limit(self, limit: Any) -> None: ...

    def wake_dispatch(self) -> None: ...


class FollowerState(NamedTuple):
    """What the leader last heard from one replica.

    ``caught_up_monotonic_s``: the last fetch whose end reached the leader's end as
    of the previous response to it (Kafka's lastCaughtUpTimeMs); -inf: never.
    ``end_sent``: the leader's end in the last response to it (-1: none yet).
    """

    replica_id: int
    log_end: int
    seen_monotonic_s: float
    caught_up_monotonic_s: float = -float("inf")
    end_sent: int = -1


def read_chunk(
    source: ReplicaSource, position: int, max_bytes: int, end: int | None = None
) -> bytes:
    """The bytes a follower at ``position`` gets next (see the module), up to ``end``
    (default: the replicable end now); b"" when it is there.

    Raises:
        OffsetOutOfRangeError: ``position`` is past ``end`` or before the log's
            first file.
        CorruptDataError: the record at ``position`` does not parse.
    """
    assert max_bytes >= 1
    commitlog = source.commitlog
    end_limit = source.replicable_end if end is None else end
    if position > end_limit:
        raise OffsetOutOfRangeError(f"position {position} is past the log's end {end_limit}")
    if position == end_limit:
        return b""
    mapped = commitlog.file_for(position)
    start = mapped.start_offset
    in_file = position - start
    hard_end = min(mapped.size_bytes, end_limit - start)
    out = new_columns(SCAN_ROWS)
    at, taken, last_start, last_end = in_file, 0, in_file, in_file
    closing, closing_before = in_file, in_file  # the ends of the last two group ends
    try:
        while True:
            at, count, status = dispatch_columns(
                mapped.mapping, at, min(in_file + max_bytes, hard_end), mapped.size_bytes,
                hard_end, start, False, out,
            )  # fmt: skip
            if count:
                last_start = int(out[DISPATCH_PHYSICAL, count - 1]) - start
                last_end = last_start + int(out[DISPATCH_SIZE, count - 1])
                closing, closing_before = _group_ends(out, count, start, closing, closing_before)
            taken += count
            if status != DISPATCH_FULL:
                break
        if status == DISPATCH_BLANK:
            if taken and at - in_file > max_bytes:
                at = last_end  # the blank record goes next time, whole
        elif status == DISPATCH_INVALID:
            if at == in_file:
                raise CorruptDataError(mapped.path, in_file, "no record parses where a follower is")
        elif at - in_file > max_bytes and taken > 1:
            at = last_start  # the last record passed the budget: it goes next time
        if taken and at != mapped.size_bytes:  # (a blank taken: the group goes on there)
            group_end = closing if closing <= at else closing_before
            if group_end > in_file:
                at = group_end  # the open group at the cut goes next time, whole
            elif group_end != at:
                at = _group_end(mapped.mapping, at, mapped.size_bytes, hard_end, start, out)
        return bytes(mapped.mapping[in_file:at])
    except ValueError:
        if not mapped.mapping.closed:
            raise
        raise OffsetOutOfRangeError(f"position {position}: removed by retention") from None


def _group_ends(
    out: Any, count: int, start: int, closing: int, closing_before: int
) -> tuple[int, int]:
    """The in-file ends of the last two records that close their group, after a run of
    ``count`` scanned records (``closing``, ``closing_before``: before it)."""
    closed = np.flatnonzero((out[DISPATCH_FLAGS, :count] & FLAG_GROUP_OPEN) == 0)
    ends = [
        int(out[DISPATCH_PHYSICAL, row]) + int(out[DISPATCH_SIZE, row]) - start
        for row in closed[-2:].tolist()
    ]
    if len(ends) == 2:
        return ends[1], ends[0]
    if len(ends) == 1:
        return ends[0], closing
    return closing, closing_before


def _group_end(mapping: Any, at: int, file_size: int, hard_end: int, start: int, out: Any) -> int:
    """Where the group open at in-file ``at`` ends: past the first record that closes
    it, at the file's end (a blank record: it goes on in the next file), or where the
    written records end (it is not whole yet)."""
    while True:
        at, count, status = dispatch_columns(
            mapping, at, hard_end if hard_end < file_size else file_size, file_size,
            hard_end, start, False, out,
        )  # fmt: skip
        if count:
            closed = np.flatnonzero((out[DISPATCH_FLAGS, :count] & FLAG_GROUP_OPEN) == 0)
            if len(closed):
                row = int(closed[0])
                return int(out[DISPATCH_PHYSICAL, row]) + int(out[DISPATCH_SIZE, row]) - start
        if status != DISPATCH_FULL:
            return at


class ReplicaLeader:
    """Answers ReplicaFetch requests for one store and remembers each follower's LEO."""

    def __init__(
        self, source: ReplicaSource, config: ReplicationConfig | None = None, node_id: int = 0
    ) -> None:
        self.source = source
        self.config = config or ReplicationConfig()
        self.node_id = node_id
        self._changed = threading.Condition()  # a follower's LEO moved
        self._followers: dict[int, FollowerState] = {}
        self._high_watermark = 0  # never moves back while this node leads (Kafka's HW)
        self.active = False
        #: Called with a newer epoch a follower named: this node is a stale leader.
        self.on_newer_epoch: Any = None

    def activate(self, high_watermark: int = 0, restarted: bool = False) -> None:
        """Lead: answer followers, and (with followers configured) let readers see
        only what the in-sync set holds. ``high_watermark``: where a promoted
        follower's HW stood, or what a restarted leader's readers saw (it never
        moves back). ``restarted``: the configured followers are presumed in sync at
        ``high_watermark`` until they fetch or ``replica_lag_time_max_ms`` passes, as
        Kafka's in-sync set outlives a leader's restart; without this the leader alone
        would be the set and the HW would jump to its end, past what they hold."""
        now = time.monotonic()
        with self._changed:
            self._followers.clear()
            self._high_watermark = max(0, high_watermark)
            if restarted:
                for replica in self.config.replica_ids:
                    self._followers[replica] = FollowerState(
                        replica, self._high_watermark, now, now
                    )
            self.active = True
        if self.configured:
            self.source.set_commit_limit(self.high_watermark)

    def close(self, lift: bool = True) -> None:
        """Stop leading. ``lift``: lift the commit limit too (the broker stops; the
        store may live on); False: the caller sets another limit (a demotion: its
        tail past the HW may be cut, so readers must not see it meanwhile)."""
        with self._changed:
            was_active, self.active = self.active, False
            self._changed.notify_all()
        if was_active and self.configured and lift:
            self.source.set_commit_limit(None)

    @property
    def configured(self) -> bool:
        """Whether followers count for the high watermark."""
        return bool(self.config.replica_ids)

    def followers(self) -> dict[int, FollowerState]:
        """Each replica's last valid LEO and when it was seen (a copy)."""
        with self._changed:
            return dict(self._followers)

    def in_sync(self) -> list[int]:
        """The configured followers in the in-sync set now (the leader is always in)."""
        now = time.monotonic()
        lag_s = self.config.replica_lag_time_max_ms / 1000
        with self._changed:
            return [
                replica
                for replica in self.config.replica_ids
                if replica in self._followers
                and now - self._followers[replica].caught_up_monotonic_s <= lag_s
            ]

    def high_watermark(self) -> int:
        """min LEO over the in-sync set, the leader's end included; never decreasing;
        and it stands still while the set (the leader included) is below
        min.insync.replicas: readers then see only what that many replicas hold, so
        a follower that was in the set as far as it knows (and may be promoted) holds
        every record a reader saw. Kafka moves the HW with the leader alone, and its
        controller keeps such a follower from being elected; without a controller
        the HW waits instead."""
        end = self.source.replicable_end
        members = self.in_sync()
        if 1 + len(members) < self.config.min_insync_replicas:
            with self._changed:
                return min(self._high_watermark, end)
        with self._changed:
            ends = [self._followers[replica].log_end for replica in members]
            self._high_watermark = max(self._high_watermark, min([end, *ends]))
            return self._high_watermark

    def enough_in_sync(self) -> bool:
        """Whether the in-sync set (the leader included) reaches min.insync.replicas."""
        return 1 + len(self.in_sync()) >= self.config.min_insync_replicas

    def wait_for_high_watermark(self, position: int, timeout_ms: int) -> bool:
        """Block until the HW reaches ``position`` or the timeout passes; whether it
        did. It gives up as soon as the in-sync set falls below min.insync.replicas
        (the HW stands still then; Kafka completes such a wait at once with
        NOT_ENOUGH_REPLICAS_AFTER_APPEND)."""
        deadline = time.monotonic() + timeout_ms / 1000
        while self.high_watermark() < position:
            left_s = deadline - time.monotonic()
            if left_s <= 0 or not self.enough_in_sync():
                return False
            with self._changed:
                self._changed.wait(min(left_s, HW_RECHECK_S))
        return True

    def answer(
        self, request: ReplicaFetchRequest, wait: bool, record: bool = True
    ) -> ReplicaFetchResponse:
        """The response to ``request``; with ``wait``, long-poll (up to its
        max_wait_ms) while there is nothing past the follower's end. ``record``
        False: a later slice of a long poll already recorded (the follower's LEO and
        catch-up time count once per request, as Kafka's lag clock does)."""
        source = self.source
        epochs = source.epochs
        epoch = epochs.current_epoch
        topics, end = self._snapshot(request)
        if not self.active or source.is_follower:
            return self._response(NOT_LEADER_OR_FOLLOWER, request, end, None, b"")
        if request.leader_epoch > epoch:  # a newer leader exists: this one is stale
            log.warning("replica %d names epoch %d > %d: fenced", request.replica_id,
                        request.leader_epoch, epoch)  # fmt: skip
            if self.on_newer_epoch is not None:
                self.on_newer_epoch(request.leader_epoch)
            return self._response(UNKNOWN_LEADER_EPOCH, request, end, None, b"")
        if 0 <= request.leader_epoch < epoch:  # the follower learns the epoch, asks again
            return self._response(FENCED_LEADER_EPOCH, request, end, None, b"")
        diverging = self._diverging(request)
        if diverging is not None:
            return self._response(NONE, request, end, None, b"", diverging=diverging)
        if not source.commitlog.min_position <= request.log_end <= end:
            log.warning(
                "replica %d claims log end %d outside [%d, %d]: refused",
                request.replica_id, request.log_end, source.commitlog.min_position, end,
            )  # fmt: skip
            return self._response(OFFSET_OUT_OF_RANGE, request, end, topics, b"")
        if record:
            self._record(request, end)
        # A follower whose registry is stale is answered at once: its topics are news.
        if wait and request.log_end == end and request.max_wait_ms > 0 and topics is None:
            source.wait_for_position(request.log_end, request.max_wait_ms)
            topics, end = self._snapshot(request)
        next_epoch_start = epochs.next_start_after(request.log_end)
        if next_epoch_start is not None:
            end = min(end, next_epoch_start)  # one epoch per chunk
        try:
            data = read_chunk(source, request.log_end, request.max_bytes, end)
        except OffsetOutOfRangeError:
            return self._response(OFFSET_OUT_OF_RANGE, request, end, topics, b"")
        except CorruptDataError as error:
            log.error("replica %d: cannot send: %s", request.replica_id, error)
            return self._response(KAFKA_STORAGE_ERROR, request, end, topics, b"")
        self._sent(request.replica_id, end)
        return self._response(NONE, request, end, topics, data)

    def _diverging(self, request: ReplicaFetchRequest) -> tuple[int, int] | None:
        """KIP-595's check: (the largest epoch <= the follower's last, where it ends
        here) when the follower's log is not a prefix of this one; else None."""
        source = self.source
        return diverging(
            source.epochs, source.commitlog.write_position, request.last_fetched_epoch,
            request.log_end,
        )  # fmt: skip

    def _snapshot(self, request: ReplicaFetchRequest) -> tuple[bytes | None, int]:
        """(the topic registry if the follower's differs, else None; the replicable
        end). The end is read first: a topic is registered (and grown) before its
        records are appended, so every record before the end has its partition in the
        registry read after. Read the other way, a put between the two reads would send
        a record of a partition the follower's registry lacks."""
        end = self.source.replicable_end
        topics = self.source.replica_topics()
        if not topics or zlib.crc32(topics) == request.topics_crc:
            return None, end  # current, or no registry yet (nothing to adopt)
        return topics, end

    def _record(self, request: ReplicaFetchRequest, end: int) -> None:
        """A valid fetch: the replica's LEO, and whether it caught up (its end reached
        the leader's end as of the previous response to it, or the end now)."""
        now = time.monotonic()
        with self._changed:
            known = self._followers.get(request.replica_id)
            if known is None and len(self._followers) >= REPLICAS_MAX:
                return
            caught_up = -float("inf") if known is None else known.caught_up_monotonic_s
            end_sent = -1 if known is None else known.end_sent
            if request.log_end == end or 0 <= end_sent <= request.log_end:
                caught_up = now
            self._followers[request.replica_id] = FollowerState(
                request.replica_id, request.log_end, now, caught_up, end_sent
            )
            self._changed.notify_all()
        if self.configured and request.replica_id in self.config.replica_ids:
            self.source.wake_dispatch()  # the HW may have moved: expose up to it

    def _sent(self, replica_id: int, end: int) -> None:
        with self._changed:
            known = self._followers.get(replica_id)
            if known is not None:
                self._followers[replica_id] = known._replace(end_sent=end)

    def _response(
        self, error: int, request: ReplicaFetchRequest, end: int, topics: bytes | None,
        data: bytes, diverging: tuple[int, int] = (UNDEFINED, UNDEFINED),
    ) -> ReplicaFetchResponse:  # fmt: skip
        epochs = self.source.epochs
        high_watermark = min(self.high_watermark(), end)
        data_epoch = epochs.epoch_at(request.log_end)
        return ReplicaFetchResponse(
            error_code=error, leader_epoch=epochs.current_epoch, leader_node_id=self.node_id,
            high_watermark=high_watermark, log_end=end,
            log_start=self.source.commitlog.min_position, position=request.log_end,
            diverging_epoch=diverging[0], diverging_end=diverging[1],
            data_epoch=data_epoch.epoch, data_epoch_start=data_epoch.start, topics=topics,
            data=data,
        )  # fmt: skip
