"""Retention: deletes whole CommitLog files from the oldest end, as RocketMQ's
CleanCommitLogService does, then moves ConsumeQueue minimum offsets and drops old
index files.

A file may go when (checked every ``retention_check_interval_ms`` by apscheduler):
- it is older than the longest retention of any topic (``retention_hours``, the
  store default, for topics without their own ``retention_ms``; never when a topic
  keeps forever with -1). Its age is the time since its last record was stored, read
  from the first record of the file after it. Topics with a shorter retention lose
  their older records earlier, through their log start offset (``topic_start_offset``).
- the log is larger than ``retention_bytes`` (when >= 0), or
- disk usage is at or above ``disk_clean_ratio_percent`` (one file per check, the
  gentle watermark) or ``disk_force_ratio_percent`` (up to DELETE_FILES_MAX per check).

At or above ``disk_reject_ratio_percent`` puts are rejected with DiskFullError, and
accepted again as soon as a check finds usage below it. The file being written is
never deleted, so the log always keeps its newest file, and neither is a file the
dispatcher has not finished reading. ``retention_bytes`` and the disk watermarks
protect the disk and apply to every topic, those that keep forever included.

Crash policy: a file is unlinked before the ConsumeQueues are corrected; after a
crash in between, open corrects them from the CommitLog's first file.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import threading
from collections.abc import Callable, Iterable
from typing import Any, Final

import attrs
import numpy as np

from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.errors import StoreError
from mqstore.commitlog.mapped_file import MappedFile

__all__ = [
    "FOREVER",
    "RetentionReport",
    "RetentionService",
    "disk_usage_percent",
    "file_retention_ms",
    "hours_to_ms",
    "topic_start_offset",
]

log = logging.getLogger(__name__)

DELETE_FILES_MAX: Final = 10  # RocketMQ's deleteFileBatchMax: bound one check's work
FOREVER: Final = -1  # a topic's retention_ms that keeps its records for ever (Kafka's -1)
HOUR_MS: Final = 3_600_000


def hours_to_ms(hours: float) -> int:
    """``StoreConfig.retention_hours`` in ms."""
    return round(hours * HOUR_MS)


def file_retention_ms(topics: Iterable[Any], default_ms: int) -> float:
    """The age at which a CommitLog file may be deleted: every file holds records of
    every topic, so the longest retention among the topics (``retention_ms`` None:
    ``default_ms``, the store's), and infinity when a topic keeps forever."""
    longest: float = default_ms
    for topic in topics:
        if topic.retention_ms == FOREVER:
            return math.inf
        if topic.retention_ms is not None:
            longest = max(longest, topic.retention_ms)
    assert longest >= default_ms
    return longest


def disk_usage_percent(path: str) -> float:
    usage = shutil.disk_usage(path)
    return 100.0 * usage.used / usage.total if usage.total else 0.0


@attrs.frozen
class RetentionReport:
    deleted_files: int
    min_position: int
    disk_usage_percent: float
    rejecting_writes: bool


class RetentionService:
    """One retention check at a time over one store's components."""

    def __init__(
        self,
        commitlog: CommitLog,
        after_delete: Callable[[int], None],
        *,
        retention_ms: Callable[[], float],
        retention_bytes: int,
        clean_percent: float,
        force_percent: float,
        reject_percent: float,
        clock_ms: Callable[[], int],
        disk_usage: Callable[[], float],
        dispatched_position: Callable[[], int],
    ) -> None:
        self._commitlog = commitlog
        self._dispatched_position = dispatched_position
        self._after_delete = after_delete
        self._retention_ms = retention_ms
        self._retention_bytes = retention_bytes
        self._clean_percent = clean_percent
        self._force_percent = force_percent
        self._reject_percent = reject_percent
        self._clock_ms = clock_ms
        self._disk_usage = disk_usage
        self._lock = threading.Lock()
        self.rejecting = False

    def run_once(self) -> RetentionReport:
        with self._lock:
            usage = self._disk_usage()
            deleted = 0
            gentle_used = False
            while deleted < DELETE_FILES_MAX:
                reason = self._reason_to_delete(usage, gentle_used)
                if reason is None:
                    break
                oldest = self._commitlog.delete_oldest_file()
                if oldest is None:
                    break
                log.info("retention deleted %s (%s)", oldest.path, reason)
                deleted += 1
                gentle_used = gentle_used or reason == "disk above the clean watermark"
                usage = self._disk_usage()
            if deleted:
                self._after_delete(self._commitlog.min_position)
            self._update_reject(usage)
            return RetentionReport(deleted, self._commitlog.min_position, usage, self.rejecting)

    def _reason_to_delete(self, usage: float, gentle_used: bool) -> str | None:
        files = self._commitlog.files()
        if len(files) < 2:
            return None
        if files[0].start_offset + files[0].size_bytes > self._dispatched_position():
            return None  # never delete what the dispatcher has not read yet
        if usage >= self._force_percent:
            return "disk above the force watermark"
        if self._retention_bytes >= 0:
            total = sum(mapped.size_bytes for mapped in files)
            if total > self._retention_bytes:
                return "log larger than retention_bytes"
        if self._age_ms(files[1]) >= self._retention_ms():
            return "older than retention"
        if usage >= self._clean_percent and not gentle_used:
            return "disk above the clean watermark"
        return None

    def _age_ms(self, following: MappedFile) -> float:
        """Time since the oldest file's last record: the next file's first record
        was stored right after it."""
        try:
            stored_ms = self._commitlog.record_at(following.start_offset).store_ts_ms
        except StoreError:
            stored_ms = int(os.stat(following.path).st_mtime * 1000)
        return float(self._clock_ms() - stored_ms)

    def _update_reject(self, usage: float) -> None:
        rejecting = usage >= self._reject_percent
        if rejecting != self.rejecting:
            if rejecting:
                log.error(
                    "disk usage %.1f%% >= %.1f%%: rejecting writes", usage, self._reject_percent
                )
            else:
                log.warning("disk usage %.1f%%: accepting writes again", usage)
        self.rejecting = rejecting
        self._commitlog.reject_writes(
            f"disk usage {usage:.1f}% >= {self._reject_percent:.1f}%" if rejecting else None
        )


def topic_start_offset(
    queue: Any, now_ms: int, retention_ms: int | None, retention_bytes: int | None
) -> int:
    """The log start a topic's own retention allows for one of its queues.

    Per-topic retention cannot delete CommitLog files (every file holds every topic),
    so, like Kafka's deleteRecords, it moves the queue's log start offset: records
    older than ``retention_ms`` (by the topic's timestamp type) and, beyond
    ``retention_bytes`` of newest records, the rest, become unreadable; their bytes
    go with their CommitLog files later.
    """
    low, high = queue.min_offset, queue.max_offset
    cut = low
    if retention_ms is not None and retention_ms >= 0 and low < high:
        first_kept = queue.offset_for_time(max(now_ms - retention_ms, 0))
        cut = high if first_kept is None else max(cut, first_kept)
    if retention_bytes is not None and retention_bytes >= 0 and cut < high:
        offset = high
        while offset > cut:  # walk back from the newest unit, one file-sized view at a time
            start = max(cut, offset - SIZE_SCAN_UNITS)
            sizes = np.concatenate(
                [chunk["size"] for chunk in _ranges(queue, start, offset)]
            ).astype(np.int64)
            totals = np.cumsum(sizes[::-1])
            over = np.searchsorted(totals, retention_bytes, side="right")
            if over < len(sizes):
                cut = max(cut, offset - int(over))
                break
            retention_bytes -= int(totals[-1])
            offset = start
    return cut


SIZE_SCAN_UNITS: Final = 1 << 16  # units read per step of a size-retention walk


def _ranges(queue: Any, start: int, stop: int) -> list[np.ndarray]:
    chunks = []
    while start < stop:
        units = queue.get_range(start, stop - start)
        chunks.append(units)
        start += len(units)
    return chunks
