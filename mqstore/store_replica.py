"""The store's part in replication: a follower's copy of its leader's CommitLog.

A follower store (``become_follower``) refuses every local write with
``NotLeaderError`` (Kafka's NOT_LEADER_OR_FOLLOWER) and takes only bytes copied from
its leader's CommitLog (``append_replica``), at its own write position and verified
record by record (commitlog/replica.py). Its dispatcher builds the ConsumeQueues,
the index and the queue-offset counters from those bytes as from local appends, and
its flush and checkpoint run unchanged, so a follower's reads (``get``,
``query_by_key``, ``offset_for_time``, the Kafka-style consumer) answer as the
leader's. Topic metadata is not in the log: the leader sends its registry file's
bytes (``replica_topics``) and the follower adopts them (``apply_replica_topics``)
before the records that need them.

The leader's side: ``replicable_end`` is where a follower may copy up to (in
sync-flush mode only durable bytes), ``wait_for_position`` long-polls for bytes past
a follower's end, and ``set_commit_limit`` holds what readers see below the high
watermark (RocketMQ 5's confirmOffset) when followers count.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from mqstore.commitlog.errors import IllegalStateError, StoreClosedError
from mqstore.replication.epochs import LeaderEpochs

if TYPE_CHECKING:
    from mqstore.commitlog.checkpoint import Checkpoint, CheckpointFile
    from mqstore.commitlog.commitlog import CommitLog
    from mqstore.consumequeue.queue_store import ConsumeQueueStore
    from mqstore.dispatch.dispatcher import Dispatcher
    from mqstore.indexfile.index_service import IndexService
    from mqstore.topics import TopicRegistry

__all__ = ["ReplicaStore"]

#: A wait_for_position poll when the store has no dispatcher (never on a writer).
POLL_S = 0.001


class ReplicaStore:
    """Mixed into MessageStore: the follower's and the leader's replication calls."""

    root: str
    read_only: bool
    commitlog: CommitLog
    topics: TopicRegistry
    consume_queues: ConsumeQueueStore
    index: IndexService
    _dispatcher: Dispatcher | None
    _put_topics: dict[str, int]
    _closed: bool
    _checkpoint: Checkpoint
    _checkpoint_file: CheckpointFile | None
    _checkpoint_guard: threading.Lock
    held_at_open: int | None  # MessageStore's: set by _hold_at_open
    _commit_limited = False  # set_commit_limit gave a limit
    _epochs: LeaderEpochs | None = None
    #: The replicated sync mode (set_replicated_wait): called with the log end after
    #: each embedded put; None: puts return after the local append.
    _replicated_wait: Callable[[int], None] | None = None

    def set_replicated_wait(self, wait: Callable[[int], None] | None) -> None:
        """The leader's replicated sync mode: after each embedded put (``put``,
        ``put_batch``, ``put_batch_arrays``, ``put_batch_buffers``; not the broker's
        appends, which wait per acks), ``wait(log end)`` returns once the in-sync
        replicas hold the put, or raises NotEnoughReplicasError or
        ReplicationTimeoutError (mqstore.replication.node sets it)."""
        self._replicated_wait = wait
        self._put_path_changed()

    if TYPE_CHECKING:  # MessageStore's (its other mixins'): typed here, defined there

        def _put_path_changed(self) -> None: ...  # put's C path on or off
        def _after_batch(self) -> None: ...  # backpressure on dispatch
        def _write_checkpoint(self, derived: bool = False, opening: bool = False) -> None: ...
        def _after_retention(self, min_position: int) -> None: ...

    def _hold_at_open(self, checkpoint: Checkpoint | None, replicated: bool) -> int | None:
        """At a writer's open, what readers may see before replication says more
        (``held_at_open``; None: no hold).

        A store its epoch file records as a follower (mqstore.replication.node) stays
        one: local writes are refused, and its readers see no more than they saw
        before (the dispatched position of the last checkpoint) until its fetcher
        hears a HW again. A store opened to lead followers (``replicated``) is held
        the same way: after a crash its log may end past what its followers hold,
        and a follower promoted meanwhile would cut that tail after readers saw it
        (Kafka restores the HW from a checkpoint for this). What the last checkpoint
        recorded as readable was at most the HW then; the node's HW starts there
        (and the followers are presumed in sync there until they fetch or lag:
        ``ReplicaLeader.activate``). A log that ends there is not held."""
        follower = self.epochs.role == "follower"
        if not follower and not replicated:
            return None
        if follower:
            self.commitlog.set_follower(True)
            self._put_topics.clear()
        shown = 0 if checkpoint is None else checkpoint.dispatched_position
        shown = min(shown, self.commitlog.write_position)
        if not follower and shown == self.commitlog.write_position:
            return None  # nothing past what readers saw: nothing to hold
        self.set_commit_limit(lambda: shown)
        self.held_at_open = shown
        # Recovery counted the records past the checkpoint's flushed position; those
        # between the hold and it are in no ConsumeQueue until the hold lifts.
        self.commitlog.count_queues_from(shown)
        return shown

    def follow_log_start(self, log_start: int) -> int:
        """A follower runs no retention of its own: it deletes the files wholly below
        its leader's log start (heard with every fetch), so both keep the same
        records; returns how many files were deleted."""
        self._check_replica_open()
        commitlog = self.commitlog
        deleted = 0
        while True:
            files = commitlog.files()
            if len(files) < 2 or files[1].start_offset > log_start:
                break
            if commitlog.delete_oldest_file() is None:
                break
            deleted += 1
        if deleted:
            self._after_retention(commitlog.min_position)
        return deleted

    @property
    def epochs(self) -> LeaderEpochs:
        """The leader epochs and role (mqstore.replication.epochs), loaded on first use;
        entries past the log's end (lost in a crash) are dropped then."""
        epochs = self._epochs
        if epochs is None:
            epochs = LeaderEpochs(self.root, self.read_only)
            epochs.drop_past(self.commitlog.write_position)
            self._epochs = epochs
        return epochs

    def restart_replica_at(self, position: int) -> None:
        """Drop a follower's whole log and everything derived from it, and start it
        again at ``position``: its leader's first file, when the leader's retention
        removed the records this follower would copy next (Kafka's
        truncateFullyAndStartAt). The checkpoint is lowered to 0 first, so a crash
        in between recovers a prefix of the old log, or an empty one.

        Raises:
            IllegalStateError: not a follower, or ``position`` not past the log's end.
        """
        self._check_replica_open()
        commitlog, dispatcher = self.commitlog, self._dispatcher
        if not commitlog.is_follower or dispatcher is None or self._checkpoint_file is None:
            raise IllegalStateError("only a follower's writer store restarts its log")
        with self._checkpoint_guard, dispatcher.truncating() as rewind:
            self._checkpoint = self._checkpoint_file.store(
                attrs.evolve(self._checkpoint, flushed_position=0, dispatched_position=0)
            )
            self.epochs.clear()
            commitlog.restart_replica_at(position)
            self.consume_queues.truncate_beyond(0)
            self.index.truncate_beyond(0)
            rewind(position, exactly=True)
        self._write_checkpoint(derived=True)

    def truncate_replica(self, position: int) -> int:
        """Cut a follower's log at ``position`` (its divergence point from the
        leader) with everything derived from it, durably; returns the bytes cut.

        Order, so a crash at any step leaves a log the next divergence check cuts
        again and nothing stale comes back (apache/rocketmq#10666, #7689):
        1. the checkpoint is lowered to the cut (recovery never trusts past it);
        2. the epoch entries past the cut are dropped;
        3. the CommitLog is cut and synced (files past it deleted, the rest zeroed);
        4. ConsumeQueue units and index entries at or past the cut are removed, the
           queue-offset table is rebuilt, and dispatch resumes from the cut;
        5. a new checkpoint is written with the derived files flushed.

        Raises:
            IllegalStateError: the store is not a follower.
            OffsetOutOfRangeError: ``position`` is past the end or before the first file.
        """
        self._check_replica_open()
        commitlog, dispatcher = self.commitlog, self._dispatcher
        if not commitlog.is_follower or dispatcher is None or self._checkpoint_file is None:
            raise IllegalStateError("only a follower's writer store truncates its log")
        if position == commitlog.write_position:
            # Nothing to cut, but an epoch that starts here and wrote nothing here
            # goes (a leader restarted and took it): else the same answer comes back.
            self.epochs.truncate_from(position)
            return 0
        with self._checkpoint_guard, dispatcher.truncating() as rewind:
            derived_end = dispatcher.position
            checkpoint = self._checkpoint
            self._checkpoint = self._checkpoint_file.store(
                attrs.evolve(
                    checkpoint,
                    flushed_position=min(checkpoint.flushed_position, position),
                    dispatched_position=min(checkpoint.dispatched_position, position),
                )
            )
            self.epochs.truncate_from(position)
            cut = commitlog.truncate_replica(position, derived_end)
            self.consume_queues.truncate_beyond(position)
            self.index.truncate_beyond(position)
            rewind(position)
        self._write_checkpoint(derived=True)
        return cut

    def become_follower(self) -> None:
        """Refuse local writes from now on (NotLeaderError) and take replicated bytes."""
        self._check_replica_open()
        self.commitlog.set_follower(True)
        self._put_topics.clear()  # put's fast path must not skip the refusal

    def become_leader(self) -> None:
        """Take local writes again (a promotion: the caller recorded a new epoch
        first, mqstore.replication.epochs)."""
        self._check_replica_open()
        self.commitlog.set_follower(False)

    @property
    def is_follower(self) -> bool:
        return self.commitlog.is_follower

    @property
    def dispatched_position(self) -> int:
        """Every record before this physical offset is readable (0: no dispatcher)."""
        dispatcher = self._dispatcher
        return 0 if dispatcher is None else dispatcher.position

    def append_replica(self, position: int, data: bytes | bytearray | memoryview) -> int:
        """Append bytes of the leader's CommitLog at physical ``position`` (see
        ``CommitLog.append_replica``); returns the new end of the log.

        Raises:
            ReplicaPositionError: ``position`` is not this log's end.
            CorruptDataError: ``data`` is not whole, valid records; nothing is written.
            IllegalStateError: the store is not a follower.
        """
        self._check_replica_open()
        end = self.commitlog.append_replica(position, data)
        self._after_batch()  # a follower catching up cannot outrun its dispatcher
        return end

    def replica_topics(self) -> bytes:
        """The topic registry's bytes, for a follower (b"": no topic yet), with every
        topic ``put`` grew."""
        self.topics.try_persist_pending()
        return self.topics.raw()

    def apply_replica_topics(self, raw: bytes) -> None:
        """Adopt the leader's topic registry (``replica_topics`` bytes).

        Raises:
            CorruptDataError: ``raw`` does not validate; nothing changes.
        """
        self._check_replica_open()
        self.topics.replace_from(raw)

    @property
    def replicable_end(self) -> int:
        """The end of what a follower may copy: every byte before it is a whole
        record (and durable in sync-flush mode). Not held back by a commit limit:
        followers must copy past the high watermark for it to move."""
        commitlog = self.commitlog
        if commitlog.config.flush_mode == "sync":
            return commitlog.flushed_position
        return commitlog.write_position

    def set_commit_limit(self, limit: Callable[[], int] | None) -> None:
        """Expose records to readers only below ``limit()`` (the leader's high
        watermark; None: no limit). See Dispatcher.set_commit_limit."""
        self._commit_limited = limit is not None
        if self._dispatcher is not None:
            self._dispatcher.set_commit_limit(limit)

    def wake_dispatch(self) -> None:
        """The commit limit moved: dispatch up to it now."""
        if self._dispatcher is not None:
            self._dispatcher.wake()

    def wait_for_position(self, position: int, timeout_ms: int) -> bool:
        """Block until ``replicable_end`` passes ``position`` or the timeout ends;
        return whether it did. Woken by the dispatcher's rounds; under a commit limit
        a round adds nothing until the limit moves, so it polls every ms instead."""
        dispatcher = self._dispatcher

        def ready() -> bool:
            return self._closed or self.replicable_end > position

        if dispatcher is not None and not self._commit_limited:
            return dispatcher.wait_for(ready, timeout_ms) and not self._closed
        deadline = time.monotonic() + timeout_ms / 1000
        while not ready():
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return not self._closed

    def _check_replica_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")
