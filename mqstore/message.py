"""What the store hands back: put results and messages."""

from __future__ import annotations

from mqstore.commitlog.commitlog import AppendResult
from mqstore.commitlog.record import Record

__all__ = ["Message", "PutResult"]


#: Where a put landed: ``physical_offset``, ``queue_offset`` (the Kafka partition
#: offset), ``store_timestamp_ms`` (set under the append lock) and the record ``size``.
PutResult = AppendResult


class Message(Record):
    """One stored message. ``body`` is a zero-copy memoryview into the CommitLog
    (None for a tombstone); copy it (``bytes(message.body)``) to keep it past the
    store's retention of that file. Fields: topic, queue_id, queue_offset,
    physical_offset, size, born_timestamp_ms, store_timestamp_ms, tag, keys,
    properties, body."""

    __slots__ = ()

    @property
    def born_timestamp_ms(self) -> int:
        return self.born_ts_ms

    @property
    def store_timestamp_ms(self) -> int:
        return self.store_ts_ms

    @property
    def value(self) -> bytes | None:
        """The body as bytes (a copy)."""
        return None if self.body is None else bytes(self.body)

    @classmethod
    def of(cls, record: Record) -> Message:
        """The message of a record decoded as a plain Record."""
        return cls(
            record.size, record.queue_offset, record.physical_offset, record.born_ts_ms,
            record.store_ts_ms, record.queue_id, record.flags, record.topic, record.tag,
            record.keys_raw, record.properties_raw, record.body,
        )  # fmt: skip

    def __repr__(self) -> str:
        body_len = -1 if self.body is None else len(self.body)
        return (
            f"Message(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, store_timestamp_ms={self.store_timestamp_ms}, "
            f"body_len={body_len})"
        )
