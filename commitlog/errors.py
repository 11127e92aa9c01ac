"""The store's one error root and its typed children.

Every error the store raises on purpose is a ``StoreError``. Where an error also
means what a builtin means (a bad argument is a ``ValueError``, a wrong type a
``TypeError``, a timeout a ``TimeoutError``), it subclasses that builtin too, so
callers may catch either.
"""

from __future__ import annotations

import os

__all__ = [
    "StoreError",
    "ConfigError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "InvalidRecordError",
    "CorruptDataError",
    "LimitExceededError",
    "OffsetOutOfRangeError",
    "StoreLockedError",
    "StoreClosedError",
    "FlushTimeoutError",
    "KafkaTimeoutError",
    "FlushFailedError",
    "DiskFullError",
    "ReadOnlyStoreError",
    "NotLeaderError",
    "NotEnoughReplicasError",
    "ReplicationTimeoutError",
    "ReplicaPositionError",
    "UnknownTopicError",
    "DispatchFailedError",
    "IllegalStateError",
    "TopicDeletionDisabledError",
]


class StoreError(Exception):
    """Root of every error the store raises on purpose."""


class ConfigError(StoreError, ValueError):
    """A configuration value is out of its bounds or inconsistent with another."""


class InvalidArgumentError(StoreError, ValueError):
    """An argument has the right type but a value the store refuses (a bad topic name...)."""


class InvalidRecordError(InvalidArgumentError):
    """A record the topic refuses (Kafka's INVALID_RECORD): a record without a key
    on a compacted topic. Nothing of its batch is appended."""


class InvalidTypeError(StoreError, TypeError):
    """An argument has the wrong type (a body that is not bytes-like...)."""


class CorruptDataError(StoreError):
    """Bytes on disk do not decode: bad magic, impossible size or a checksum mismatch.

    Attributes:
        path: the file that holds the bad bytes.
        position: the byte position inside that file.
    """

    def __init__(self, path: str | os.PathLike[str], position: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.position = position
        self.reason = reason
        super().__init__(f"corrupt data in {self.path} at position {position}: {reason}")

    def __reduce__(self) -> tuple[type[CorruptDataError], tuple[str, int, str]]:
        return (type(self), (self.path, self.position, self.reason))


class LimitExceededError(StoreError, ValueError):
    """A value is larger than a configured limit (message size, key length...)."""


class OffsetOutOfRangeError(StoreError, IndexError):
    """A logical offset or physical position lies outside what the store holds."""


class StoreLockedError(StoreError):
    """Another writer (in this or another process) holds the store's lock."""


class StoreClosedError(StoreError):
    """The store or component was used after close()."""


class FlushTimeoutError(StoreError, TimeoutError):
    """A synchronous flush did not make the bytes durable within the timeout.

    The record was appended and may still become durable; it was not acknowledged.
    ``first_queue_offset``: a batch's first queue offset, when the batch append knows
    it (None otherwise), so that a caller can still remember what it appended (the
    broker's idempotent producers: a retry must be answered as a duplicate).
    """

    first_queue_offset: int | None = None


class FlushFailedError(StoreError):
    """A sync of the CommitLog failed, so bytes it covered may not be on disk.

    Linux reports a writeback error once and marks the pages clean, so a retry that
    "succeeds" proves nothing (PostgreSQL's fsyncgate). The store never trusts one:
    every later write and flush raises this error, writers waiting for durability are
    never acknowledged, and only a reopen (whose recovery re-verifies the log from the
    checkpoint) makes the store writable again. The original error is the cause.
    """


class KafkaTimeoutError(StoreError, TimeoutError):
    """The Kafka-style producer could not do its part within the time it was given.

    kafka-python's name: ``send`` found the producer's buffer full for ``max_block_ms``
    (the record was not accepted), or ``flush(timeout)`` could not start appending the
    buffered records in time (they stay buffered and are appended later).
    """


class DiskFullError(StoreError, OSError):
    """The disk has no room (ENOSPC) or usage is above the reject watermark.

    Nothing already stored is lost; writes resume once space frees.
    """


class ReadOnlyStoreError(StoreError):
    """A write was attempted through a store opened read-only."""


class NotLeaderError(StoreError):
    """A local write to a follower store (Kafka's NOT_LEADER_OR_FOLLOWER): its log is
    a copy of the leader's and takes only bytes copied from it."""


class NotEnoughReplicasError(StoreError):
    """A replicated write (acks=all) not acknowledged: fewer replicas are in sync than
    min.insync.replicas. The embedded put checks after its append, so the record is
    in the leader's log but not acknowledged (Kafka's
    NOT_ENOUGH_REPLICAS_AFTER_APPEND); the caller must treat it as not written."""


class ReplicationTimeoutError(StoreError, TimeoutError):
    """A replicated write appended on the leader that the in-sync replicas did not all
    hold before its timeout. It may still be replicated, or lost in a failover: the
    caller must treat it as not acknowledged."""


class ReplicaPositionError(StoreError):
    """Bytes copied from a leader that do not start at the follower's write position
    (a gap or an overlap): nothing of them is written.

    Attributes:
        position: where the bytes claim to start.
        write_position: where the follower's log ends.
    """

    def __init__(self, position: int, write_position: int) -> None:
        self.position = position
        self.write_position = write_position
        super().__init__(
            f"replicated bytes start at {position}, but the log ends at {write_position}"
        )

    def __reduce__(self) -> tuple[type[ReplicaPositionError], tuple[int, int]]:
        return (type(self), (self.position, self.write_position))


class UnknownTopicError(StoreError, KeyError):
    """The topic (or partition) does not exist."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable.
        return str(self.args[0]) if self.args else "unknown topic"


class IllegalStateError(StoreError):
    """A call that the object's current state forbids (kafka-python's name): a
    consumer's ``assign`` after ``subscribe``, or ``subscribe`` after ``assign``."""


class TopicDeletionDisabledError(StoreError):
    """Topics cannot be deleted (Kafka's name, for ``delete.topic.enable=false``):
    every topic's records share the CommitLog files, and recovery re-creates a
    topic's ConsumeQueues from them, so a topic lives until retention drops them."""


class DispatchFailedError(StoreError):
    """The dispatcher stopped: the CommitLog holds a record it cannot parse, or its
    rounds kept failing past their retry bound. The cause is chained.

    ConsumeQueues and the index stop at ``position``; reads that need later records
    and writes raise this error until the store is reopened (after fixing the cause).

    Attributes:
        position: the physical offset dispatch stopped at.
        reason: what stopped it.
    """

    def __init__(self, position: int, reason: str) -> None:
        self.position = position
        self.reason = reason
        super().__init__(f"dispatch stopped at physical offset {position}: {reason}")

    def __reduce__(self) -> tuple[type[DispatchFailedError], tuple[int, str]]:
        return (type(self), (self.position, self.reason))
