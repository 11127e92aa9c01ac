"""File and directory names of the segmented log, in one place (Kafka's LogFileUtils).

A store directory holds::

    <root>/lock                               exclusive writer lock (flock)
    <root>/.kafka_cleanshutdown               present only while the store is closed cleanly
    <root>/recovery-point-offset-checkpoint   flushed offset per partition (text, Kafka's)
    <root>/log-start-offset-checkpoint        log start offset per partition (text, Kafka's)
    <root>/cleaner-offset-checkpoint          compacted partitions: the first dirty offset
    <root>/topics                             topic metadata (mqstore.topics)
    <root>/offsets/<group>                    committed offsets (mqstore.offsets)
    <root>/<topic>-<partition>/<20-digit base offset>.log|.index|.timeindex

Segment names carry the base offset zero-padded to 20 digits "so that ls sorts
numerically", as Kafka does. A segment being deleted is renamed ``<name>.deleted``
first and removed after ``file_delete_delay_ms``. The cleaner writes a segment as
``<name>.cleaned``, commits it by renaming it ``<name>.swap``, renames the segments
it replaces ``*.deleted``, then drops the suffix (Kafka's replaceSegments).
"""

from __future__ import annotations

import os
from typing import Final

from mqstore.commitlog.durable import fsync_directory  # re-exported: the segmented files use it

__all__ = [
    "CLEANED_SUFFIX",
    "CLEANER_CHECKPOINT_NAME",
    "CLEANER_STATS_NAME",
    "CLEAN_SHUTDOWN_NAME",
    "SWAP_SUFFIX",
    "DELETED_SUFFIX",
    "INDEX_SUFFIX",
    "LOG_START_OFFSET_CHECKPOINT_NAME",
    "LOG_SUFFIX",
    "OFFSET_DIGITS",
    "RECOVERY_POINT_CHECKPOINT_NAME",
    "TIME_INDEX_SUFFIX",
    "fsync_directory",
    "parse_base_offset",
    "partition_directory",
    "segment_path",
]

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
TIME_INDEX_SUFFIX: Final = ".timeindex"
DELETED_SUFFIX: Final = ".deleted"
CLEANED_SUFFIX: Final = ".cleaned"  # a segment the cleaner is writing: deleted at open
SWAP_SUFFIX: Final = ".swap"  # a cleaned segment committed to replace others: completed at open
CLEANER_CHECKPOINT_NAME: Final = "cleaner-offset-checkpoint"
CLEANER_STATS_NAME: Final = "cleaner-stats.json"  # the cleaner's figures (log_cleaner)
OFFSET_DIGITS: Final = 20  # enough for any int64 offset
CLEAN_SHUTDOWN_NAME: Final = ".kafka_cleanshutdown"
RECOVERY_POINT_CHECKPOINT_NAME: Final = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT_NAME: Final = "log-start-offset-checkpoint"


def partition_directory(root: str, topic: str, partition: int) -> str:
    """``<root>/<topic>-<partition>``. The topic name was validated (no ``/``)."""
    assert partition >= 0
    return os.path.join(root, f"{topic}-{partition}")


def segment_path(directory: str, base_offset: int, suffix: str) -> str:
    """``<directory>/<20-digit base offset><suffix>``."""
    assert base_offset >= 0
    return os.path.join(directory, f"{base_offset:0{OFFSET_DIGITS}d}{suffix}")


def parse_base_offset(name: str, suffix: str) -> int | None:
    """The base offset of a file named ``<20 digits><suffix>``, else None."""
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    if len(stem) != OFFSET_DIGITS or not stem.isdigit():
        return None
    return int(stem)
