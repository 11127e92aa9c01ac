"""What the store hands back: put results and messages."""

from __future__ import annotations

from mqstore.commitlog.columns import Row
from mqstore.commitlog.commitlog import AppendResult
from mqstore.commitlog.record import Record

__all__ = ["Message", "PutResult"]


#: Where a put landed: ``physical_offset``, ``queue_offset`` (the Kafka partition
#: offset), ``store_timestamp_ms`` (set under the append lock) and the record ``size``.
PutResult = AppendResult


class Message(Row):
    """One stored message: a row of the MessageBatch its read made (mqstore.batch).

    Fields: topic, queue_id, queue_offset, physical_offset, size, born_timestamp_ms,
    store_timestamp_ms, flags, tag, keys, properties, body (``born_ts_ms``,
    ``store_ts_ms``, ``keys_raw`` and ``properties_raw`` as on a Record); all
    read-only. ``body`` is a read-only memoryview into the one buffer the read copied
    every body into (no copy per message; a new view each time it is read), or None
    for a tombstone. It stays valid after retention deletes the CommitLog file, and
    keeps that buffer alive while held: copy it (``bytes(message.body)``, or
    ``message.value``) to keep one body alone. The other fields are read from the
    batch's columns when asked (made into Python ints once per batch).

    Messages are made by reads only (``MessageBatch.messages``, C when built:
    commitlog/_columns.c makes them without a Python call and out of the cyclic GC,
    see ``mqstore.commitlog.columns.rows``).
    """

    __slots__ = ()

    @property
    def topic(self) -> str:
        return self._batch.topic

    @property
    def queue_id(self) -> int:
        return self._batch.queue_id

    @property
    def queue_offset(self) -> int:
        return self._batch.to_list("queue_offsets")[self._row]

    @property
    def physical_offset(self) -> int:
        return self._batch.to_list("physical_offsets")[self._row]

    @property
    def size(self) -> int:
        """The whole record's size in bytes."""
        return self._batch.to_list("sizes")[self._row]

    @property
    def born_timestamp_ms(self) -> int:
        return self._batch.to_list("born_timestamps_ms")[self._row]

    @property
    def store_timestamp_ms(self) -> int:
        return self._batch.to_list("store_timestamps_ms")[self._row]

    born_ts_ms = born_timestamp_ms
    store_ts_ms = store_timestamp_ms

    @property
    def flags(self) -> int:
        return self._batch.to_list("flags")[self._row]

    @property
    def tag(self) -> str | None:
        return self._batch.tag(self._row)

    @property
    def keys(self) -> tuple[str, ...]:
        return self._batch.keys(self._row)

    @property
    def keys_raw(self) -> memoryview:
        return self._batch.keys_raw(self._row)

    @property
    def properties(self) -> tuple[tuple[str, bytes], ...]:
        return self._batch.properties(self._row)

    @property
    def properties_raw(self) -> memoryview:
        return self._batch.properties_raw(self._row)

    @property
    def value(self) -> bytes | None:
        """The body as bytes (a copy)."""
        return None if self.body is None else bytes(self.body)

    @classmethod
    def of(cls, record: Record) -> Message:
        """The message of a decoded Record (its body and sections are copied)."""
        from mqstore.batch import MessageBatch  # the batch module builds Messages

        return MessageBatch.from_records([record]).messages()[0]

    def __repr__(self) -> str:
        body_len = -1 if self.body is None else len(self.body)
        return (
            f"Message(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, store_timestamp_ms={self.store_timestamp_ms}, "
            f"body_len={body_len})"
        )
