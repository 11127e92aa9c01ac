"""The ``mqstore`` Spark sink: DataFrames appended to topics, batch and streaming.

Input columns, as for Spark's Kafka sink: ``value`` (binary or string, required;
null is a tombstone), ``key`` (binary or string), ``topic`` (string; else option
``topic``), ``partition`` (int; else murmur2 of the key as Kafka's default
partitioner, round-robin for null keys), ``headers`` (array<struct<key:string,
value:binary>>), ``timestamp`` (timestamp; CreateTime; null: the time of the write).
A batch of value (and timestamp) only goes in as the value column's Arrow buffers
(``put_batch_buffers``, no Python object per row); other columns go row by row.

The single-writer rule: the store has one writer, guarded by an flock on
``<root>/lock``. A write task tries to take it (waiting up to ``lockTimeoutMs``,
default 0):

- free: the task opens the store AS the writer, appends the inbox's waiting spool
  files first (so that earlier rows stay first), appends its rows, taking the spool
  files that arrive between its Arrow batches (a sibling task's), closes (flush +
  checkpoint) and so releases the lock;
- held (a running service, or a sibling task): the task writes its rows to spool
  files ``<root>/inbox/<sinkId>.<run>.p<partition>.c<k>.spool`` (``mqstore.spool``:
  temp name, fsync, rename) of SPOOL_FILE_ROWS_MAX rows each, file k holding the
  task's rows [k * max, (k + 1) * max). Each file is committed when full, so the lock
  holder (``mqstore.inbox``) appends it while the task writes the next: two tasks of
  one write append side by side. The task then waits up to ``spoolWaitMs`` (default
  60 s) until its files are ingested, taking the lock itself whenever it is free, so
  that in the usual case its rows are readable when the task succeeds. If the wait
  times out the task still succeeds: the rows are durable in the spool and become
  readable at the writer's next inbox tick (``StoreConfig.inbox_interval_ms``), or
  when a writer next opens the store. A file the writer refuses (unknown partition,
  corrupt) is quarantined and the task fails with its typed error.

``<run>`` is ``q<queryId>.b<batchId>`` when streaming, ``w<writeId>`` (one id per
DataFrame write) otherwise. A retried task rewrites the same names with the same rows
(file k is fixed by row position): the ingest ledger appends a name once, so a retry
after a successful spool adds nothing.

Delivery is at-least-once: a task that fails after appending directly, or after
committing some of its spool files, is retried and appends again (the committed
files once). Streaming adds an idempotent commit per batchId: ``commit`` records
the batchId in ``<root>/spark-sinks/<sinkId>.json``, and a replayed batch whose id
is already committed (a restart from a checkpoint that missed Spark's own commit)
is skipped by every task.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
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

from mqstore.atomic import write_json_atomically
from mqstore.commitlog.errors import InvalidArgumentError, UnknownTopicError
from mqstore.engine import ProducerRecord
from mqstore.inbox import INBOX_DIR, QUARANTINE_DIR, SpoolRejectedError, pending_spools
from mqstore.kafka import murmur2
from mqstore.spark.store_access import cached_reader, try_open_writer
from mqstore.spool import BLOCK_ROWS_MAX, SPOOL_SUFFIX, SpoolWriter

__all__ = ["BatchWriter", "StreamWriter", "WriteOptions", "WriteResult", "drain_inbox"]

ROWS_PER_APPEND_MAX: Final = BLOCK_ROWS_MAX  # rows per put_batch: bounds the append-lock hold
LOCK_TIMEOUT_MS_DEFAULT: Final = 0  # a held lock means a live writer: spool at once
SPOOL_WAIT_MS_DEFAULT: Final = 60_000  # a task waits this long for its spool to be ingested
SPOOL_POLL_S: Final = 0.02  # how often a waiting task looks at the inbox and the lock
SPOOL_FILE_BYTES_MAX: Final = 2 << 30  # one spool file; the ingest maps it, never reads it
# Rows per spool file: a locked-out task commits a file this full and starts the next,
# so that the lock holder appends its rows while it still writes. 16 blocks: about
# 14 MB at 100 B values, three small fsyncs (file, ledger, directory) per file.
SPOOL_FILE_ROWS_MAX: Final = 16 * BLOCK_ROWS_MAX
DRAIN_ROUNDS_MAX: Final = 8  # writer opens one hand-off may make while files keep arriving
SINKS_DIR: Final = "spark-sinks"
_COLUMNS: Final = ("value", "key", "topic", "partition", "headers", "timestamp")


@attrs.frozen(kw_only=True)
class WriteOptions:
    path: str
    topic: str | None
    sink_id: str
    lock_timeout_ms: int
    spool_wait_ms: int
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
        timeout_ms = _non_negative(options, "lockTimeoutMs", LOCK_TIMEOUT_MS_DEFAULT)
        spool_wait_ms = _non_negative(options, "spoolWaitMs", SPOOL_WAIT_MS_DEFAULT)
        sink_id = str(options.get("sinkid") or f"topic-{topic or 'column'}")
        if not sink_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise InvalidArgumentError("option sinkId holds only [A-Za-z0-9._-]")
        return cls(
            path=str(path),
            topic=topic,
            sink_id=sink_id,
            lock_timeout_ms=timeout_ms,
            spool_wait_ms=spool_wait_ms,
            columns=names,
        )


def _non_negative(options: Mapping[str, str], name: str, default: int) -> int:
    try:
        value = int(options.get(name.lower(), default))
    except ValueError:
        raise InvalidArgumentError(f"option {name} must be an integer") from None
    if value < 0:
        raise InvalidArgumentError(f"option {name} must be >= 0")
    return value


@attrs.define
class WriteResult(WriterCommitMessage):
    """Rows written per "topic/partition" by one task (skipped: a replayed batch;
    spooled: handed to the live writer through the inbox, ingested: readable when
    the task ended)."""

    rows: dict[str, int]
    skipped: bool = False
    spooled: bool = False
    ingested: bool = True


def _as_binary(column: pa.Array) -> pa.Array:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.binary())
    if pa.types.is_large_binary(column.type):
        return column.cast(pa.binary())
    if not pa.types.is_binary(column.type):
        raise InvalidArgumentError(f"key and value must be binary or string, not {column.type}")
    return column


def _binary_buffers(column: pa.Array) -> tuple[np.ndarray, Any, np.ndarray | None]:
    """A binary or string column as Arrow lays it out, without copying its bytes:
    (offsets int64[n + 1] into data, the data buffer, uint8 null flags or None)."""
    kind = column.type
    offset_type: type[np.signedinteger[Any]]
    if pa.types.is_binary(kind) or pa.types.is_string(kind):
        offset_type = np.int32
    elif pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
        offset_type = np.int64
    else:
        raise InvalidArgumentError(f"key and value must be binary or string, not {kind}")
    count = len(column)
    assert count > 0
    _, offsets_buffer, data_buffer = column.buffers()
    assert offsets_buffer is not None
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)
    offsets = offsets[column.offset : column.offset + count + 1].astype(np.int64)
    assert len(offsets) == count + 1
    nulls = None
    if column.null_count:
        nulls = column.is_null().to_numpy(zero_copy_only=False).view(np.uint8)
    return offsets, b"" if data_buffer is None else data_buffer, nulls


def _born_times_ms(column: pa.Array) -> np.ndarray | None:
    """Spark timestamps (microseconds) as born times in ms; a null one is the time of
    the write, as Kafka's producer stamps a record without one. None: all null."""
    if column.null_count == len(column):
        return None
    micros = pc.fill_null(column.cast(pa.int64()), 0).to_numpy()
    stamps = np.floor_divide(micros, 1000)
    if column.null_count:
        stamps[column.is_null().to_numpy(zero_copy_only=False)] = time.time_ns() // 1_000_000
    return stamps


