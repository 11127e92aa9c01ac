"""Long-poll waiters of one store: each blocked reader is woken on its own condition.

A reader registers a Waiter holding its condition (``ready``: e.g. "this queue's max
offset is past my offset", or any of several queues for a Kafka poll) and blocks on
the Waiter's own lock. After every dispatch round that added records the dispatcher
calls ``notify``, which evaluates each registered condition once and releases only
the waiters whose condition now holds: a reader of a queue the round did not touch
stays asleep, and no reader polls.

No lost wake-up: a reader registers BEFORE it checks its condition. A round that
ended before the registration is seen by that check; a round that ends after it
finds the waiter registered and evaluates its condition after the round's units are
written. Re-arming (``_rearm``) happens before each re-check, under the same lock as
``notify``, so a release between a re-check and the next block is never consumed
unseen: the block returns at once.

Kicks (async flush mode): an append calls ``kick`` instead of waking the dispatcher
thread; it releases ONE waiter (the oldest) to run a dispatch round in its own thread
(``wait``'s ``helper``) before it re-checks its condition. A reader of the appended
queue then sees its message after one thread wake-up instead of two (the dispatcher
thread's, then its own); a reader of another queue runs the round for the others
(whom the round's ``notify`` wakes as usual) and sleeps again. One kick is pending at
a time: appends while it is pending add nothing, its round takes them all. A waiter
that leaves with its kick unserved (timeout, stop) hands it back (``kick_lost``).

Failure and stop: ``wake_all`` releases every waiter (the dispatcher failed or is
closing); each one re-checks the failure and its stop flag in its own thread. A
condition that raises inside ``notify`` releases its waiter, which then raises the
same error from its own call (the dispatcher thread never fails for a reader).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from mqstore.commitlog.errors import LimitExceededError

__all__ = ["Waiters"]

# Waiters registered at once, a bound that is still a bound: every round evaluates
# each condition (about 1 µs for a queue's max offset), so 65,536 waiters would cost
# 65 ms a round; a broker holds one per Fetch long poll, far fewer.
WAITERS_MAX: Final = 65_536


class _Waiter:
    """One blocked reader: its condition and the lock it blocks on (held = asleep)."""

    __slots__ = ("blocker", "kicked", "ready", "released")

    def __init__(self, ready: Callable[[], bool]) -> None:
        self.ready = ready
        self.blocker = threading.Lock()
        self.blocker.acquire()
        self.released = False  # the blocker was released and not yet re-armed
        self.kicked = False  # released by ``kick``: run a round before re-checking

    def release(self) -> None:
        """Wake the reader (under the Waiters' lock; at most once per arming)."""
        if not self.released:
            self.released = True
            self.blocker.release()


class Waiters:
    """The registered waiters of one dispatcher."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[int, _Waiter] = {}  # id(waiter) -> waiter, in arrival order
        # The same dict, read only outside: its truthiness (a C check, no __len__ call)
        # is what every append's listener asks first (Dispatcher.appended).
        self.registered: Final = self._waiters
        self.notified_rounds = 0  # rounds whose notify evaluated at least one waiter
        self.released = 0  # wake-ups handed out by notify
        self.kicks = 0  # kicks handed to a waiter
        self._kick_pending = False  # a kicked waiter has not started its round yet

    def __len__(self) -> int:
        return len(self._waiters)

    def notify(self) -> None:
        """After a round that added records: release each waiter whose condition holds.

        The unlocked emptiness check is safe: a waiter registering concurrently checks
        its condition after registering, and this round's units are already written."""
        if not self._waiters:
            return
        with self._lock:
            self.notified_rounds += 1
            for waiter in self._waiters.values():
                if waiter.released:
                    continue
                try:
                    ready = waiter.ready()
                except Exception:  # the waiter raises it from its own call
                    ready = True
                if ready:
                    waiter.release()
                    self.released += 1

    def kick(self) -> bool:
        """After an append: have the oldest waiter run a round. Returns False when
        nobody waits (the caller wakes the dispatcher thread instead).

        The unlocked read of ``_kick_pending`` is safe under the GIL: True means the
        kicked waiter has not yet cleared it, which it does before its round reads the
        log's end, so that round covers the caller's append."""
        if self._kick_pending:
            return True
        with self._lock:
            for waiter in self._waiters.values():
                if not waiter.released:
                    waiter.kicked = True
                    self._kick_pending = True
                    waiter.release()
                    self.kicks += 1
                    return True
            return self._kick_pending  # all released already: their rounds come

    def wake_all(self) -> None:
        """Release every waiter (failure or stop: each re-checks why in its thread)."""
        with self._lock:
            for waiter in self._waiters.values():
                waiter.release()

    def wait(
        self,
        ready: Callable[[], bool],
        timeout_ms: int,
        check_failed: Callable[[], None],
        stopped: Callable[[], bool],
        helper: Callable[[], None] | None = None,
        kick_lost: Callable[[], None] | None = None,
    ) -> bool:
        """Block until ``ready()`` holds or ``timeout_ms`` passes; return which.

        Args:
            ready: the reader's condition, evaluated here and by ``notify``.
            check_failed: raises when waiting can no longer succeed (a failed
                dispatcher); called before every block.
            stopped: True once nothing more will be dispatched (close).
            helper: runs a dispatch round, when this waiter was kicked; must not
                raise.
            kick_lost: called when this waiter leaves with a kick it did not serve
                (the dispatcher thread takes the round).

        Raises:
            LimitExceededError: WAITERS_MAX readers wait already.
            Whatever ``check_failed`` or ``ready`` raise.
        """
        if ready():
            return True
        deadline_s = time.monotonic() + timeout_ms / 1000
        waiter = _Waiter(ready)
        key = id(waiter)
        with self._lock:
            if len(self._waiters) >= WAITERS_MAX:
                raise LimitExceededError(f"{WAITERS_MAX} readers wait already")
            self._waiters[key] = waiter
        try:
            while True:
                if self._rearm(waiter) and helper is not None:
                    helper()
                check_failed()
                if ready():
                    return True
                remaining_s = deadline_s - time.monotonic()
                if remaining_s <= 0 or stopped():
                    return False
                waiter.blocker.acquire(timeout=remaining_s)
        finally:
            with self._lock:
                del self._waiters[key]
                lost = waiter.kicked
                if lost:
                    self._kick_pending = False
            if lost and kick_lost is not None:
                kick_lost()

    def _rearm(self, waiter: _Waiter) -> bool:
        """Hold the waiter's blocker again (taking a release not yet consumed);
        return whether it was a kick (the waiter then runs a round)."""
        with self._lock:
            kicked = waiter.kicked
            if waiter.released:
                waiter.blocker.acquire(blocking=False)  # held already after a wake
                waiter.released = False
            if kicked:
                waiter.kicked = False
                self._kick_pending = False
            assert waiter.blocker.locked()
            return kicked
