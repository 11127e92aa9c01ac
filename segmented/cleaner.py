"""Cleaner: one compaction pass over one partition log (Kafka's Cleaner, with
SkimpyOffsetMap's bound and LogCleanerManager's cleanable offsets).

A compacted log splits in three: a **clean** prefix (cleaned before, below the
cleaner point kept in ``cleaner-offset-checkpoint``), a **dirty** section, and an
**uncleanable** head: from the first of the active segment and the first dirty
segment whose largest timestamp is younger than ``min.compaction.lag.ms`` (there
is no replication, so the high watermark is the log end and bounds nothing more).

One pass (``Cleaner.clean``):

1. Map every key of the dirty section to its latest offset (``OffsetMap``: a
   128-bit digest -> offset, at most ``entries_max`` keys; Kafka digests with MD5,
   here XXH3-128, which is as collision-resistant for this use and several times
   faster). A full map stops the pass at
   the last offset it mapped: that offset + 1 is the new cleaner point, and every
   record past it is kept, so a full map loses nothing.
2. Group the segments from the log start up to that end by size (total bytes <=
   segment.bytes, an offset span that fits int32); each group becomes ONE segment.
3. Copy each group into ``<base>.log.cleaned`` (and its indexes), keeping a record
   iff it lies past the mapped range, or it has a key, no later offset for that key
   was mapped, and it holds a value or is a tombstone whose delete horizon has not
   passed. A batch keeps its base offset and last offset delta (offsets never
   move); a batch left without records is dropped, except the last batch of a
   group, kept empty so the segment still ends at its last offset. A kept
   tombstone's batch without a delete horizon gets one: ``now +
   delete.retention.ms``, stamped in the header (KIP-534: attribute bit 6, the base
   timestamp). A batch that loses nothing and needs no stamp is copied as it is.
4. Swap each cleaned segment in (``PartitionLog.replace_segments``): ``.cleaned``
   -> ``.swap`` (the commit point) -> the old segments ``*.deleted`` -> no suffix.

Crash policy: a crash before the ``.swap`` rename leaves ``*.cleaned`` files, which
the loader deletes; after it, the loader completes the swap. The cleaner point is
written after the swaps: a crash before that only makes the next pass clean the
same section again. Records are never lost or reordered at any step.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Final

import attrs
from xxhash import xxh3_128_digest

from mqstore.commitlog.errors import CorruptDataError
from mqstore.segmented.compression import InflateError
from mqstore.segmented.files import (
    CLEANED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    segment_path,
)
from mqstore.segmented.partition_log import PartitionLog
from mqstore.segmented.record_batch import (
    COMPRESSION_MASK,
    DELETE_HORIZON_MASK,
    HEADER,
    HEADER_SIZE,
    BatchHeader,
    MalformedBatchError,
    decode_records,
    encode_record,
    inflated_batch,
    rebuild_batch,
    record_spans,
)
from mqstore.segmented.segment import LogSegment

__all__ = ["CleanResult", "Cleaner", "CleanerSettings", "OffsetMap", "cleanable_range"]

log = logging.getLogger(__name__)

INT32_MAX: Final = 2**31 - 1  # a segment's relative offsets are int32
# What one map entry costs in Kafka's SkimpyOffsetMap (16 B MD5 + 8 B offset); here
# a Python dict entry costs more (bench/compaction.py measures it), so the bound is
# taken in entries and stated per key by the benchmark.
KAFKA_ENTRY_BYTES: Final = 24
ENTRY_BYTES: Final = 160  # measured: digest object + int + dict slot (CPython 3.12)
LOAD_FACTOR: Final = 0.9  # Kafka's log.cleaner.io.buffer.load.factor


@attrs.frozen(kw_only=True)
class CleanerSettings:
    """What one pass needs of the topic and the store."""

    min_compaction_lag_ms: int
    delete_retention_ms: int
    segment_bytes: int


@attrs.frozen(kw_only=True)
class CleanResult:
    """The figures of one pass over one log."""

    topic: str
    partition: int
    first_dirty_offset: int
    end_offset: int  # the new cleaner point
    bytes_read: int
    bytes_written: int
    keys: int
    segments_in: int
    segments_out: int
    map_full: bool
    duration_ms: float
    delete_horizon_ms: int | None  # the earliest horizon of a tombstone kept, if any


class OffsetMap:
    """Key digest -> the latest offset seen, for at most ``entries_max`` keys."""

    def __init__(self, memory_bytes: int) -> None:
        self.entries_max = max(1, int(memory_bytes // ENTRY_BYTES * LOAD_FACTOR))
        self._offsets: dict[bytes, int] = {}
        self.latest_offset = -1

    def put(self, key: bytes, offset: int) -> bool:
        """Record ``offset`` for ``key``; False (nothing changed) if the map is full
        and ``key`` is new."""
        assert offset > self.latest_offset
        digest = xxh3_128_digest(key)
        offsets = self._offsets
        if digest not in offsets and len(offsets) >= self.entries_max:
            return False
        offsets[digest] = offset
        self.latest_offset = offset
        return True

    def get(self, key: bytes) -> int:
        """The latest offset mapped for ``key``, or -1."""
        return self._offsets.get(xxh3_128_digest(key), -1)

    def __len__(self) -> int:
        return len(self._offsets)


def cleanable_range(
    partition_log: PartitionLog, checkpoint: int, now_ms: int, min_compaction_lag_ms: int
) -> tuple[int, int]:
    """(first dirty offset, first uncleanable offset) of ``partition_log`` (Kafka's
    LogCleanerManager.cleanableOffsets). A checkpoint outside [log start, log end]
    resets to the log start."""
    segments = partition_log.segments
    start, end = partition_log.log_start_offset, partition_log.next_offset
    first_dirty = checkpoint if start <= checkpoint <= end else start
    uncleanable = segments[-1].base_offset  # the active segment
    if min_compaction_lag_ms > 0:
        for segment, next_base in _with_next_bases(partition_log):
            if next_base <= first_dirty:
                continue
            if segment.largest_timestamp_ms > now_ms - min_compaction_lag_ms:
                uncleanable = min(uncleanable, segment.base_offset)
                break
    return first_dirty, max(first_dirty, uncleanable)


def dirty_ratio(partition_log: PartitionLog, first_dirty: int, uncleanable: int) -> float:
    """Dirty bytes / (clean + dirty bytes), by whole segments (Kafka's
    cleanableRatio); 0 for an empty log."""
    clean_bytes = dirty_bytes = 0
    for segment, next_base in _with_next_bases(partition_log):
        if segment.base_offset >= uncleanable:
            break
        if next_base <= first_dirty:
            clean_bytes += segment.size_bytes
        else:
            dirty_bytes += segment.size_bytes
    total = clean_bytes + dirty_bytes
    return dirty_bytes / total if total else 0.0


def _with_next_bases(partition_log: PartitionLog) -> list[tuple[LogSegment, int]]:
    """The inactive segments, each with the base offset of the one after it."""
    segments = partition_log.segments
    return [(segments[i], segments[i + 1].base_offset) for i in range(len(segments) - 1)]


def overdue(
    partition_log: PartitionLog, first_dirty: int, now_ms: int, max_compaction_lag_ms: int
) -> bool:
    """Whether a dirty segment's first batch is older than max.compaction.lag.ms
    (Kafka's maxCompactionDelay > 0: clean whatever the dirty ratio)."""
    for segment, next_base in _with_next_bases(partition_log):
        if next_base <= first_dirty:
            continue
        first_ms = segment.rolling_timestamp_ms
        if first_ms < 0:
            first_ms = segment.largest_timestamp_ms
        if now_ms - first_ms > max_compaction_lag_ms:
            return True
    return False


class Cleaner:
    """Cleans one log at a time (Kafka's Cleaner). Not thread-safe: one per thread."""

    def __init__(
        self,
        offset_map_memory_bytes: int,
        stage_hook: Callable[[str], None] | None = None,
    ) -> None:
        self.offset_map_memory_bytes = offset_map_memory_bytes
        self.stage_hook = stage_hook  # crash tests: called after each step
        self.replaced: list[LogSegment] = []  # old segments for the caller to destroy
        self._horizon_ms: int | None = None  # this pass's earliest tombstone horizon

    def clean(
        self,
        partition_log: PartitionLog,
        first_dirty: int,
        uncleanable: int,
        now_ms: int,
        settings: CleanerSettings,
    ) -> CleanResult:
        """One pass over [log start, uncleanable) with the map built over
        [first_dirty, uncleanable). With no dirty section (``first_dirty ==
        uncleanable``) the pass only drops tombstones whose horizon has passed.

        Raises:
            CorruptDataError: a batch does not validate (nothing was swapped in for
                the group it belongs to).
        """
        started = time.perf_counter()
        self._horizon_ms = None
        assert first_dirty <= uncleanable <= partition_log.segments[-1].base_offset
        offset_map = OffsetMap(self.offset_map_memory_bytes)
        groups: list[list[LogSegment]] = []
        try:
            mapped_bytes, map_full = self._build_map(
                partition_log, offset_map, first_dirty, uncleanable
            )
            end_offset = offset_map.latest_offset + 1 if map_full else uncleanable
            groups = _group_by_size(partition_log, end_offset, settings.segment_bytes)
        except _Aborted:  # retention deleted a dirty segment: a later pass starts anew
            mapped_bytes, map_full, end_offset = 0, False, first_dirty
        bytes_read = mapped_bytes
        bytes_written = 0
        for group in groups:
            bytes_read += sum(segment.size_bytes for segment in group)
            bytes_written += self._clean_group(partition_log, group, offset_map, now_ms, settings)
        result = CleanResult(
            topic=partition_log.topic,
            partition=partition_log.partition,
            first_dirty_offset=first_dirty,
            end_offset=max(end_offset, first_dirty),
            bytes_read=bytes_read,
            bytes_written=bytes_written,
            keys=len(offset_map),
            segments_in=sum(len(group) for group in groups),
            segments_out=len(groups),
            map_full=map_full,
            duration_ms=(time.perf_counter() - started) * 1000,
            delete_horizon_ms=self._horizon_ms,
        )
        log.info(
            "cleaned %s-%d: [%d, %d), %d keys, %d B read, %d B written, %d -> %d segments, "
            "%.1f ms%s", partition_log.topic, partition_log.partition, first_dirty,
            result.end_offset, result.keys, bytes_read, bytes_written, result.segments_in,
            result.segments_out, result.duration_ms, " (map full)" if map_full else "",
        )  # fmt: skip
        return result

    def _build_map(
        self, partition_log: PartitionLog, offset_map: OffsetMap, first_dirty: int, end: int
    ) -> tuple[int, bool]:
        """Map the keys of [first_dirty, end); (bytes read, whether the map filled)."""
        read_bytes = 0
        for segment, next_base in _with_next_bases(partition_log):
            if segment.base_offset >= end:
                break
            if next_base <= first_dirty:
                continue
            read_bytes += segment.size_bytes
            for _, body, header, spans, _ in _batches(segment):
                base = header.base_offset
                deltas, key_starts, key_sizes = spans[0], spans[1], spans[2]
                for delta, key_start, key_size in zip(deltas, key_starts, key_sizes, strict=True):
                    offset = base + delta
                    if offset < first_dirty or offset >= end or key_size < 0:
                        continue
                    if not offset_map.put(body[key_start : key_start + key_size], offset):
                        return read_bytes, True
        # The whole section was mapped, keyless and empty batches included (Kafka
        # updates the map's latest offset per batch): nothing below ``end`` lies
        # past the mapped range, even when no key was found.
        offset_map.latest_offset = max(offset_map.latest_offset, end - 1)
        return read_bytes, False

    def _clean_group(
        self,
        partition_log: PartitionLog,
        group: list[LogSegment],
        offset_map: OffsetMap,
        now_ms: int,
        settings: CleanerSettings,
    ) -> int:
        """Copy ``group`` into one cleaned segment and swap it in; its bytes."""
        directory = partition_log.directory
        base = group[0].base_offset
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):  # an earlier pass's
            try:
                os.unlink(segment_path(directory, base, suffix) + CLEANED_SUFFIX)
            except FileNotFoundError:
                pass
        cleaned = LogSegment.create(
            directory, base, partition_log.settings.segment, partition_log.index_cache,
            CLEANED_SUFFIX,
        )  # fmt: skip
        try:
            for segment in group:
                last_segment = segment is group[-1]
                for raw, body, header, spans, last in _batches(segment):
                    batch = _filter_batch(
                        raw, body, header, spans, offset_map, now_ms,
                        settings.delete_retention_ms, last_segment and last,
                    )  # fmt: skip
                    if batch is None:
                        continue
                    cleaned.append(batch, header.last_offset, header.max_timestamp)
                    self._note_horizon(batch)
            cleaned.become_inactive()
            cleaned.flush()
            _hook(self.stage_hook, "cleaned")
            if not partition_log.replace_segments(group, cleaned, self.stage_hook):
                raise _Aborted
        except BaseException as error:
            cleaned.mark_deleted()
            cleaned.destroy()
            if isinstance(error, _Aborted):
                return 0
            raise
        self.replaced += group
        return cleaned.size_bytes

    def _note_horizon(self, batch: bytearray) -> None:
        """Keep the earliest delete horizon of the batches written (when a pass
        with no dirty section is due to drop tombstones)."""
        header = BatchHeader._make(HEADER.unpack_from(batch, 0))
        if header.attributes & DELETE_HORIZON_MASK and header.records_count:
            horizon_ms = header.base_timestamp
            if self._horizon_ms is None or horizon_ms < self._horizon_ms:
                self._horizon_ms = horizon_ms


