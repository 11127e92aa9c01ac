"""What the store hands back: put results and messages."""

from __future__ import annotations

from commitlog.commitlog import AppendResult
from commitlog.record import Record, decode_keys, decode_properties

__all__ = ["Message", "PutResult"]


#: Where a put landed: ``physical_offset``, ``queue_offset`` (the Kafka partition
#: offset), ``store_timestamp_ms`` (set under the append lock) and the record ``size``.
PutResult = AppendResult


class Message:
    """One stored message. ``body`` is a zero-copy memoryview into the CommitLog
    (None for a tombstone); copy it (``bytes(message.body)``) to keep it past the
    store's retention of that file."""

    __slots__ = (
        "_keys_raw",
        "_properties_raw",
        "body",
        "born_timestamp_ms",
        "physical_offset",
        "queue_id",
        "queue_offset",
        "size",
        "store_timestamp_ms",
        "tag",
        "topic",
    )

    def __init__(self, record: Record) -> None:
        self.topic = record.topic
        self.queue_id = record.queue_id
        self.queue_offset = record.queue_offset
        self.physical_offset = record.physical_offset
        self.size = record.size
        self.born_timestamp_ms = record.born_ts_ms
        self.store_timestamp_ms = record.store_ts_ms
        self.tag = record.tag
        self.body = record.body
        self._keys_raw = record.keys_raw
        self._properties_raw = record.properties_raw

    @property
    def keys(self) -> tuple[str, ...]:
        return decode_keys(self._keys_raw)

    @property
    def properties(self) -> tuple[tuple[str, bytes], ...]:
        """(key, value) pairs in the order they were given; keys may repeat."""
        return decode_properties(self._properties_raw)

    @property
    def value(self) -> bytes | None:
        """The body as bytes (a copy)."""
        return None if self.body is None else bytes(self.body)

    def __repr__(self) -> str:
        body_len = -1 if self.body is None else len(self.body)
        return (
            f"Message(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, store_timestamp_ms={self.store_timestamp_ms}, "
            f"body_len={body_len})"
        )
