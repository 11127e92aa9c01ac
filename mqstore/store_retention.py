"""MessageStore's retention (a mixin of mqstore/store.py's MessageStore): the
CommitLog's oldest files go when every topic's retention let them go and the
compacted copies have taken what they keep (mqstore/retention.py holds the policy
and the service); a topic with its own retention moves its queues' log start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqstore import retention
from mqstore.commitlog.commitlog import CommitLog
from mqstore.compaction import CompactionLogs
from mqstore.config import StoreConfig
from mqstore.consumequeue import ConsumeQueueStore
from mqstore.dispatch.dispatcher import Dispatcher
from mqstore.indexfile import IndexService
from mqstore.topics import TopicRegistry

if TYPE_CHECKING:
    from mqstore.compaction import CopyReader

__all__ = ["StoreRetention"]


class StoreRetention:
    """Retention of the store's files and queues (see the module)."""

    # MessageStore's, set in its __init__ and _open.
    config: StoreConfig
    read_only: bool
    commitlog: CommitLog
    consume_queues: ConsumeQueueStore
    index: IndexService
    topics: TopicRegistry
    _closed: bool
    _retention: retention.RetentionService | None
    _compaction: CompactionLogs | CopyReader | None
    _dispatcher: Dispatcher | None

    if TYPE_CHECKING:  # StoreWriter's

        def _check_writable(self) -> None: ...

    def run_retention(self) -> retention.RetentionReport:
        """Run one retention check now (the scheduler runs it periodically). A
        follower deletes nothing: its log is its leader's copy (docs/REPLICATION.md)."""
        if not self._closed and not self.read_only and self.commitlog.is_follower:
            return retention.RetentionReport(0, self.commitlog.min_position, 0.0, False)
        self._check_writable()
        assert self._retention is not None
        assert self._dispatcher is not None
        self._dispatcher.dispatch_available()
        if isinstance(self._compaction, CompactionLogs):  # the copies first: retention waits
            self.commitlog.flush_to(self.commitlog.write_position)  # copies take flushed
            self._compaction.copy_all()
            self._compaction.flush()
        report = self._retention.run_once()
        self._apply_topic_retention()
        return report

    def _compaction_floor(self) -> int:
        compaction = self._compaction
        return compaction.floor() if isinstance(compaction, CompactionLogs) else 2**63 - 1

    def _after_retention(self, min_position: int) -> None:
        self.consume_queues.correct_min_offsets(min_position)
        self.index.delete_files_before(min_position)

    def _file_retention_ms(self) -> float:
        """How old a CommitLog file may grow: the longest retention of any topic
        (every file holds every topic), infinite when one keeps forever (-1). A
        compacted topic's copy keeps its records: it does not hold files back (and
        retention waits for its copy anyway, ``_compaction_floor``)."""
        copied = self._compaction is not None
        topics = [t for t in self.topics.all().values() if not (copied and t.compacted)]
        return retention.file_retention_ms(
            topics, retention.hours_to_ms(self.config.retention_hours)
        )

    def _apply_topic_retention(self) -> int:
        """Move the log start of topics that have their own retention, and of the
        others too when files outlive the store default (a topic keeps longer);
        return how many queues moved."""
        moved = 0
        now_ms = self.commitlog.now_ms()
        default_ms = retention.hours_to_ms(self.config.retention_hours)
        files_outlive_default = self._file_retention_ms() > default_ms
        for topic in self.topics.all().values():
            if topic.compacted and self._compaction is not None:
                continue  # its copy keeps it (mqstore.compaction), with its own retention
            retention_ms = topic.retention_ms
            if retention_ms is None and files_outlive_default:
                retention_ms = default_ms
            if retention_ms is None and topic.retention_bytes is None:
                continue
            for partition in range(topic.partitions):
                queue = self.consume_queues.queue(topic.name, partition)
                start = retention.topic_start_offset(
                    queue, now_ms, retention_ms, topic.retention_bytes
                )
                if start <= queue.min_offset:
                    continue
                if start >= queue.max_offset:
                    boundary = self.commitlog.write_position
                else:
                    boundary = int(queue.get(start)["commitlog_offset"])
                queue.correct_min_offset(boundary)
                moved += 1
        return moved