class _Aborted(Exception):
    """Retention removed a segment of the group while it was being cleaned."""


def _hook(stage_hook: Callable[[str], None] | None, stage: str) -> None:
    if stage_hook is not None:
        stage_hook(stage)


def _batches(
    segment: LogSegment,
) -> Iterator[tuple[bytes, bytes, BatchHeader, list[list[int]], bool]]:
    """(bytes, uncompressed bytes, header, record spans, whether it is the last) of
    every batch of ``segment``, CRC-checked; the spans (``record_spans``: C when
    built) are positions in the uncompressed bytes, every record checked, none
    decoded. A compressed batch is inflated once here.

    Raises:
        CorruptDataError: a batch does not validate.
    """
    if not segment.pin():
        raise _Aborted(f"{segment.log_path} was deleted while cleaning")
    position = 0
    try:
        end = segment.size_bytes
        for position, header, buffer, start in segment._batches(0, end, verify_crc=True):
            raw = buffer[start : start + header.size]
            codec = header.attributes & COMPRESSION_MASK
            body = inflated_batch(raw, 0, codec) if codec else raw
            spans = record_spans(
                body, HEADER_SIZE, len(body), header.records_count, header.last_offset_delta
            )
            yield raw, body, header, spans, position + header.size == end
    except MalformedBatchError as error:
        raise CorruptDataError(segment.log_path, error.position, error.reason) from None
    except InflateError as error:
        raise CorruptDataError(segment.log_path, position, f"compressed batch: {error}") from None
    finally:
        segment.unpin()


