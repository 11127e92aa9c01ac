"""LogCleaner: the scheduled service that compacts the logs of compacted topics
(Kafka's LogCleaner thread with LogCleanerManager's choice, checkpoint and errors).

State on disk: ``<root>/cleaner-offset-checkpoint`` (``checkpoint`` format: topic,
partition, the first dirty offset), written after every pass that moved a cleaner
point. A partition missing from it starts at its log start offset.

Each run (``run``, on apscheduler every ``cleaner_backoff_ms``; ``clean_topic``
for ``mqstore compact``):

- the candidates are the partitions of compacted topics; one is due when its
  dirty ratio reaches ``min.cleanable.dirty.ratio``, a dirty segment is older than
  ``max.compaction.lag.ms`` (Kafka's needCompactionNow), or tombstones it kept
  passed their delete horizon (KIP-534: only a pass removes them);
- they are cleaned dirtiest first, one after another; a run with nothing due is
  idle, and the next run waits ``cleaner_backoff_ms`` (the job's period);
- a pass that raises is logged and counted, and its partition is retried after a
  backoff that doubles from ``cleaner_backoff_ms`` up to ``RETRY_BACKOFF_MAX_MS``,
  for ever (KAFKA-19895: one exception must not leave a log uncleanable until a
  restart); changing the topic's settings retries it at once. ``stats()`` reports
  the failing partitions and the last error.

Figures (passes, bytes read and written, keys, duration) go to the log and to
``stats()``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Final

import attrs

from mqstore.atomic import write_json_atomically
from mqstore.commitlog.errors import CorruptDataError
from mqstore.segmented.checkpoint import read_offsets, write_offsets
from mqstore.segmented.cleaner import (
    Cleaner,
    CleanerSettings,
    CleanResult,
    cleanable_range,
    dirty_ratio,
    overdue,
)
from mqstore.segmented.files import CLEANER_CHECKPOINT_NAME, CLEANER_STATS_NAME
from mqstore.segmented.partition_log import PartitionLog
from mqstore.segmented.segment import LogSegment
from mqstore.topics import TopicConfig

__all__ = ["LogCleaner"]

log = logging.getLogger(__name__)

RETRY_BACKOFF_MAX_MS: Final = 3_600_000  # a failing log is retried at least hourly
ERROR_TEXT_MAX: Final = 500  # characters of the last error kept for stats()

_Key = tuple[str, int]
_Logs = Callable[[], list[tuple[TopicConfig, PartitionLog]]]


@attrs.define
class _Failure:
    count: int
    retry_ms: int
    error: str


class LogCleaner:
    """Compacts the compacted topics of one store. Thread-safe: one pass at a time."""

    def __init__(
        self,
        root: str,
        logs: _Logs,
        on_replaced: Callable[[list[LogSegment]], None],
        clock_ms: Callable[[], int],
        *,
        segment_bytes: int,
        dedupe_buffer_bytes: int,
        backoff_ms: int,
    ) -> None:
        self.path = os.path.join(root, CLEANER_CHECKPOINT_NAME)
        self._logs = logs
        self._on_replaced = on_replaced
        self._clock_ms = clock_ms
        self._segment_bytes = segment_bytes
        self._backoff_ms = backoff_ms
        self.cleaner = Cleaner(dedupe_buffer_bytes)
        self._lock = threading.Lock()
        self._failures: dict[_Key, _Failure] = {}
        # The earliest delete horizon of the tombstones each log kept (in memory, as
        # Kafka's latestDeleteHorizon): past it, a log with nothing dirty is cleaned
        # to drop them. After a restart the next dirty pass finds them again.
        self._horizons: dict[_Key, int] = {}
        try:
            self._checkpoints = read_offsets(self.path)
        except CorruptDataError as error:  # Kafka: start over from the log starts
            log.warning("ignoring %s: %s", self.path, error)
            self._checkpoints = {}
        self._totals = {"passes": 0, "bytes_read": 0, "bytes_written": 0, "failures": 0}
        self._duration_ms = 0.0
        self._last: CleanResult | None = None

    # ------------------------------------------------------------------ runs

    def run(self) -> list[CleanResult]:
        """The scheduled job: clean every due partition, dirtiest first."""
        return self._clean(lambda topic: True, force=False)

    def clean_topic(self, topic: str) -> list[CleanResult]:
        """Clean every cleanable partition of ``topic`` now, whatever its dirty
        ratio (``mqstore compact``). Failures are raised after the other partitions
        were cleaned."""
        return self._clean(lambda name: name == topic, force=True)

    def reset_failures(self, topic: str) -> None:
        """The topic's settings changed: retry its failed partitions at once."""
        with self._lock:
            for key in [key for key in self._failures if key[0] == topic]:
                del self._failures[key]

    def _clean(self, wanted: Callable[[str], bool], force: bool) -> list[CleanResult]:
        with self._lock:
            now_ms = self._clock_ms()
            due = []
            for topic, partition_log in self._logs():
                if not topic.compacted or not wanted(topic.name) or partition_log.closed:
                    continue
                key = (topic.name, partition_log.partition)
                failure = self._failures.get(key)
                if failure is not None and failure.retry_ms > now_ms and not force:
                    continue
                checkpoint = self._checkpoints.get(key, 0)
                first_dirty, uncleanable = cleanable_range(
                    partition_log, checkpoint, now_ms, topic.min_compaction_lag_ms
                )
                ratio = dirty_ratio(partition_log, first_dirty, uncleanable)
                dirty = first_dirty < uncleanable
                if not (force or self._due(key, topic, partition_log, ratio, dirty, now_ms)):
                    continue
                if first_dirty >= uncleanable and len(partition_log.segments) == 1:
                    continue  # nothing but the active segment
                due.append((ratio, key, topic, partition_log, first_dirty, uncleanable))
            due.sort(key=lambda item: (-item[0], item[1]))  # the dirtiest first
            results = []
            errors: list[BaseException] = []
            for _, key, topic, partition_log, first_dirty, uncleanable in due:
                try:
                    results.append(
                        self._clean_log(key, topic, partition_log, first_dirty, uncleanable)
                    )
                except Exception as error:  # any: KAFKA-19895, retried with a backoff
                    self._failed(key, error)
                    errors.append(error)
            if results or errors:
                self._write_stats()
            if force and errors:
                raise errors[0]
            return results

    def _due(
        self,
        key: _Key,
        topic: TopicConfig,
        partition_log: PartitionLog,
        ratio: float,
        dirty: bool,
        now_ms: int,
    ) -> bool:
        """Dirty enough, overdue by max.compaction.lag.ms, or holding tombstones past
        their delete horizon (which only a pass removes)."""
        first_dirty = self._checkpoints.get(key, 0)
        horizon_ms = self._horizons.get(key)
        lag_ms = topic.max_compaction_lag_ms
        return (
            dirty
            and (
                ratio >= topic.min_cleanable_dirty_ratio
                or overdue(partition_log, first_dirty, now_ms, lag_ms)
            )
        ) or (horizon_ms is not None and now_ms >= horizon_ms)

    def _clean_log(
        self,
        key: _Key,
        topic: TopicConfig,
        partition_log: PartitionLog,
        first_dirty: int,
        uncleanable: int,
    ) -> CleanResult:
        settings = CleanerSettings(
            min_compaction_lag_ms=topic.min_compaction_lag_ms,
            delete_retention_ms=topic.delete_retention_ms,
            segment_bytes=self._segment_bytes,
        )
        self.cleaner.replaced = []
        try:
            result = self.cleaner.clean(
                partition_log, first_dirty, uncleanable, self._clock_ms(), settings
            )
        finally:
            if self.cleaner.replaced:
                self._on_replaced(self.cleaner.replaced)
            self.cleaner.replaced = []
        self._checkpoints[key] = result.end_offset
        self._write_checkpoints()
        if result.delete_horizon_ms is None:
            self._horizons.pop(key, None)
        else:
            self._horizons[key] = result.delete_horizon_ms
        self._failures.pop(key, None)
        self._totals["passes"] += 1
        self._totals["bytes_read"] += result.bytes_read
        self._totals["bytes_written"] += result.bytes_written
        self._duration_ms += result.duration_ms
        self._last = result
        return result

    def _failed(self, key: _Key, error: BaseException) -> None:
        failure = self._failures.get(key) or _Failure(0, 0, "")
        failure.count += 1
        backoff_ms = min(self._backoff_ms * 2 ** min(failure.count, 30), RETRY_BACKOFF_MAX_MS)
        failure.retry_ms = self._clock_ms() + backoff_ms
        failure.error = f"{type(error).__name__}: {error}"[:ERROR_TEXT_MAX]
        self._failures[key] = failure
        self._totals["failures"] += 1
        log.error(
            "cleaning %s-%d failed (%d in a row; retrying in %d ms): %s",
            key[0], key[1], failure.count, backoff_ms, failure.error,
        )  # fmt: skip

    def _write_checkpoints(self) -> None:
        write_offsets(self.path, self._checkpoints)

    def _write_stats(self) -> None:
        """``stats()`` into ``cleaner-stats.json`` after a round that did something,
        for readers without the writer's process (``mqstore stats`` on a CommitLog
        store reads its copies' figures there). Figures only: a failed write is
        logged, never raised."""
        path = os.path.join(os.path.dirname(self.path), CLEANER_STATS_NAME)
        try:
            write_json_atomically(path, self.stats())
        except OSError as error:
            log.warning("could not write %s: %s", path, error)

    # ------------------------------------------------------------------ stats

    def checkpoint(self, topic: str, partition: int) -> int:
        """The partition's cleaner point (0 if never cleaned)."""
        return self._checkpoints.get((topic, partition), 0)

    def stats(self) -> dict[str, Any]:
        """Totals since open, the last pass's figures and the failing partitions."""
        last = self._last
        return {
            "cleaner_passes": self._totals["passes"],
            "cleaner_bytes_read": self._totals["bytes_read"],
            "cleaner_bytes_written": self._totals["bytes_written"],
            "cleaner_duration_ms": round(self._duration_ms, 1),
            "cleaner_last_keys": last.keys if last else None,
            "cleaner_last_duration_ms": round(last.duration_ms, 1) if last else None,
            "cleaner_failures": self._totals["failures"],
            "cleaner_failing_partitions": sorted(f"{t}-{p}" for t, p in self._failures),
            "cleaner_last_error": next((f.error for f in reversed(self._failures.values())), None),
        }
