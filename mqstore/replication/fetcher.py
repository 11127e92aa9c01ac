"""The follower's fetcher: one thread that copies the leader's CommitLog from its own end.

Loop: connect to the leader's broker, then send ReplicaFetch (mqstore.replication.
protocol) with this store's end (its LEO), adopt the topic registry when the leader
sends one, and append the bytes at that end (``append_replica``, which verifies
every record before writing). One request is in flight at a time, so the follower's
end in each request is exactly what it holds.

Failures: a connection that breaks, times out or sends a frame that does not decode
is closed and re-opened after a back-off that doubles from ``backoff_ms_min`` to
``backoff_ms_max`` (reset by every good response); an error code from the leader,
and a chunk the store refuses (CorruptDataError, ReplicaPositionError), are logged and
retried the same way: nothing is written from a refused chunk, and the next request
asks again from the same end. Nothing here raises out of the thread; ``last_error``
says what went wrong last.

Leader epochs (mqstore.replication.epochs): every request carries the epoch of the
store's last records; a leader whose log is not a superset answers with the point of
divergence, and the store truncates there durably (``truncate_replica``) before the
next fetch (KIP-279's loop: ask again until the epochs agree). A chunk's epoch is
recorded before its bytes land. FENCED_LEADER_EPOCH (this fetcher named an older
epoch) adopts the leader's and asks again at once.

Follower reads up to the HW: ``commit_limit`` is what the store's dispatcher may
expose, the leader's HW as last heard, clamped to the store's end, and never below
what was exposed when the fetcher started.

Crash policy: the fetcher keeps no state of its own. After a crash the store
recovers its CommitLog to the last whole record and the fetcher resumes from there.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import zlib
from typing import Any, Final

from mqstore.commitlog.errors import StoreError
from mqstore.replication.epochs import UNDEFINED, truncation_point
from mqstore.replication.protocol import (
    FRAME_SIZE,
    REPLICA_FETCH_BYTES_DEFAULT,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ReplicationProtocolError,
    decode_response,
    encode_request,
)

__all__ = ["ReplicaFetcher"]

log = logging.getLogger(__name__)

#: The long poll each request asks for: short, so stop() is prompt.
FETCH_WAIT_MS: Final = 500
#: A response must arrive within the long poll plus this (else the connection is dead).
RESPONSE_GRACE_S: Final = 30.0
CONNECT_TIMEOUT_S: Final = 5.0
#: The largest response frame accepted: max_bytes plus one record (4 MiB) and topics.
RESPONSE_BYTES_SLACK: Final = 16 << 20
#: Kafka's codes the fetcher acts on.
OFFSET_OUT_OF_RANGE: Final = 1
FENCED_LEADER_EPOCH: Final = 74


class ReplicaFetcher:
    """Copies the leader at ``host:port`` into ``store`` (a follower MessageStore)."""

    def __init__(
        self,
        store: Any,
        host: str,
        port: int,
        *,
        replica_id: int = 1,
        max_bytes: int = REPLICA_FETCH_BYTES_DEFAULT,
        backoff_ms_min: int = 100,
        backoff_ms_max: int = 5_000,
    ) -> None:
        assert replica_id >= 0
        assert max_bytes >= 1
        assert 0 < backoff_ms_min <= backoff_ms_max
        self.store = store
        self.host = host
        self.port = port
        self.replica_id = replica_id
        self.max_bytes = max_bytes
        self.backoff_ms_min = backoff_ms_min
        self.backoff_ms_max = backoff_ms_max
        self.leader_log_end = -1  # the leader's end in its last response
        self.high_watermark = -1
        self.leader_epoch = UNDEFINED  # the leader's epoch in its last response
        self.leader_node_id = -1
        self.truncations = 0
        self.bytes_truncated = 0
        #: Monotonic times: the last good response, and the last one after which this
        #: store held the leader's end as of the response before (Kafka's
        #: lastCaughtUpTimeMs, seen from the follower); -inf: never.
        self.last_contact_s = -float("inf")
        self.caught_up_s = -float("inf")
        self._previous_leader_end = -1
        self._exposed = int(getattr(store, "dispatched_position", 0))
        self.bytes_copied = 0
        self.last_error: str | None = None
        self.connects = 0
        self._stop = threading.Event()
        self._socket: socket.socket | None = None
        self._socket_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._correlation_id = 0
        self._topics_crc = zlib.crc32(store.replica_topics())

    def start(self) -> ReplicaFetcher:
        assert self._thread is None, "a fetcher starts once"
        self._thread = threading.Thread(target=self._run, name="replica-fetcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (idempotent); a request in flight is cut short."""
        self._stop.set()
        self._close_socket()
        if self._thread is not None:
            self._thread.join(FETCH_WAIT_MS / 1000 + RESPONSE_GRACE_S)

    def in_sync(self, lag_time_max_ms: int) -> bool:
        """Whether this follower was in the leader's in-sync set as far as it knows:
        it holds the last HW it heard, and it had caught up within
        ``lag_time_max_ms`` before its last contact with the leader."""
        end = self.store.commitlog.write_position
        return (
            self.last_contact_s > -float("inf")
            and end >= self.high_watermark
            and self.last_contact_s - self.caught_up_s <= lag_time_max_ms / 1000
        )

    def commit_limit(self) -> int:
        """What the follower's readers may see: up to the leader's HW as last heard
        (a record boundary of this log once clamped to its end), never less than
        what was exposed before."""
        end = self.store.commitlog.write_position
        limit = min(self.high_watermark, end)
        if limit > self._exposed:
            self._exposed = limit
        return min(self._exposed, end)

    def _run(self) -> None:
        backoff_ms = self.backoff_ms_min
        while not self._stop.is_set():
            try:
                self._connect()
                while not self._stop.is_set():
                    self._fetch_once()
                    backoff_ms = self.backoff_ms_min
            except (OSError, ReplicationProtocolError, StoreError) as error:
                if self._stop.is_set():
                    break
                self.last_error = f"{type(error).__name__}: {error}"
                log.warning(
                    "replication from %s:%d: %s; again in %d ms",
                    self.host, self.port, self.last_error, backoff_ms,
                )  # fmt: skip
            self._close_socket()
            self._stop.wait(backoff_ms / 1000)
            backoff_ms = min(backoff_ms * 2, self.backoff_ms_max)

    def _connect(self) -> None:
        connection = socket.create_connection((self.host, self.port), CONNECT_TIMEOUT_S)
        connection.settimeout(FETCH_WAIT_MS / 1000 + RESPONSE_GRACE_S)
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._socket_lock:
            if self._stop.is_set():
                connection.close()
                return
            self._socket = connection
        self.connects += 1
        log.info("replicating from %s:%d (replica %d)", self.host, self.port, self.replica_id)

    def _fetch_once(self) -> None:
        connection = self._socket
        if connection is None:
            raise ConnectionError("not connected")
        position = self.store.commitlog.write_position
        request = ReplicaFetchRequest(
            replica_id=self.replica_id, leader_epoch=self.leader_epoch,
            last_fetched_epoch=self.store.epochs.latest_epoch, log_end=position,
            max_bytes=self.max_bytes, max_wait_ms=FETCH_WAIT_MS, topics_crc=self._topics_crc,
        )  # fmt: skip
        self._correlation_id = (self._correlation_id + 1) & 0x7FFF_FFFF
        connection.sendall(encode_request(request, self._correlation_id))
        correlation_id, response = decode_response(self._read_frame(connection))
        if correlation_id != self._correlation_id:
            raise ReplicationProtocolError(
                f"response {correlation_id} to request {self._correlation_id}"
            )
        self._apply(position, response)

    def _apply(self, position: int, response: ReplicaFetchResponse) -> None:
        store = self.store
        if response.error_code == FENCED_LEADER_EPOCH:
            log.info("the leader is at epoch %d (this follower knew %d)",
                     response.leader_epoch, self.leader_epoch)  # fmt: skip
            self._adopt_epoch(response)
            return  # asks again at once, with the leader's epoch
        if response.error_code == OFFSET_OUT_OF_RANGE and position < response.log_start:
            # The leader's retention removed what this log would copy next: start
            # again at the leader's first file (Kafka's truncateFullyAndStartAt).
            log.warning("the leader's log starts at %d, past this log's end %d: "
                        "starting again there", response.log_start, position)  # fmt: skip
            store.restart_replica_at(response.log_start)
            self._exposed = response.log_start
            self.high_watermark = -1
            self.truncations += 1
            return
        if response.error_code:
            raise ReplicationProtocolError(
                f"the leader answered error {response.error_code} at {position} "
                f"(its end: {response.log_end})"
            )
        if response.position != position:
            raise ReplicationProtocolError(f"data for {response.position}, asked for {position}")
        self._adopt_epoch(response)
        if response.diverging_epoch != UNDEFINED or response.diverging_end != UNDEFINED:
            self._truncate(position, response)
            return
        if response.topics is not None:
            store.apply_replica_topics(response.topics)
            self._topics_crc = zlib.crc32(response.topics)
        if response.data:
            store.epochs.learn(response.data_epoch, response.data_epoch_start)
            store.append_replica(position, response.data)
            self.bytes_copied += len(response.data)
        if response.log_start > store.commitlog.min_position:
            store.follow_log_start(response.log_start)  # the leader's retention
        now = time.monotonic()
        end = store.commitlog.write_position
        if end >= response.log_end or 0 <= self._previous_leader_end <= position:
            self.caught_up_s = now
        self.last_contact_s = now
        self._previous_leader_end = response.log_end
        self.leader_log_end = response.log_end
        self.high_watermark = response.high_watermark
        self.last_error = None

    def _adopt_epoch(self, response: ReplicaFetchResponse) -> None:
        self.leader_epoch = response.leader_epoch
        self.leader_node_id = response.leader_node_id
        self.store.epochs.see_epoch(response.leader_epoch)

    def _truncate(self, position: int, response: ReplicaFetchResponse) -> None:
        """The leader says this log diverged: cut it where KIP-279 says (the smaller
        of the leader's and this log's end for the largest common epoch)."""
        store = self.store
        epoch, leader_end = response.diverging_epoch, response.diverging_end
        if epoch == UNDEFINED or leader_end < 0:
            raise ReplicationProtocolError(
                f"the leader shares no epoch with this log (its answer: {epoch}, {leader_end})"
            )
        target = truncation_point(store.epochs, position, epoch, leader_end)
        log.warning(
            "diverged from the leader (epoch %d ends at %d there): truncating %d -> %d",
            epoch, leader_end, position, target,
        )  # fmt: skip
        cut = store.truncate_replica(target)
        reload = getattr(store, "reload_offsets", None)
        if reload is not None:  # committed offsets come from the log: cut with it
            reload()
        self._exposed = min(self._exposed, target)
        self.high_watermark = -1  # a new HW comes with the next response
        self.truncations += 1
        self.bytes_truncated += cut

    def _read_frame(self, connection: socket.socket) -> bytearray:
        (size,) = FRAME_SIZE.unpack(_read_exactly(connection, FRAME_SIZE.size))
        if not 0 <= size <= self.max_bytes + RESPONSE_BYTES_SLACK:
            raise ReplicationProtocolError(f"a response frame of {size} bytes")
        return _read_exactly(connection, size)

    def _close_socket(self) -> None:
        with self._socket_lock:
            connection, self._socket = self._socket, None
        if connection is not None:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the peer
            connection.close()


def _read_exactly(connection: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        count = connection.recv_into(view[got:])
        if count == 0:
            raise ConnectionError("the leader closed the connection")
        got += count
    return buffer