def _group_by_size(
    partition_log: PartitionLog, end_offset: int, segment_bytes: int
) -> list[list[LogSegment]]:
    """The segments from the log start holding offsets below ``end_offset``, in runs
    of consecutive segments whose total size fits ``segment_bytes`` and whose offset
    span fits int32 (Kafka's groupSegmentsBySize). The active segment never."""
    groups: list[list[LogSegment]] = []
    next_bases = {s.base_offset: nb for s, nb in _with_next_bases(partition_log)}
    candidates = [s for s in partition_log.segments[:-1] if s.base_offset < end_offset]
    while candidates:
        group = [candidates.pop(0)]
        size = group[0].size_bytes
        while candidates:
            following = candidates[0]
            span = next_bases[following.base_offset] - group[0].base_offset
            if size + following.size_bytes > segment_bytes or span - 1 > INT32_MAX:
                break
            size += following.size_bytes
            group.append(candidates.pop(0))
        groups.append(group)
    return groups


def _filter_batch(
    raw: bytes,
    body: bytes,
    header: BatchHeader,
    spans: list[list[int]],
    offset_map: OffsetMap,
    now_ms: int,
    delete_retention_ms: int,
    keep_empty: bool,
) -> bytearray | None:
    """The batch to write for ``header``: None to drop it, the original or rebuilt
    bytes otherwise (Kafka's shouldRetainRecord and the batch retention rules).
    ``body`` is the batch with its records uncompressed (``raw`` itself unless it is
    compressed); ``spans`` point into it. Kept records are copied as they are; only a
    batch whose tombstones get their delete horizon stamped now is decoded and
    re-encoded (its base timestamp moves)."""
    has_horizon = bool(header.attributes & DELETE_HORIZON_MASK)
    retain_deletes = not has_horizon or now_ms < header.base_timestamp
    latest = offset_map.latest_offset
    base = header.base_offset
    deltas, key_starts, key_sizes, _, value_sizes, starts, _ = spans
    kept: list[int] = []
    for i, delta in enumerate(deltas):
        offset = base + delta
        if offset > latest:
            kept.append(i)
            continue
        key_size = key_sizes[i]
        if key_size < 0:  # refused at produce time; older files may hold one
            continue
        if offset < offset_map.get(body[key_starts[i] : key_starts[i] + key_size]):
            continue
        if value_sizes[i] >= 0 or retain_deletes:
            kept.append(i)
    stamp = not has_horizon and any(value_sizes[i] < 0 for i in kept)
    count = len(deltas)
    if len(kept) == count and not stamp:
        return None if not count and not keep_empty else bytearray(raw)
    if not kept and not keep_empty:
        return None
    attributes = header.attributes & ~COMPRESSION_MASK  # rewritten records go uncompressed
    if not stamp:
        ends = [*starts[1:], len(body)]
        encoded = [body[starts[i] : ends[i]] for i in kept]
        return rebuild_batch(header, encoded, attributes, header.base_timestamp)
    records = decode_records(raw, 0, header, 0, count)  # inflates a compressed batch
    base_timestamp = now_ms + delete_retention_ms
    encoded = [
        encode_record(
            record.offset - base,
            record.timestamp_ms - base_timestamp,
            record.key,
            record.value,
            [(name.encode(), value) for name, value in record.headers],
        )
        for record in (records[i] for i in kept)
    ]
    return rebuild_batch(header, encoded, attributes | DELETE_HORIZON_MASK, base_timestamp)
