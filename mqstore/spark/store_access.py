"""Opening the store from Spark processes: read-only for readers, as THE writer
for sinks when the lock is free, with the file layout the store's files already have.

A store directory fixes its CommitLog file size and ConsumeQueue units per file
when it is created; ``layout_config`` reads them back so that Spark users give
only the path.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any, Final

from mqstore.cli_verify import disk_layout
from mqstore.commitlog.errors import InvalidArgumentError, StoreLockedError
from mqstore.config import StoreConfig
from mqstore.store import MessageStore
from mqstore.topics import TopicConfig

__all__ = [
    "ReaderView",
    "cached_reader",
    "layout_config",
    "open_reader",
    "try_open_writer",
]

LOCK_POLL_MIN_S: Final = 0.01  # first wait for the writer lock; doubles up to the max
LOCK_POLL_MAX_S: Final = 0.5


def layout_config(path: str) -> StoreConfig:
    """A StoreConfig matching the store's existing files (no prewarm: Spark tasks are
    short-lived and must not pre-fault a 1 GiB file)."""
    layout: dict[str, Any] = dict(disk_layout(path))
    return StoreConfig(prewarm=False, **layout)


class ReaderView:
    """A read-only store as planning sees it (``offsets.StoreState``).

    ``earliest_offset`` is the first offset whose record is still in the CommitLog:
    a read-only ConsumeQueue's minimum can lag the writer's retention, so it is
    moved past units that point below the CommitLog's first file (binary search).
    """

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def list_topics(self) -> dict[str, TopicConfig]:
        return self.store.list_topics()

    def describe_topic(self, name: str) -> TopicConfig:
        return self.store.describe_topic(name)

    def latest_offset(self, topic: str, partition: int) -> int:
        return self.store.latest_offset(topic, partition)

    def earliest_offset(self, topic: str, partition: int) -> int:
        store = self.store
        low = store.earliest_offset(topic, partition)
        high = store.latest_offset(topic, partition)
        queue = store.consume_queues.queue(topic, partition)
        floor = store.commitlog.min_position
        while low < high:  # first offset whose unit points at or past ``floor``
            middle = (low + high) // 2
            if int(queue.get(middle)["commitlog_offset"]) < floor:
                low = middle + 1
            else:
                high = middle
        return low

    def offset_for_timestamp(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None:
        earliest = self.earliest_offset(topic, partition)
        found = self.store.offset_for_time(topic, partition, timestamp_ms)
        if found is None:
            return None
        return max(found, earliest), timestamp_ms


_READERS: dict[tuple[int, str], MessageStore] = {}  # (pid, path) -> open read-only store
_READERS_MAX: Final = 8  # stores one Python worker keeps open across tasks


def cached_reader(path: str) -> ReaderView:
    """A read-only store kept open in this worker process across tasks.

    Opening one costs about 180 ms here (mapping files, loading topics); Spark reuses
    its Python workers, so every task after the first in a worker skips that. A
    read-only store follows the writer (new files, topics and units) by itself.
    """
    key = (os.getpid(), os.path.abspath(path))
    store = _READERS.get(key)
    if store is None:
        if not os.path.isdir(path):
            raise InvalidArgumentError(f"option path: no store at {path!r}")
        if len(_READERS) >= _READERS_MAX:
            _READERS.pop(next(iter(_READERS))).close()
        store = _READERS[key] = MessageStore.open(path, layout_config(path), read_only=True)
        if len(_READERS) == 1:
            atexit.register(_close_readers)
    return ReaderView(store)


def _close_readers() -> None:
    while _READERS:
        _READERS.popitem()[1].close()


@contextlib.contextmanager
def open_reader(path: str) -> Iterator[ReaderView]:
    """Open read-only (no lock, works while a writer process runs); close on exit."""
    if not os.path.isdir(path):
        raise InvalidArgumentError(f"option path: no store at {path!r}")
    store = MessageStore.open(path, layout_config(path), read_only=True)
    try:
        yield ReaderView(store)
    finally:
        store.close()


def try_open_writer(path: str, lock_timeout_ms: int = 0) -> MessageStore | None:
    """Open as the store's one writer, waiting up to ``lock_timeout_ms`` for the lock;
    None when another writer (a service, a sibling task) still holds it."""
    deadline = time.monotonic() + lock_timeout_ms / 1000
    delay_s = LOCK_POLL_MIN_S
    while True:
        try:
            return MessageStore.open(path, layout_config(path))
        except StoreLockedError:
            if time.monotonic() + delay_s >= deadline:
                return None
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, LOCK_POLL_MAX_S)
