"""Flush services: when bytes written through the mappings become durable.

- ``AsyncFlushService``: every ``flush_interval_ms`` it flushes if at least
  ``flush_least_pages`` dirty pages wait, and every ``flush_thorough_interval_ms``
  it flushes whatever waits. A put returns before its bytes are durable.
- ``GroupCommitService``: a put waits until its bytes are durable. Waiting writers
  are served in groups, by leader and followers (no service thread): a leader
  snapshots the write position, makes everything up to it durable with one
  fdatasync per file touched, and releases every writer whose record ends at or
  before it; each waiting writer is woken once, to return or to lead the next sync.
  A writer whose bytes are not durable within ``sync_flush_timeout_ms`` gets
  ``FlushTimeoutError``.

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
# The longest a group-commit leader waits for its group to gather before it syncs:
# two fdatasyncs of a fast disk. It never waits longer than the last sync took.
GATHER_MAX_S = 0.002


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


class _Waiter:
    """A writer waiting for a sync: blocked on its own lock until a leader resolves
    it (``state``), so each waiter is woken once, by the sync that decides it."""

    __slots__ = ("end_position", "error", "lock", "state")

    def __init__(self, end_position: int) -> None:
        self.end_position = end_position
        self.state = _WAITING
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.lock.acquire()  # released once, by whoever resolves the waiter


_WAITING = 0
_DURABLE = 1  # its bytes are durable: acknowledged
_FAILED = 2  # the sync failed: never acknowledged (``error``)
_LEAD = 3  # not covered by the last sync: it leads the next one


class GroupCommitService:
    """Synchronous group commit by leader and followers, one wake-up per writer.

    A writer that needs its bytes durable and finds no leader becomes the leader; the
    others wait as followers, each on its own lock. The leader first gathers its group
    (below), snapshots the write position, makes everything before it durable
    (fdatasync releases the GIL, so other writers keep appending meanwhile), then
    resolves every follower in one pass under the mutex: the ones the sync covered
    are acknowledged, and the first one it did not cover (it appended during the
    sync) is told to lead the next sync; the leader returns to its own work at once.
    No service thread, no notify_all: every writer wakes exactly once per sync that
    concerns it, to return or to lead.

    Gathering: the writers a sync acknowledges are about to append again, but they
    need the GIL to do it, which a leader that went straight to its next sync would
    not give them (the GIL is taken back from a running thread only every 5 ms). So
    a leader waits, before its snapshot, until as many writers as the last sync
    acknowledged have joined (they release it), for at most as long as the last sync
    took (GATHER_MAX_S at most): waiting longer would cost more than another sync.
    One writer alone never waits.

    Failure: a failed sync is never retried. Every waiting writer gets
    FlushFailedError (each follower resolved with the error, the leader raising it),
    and every later one too, before it waits; none is acknowledged.
    """

    def __init__(self, log_: Flushable, timeout_ms: int) -> None:
        self._log = log_
        self._timeout_s = timeout_ms / 1000
        self._mutex = threading.Lock()  # guards every field below
        self._leading = False  # a leader is gathering, syncing or resolving
        self._waiting: list[_Waiter] = []  # followers of the next sync, in arrival order
        self._error: BaseException | None = None
        self._gathering: threading.Lock | None = None  # held by a gathering leader
        self._gather_size = 0  # writers the gathering leader waits for, itself included
        self._group_size = 1  # writers the last sync acknowledged, its leader included
        self._sync_s = 0.0  # how long the last sync took
        self._closed = False
        self.flush_count = 0  # one per group: the figure that shows grouping works

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
        with self._mutex:
            if self._error is not None:
                raise _failed(end_position, self._error)
            if log_.flushed_position >= end_position:
                return
            if self._leading:
                waiter: _Waiter | None = _Waiter(end_position)
                self._waiting.append(waiter)  # type: ignore[arg-type]
                gathering = self._gathering
                if gathering is not None and len(self._waiting) + 1 >= self._gather_size:
                    self._gathering = None
                    gathering.release()  # the group is complete: the leader goes on
            else:
                self._leading = True
                waiter = None
        if waiter is not None and not self._follow(waiter, deadline):
            return
        self._lead(end_position)

    def _follow(self, waiter: _Waiter, deadline: float) -> bool:
        """Wait to be resolved: False when acknowledged, True when told to lead.

        Raises:
            FlushTimeoutError, FlushFailedError: see ``wait_durable``.
        """
        if not waiter.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            with self._mutex:
                if waiter.state == _WAITING:  # still unresolved: leave the queue
                    self._waiting.remove(waiter)
                    raise FlushTimeoutError(
                        f"bytes up to {waiter.end_position} not durable within "
                        f"{self._timeout_s * 1000:.0f} ms"
                    )
            # Resolved as the timeout passed; the resolver released the lock already.
        state = waiter.state
        if state == _FAILED:
            assert waiter.error is not None
            raise _failed(waiter.end_position, waiter.error)
        assert state in (_DURABLE, _LEAD)
        return state == _LEAD

    def _lead(self, end_position: int) -> None:
        """Gather, sync, resolve the followers, hand the lead on (see the class)."""
        log_ = self._log
        failure: BaseException | None = None
        leading = True
        try:
            self._gather()
            started = time.monotonic()
            failure = self._sync(log_.write_position)  # everything appended joins
            with self._mutex:
                if failure is None:
                    self.flush_count += 1
                    self._sync_s = time.monotonic() - started
                self._resolve(log_.flushed_position, failure)
                leading = False
        finally:
            if leading:  # not the sync's failure (an interrupt): let the lead go
                with self._mutex:
                    self._resolve(log_.flushed_position, None)
        if failure is not None:
            raise _failed(end_position, failure)
        assert log_.flushed_position >= end_position

    def _sync(self, target: int) -> BaseException | None:
        """flush_to(target); the failure that poisons the log, if it failed."""
        log_ = self._log
        try:
            log_.flush_to(target)
        except Exception as failure:  # never retried: see the module's crash policy
            if log_.flushed_position >= target:  # synced; what ran after it failed
                log.exception("after a group commit sync")
                return None
            log.critical("group commit flush failed: %s", failure)
            with self._mutex:
                if self._error is None:
                    self._error = failure  # before resolving: no waiter may miss it
                return self._error
        return None

    def _resolve(self, flushed: int, failure: BaseException | None) -> None:
        """Under the mutex: release every follower the sync decided (acknowledged, or
        failed with ``failure``), and tell the first one it did not cover to lead the
        next sync, or let the lead go."""
        acknowledged = 1  # the leader
        rest = []
        for waiter in self._waiting:
            if failure is not None:
                waiter.state, waiter.error = _FAILED, failure
            elif waiter.end_position <= flushed:
                waiter.state = _DURABLE
                acknowledged += 1
            else:
                rest.append(waiter)
                continue
            waiter.lock.release()
        self._group_size = acknowledged
        if rest:
            successor = rest.pop(0)
            successor.state = _LEAD
            successor.lock.release()  # _leading stays True: the lead passes to it
        else:
            self._leading = False
        self._waiting = rest

    def _gather(self) -> None:
        """Wait (bounded) until the writers the last sync acknowledged have joined."""
        size = self._group_size
        if size <= 1:
            return
        with self._mutex:
            if len(self._waiting) + 1 >= size:
                return
            gathering = threading.Lock()
            gathering.acquire()
            self._gathering, self._gather_size = gathering, size
            timeout_s = min(self._sync_s, GATHER_MAX_S)
        gathering.acquire(timeout=timeout_s)
        with self._mutex:
            if self._gathering is gathering:  # timed out: the group is what came
                self._gathering = None

    @property
    def waiting(self) -> int:
        """Writers waiting for a sync right now (followers; a snapshot, no lock)."""
        return len(self._waiting)

    def close(self) -> None:
        """Nothing runs in the background; waiting writers finish on their own."""
        with self._mutex:
            self._closed = True


def _failed(end_position: int, failure: BaseException) -> FlushFailedError:
    error = FlushFailedError(f"bytes up to {end_position} were not made durable: {failure}")
    error.__cause__ = failure.__cause__ or failure  # the OS error itself
    return error
