"""Leader epochs: which leader wrote which stretch of the CommitLog, and this node's role.

Kafka's leader-epoch-checkpoint (KIP-101, KIP-279) on the one CommitLog, by physical
offset: an ordered list of (epoch, start offset) entries, epochs strictly increasing
and start offsets non-decreasing. Entry (E, S) says the records from S up to the next
entry's start were written by the leader of epoch E. Two entries may share a start:
an epoch that wrote nothing before the next began.

Rules (every one a test in tests/mqstore/replication/test_epochs.py):

- **A new leader** takes the next epoch of its own past every one it has seen
  (``next_epoch``: epochs are ``k * EPOCH_NODES + node id``, so two nodes that
  start leading from the same knowledge, say an old leader restarted while its
  follower was promoted, never take the same number; the larger wins) and records
  (epoch, its log end) durably *before* it accepts a write (Kafka PR #5678's
  monotonic rule), so an epoch number is never reused, even by a leader that wrote
  nothing in it and restarted. Kafka's controller hands out epochs; without one
  (issue 18: no home-made consensus) the node id in the epoch keeps them unique.
- **A follower** records the epoch of the bytes it copies (the leader sends it with
  every chunk, chunks never span two epochs) durably before the bytes land.
- ``end_offset_for(epoch, log_end)`` is Kafka's OffsetsForLeaderEpoch answer: the
  largest epoch <= ``epoch`` this log knows and where it ends (the next entry's
  start, or ``log_end`` for the latest); (-1, -1) when every epoch here is newer.
- **Divergence** (KIP-279, as Kafka 2.7's Fetch does it): a follower sends its last
  epoch and its end; the leader answers the end of the largest common epoch; the
  follower truncates to the smaller of that end and its own end for that epoch, and
  asks again, until the epochs agree. Both ends are record boundaries of both logs:
  for one epoch, both logs hold prefixes of what that epoch's leader wrote.
- **Truncation** removes the entries that start at or past the new end (Kafka's
  ``truncateFromEnd``) and is recorded before the log is cut.
- At open, entries that start past the log's end (the log lost its tail in a crash)
  are dropped; ``current_epoch`` is kept: it is the largest epoch this node has
  seen, and a promotion goes past it.

The file also holds the node's role (leader, or follower of an address), so a node
that was demoted stays a follower across restarts until it is promoted again.

Format: ``<root>/leader-epoch-checkpoint``, JSON written atomically (temporary file,
fsync, rename, fsync of the directory) and validated by checksum::

    {"format": "mqstore-leader-epochs", "version": 1, "current_epoch": 3,
     "entries": [[0, 0], [2, 1048576], [3, 2097152]],
     "role": "leader" | "follower", "leader": "host:port" | null,
     "checksum": "<xxh3_64 of the canonical JSON of the rest>"}

A store without the file is at epoch 0 with the one entry (0, 0): everything written
before epochs existed was written by one leader.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import threading
from typing import Any, Final, NamedTuple

from mqstore.atomic import json_checksum, write_json_atomically
from mqstore.commitlog.errors import CorruptDataError, IllegalStateError

__all__ = ["EPOCH_FILE", "EPOCH_NODES", "UNDEFINED", "EpochEntry", "LeaderEpochs", "next_epoch"]

EPOCH_FILE: Final = "leader-epoch-checkpoint"
FORMAT: Final = "mqstore-leader-epochs"
VERSION: Final = 1
#: Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET.
UNDEFINED: Final = -1
#: Node ids a replicated node may have: 0 .. EPOCH_NODES - 1 (see next_epoch).
EPOCH_NODES: Final = 1024


def next_epoch(current: int, node_id: int) -> int:
    """The epoch a node starting to lead takes: past ``current``, and its own."""
    assert 0 <= node_id < EPOCH_NODES
    return (current // EPOCH_NODES + 1) * EPOCH_NODES + node_id


ROLES: Final = ("leader", "follower")


class EpochEntry(NamedTuple):
    epoch: int
    start: int


class LeaderEpochs:
    """The epoch entries and role of one store, kept in memory and on disk.

    Thread-safe: the fetcher, the broker's request threads and a promotion may call
    it at once.
    """

    def __init__(self, root: str, read_only: bool = False) -> None:
        self.path = os.path.join(root, EPOCH_FILE)
        self.read_only = read_only
        self._lock = threading.RLock()
        self._entries: list[EpochEntry] = [EpochEntry(0, 0)]
        self._current_epoch = 0
        self._role = "leader"
        self._leader: str | None = None
        self._load()

    # ------------------------------------------------------------------ reading

    @property
    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The epoch of the newest entry: the epoch of this log's last records
        (UNDEFINED: none, a log started again empty)."""
        with self._lock:
            return self._entries[-1].epoch if self._entries else UNDEFINED

    @property
    def current_epoch(self) -> int:
        """The largest epoch this node knows of (as leader or follower)."""
        with self._lock:
            return self._current_epoch

    @property
    def role(self) -> str:
        with self._lock:
            return self._role

    @property
    def leader(self) -> str | None:
        """As a follower: the leader's HOST:PORT."""
        with self._lock:
            return self._leader

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """(the largest known epoch <= ``epoch``, the offset where it ends); the
        latest epoch ends at ``log_end``; (UNDEFINED, UNDEFINED) when every known
        epoch is newer than ``epoch``."""
        with self._lock:
            entries = self._entries
            at = bisect.bisect_right([entry.epoch for entry in entries], epoch) - 1
            if at < 0:
                return UNDEFINED, UNDEFINED
            if at == len(entries) - 1:
                return entries[at].epoch, log_end
            return entries[at].epoch, entries[at + 1].start

    def epoch_at(self, position: int) -> EpochEntry:
        """The entry whose records include the record at ``position`` (the newest
        entry starting at or before it)."""
        with self._lock:
            entries = self._entries
            if not entries:
                return EpochEntry(UNDEFINED, 0)
            at = bisect.bisect_right([entry.start for entry in entries], position) - 1
            return entries[max(at, 0)]

    def next_start_after(self, position: int) -> int | None:
        """The start of the first entry past ``position`` (a chunk from ``position``
        must end there), or None."""
        with self._lock:
            for entry in self._entries:
                if entry.start > position:
                    return entry.start
            return None

    # ------------------------------------------------------------------ changes

    def begin_leadership(self, log_end: int, node_id: int) -> int:
        """This node leads from now on: a new epoch of its own past every one it has
        seen, starting at ``log_end``, made durable before the caller takes a write."""
        with self._lock:
            epoch = next_epoch(self._current_epoch, node_id)
            self._append(EpochEntry(epoch, log_end))
            self._current_epoch = epoch
            self._role, self._leader = "leader", None
            self._save()
            return epoch

    def follow(self, leader: str, epoch: int | None = None) -> None:
        """This node follows ``leader`` (HOST:PORT) from now on, durably; ``epoch``:
        the leader's epoch when it is known (it raises ``current_epoch``)."""
        with self._lock:
            self._role, self._leader = "follower", leader
            if epoch is not None:
                self._current_epoch = max(self._current_epoch, epoch)
            self._save()

    def learn(self, epoch: int, start: int) -> None:
        """A follower copies records of ``epoch`` that start at ``start``: record the
        entry (durably) if it is new. Entries of older epochs are already here."""
        with self._lock:
            latest = self._entries[-1] if self._entries else EpochEntry(UNDEFINED, 0)
            if epoch == latest.epoch:
                return
            if epoch < latest.epoch:
                raise IllegalStateError(
                    f"records of epoch {epoch} after epoch {latest.epoch}: truncate first"
                )
            self._append(EpochEntry(epoch, start))
            self._current_epoch = max(self._current_epoch, epoch)
            self._save()

    def see_epoch(self, epoch: int) -> bool:
        """A leader's epoch was seen (a response, a notice): raise ``current_epoch``
        durably if it is newer; returns whether it was."""
        with self._lock:
            if epoch <= self._current_epoch:
                return False
            self._current_epoch = epoch
            self._save()
            return True

    def truncate_from(self, end: int) -> None:
        """The log is about to be cut at ``end``: drop the entries starting at or past
        it (never the first), durably, before the cut."""
        with self._lock:
            kept = [entry for entry in self._entries if entry.start < end] or self._entries[:1]
            if kept != self._entries:
                self._entries = kept
                self._save()

    def clear(self) -> None:
        """The log starts again empty at a leader's first file: no entry describes
        it until its first copied records name their epoch (Kafka clears its cache
        in truncateFullyAndStartAt), durably."""
        with self._lock:
            self._entries = []
            self._save()

    def drop_past(self, log_end: int) -> None:
        """At open: the log ends at ``log_end`` (a crash may have cut its tail);
        entries starting past it name records that are gone."""
        with self._lock:
            kept = [entry for entry in self._entries if entry.start <= log_end]
            kept = kept or self._entries[:1]
            if kept != self._entries:
                self._entries = kept
                if not self.read_only:
                    self._save()

    # ------------------------------------------------------------------ file

    def _append(self, entry: EpochEntry) -> None:
        latest = self._entries[-1] if self._entries else EpochEntry(UNDEFINED, 0)
        if entry.epoch <= latest.epoch or entry.start < latest.start:
            raise IllegalStateError(f"epoch entry {entry} does not follow {latest}")
        self._entries.append(entry)

    def _document(self) -> dict[str, object]:
        return {
            "current_epoch": self._current_epoch,
            "entries": [list(entry) for entry in self._entries],
            "role": self._role,
            "leader": self._leader,
        }

    def _save(self) -> None:
        if self.read_only:
            raise IllegalStateError("the store is open read-only: epochs are not written")
        body = self._document()
        write_json_atomically(
            self.path,
            {"format": FORMAT, "version": VERSION, **body, "checksum": json_checksum(body)},
        )

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return
        try:
            document = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CorruptDataError(self.path, 0, "not valid JSON") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise CorruptDataError(self.path, 0, "not an mqstore leader-epoch file")
        if document.get("version") != VERSION:
            raise CorruptDataError(self.path, 0, f"version {document.get('version')!r}")
        body: dict[str, Any] = {
            key: document.get(key) for key in ("current_epoch", "entries", "role", "leader")
        }
        if document.get("checksum") != json_checksum(body):
            raise CorruptDataError(self.path, 0, "checksum mismatch")
        try:
            entries = [EpochEntry(int(epoch), int(start)) for epoch, start in body["entries"]]
        except (TypeError, ValueError):
            raise CorruptDataError(self.path, 0, "malformed entries") from None
        current, role, leader = body["current_epoch"], body["role"], body["leader"]
        valid = (
            all(entry.epoch >= 0 and entry.start >= 0 for entry in entries)
            and all(
                later.epoch > earlier.epoch and later.start >= earlier.start
                for earlier, later in itertools.pairwise(entries)
            )
            and isinstance(current, int)
            and current >= (entries[-1].epoch if entries else 0)
            and role in ROLES
            and (leader is None or isinstance(leader, str))
        )
        if not valid:
            raise CorruptDataError(self.path, 0, "entries, epoch or role out of their rules")
        self._entries = entries
        self._current_epoch = int(current)
        self._role = str(role)
        self._leader = leader


def diverging(
    leader: LeaderEpochs, leader_end: int, last_fetched_epoch: int, follower_end: int
) -> tuple[int, int] | None:
    """The leader's side of KIP-595's check: None when the follower's log (ending at
    ``follower_end`` with records of ``last_fetched_epoch``) is a prefix of the
    leader's, else (the largest epoch <= the follower's last that the leader knows,
    where it ends on the leader)."""
    if last_fetched_epoch == UNDEFINED:
        return None
    epoch, end = leader.end_offset_for(last_fetched_epoch, leader_end)
    if epoch == last_fetched_epoch and end >= follower_end:
        return None
    return epoch, end


def truncation_point(follower: LeaderEpochs, follower_end: int, epoch: int, leader_end: int) -> int:
    """The follower's side (KIP-279): where to cut, given the leader's answer (its
    ``epoch`` and where it ends there): the smaller of the leader's end and this
    log's end for the largest epoch <= ``epoch`` it knows. If the epochs differ the
    next fetch asks again from the cut, until they agree."""
    own_epoch, own_end = follower.end_offset_for(epoch, follower_end)
    target = leader_end if own_epoch == UNDEFINED else min(leader_end, own_end)
    return max(0, min(target, follower_end))
