"""The ``mqstore`` Spark sink: DataFrames appended to topics, batch and streaming.

Input columns, as for Spark's Kafka sink: ``value`` (binary or string, required;
null is a tombstone), ``key`` (binary or string), ``topic`` (string; else option
``topic``), ``partition`` (int; else murmur2 of the key as Kafka's default
partitioner, round-robin for null keys), ``headers`` (array<struct<key:string,
value:binary>>), ``timestamp`` (timestamp; CreateTime).

The single-writer rule: the store has one writer, guarded by an flock on
``<root>/lock``. Each write task opens the store AS the writer, appends its rows,
closes (flush + checkpoint) and so releases the lock; tasks of one job take turns
(a task waits up to ``lockTimeoutMs`` for the lock). If another process keeps the
store open for writing (a running service), the task fails with StoreLockedError:
write into a store that no service holds open, or feed the service another way.

Delivery is at-least-once: a task that fails after appending is retried and
appends again. Streaming adds an idempotent commit per batchId: ``commit`` records
the batchId in ``<root>/spark-sinks/<sinkId>.json``, and a replayed batch whose id
is already committed (a restart from a checkpoint that missed Spark's own commit)
is skipped by every task.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from commitlog.errors import InvalidArgumentError
from mqstore.atomic import write_json_atomically
from mqstore.engine import ProducerRecord
from mqstore.kafka import murmur2
from mqstore.spark.store_access import open_writer

__all__ = ["BatchWriter", "StreamWriter", "WriteOptions", "WriteResult"]

ROWS_PER_APPEND_MAX: Final = 8_192  # rows per put_batch: bounds the append-lock hold time
LOCK_TIMEOUT_MS_DEFAULT: Final = 120_000  # tasks of one job queue for the writer lock
SINKS_DIR: Final = "spark-sinks"
_COLUMNS: Final = ("value", "key", "topic", "partition", "headers", "timestamp")


@attrs.frozen(kw_only=True)
class WriteOptions:
    path: str
    topic: str | None
    sink_id: str
    lock_timeout_ms: int
    columns: tuple[str, ...]

    @classmethod
    def parse(cls, raw: Mapping[str, str], schema: StructType) -> WriteOptions:
        options = {str(k).lower(): v for k, v in raw.items()}
        path = options.get("path")
        if not path:
            raise InvalidArgumentError("option path (the store directory) is required")
        names = tuple(schema.fieldNames())
        if "value" not in names:
            raise InvalidArgumentError("the DataFrame to write needs a value column")
        unknown = [n for n in names if n not in _COLUMNS]
        if unknown:
            raise InvalidArgumentError(
                f"unknown columns {unknown}; the sink takes {', '.join(_COLUMNS)}"
            )
        topic = options.get("topic")
        if topic is None and "topic" not in names:
            raise InvalidArgumentError("give option topic or a topic column")
        try:
            timeout_ms = int(options.get("locktimeoutms", LOCK_TIMEOUT_MS_DEFAULT))
        except ValueError:
            raise InvalidArgumentError("option lockTimeoutMs must be an integer") from None
        sink_id = str(options.get("sinkid") or f"topic-{topic or 'column'}")
        if not sink_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise InvalidArgumentError("option sinkId holds only [A-Za-z0-9._-]")
        return cls(
            path=str(path), topic=topic, sink_id=sink_id, lock_timeout_ms=timeout_ms, columns=names
        )


@attrs.define
class WriteResult(WriterCommitMessage):
    """Rows appended per "topic/partition" by one task (skipped: a replayed batch)."""

    rows: dict[str, int]
    skipped: bool = False


def _as_binary(column: pa.Array) -> pa.Array:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.binary())
    if pa.types.is_large_binary(column.type):
        return column.cast(pa.binary())
    if not pa.types.is_binary(column.type):
        raise InvalidArgumentError(f"key and value must be binary or string, not {column.type}")
    return column


class _Appender:
    """Appends Arrow batches to an open store, grouped per (topic, partition)."""

    def __init__(self, store: Any, options: WriteOptions) -> None:
        self.store = store
        self.options = options
        self.rows: dict[str, int] = {}
        self._partitions: dict[str, int] = {}
        self._round_robin = itertools.count(random.randrange(1 << 16))

    def append(self, batch: pa.RecordBatch) -> None:
        count = batch.num_rows
        if not count:
            return
        names = batch.schema.names
        values = _as_binary(batch.column("value")).to_pylist()
        if not {"key", "partition", "topic", "headers"} & set(names):
            # Kafka's sticky partitioner: a batch of null-key rows goes to one partition.
            assert self.options.topic is not None
            topic = self.options.topic
            partition = next(self._round_robin) % self._partition_count(topic)
            self.store._partition(topic, partition)
            stamps_all = None
            if "timestamp" in names:
                micros = batch.column("timestamp").cast(pa.int64())
                stamps_all = pc.divide(micros, 1000).to_pylist()
            for first in range(0, count, ROWS_PER_APPEND_MAX):
                self.store.put_batch(
                    topic,
                    partition,
                    values[first : first + ROWS_PER_APPEND_MAX],
                    born_timestamp_ms=None
                    if stamps_all is None
                    else stamps_all[first : first + ROWS_PER_APPEND_MAX],
                )
            name = f"{topic}/{partition}"
            self.rows[name] = self.rows.get(name, 0) + count
            return
        keys = _as_binary(batch.column("key")).to_pylist() if "key" in names else None
        topics = self._topics(batch)
        partitions = self._choose_partitions(batch, topics, keys)
        headers = batch.column("headers").to_pylist() if "headers" in names else None
        stamps = None
        if "timestamp" in names:
            micros = batch.column("timestamp").cast(pa.int64())
            stamps = pc.divide(micros, 1000).to_pylist()
        order = np.lexsort((np.arange(count), partitions, np.asarray(topics)))
        groups: dict[tuple[str, int], list[int]] = {}
        for i in order.tolist():
            groups.setdefault((topics[i], int(partitions[i])), []).append(i)
        for (topic, partition), rows in groups.items():
            for first in range(0, len(rows), ROWS_PER_APPEND_MAX):
                chunk = rows[first : first + ROWS_PER_APPEND_MAX]
                self._append_chunk(topic, partition, chunk, values, keys, headers, stamps)
            name = f"{topic}/{partition}"
            self.rows[name] = self.rows.get(name, 0) + len(rows)

    def _topics(self, batch: pa.RecordBatch) -> list[str]:
        if "topic" in batch.schema.names:
            topics = batch.column("topic").to_pylist()
            if self.options.topic is not None:
                topics = [t if t is not None else self.options.topic for t in topics]
            if any(t is None for t in topics):
                raise InvalidArgumentError("a row has a null topic and no option topic is set")
            return topics
        assert self.options.topic is not None
        return [self.options.topic] * batch.num_rows

    def _partition_count(self, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            count = self.store.describe_topic(topic).partitions
            self._partitions[topic] = count
        return count

    def _choose_partitions(
        self, batch: pa.RecordBatch, topics: list[str], keys: list[bytes | None] | None
    ) -> np.ndarray:
        given = batch.column("partition").to_pylist() if "partition" in batch.schema.names else None
        out = np.empty(batch.num_rows, dtype=np.int64)
        for i, topic in enumerate(topics):
            if given is not None and given[i] is not None:
                out[i] = given[i]
            elif keys is not None and (key := keys[i]) is not None:
                out[i] = (murmur2(key) & 0x7FFFFFFF) % self._partition_count(topic)
            else:
                out[i] = next(self._round_robin) % self._partition_count(topic)
        return out

    def _append_chunk(
        self,
        topic: str,
        partition: int,
        rows: list[int],
        values: list[bytes | None],
        keys: list[bytes | None] | None,
        headers: list[Any] | None,
        stamps: list[int | None] | None,
    ) -> None:
        has_keys = keys is not None and any(keys[i] is not None for i in rows)
        has_headers = headers is not None and any(headers[i] for i in rows)
        if not has_keys and not has_headers:  # fast path: bodies straight into one batch
            self.store._partition(topic, partition)  # the topic and partition must exist
            self.store.put_batch(
                topic,
                partition,
                [values[i] for i in rows],
                born_timestamp_ms=None if stamps is None else [stamps[i] for i in rows],
            )
            return
        records = [
            ProducerRecord(
                None if keys is None else keys[i],
                values[i],
                [(h["key"], h["value"]) for h in headers[i]] if headers and headers[i] else [],
                None if stamps is None else stamps[i],
            )
            for i in rows
        ]
        self.store.append_records(topic, partition, records)


def _write(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> WriteResult:
    with open_writer(options.path, options.lock_timeout_ms) as store:
        appender = _Appender(store, options)
        for batch in batches:
            appender.append(batch)
        return WriteResult(appender.rows)


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("mqstore").option("path", p).option("topic", t).save()``."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        return _write(self.options, iterator)


def _marker_path(root: str, sink_id: str) -> str:
    return os.path.join(root, SINKS_DIR, f"{sink_id}.json")


def committed_batch_id(root: str, sink_id: str) -> int:
    """The last batchId committed by the streaming sink ``sink_id`` (-1: none)."""
    try:
        with open(_marker_path(root, sink_id), encoding="utf-8") as handle:
            return int(json.load(handle)["batch_id"])
    except FileNotFoundError:
        return -1


def _current_batch_id() -> int | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    raw = None if context is None else context.getLocalProperty("streaming.sql.batchId")
    return None if raw is None else int(raw)


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("mqstore")``: at-least-once appends, idempotent per
    batchId (see the module docstring)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        batch_id = _current_batch_id()
        if batch_id is not None and batch_id <= committed_batch_id(
            self.options.path, self.options.sink_id
        ):
            for _ in iterator:  # drain: the batch is already in the store
                pass
            return WriteResult({}, skipped=True)
        return _write(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if batchId <= committed_batch_id(self.options.path, self.options.sink_id):
            return  # a replay of a committed batch: committing again changes nothing
        rows: dict[str, int] = {}
        for message in messages:
            if isinstance(message, WriteResult):
                for name, count in message.rows.items():
                    rows[name] = rows.get(name, 0) + count
        path = _marker_path(self.options.path, self.options.sink_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json_atomically(path, {"batch_id": batchId, "rows": rows})

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: appended rows stay (at-least-once); a retry appends again."""
