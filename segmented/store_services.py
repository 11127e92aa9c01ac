"""The segmented store's periodic work (a mixin of segmented/store.py's
SegmentedStore), as Kafka's LogManager schedules it: flushing partitions and their
recovery points, retention by log start offset, size and time with delayed file
deletion (``file.delete.delay.ms``), and the log cleaner of compacted topics.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from mqstore.commitlog.errors import InvalidArgumentError
from mqstore.segmented.checkpoint import write_offsets
from mqstore.segmented.cleaner import CleanResult
from mqstore.segmented.config import SegmentedConfig
from mqstore.segmented.files import (
    LOG_START_OFFSET_CHECKPOINT_NAME,
    RECOVERY_POINT_CHECKPOINT_NAME,
)
from mqstore.segmented.log_cleaner import LogCleaner
from mqstore.segmented.partition_log import PartitionLog
from mqstore.segmented.segment import LogSegment
from mqstore.topics import TopicConfig, TopicRegistry

__all__ = ["SegmentedServices"]


class SegmentedServices:
    """Flush, retention, deletion and cleaning (see the module)."""

    # SegmentedStore's, set in its __init__ and _open.
    root: str
    config: SegmentedConfig
    topics: TopicRegistry
    _clock_ms: Callable[[], int]
    _logs: dict[tuple[str, int], PartitionLog]
    _pending_lock: threading.Lock
    _pending_deletes: list[tuple[int, LogSegment]]
    _cleaner: LogCleaner

    if TYPE_CHECKING:  # SegmentedStore's

        def _check_open(self) -> None: ...
        def describe_topic(self, name: str) -> TopicConfig: ...

    def flush(self) -> None:
        """Flush every dirty partition (.log and indexes) and advance its recovery
        point. The periodic flush job; callable any time."""
        for partition_log in list(self._logs.values()):
            if not partition_log.closed:
                partition_log.flush()

    def checkpoint_recovery_points(self) -> None:
        """Write ``recovery-point-offset-checkpoint`` (the periodic job, and close)."""
        offsets = {key: p.recovery_point for key, p in list(self._logs.items())}
        write_offsets(os.path.join(self.root, RECOVERY_POINT_CHECKPOINT_NAME), offsets)

    def _write_log_start_offsets(self) -> None:
        offsets = {key: p.log_start_offset for key, p in list(self._logs.items())}
        write_offsets(os.path.join(self.root, LOG_START_OFFSET_CHECKPOINT_NAME), offsets)

    def enforce_retention(self) -> int:
        """Delete old segments of every partition by log start offset, size and time
        (the periodic job). Their files are renamed ``*.deleted`` and removed after
        ``file_delete_delay_ms``.

        Returns:
            The number of segments deleted.
        """
        now_ms = self._clock_ms()
        defaults = self.config
        deleted: list[LogSegment] = []
        for (topic, _), partition_log in list(self._logs.items()):
            if partition_log.closed:
                continue
            config = self.topics.get(topic)
            assert config is not None
            if not config.deletes:  # "compact": only the log start offset (Kafka)
                deleted += partition_log.delete_old_segments(now_ms, -1, -1)
                continue
            deleted += partition_log.delete_old_segments(
                now_ms,
                _override(config.retention_ms, defaults.retention_ms),
                _override(config.retention_bytes, defaults.retention_bytes),
            )
        if deleted:
            self._delete_later(deleted)
        return len(deleted)

    def _delete_later(self, segments: list[LogSegment]) -> None:
        """Destroy segments renamed ``*.deleted`` after ``file_delete_delay_ms``."""
        due_ms = self._clock_ms() + self.config.file_delete_delay_ms
        with self._pending_lock:
            self._pending_deletes += [(due_ms, segment) for segment in segments]
        self.delete_expired_files()

    def _compacted_logs(self) -> list[tuple[TopicConfig, PartitionLog]]:
        """(topic, log) of every partition of a compacted topic (the cleaner's)."""
        found = []
        for (name, _), partition_log in list(self._logs.items()):
            topic = self.topics.get(name)
            if topic is not None and topic.compacted:
                found.append((topic, partition_log))
        return found

    def compact(self, topic: str) -> list[CleanResult]:
        """Run a cleaning pass now over every cleanable partition of ``topic``,
        whatever its dirty ratio (``mqstore compact``); the active segment and the
        head younger than min.compaction.lag.ms stay as they are.

        Returns:
            One result per partition cleaned (bytes read and written, keys...).

        Raises:
            UnknownTopicError: no such topic.
            InvalidArgumentError: the topic is not compacted.
            CorruptDataError: a batch did not validate (that partition is retried by
                the scheduled cleaner with a backoff).
        """
        self._check_open()
        config = self.describe_topic(topic)
        if not config.compacted:
            raise InvalidArgumentError(
                f"topic {topic!r} has cleanup_policy {config.cleanup_policy!r}: nothing to "
                "compact (alter it with cleanup.policy=compact)"
            )
        return self._cleaner.clean_topic(topic)

    @property
    def cleaner(self) -> LogCleaner:
        """The log cleaner (its cleaner points, its stats)."""
        return self._cleaner

    def delete_expired_files(self) -> int:
        """Remove the ``*.deleted`` files whose delay has passed and that no reader
        pins (the periodic job). Returns how many segments were removed."""
        now_ms = self._clock_ms()
        with self._pending_lock:
            pending, self._pending_deletes = self._pending_deletes, []
        kept = [(due, s) for due, s in pending if due > now_ms or not s.destroy()]
        with self._pending_lock:
            self._pending_deletes += kept
        return len(pending) - len(kept)


def _override(topic_value: int | None, store_value: int) -> int:
    """A topic's retention setting, or the store's when the topic has none."""
    return store_value if topic_value is None else topic_value