def _partitions_for_write(topics: Any, topic: str) -> int:
    """The partition count rows of ``topic`` are spread over. The writer creates an
    unknown topic now when the store auto-creates topics (the store's one rule); a
    spooling task (read-only view) cannot create it: it spreads rows over its own
    config's ``auto_create_topic_partitions`` and the writer creates the topic when
    it appends the spool file (with its own setting: rows past the writer's count
    are refused with SpoolRejectedError, so both should agree; both default to 1).

    Raises:
        UnknownTopicError: no such topic, and the store does not auto-create topics.
    """
    if not topics.read_only:
        return int(topics.topic_for_write(topic).partitions)
    try:
        return int(topics.describe_topic(topic).partitions)
    except UnknownTopicError:
        if not topics.auto_create_topics:
            raise
        return int(topics.config.auto_create_topic_partitions)


class _Appender:
    """Appends Arrow batches, grouped per (topic, partition), to ``store``: the store
    opened as the writer, or a ``_SpoolSink``. ``topics`` answers describe_topic."""

    def __init__(self, store: Any, topics: Any, options: WriteOptions) -> None:
        self.store = store
        self.topics = topics
        self.options = options
        self.rows: dict[str, int] = {}
        self._partitions: dict[str, int] = {}
        self._round_robin = itertools.count(random.randrange(1 << 16))

    def append(self, batch: pa.RecordBatch) -> None:
        count = batch.num_rows
        if not count:
            return
        names = batch.schema.names
        if not {"key", "partition", "topic", "headers"} & set(names):
            self._append_values(batch)
            return
        values = _as_binary(batch.column("value")).to_pylist()
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

    def _append_values(self, batch: pa.RecordBatch) -> None:
        """The fast path (value and timestamp only): the value column's Arrow buffers
        go to ``put_batch_buffers`` as they are, no Python object per row. Kafka's
        sticky partitioner: a batch of null-key rows goes to one partition."""
        assert self.options.topic is not None
        topic = self.options.topic
        partition = next(self._round_robin) % self._partition_count(topic)
        offsets, data, nulls = _binary_buffers(batch.column("value"))
        stamps = None
        if "timestamp" in batch.schema.names:
            stamps = _born_times_ms(batch.column("timestamp"))
        count = batch.num_rows
        for first in range(0, count, ROWS_PER_APPEND_MAX):
            last = min(count, first + ROWS_PER_APPEND_MAX)
            self.store.put_batch_buffers(
                topic,
                partition,
                offsets[first : last + 1],
                data,
                nulls=None if nulls is None else nulls[first:last],
                born_timestamp_ms=None if stamps is None else stamps[first:last],
            )
        name = f"{topic}/{partition}"
        self.rows[name] = self.rows.get(name, 0) + count

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
            count = _partitions_for_write(self.topics, topic)
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
            if not 0 <= partition < self._partition_count(topic):  # as append_records checks
                raise UnknownTopicError(f"topic {topic!r} has no partition {partition}")
            self.store.put_batch_arrays(
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


class _SpoolSink:
    """The writer interface _Appender uses, writing a task's rows to spool files of
    SPOOL_FILE_ROWS_MAX rows each: file k holds rows [k * max, (k + 1) * max) of the
    task, under ``<stem>.c<k>.spool``. Each full file is committed at once, so the
    lock holder appends it while the task writes the next; the last one is committed
    by ``commit``. A file is created at its first block: an empty task leaves none."""

    def __init__(self, directory: str, stem: str) -> None:
        self.directory = directory
        self.stem = stem
        self.writer: SpoolWriter | None = None
        self.committed: list[str] = []  # paths of the committed files, in row order
        self.first_commit_s: float | None = None

    def put_batch_arrays(
        self,
        topic: str,
        partition: int,
        values: list[bytes | None],
        *,
        born_timestamp_ms: list[int | None] | None = None,
    ) -> None:
        def add(writer: SpoolWriter, first: int, last: int) -> None:
            stamps = None if born_timestamp_ms is None else born_timestamp_ms[first:last]
            writer.add_block(topic, partition, values[first:last], timestamps_ms=stamps)

        self._add(len(values), add)

    def put_batch_buffers(
        self,
        topic: str,
        partition: int,
        offsets: np.ndarray,
        data: Any,
        *,
        nulls: np.ndarray | None = None,
        born_timestamp_ms: np.ndarray | None = None,
    ) -> None:
        def add(writer: SpoolWriter, first: int, last: int) -> None:
            writer.add_column_block(
                topic,
                partition,
                offsets[first : last + 1],
                data,
                nulls=None if nulls is None else nulls[first:last],
                timestamps_ms=None if born_timestamp_ms is None else born_timestamp_ms[first:last],
            )

        self._add(len(offsets) - 1, add)

    def append_records(self, topic: str, partition: int, records: list[ProducerRecord]) -> None:
        def add(writer: SpoolWriter, first: int, last: int) -> None:
            chunk = records[first:last]
            writer.add_block(
                topic,
                partition,
                [r.value for r in chunk],
                keys=[r.key for r in chunk],
                timestamps_ms=[r.timestamp_ms for r in chunk],
                headers=[list(r.headers) for r in chunk],
            )

        self._add(len(records), add)

    def _add(self, count: int, add: Callable[[SpoolWriter, int, int], None]) -> None:
        """Write ``count`` rows with ``add(writer, first, last)``, splitting them where
        a file reaches SPOOL_FILE_ROWS_MAX rows and committing the full file."""
        first = 0
        while first < count:
            writer = self._writer()
            last = first + min(count - first, SPOOL_FILE_ROWS_MAX - writer.rows)
            add(writer, first, last)
            first = last
            assert writer.rows <= SPOOL_FILE_ROWS_MAX
            if writer.rows == SPOOL_FILE_ROWS_MAX:
                self._commit_open_file()

    def _writer(self) -> SpoolWriter:
        if self.writer is None:
            os.makedirs(self.directory, exist_ok=True)
            name = f"{self.stem}.c{len(self.committed):06d}{SPOOL_SUFFIX}"
            path = os.path.join(self.directory, name)
            self.writer = SpoolWriter(path, max_bytes=SPOOL_FILE_BYTES_MAX)
        return self.writer

    def _commit_open_file(self) -> None:
        writer = self.writer
        assert writer is not None
        writer.commit()  # durable under its final name: the writer may take it
        self.committed.append(writer.final_path)
        if self.first_commit_s is None:
            self.first_commit_s = time.time()
        self.writer = None

    def commit(self) -> list[str]:
        """Commit the last file; return the paths of every file committed."""
        if self.writer is not None:
            self._commit_open_file()
        return self.committed

    def abort(self) -> None:
        """Remove the file being written, if any (committed files stay: at-least-once)."""
        if self.writer is not None:
            self.writer.abort()
            self.writer = None


def _write(options: WriteOptions, batches: Iterator[pa.RecordBatch], stem: str) -> WriteResult:
    """Append directly when the writer lock is free, else spool (module docstring)."""
    store = try_open_writer(options.path, options.lock_timeout_ms)
    if store is None:
        return _spool(options, batches, stem)
    inbox_dir = os.path.join(options.path, INBOX_DIR)
    try:
        assert store.inbox is not None
        store.inbox.ingest()  # rows spooled before ours go in first
        appender = _Appender(store, store, options)
        for batch in batches:
            appender.append(batch)
            if pending_spools(inbox_dir):  # a sibling task's full spool file: take it now
                store.inbox.ingest()
        store.inbox.ingest()  # and those committed meanwhile, before we let go
    finally:
        store.close()
    drain_inbox(options.path)  # files committed while we closed
    return WriteResult(appender.rows)


def _spool(options: WriteOptions, batches: Iterator[pa.RecordBatch], stem: str) -> WriteResult:
    sink = _SpoolSink(os.path.join(options.path, INBOX_DIR), stem)
    appender = _Appender(sink, cached_reader(options.path).store, options)
    try:
        for batch in batches:
            appender.append(batch)
        paths = sink.commit()
    finally:
        sink.abort()  # removes the file being written if commit did not happen
    if not paths:
        return WriteResult({}, spooled=True)
    assert sink.first_commit_s is not None
    ingested = _await_ingest(options, paths, sink.first_commit_s)
    return WriteResult(appender.rows, spooled=True, ingested=ingested)


def _await_ingest(options: WriteOptions, paths: list[str], committed_s: float) -> bool:
    """Wait until the spool files at ``paths`` are ingested, draining the inbox
    whenever the lock is free; True if all were ingested within ``spoolWaitMs``.

    Raises:
        SpoolRejectedError: the writer quarantined one of them.
    """
    deadline = time.monotonic() + options.spool_wait_ms / 1000
    waiting = list(paths)
    while True:
        waiting = [path for path in waiting if os.path.exists(path)]
        if not waiting:
            break
        drain_inbox(options.path)
        waiting = [path for path in waiting if os.path.exists(path)]
        if not waiting:
            break
        if time.monotonic() >= deadline:
            return False
        time.sleep(SPOOL_POLL_S)
    for path in paths:
        _raise_if_quarantined(path, committed_s)
    return True


def _raise_if_quarantined(path: str, committed_s: float) -> None:
    """Raises SpoolRejectedError: the spool file at ``path`` went to quarantine (a note
    newer than our commit, not one left by an earlier run under the same name)."""
    note = os.path.join(os.path.dirname(path), QUARANTINE_DIR, os.path.basename(path) + ".json")
    try:
        with open(note, encoding="utf-8") as handle:
            if os.fstat(handle.fileno()).st_mtime >= committed_s - 1:
                raise SpoolRejectedError(
                    f"the store's writer quarantined {os.path.basename(path)}: "
                    f"{json.load(handle).get('reason')}"
                )
    except FileNotFoundError:
        pass


def drain_inbox(path: str) -> int:
    """Give waiting spool files a writer when none runs: take the lock if it is free,
    ingest, release; again while files keep arriving. Returns the files ingested.

    Whoever spools a file calls this after the rename, and a direct writer calls it
    after releasing the lock; so either the spooling task finds the lock free, or
    the holder finds the file after its release (or is a live writer that ingests
    it on its next tick).
    """
    ingested = 0
    for _ in range(DRAIN_ROUNDS_MAX):
        if not pending_spools(os.path.join(path, INBOX_DIR)):
            break
        store = try_open_writer(path)
        if store is None:
            break  # the lock holder ingests them
        try:
            assert store.inbox is not None
            ingested += store.inbox.ingest().files
        finally:
            store.close()
    return ingested


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("mqstore").option("path", p).option("topic", t).save()``."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex  # made on the driver: one per DataFrame write

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        stem = f"{self.options.sink_id}.w{self.write_id}.p{_partition_id():05d}"
        return _write(self.options, iterator, stem)


def _marker_path(root: str, sink_id: str) -> str:
    return os.path.join(root, SINKS_DIR, f"{sink_id}.json")


def committed_batch_id(root: str, sink_id: str) -> int:
    """The last batchId committed by the streaming sink ``sink_id`` (-1: none)."""
    try:
        with open(_marker_path(root, sink_id), encoding="utf-8") as handle:
            return int(json.load(handle)["batch_id"])
    except FileNotFoundError:
        return -1


def _local_property(name: str) -> str | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else context.getLocalProperty(name)


def _current_batch_id() -> int | None:
    raw = _local_property("streaming.sql.batchId")
    return None if raw is None else int(raw)


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else context.partitionId()


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
        query_id = _local_property("sql.streaming.queryId") or "none"
        stem = f"{self.options.sink_id}.q{query_id}.b{batch_id or 0:010d}.p{_partition_id():05d}"
        return _write(self.options, iterator, stem)

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
