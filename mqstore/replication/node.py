"""A replica node: one store that is either the leader or a follower, and the moves
between the two (promotion, demotion), with leader epochs.

Roles (persisted in the store's epoch file, mqstore.replication.epochs):

- **Leader.** Every time a node starts leading (at start, or promoted) it takes a
  new epoch past every one it has seen and records it durably before it takes a
  write: a leader that restarted after losing its unflushed tail must not write new
  records under the epoch whose records a follower still holds (KIP-101's second
  scenario; Kafka's controller bumps the epoch on every election). It answers
  ReplicaFetch (mqstore.replication.leader).
- **Follower** of ``HOST:PORT``: it refuses local writes and copies the leader's log
  (mqstore.replication.fetcher), truncating where its log diverged; its readers see
  records up to the leader's HW as last heard.

Moves:

- ``promote(unclean)`` (``mqstore promote``): a follower in the in-sync set, as far
  as it knows (it holds the last HW it heard and had caught up within
  replica.lag.time.max.ms of its last contact), stops fetching and leads with a new
  epoch. Out of the set it is refused unless ``unclean``, and the answer says how
  many bytes the old leader had that this node lacks, as last heard. There is no
  election here: an operator or orchestrator promotes (issue 18).
- The promoted node then tells its former leader (the address it followed) the new
  epoch and its own address, again every ``NOTICE_INTERVAL_S`` until the former
  leader answers (it may be stopped, dead or cut off now, and come back later).
- ``leader_change`` (that notice): a node told of a newer epoch becomes a follower
  of the sender, durably, and its fetcher truncates its divergent tail. An older or
  equal epoch gets FENCED_LEADER_EPOCH.
- A leader that learns of a newer epoch from a follower's request stops taking
  writes at once (NOT_LEADER_OR_FOLLOWER) and waits for the notice.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any, Final

from mqstore.commitlog.errors import ConfigError, NotEnoughReplicasError, ReplicationTimeoutError
from mqstore.replication.epochs import EPOCH_NODES
from mqstore.replication.fetcher import ReplicaFetcher
from mqstore.replication.leader import (
    FENCED_LEADER_EPOCH,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    ReplicaLeader,
    ReplicationConfig,
)
from mqstore.replication.protocol import (
    FRAME_SIZE,
    LeaderChange,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ReplicationProtocolError,
    decode_control_response,
    encode_leader_change,
)

__all__ = ["INELIGIBLE_REPLICA", "ReplicaNode", "control_request", "parse_address"]

log = logging.getLogger(__name__)

#: Kafka's code for a replica that may not become leader (KIP-966).
INELIGIBLE_REPLICA: Final = 107
INVALID_REQUEST: Final = 42
#: How often a promoted node repeats its notice to its former leader.
NOTICE_INTERVAL_S: Final = 1.0
CONTROL_TIMEOUT_S: Final = 10.0
#: A notice's connect and answer timeout (short: a close waits for it).
NOTICE_TIMEOUT_S: Final = 2.0
#: The largest control response accepted.
CONTROL_RESPONSE_BYTES_MAX: Final = 64 << 10


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9092`` for IPv6) as (host, port).

    Raises:
        ConfigError: not HOST:PORT with a port from 0 to 65535.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65_535:
        raise ConfigError(f"{address!r}: expected HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port_text)


def control_request(host: str, port: int, frame: bytes, timeout_s: float) -> bytes:
    """Send one framed control request and return the response payload.

    Raises:
        OSError: no connection, or it broke.
        ReplicationProtocolError: a response frame out of bounds.
    """
    with socket.create_connection((host, port), timeout_s) as connection:
        connection.settimeout(timeout_s)
        connection.sendall(frame)
        head = _read_exactly(connection, FRAME_SIZE.size)
        (size,) = FRAME_SIZE.unpack(head)
        if not 0 <= size <= CONTROL_RESPONSE_BYTES_MAX:
            raise ReplicationProtocolError(f"a control response of {size} bytes")
        return _read_exactly(connection, size)


def _read_exactly(connection: socket.socket, size: int) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = connection.recv(size - got)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class ReplicaNode:
    """The replication role of one store served by one broker (thread-safe)."""

    def __init__(
        self, store: Any, config: ReplicationConfig | None = None, *, node_id: int = 0
    ) -> None:
        if not 0 <= node_id < EPOCH_NODES:
            raise ConfigError(f"a replicated node's id is 0 to {EPOCH_NODES - 1}, not {node_id}")
        self.store = store
        self.config = config or ReplicationConfig()
        self.node_id = node_id
        self.leader = ReplicaLeader(store, self.config, node_id)
        self.leader.on_newer_epoch = self._fenced
        self.fetcher: ReplicaFetcher | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._notice: threading.Thread | None = None
        self._fetcher_max_bytes: int | None = None
        #: Called when this node starts leading, before it takes a write (the broker
        #: rebuilds its idempotent producers' state from the log).
        self.on_lead: Callable[[], None] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self, host: str, port: int, follow: str | None = None) -> None:
        """Take the role: follower of ``follow`` if given, else what the store
        recorded (a demoted node stays a follower), else leader with a new epoch.
        ``host``/``port``: this broker's address, for the notices it sends."""
        self.host, self.port = host, port
        epochs = self.store.epochs
        with self._lock:
            if follow is not None:
                self._follow(follow, None)
            elif epochs.role == "follower" and epochs.leader:
                log.info("the store follows %s (recorded at its demotion)", epochs.leader)
                self._follow(epochs.leader, None)
            else:  # a store opened to lead followers was held at what they held
                held = getattr(self.store, "held_at_open", None)
                self._lead(high_watermark=held or 0, restarted=held is not None)

    def close(self) -> None:
        """Stop the fetcher and the notices, and stop leading (the store stays open)."""
        self._stop.set()
        with self._lock:
            fetcher, self.fetcher = self.fetcher, None
        if fetcher is not None:
            fetcher.stop()
        if self._notice is not None:
            self._notice.join(NOTICE_TIMEOUT_S + 1)
        self.leader.close()
        self.store.set_replicated_wait(None)
        if self.store.is_follower:
            self.store.set_commit_limit(None)

    # ------------------------------------------------------------------ state

    @property
    def role(self) -> str:
        return "follower" if self.fetcher is not None else "leader"

    @property
    def leader_address(self) -> tuple[int, str, int] | None:
        """(node id, host, port) of the partition leader as this node knows it; None
        while a follower has not heard from its leader yet."""
        fetcher = self.fetcher
        if fetcher is None:
            return self.node_id, self.host, self.port
        if fetcher.leader_node_id < 0:
            return None
        return fetcher.leader_node_id, fetcher.host, fetcher.port

    @property
    def epoch(self) -> int:
        return int(self.store.epochs.current_epoch)

    def answer_fetch(
        self, request: ReplicaFetchRequest, wait: bool, record: bool = True
    ) -> ReplicaFetchResponse:
        """A ReplicaFetch: the leader answers; a follower refuses (NOT_LEADER_OR_FOLLOWER)."""
        return self.leader.answer(request, wait, record)

    # ------------------------------------------------------------------ moves

    def promote(self, unclean: bool = False) -> tuple[int, int, str]:
        """Make this follower the leader (see the module); (error code, epoch, message)."""
        with self._lock:
            fetcher = self.fetcher
            if fetcher is None:
                return INVALID_REQUEST, self.epoch, "this node is the leader already"
            in_sync = fetcher.in_sync(self.config.replica_lag_time_max_ms)
            end = self.store.commitlog.write_position
            behind = max(0, fetcher.leader_log_end - end)
            if not in_sync and not unclean:
                return INELIGIBLE_REPLICA, self.epoch, (
                    f"not in the in-sync set as far as it knows (end {end}, last HW heard "
                    f"{fetcher.high_watermark}, leader's end {fetcher.leader_log_end}): "
                    "promote with --unclean to accept losing what only the leader has"
                )  # fmt: skip
            former = self.store.epochs.leader
            fetcher.stop()
            high_watermark = min(max(fetcher.high_watermark, 0), end)
            epoch = self._lead(high_watermark)
            # Metadata names this node the leader only now: every record it holds is
            # readable (a consumer sent here early would find its offset past the end).
            self.fetcher = None
            message = f"leader at epoch {epoch} from log end {end}"
            if unclean and not in_sync:
                message += (
                    f"; unclean: the former leader had at least {behind} bytes this node "
                    "lacks (as last heard), which are lost"
                )
            log.warning("promoted: %s", message)
            if former:
                self._start_notices(former, epoch)
            return NONE, epoch, message

    def leader_change(self, change: LeaderChange) -> tuple[int, int]:
        """A newly promoted leader's notice: follow it if its epoch is newer."""
        with self._lock:
            epochs = self.store.epochs
            if change.leader_epoch <= epochs.current_epoch and not (
                change.leader_epoch == epochs.current_epoch and self.fetcher is None
                and not self.leader.active
            ):  # fmt: skip
                return FENCED_LEADER_EPOCH, epochs.current_epoch
            address = f"{change.host}:{change.port}"
            log.warning("epoch %d: %s (node %d) leads; following it",
                        change.leader_epoch, address, change.leader_node_id)  # fmt: skip
            self._follow(address, change.leader_epoch)
            return NONE, change.leader_epoch

    def _fenced(self, epoch: int) -> None:
        """A follower named a newer epoch: another node leads. Stop taking writes."""
        with self._lock:
            if self.store.epochs.see_epoch(epoch) and self.fetcher is None:
                store = self.store
                shown = store.dispatched_position  # readers see no more until it follows
                store.set_commit_limit(lambda: shown)
                self.leader.close(lift=False)
                store.become_follower()  # NOT_LEADER_OR_FOLLOWER until a notice

    def _lead(self, high_watermark: int, restarted: bool = False) -> int:
        store = self.store
        open_group = store.commitlog.open_group_start
        if open_group is not None:  # half a producer's batch: its retry must not add to it
            log.warning("node %d drops an append group cut short at %d", self.node_id, open_group)
            store.truncate_replica(open_group)
        epoch: int = store.epochs.begin_leadership(store.commitlog.write_position, self.node_id)
        if not (restarted and self.leader.configured):  # else held until the HW moves
            store.set_commit_limit(None)
        # State derived from the log (committed offsets, producer state) is rebuilt
        # from all of it before the first write is taken.
        reload = getattr(store, "reload_offsets", None)
        if reload is not None:
            reload()
        if self.on_lead is not None:
            self.on_lead()
        store.become_leader()
        self.leader.activate(high_watermark, restarted)
        if self.config.embedded_acks == "all":
            store.set_replicated_wait(self._wait_replicated)
        log.info("node %d leads at epoch %d", self.node_id, epoch)
        return epoch

    def _wait_replicated(self, end: int) -> None:
        """The embedded put in the replicated sync mode: as acks=all."""
        leader = self.leader
        if not leader.configured:
            return
        if not leader.enough_in_sync():
            raise NotEnoughReplicasError(
                f"{1 + len(leader.in_sync())} replicas in sync, "
                f"min.insync.replicas is {self.config.min_insync_replicas}: the put is in "
                "the leader's log but not acknowledged"
            )
        passed = leader.wait_for_high_watermark(end, self.config.embedded_timeout_ms)
        if not leader.enough_in_sync():  # the HW also moves when a follower leaves
            raise NotEnoughReplicasError(
                "a replica left the in-sync set while the put waited: it is in the "
                "leader's log but not acknowledged"
            )
        if not passed:
            raise ReplicationTimeoutError(
                f"the in-sync replicas did not reach {end} within "
                f"{self.config.embedded_timeout_ms} ms: not acknowledged"
            )

    def _follow(self, address: str, epoch: int | None) -> None:
        host, port = parse_address(address)
        store = self.store
        store.set_replicated_wait(None)
        old = self.fetcher
        if old is not None:
            old.stop()
        kwargs = {} if self._fetcher_max_bytes is None else {"max_bytes": self._fetcher_max_bytes}
        fetcher = ReplicaFetcher(store, host, port, replica_id=self.node_id, **kwargs)
        if epoch is not None:
            fetcher.leader_epoch = epoch
        # The follower's limit first (what readers see now), then the leader's goes:
        # lifting it between the two exposed the tail a divergence check then cut
        # (the chaos suite saw a consumer read a record the new leader never had).
        store.set_commit_limit(fetcher.commit_limit)
        self.leader.close(lift=False)
        store.become_follower()
        store.epochs.follow(address, epoch)
        self.fetcher = fetcher.start()

    # ------------------------------------------------------------------ notices

    def _start_notices(self, former: str, epoch: int) -> None:
        change = LeaderChange(epoch, self.node_id, self.host, self.port)
        thread = threading.Thread(
            target=self._notify, args=(former, change), name="replica-notice", daemon=True
        )
        self._notice = thread
        thread.start()

    def _notify(self, former: str, change: LeaderChange) -> None:
        """Tell ``former`` of the new epoch until it answers (or this node stops
        leading at that epoch)."""
        host, port = parse_address(former)
        correlation_id = 0
        while not self._stop.is_set() and self.epoch == change.leader_epoch:
            correlation_id += 1
            try:
                payload = control_request(
                    host, port, encode_leader_change(change, correlation_id), NOTICE_TIMEOUT_S
                )
                _, error, their_epoch = decode_control_response(payload)
            except (OSError, ReplicationProtocolError) as error_:
                log.debug("notice to %s: %s", former, error_)
            else:
                if error == FENCED_LEADER_EPOCH and their_epoch > change.leader_epoch:
                    # The former leader leads at a newer epoch (it restarted past this
                    # one): the larger epoch wins, and this node follows it.
                    log.warning("%s leads at epoch %d > %d: stepping down",
                                former, their_epoch, change.leader_epoch)  # fmt: skip
                    self.leader_change(LeaderChange(their_epoch, 0, host, port))
                    return
                if error in (NONE, FENCED_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER):
                    log.info("%s knows epoch %d (answer %d, its epoch %d)",
                             former, change.leader_epoch, error, their_epoch)  # fmt: skip
                    return
            self._stop.wait(NOTICE_INTERVAL_S)
