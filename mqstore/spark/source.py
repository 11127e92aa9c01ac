"""The ``mqstore`` Spark data source: batch and streaming reads, batch and streaming
writes, through PySpark's Python Data Source API (pyspark >= 4.2).

Options and the output schema are those of Spark's Kafka source (see
``mqstore.spark.offsets`` for the offset semantics). The driver plans offset ranges
from a read-only view of the store; each executor task opens the store read-only
(no lock: it follows a live writer), reads its range as Arrow batches
(``mqstore.spark.batches``) and closes it.

Writes go through ``mqstore.spark.sink``: the store has ONE writer (an flock on
``<root>/lock``), so a write task opens the store as the writer, appends and closes;
if a service holds the store open, the task hands its rows to that service as a
spool file in ``<root>/inbox`` (``mqstore.inbox``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from mqstore.spark import offsets as plan
from mqstore.spark.batches import arrow_schema, read_range
from mqstore.spark.store_access import cached_reader, open_reader

__all__ = ["MQStoreDataSource", "OffsetRangePartition"]

FORMAT_NAME = "mqstore"


class MQStoreDataSource(DataSource):
    """``spark.read.format("mqstore").option("path", ...).option("subscribe", "t")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        options = {k.lower(): v for k, v in self.options.items()}
        include_headers = str(options.get("includeheaders", "false")).lower() == "true"
        rocketmq = str(options.get("includerocketmqcolumns", "false")).lower() == "true"
        return _spark_schema(arrow_schema(include_headers, rocketmq))

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(plan.ReadOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(plan.ReadOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from mqstore.spark.sink import BatchWriter, WriteOptions

        return BatchWriter(WriteOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from mqstore.spark.sink import StreamWriter, WriteOptions

        return StreamWriter(WriteOptions.parse(self.options, schema))


def _spark_schema(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


@attrs.frozen
class OffsetRangePartition(InputPartition):
    """One Spark input partition: an offset range and how to stamp its rows."""

    offset_range: plan.OffsetRange | None  # None: the one empty partition of an empty plan
    log_append_time: bool


class _Reading:
    """What batch and stream readers share: planning and executor-side reads."""

    options: plan.ReadOptions

    def _partitions(
        self, start: dict[plan.TopicPartition, int], end: dict[plan.TopicPartition, int]
    ) -> list[OffsetRangePartition]:
        with open_reader(self.options.path) as store:
            ranges = plan.plan_ranges(start, end, store, self.options.fail_on_data_loss)
            ranges = plan.split_ranges(ranges, self.options.min_partitions)
            types = {
                t: store.describe_topic(t).timestamp_type == "LogAppendTime"
                for t in {r.topic for r in ranges}
            }
        partitions = [OffsetRangePartition(r, types[r.topic]) for r in ranges]
        return partitions or [OffsetRangePartition(None, False)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRangePartition)
        if partition.offset_range is None:
            return
        options = self.options
        schema = arrow_schema(options.include_headers, options.include_rocketmq_columns)
        view = cached_reader(options.path)  # executors keep their read-only store open
        yield from read_range(
            view.store,
            partition.offset_range,
            schema,
            log_append_time=partition.log_append_time,
            verify_checksums=options.verify_checksums,
            fail_on_data_loss=options.fail_on_data_loss,
            max_bytes_per_batch=options.max_bytes_per_batch,
        )


class BatchReader(_Reading, DataSourceReader):
    def __init__(self, options: plan.ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        with open_reader(self.options.path) as store:
            tps = plan.subscribed_partitions(self.options, store)
            start = plan.starting_offsets(self.options, store, tps)
            end = plan.ending_offsets(self.options, store, tps)
        return self._partitions(start, end)


class StreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches between offsets ``{"topic": {"partition": next_offset}}``.

    A partition that appears later (new topic matching the pattern, added
    partitions) starts at its earliest offset, as in Kafka.
    """

    def __init__(self, options: plan.ReadOptions) -> None:
        self.options = options
        self._target: dict[plan.TopicPartition, int] | None = None  # availableNow end

    def _latest(self) -> dict[plan.TopicPartition, int]:
        with open_reader(self.options.path) as store:
            tps = plan.subscribed_partitions(self.options, store)
            return {tp: store.latest_offset(*tp) for tp in tps}

    def initialOffset(self) -> dict[str, Any]:
        with open_reader(self.options.path) as store:
            tps = plan.subscribed_partitions(self.options, store)
            start = plan.starting_offsets(self.options, store, tps, streaming=True)
        return plan.offsets_to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = plan.offsets_from_json(start)
        latest = self._target if self._target is not None else self._latest()
        with open_reader(self.options.path) as store:  # new partitions start at earliest
            for tp in latest:
                if tp not in begin:
                    begin[tp] = store.earliest_offset(*tp)
        latest = {tp: max(end, begin[tp]) for tp, end in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = plan.rate_limit(begin, latest, limit.max_rows)
        merged = {**begin, **latest}
        return plan.offsets_to_json(merged)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return plan.offsets_to_json(self._latest())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = plan.offsets_from_json(start)
        stop = plan.offsets_from_json(end)
        with open_reader(self.options.path) as store:
            for tp in stop:
                if tp not in begin:
                    begin[tp] = store.earliest_offset(*tp)
        return self._partitions(begin, stop)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the store keeps data by retention, not by consumption."""
