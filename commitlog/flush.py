"""Flush services: when bytes written through the mappings become durable.

- ``AsyncFlushService``: every ``flush_interval_ms`` it flushes if at least
  ``flush_least_pages`` dirty pages wait, and every ``flush_thorough_interval_ms``
  it flushes whatever waits. A put returns before its bytes are durable.
- ``GroupCommitService``: a put waits until its bytes are durable. Waiting writers
  are served in groups: a leader snapshots the write position, makes everything up
  to it durable with one fdatasync per file touched, and wakes every writer whose
  record ends at or before it. A writer whose bytes are not durable within
  ``sync_flush_timeout_ms`` gets ``FlushTimeoutError``.

Both call ``Flushable.flush_to(position)``, which is the only code that syncs.

Crash policy: a failed sync is never retried. Linux reports a writeback error once
and marks the failed pages clean, so a second fdatasync "succeeds" over bytes that
never reached the disk. The log poisons itself (``FlushFailedError`` from every later
flush and append); the group commit fails every waiting writer with that error
instead of acknowledging it, and the async flusher stops.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from mqstore.commitlog.errors import FlushFailedError, FlushTimeoutError

__all__ = ["AsyncFlushService", "Flushable", "GroupCommitService"]

log = logging.getLogger(__name__)

PAGE_SIZE_BYTES = 4096


class Flushable(Protocol):
    @property
    def write_position(self) -> int: ...

    @property
    def flushed_position(self) -> int: ...

    def flush_to(self, position: int) -> None: ...


class AsyncFlushService:
    """Background flushing on a timer, as RocketMQ's FlushRealTimeService."""

    def __init__(
        self, log_: Flushable, interval_ms: int, least_pages: int, thorough_interval_ms: int
    ) -> None:
        self._log = log_
        self._interval_s = interval_ms / 1000
        self._least_bytes = least_pages * PAGE_SIZE_BYTES
        self._thorough_interval_s = thorough_interval_ms / 1000
        self._stop = threading.Event()
        self.failures = 0
        self.failure: BaseException | None = None  # the sync failure that stopped it
        self._thread = threading.Thread(target=self._run, name="mqstore-flush", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_thorough = time.monotonic()
        while not self._stop.wait(self._interval_s):
            dirty = self._log.write_position - self._log.flushed_position
            thorough = time.monotonic() - last_thorough >= self._thorough_interval_s
            if dirty <= 0 or (dirty < self._least_bytes and not thorough):
                continue
            try:
                self._log.flush_to(self._log.write_position)
            except Exception as error:  # never retried: see the module's crash policy
                self.failures += 1
                self.failure = error
                log.critical("async flush failed; flushing stops until reopen: %s", error)
                return
            if thorough:
                last_thorough = time.monotonic()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class GroupCommitService:
    """Synchronous group commit by leader and followers (no extra thread hop).

    A writer that needs its bytes durable and finds no flush running becomes the
    leader: it snapshots the write position, makes everything before it durable
    (fdatasync releases the GIL, so other writers keep appending meanwhile), and
    wakes everyone. Writers that arrive during a flush wait; when it ends, every one
    it covered returns, and one of the rest leads the next flush, which covers all
    of them at once. One sync per group, and no hand-off to a service thread on
    the latency path.
    """

    def __init__(self, log_: Flushable, timeout_ms: int) -> None:
        self._log = log_
        self._timeout_s = timeout_ms / 1000
        self._condition = threading.Condition()
        self._flushing = False
        self._closed = False
        self._error: BaseException | None = None
        self.flush_count = 0  # one per group: the figure that shows grouping works
        self._waiters = 0  # writers inside wait_durable (under the condition)
        self._last_group = 0  # writers waiting when the last sync ended

    def wait_durable(self, end_position: int) -> None:
        """Block until every byte before ``end_position`` is durable.

        Raises:
            FlushTimeoutError: not durable within the timeout. The record stays in
                the log and may still become durable; it was not acknowledged.
            FlushFailedError: a sync failed (now or before); the record was not
                acknowledged and the log refuses writes until reopened.
        """
        log_ = self._log
        if log_.flushed_position >= end_position:
            return
        deadline = time.monotonic() + self._timeout_s
        condition = self._condition
        with condition:
            self._waiters += 1
            try:
                self._wait(end_position, deadline)
            finally:
                self._waiters -= 1

    def _wait(self, end_position: int, deadline: float) -> None:
        log_ = self._log
        condition = self._condition
        while log_.flushed_position < end_position:
            failure = self._error
            if failure is not None:
                raise FlushFailedError(
                    f"bytes up to {end_position} were not made durable: {failure}"
                ) from (failure.__cause__ or failure)  # the OS error itself
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FlushTimeoutError(
                    f"bytes up to {end_position} not durable within {self._timeout_s * 1000:.0f} ms"
                )
            if self._flushing:
                condition.wait(remaining)
                continue
            self._flushing = True
            condition.release()
            if self._last_group > 1:
                # Several writers are at work: give them the GIL once, so that the ones
                # the last sync woke append before this sync rather than after it
                # (bigger groups; RocketMQ gets that by swapping lists every 10 ms).
                time.sleep(0)
            target = log_.write_position  # everything appended so far joins the group
            try:
                log_.flush_to(target)
                error: BaseException | None = None
            except Exception as failure:  # never retried: see the module's crash policy
                if log_.flushed_position >= target:  # synced; what ran after it failed
                    error = None
                    log.exception("after a group commit sync")
                else:
                    error = failure
                    log.critical("group commit flush failed: %s", failure)
            finally:
                condition.acquire()
                self._flushing = False
                self._last_group = self._waiters
                if error is not None and self._error is None:
                    self._error = error  # before waking: no waiter may miss it
                condition.notify_all()
            if error is None:
                self.flush_count += 1

    def close(self) -> None:
        """Nothing runs in the background; waiting writers finish on their own."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
