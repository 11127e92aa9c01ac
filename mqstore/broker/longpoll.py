"""Fetch long polls parked on one watcher thread, not one thread each.

A Fetch that finds fewer than ``min_bytes`` parks here (``LongPolls.wait``): an
asyncio future on the broker's loop, the (topic, partition, offset) positions it
waits on and its deadline. One watcher thread waits on the engine for every parked
poll at once (one ``PartitionLog.wait`` over the union of their positions, which
the engine's appends or dispatch rounds wake) and releases each poll whose
partition moved past its offset, or whose deadline passed, by resolving its future
on the loop. So 1,000 parked Fetches cost one thread, where a pool of 32 wait
threads made the 33rd poll wait its turn (500 ms per turn ahead of it).

No lost wake-up. Each round the watcher watches:

- every partition of a parked poll, at the lowest offset parked on it;
- every partition a poll parked on within the last ``RECENT_S`` (at most
  ``RECENT_PARTITIONS_MAX``), at its high watermark read before the wait.

A poll that parks during a round, on a partition of the second kind, waits at an
offset at or past that watermark (its Fetch read the watermark later, and it never
goes down), so the first append after it ends the wait. A poll on a partition
outside both sets is taken into the next round, at most ``WATCH_SLICE_MS`` later:
the price of a consumer's first poll on a partition nobody polled recently.

Bounds: parked polls are bounded by the broker's connections times its requests in
flight per connection (each parked poll is one such request); the recent set by
``RECENT_PARTITIONS_MAX``. Shutdown (``close``) releases every parked poll and every
later one at once, so a draining broker answers its Fetches without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import Final

from mqstore.broker.log import PartitionLog
from mqstore.commitlog.errors import StoreError

__all__ = ["LongPolls"]

log = logging.getLogger(__name__)

#: The longest single engine wait: the bound on how late a poll parked on a partition
#: outside the watched set is taken in (and on how late a deadline is noticed).
WATCH_SLICE_MS: Final = 50
#: A partition polled within this long stays watched at its watermark between polls, so
#: a consumer that re-polls right after an answer is woken by the next append at once.
RECENT_S: Final = 10.0
#: At most this many recently polled partitions are watched beyond the parked ones (the
#: oldest drop out first); each costs one watermark read per round.
RECENT_PARTITIONS_MAX: Final = 4096
JOIN_TIMEOUT_S: Final = 5.0

Position = tuple[str, int, int]


class _Poll:
    __slots__ = ("deadline", "future", "positions")

    def __init__(
        self, positions: tuple[Position, ...], deadline: float, future: asyncio.Future[None]
    ) -> None:
        self.positions = positions
        self.deadline = deadline  # time.monotonic() seconds
        self.future = future


class LongPolls:
    """The parked Fetches of one broker and the thread that wakes them."""

    def __init__(self, log_: PartitionLog, loop: asyncio.AbstractEventLoop) -> None:
        self._log = log_
        self._loop = loop
        self._lock = threading.Lock()  # guards _polls, _recent, _closed
        self._polls: set[_Poll] = set()
        self._recent: dict[tuple[str, int], float] = {}  # partition -> last parked (monotonic)
        self._added = threading.Event()  # set when a poll parks or the broker stops
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="broker-longpoll", daemon=True)
        self._thread.start()

    @property
    def parked(self) -> int:
        return len(self._polls)

    async def wait(self, positions: Sequence[Position], timeout_ms: int) -> None:
        """Return when one of ``positions`` has a record at or past its offset, when
        ``timeout_ms`` passed, or when the broker stops (on the loop)."""
        assert positions, "a long poll waits on at least one partition"
        assert timeout_ms >= 0
        now = time.monotonic()
        future: asyncio.Future[None] = self._loop.create_future()
        poll = _Poll(tuple(positions), now + timeout_ms / 1000, future)
        with self._lock:
            if self._closed:
                return
            self._polls.add(poll)
            for topic, partition, _ in poll.positions:
                self._recent.pop((topic, partition), None)  # re-inserted as the newest
                self._recent[(topic, partition)] = now
            while len(self._recent) > RECENT_PARTITIONS_MAX:
                del self._recent[next(iter(self._recent))]
        self._added.set()
        try:
            await future
        finally:
            with self._lock:
                self._polls.discard(poll)  # a cancelled Fetch leaves nothing parked

    def close(self) -> None:
        """Release every parked poll, and every later one at once; stop the thread."""
        with self._lock:
            self._closed = True
            polls = list(self._polls)
            self._polls.clear()
        self._added.set()
        self._release([poll.future for poll in polls])
        if self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)

    # ------------------------------------------------------------------ watcher

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                polls = list(self._polls)
                self._added.clear()
            if not polls:
                self._added.wait(RECENT_S)  # nothing parked: sleep until a poll parks
                continue
            try:
                self._round(polls)
            except Exception:  # a bug here must not strand every parked Fetch
                log.exception("long-poll watcher round failed")
                self._release([poll.future for poll in polls])
                self._added.wait(WATCH_SLICE_MS / 1000)

    def _round(self, polls: list[_Poll]) -> None:
        """One engine wait over every watched partition, then release what is ready."""
        now = time.monotonic()
        watched = self._watched(polls, now)
        slice_s = min(WATCH_SLICE_MS / 1000, min(poll.deadline for poll in polls) - now)
        if watched and slice_s > 0:
            positions = [(topic, partition, offset) for (topic, partition), offset in watched]
            try:
                self._log.wait(positions, max(int(slice_s * 1000), 1))
            except StoreError:
                self._added.wait(slice_s)  # a partition went away: its polls go below
        watermarks: dict[tuple[str, int], int | None] = {}
        ready = [poll for poll in polls if self._ready(poll, watermarks)]
        if ready:
            with self._lock:
                self._polls.difference_update(ready)
            self._release([poll.future for poll in ready])

    def _watched(self, polls: list[_Poll], now: float) -> list[tuple[tuple[str, int], int]]:
        """(partition, offset) to wait on: parked ones at their lowest offset, recent
        ones at their watermark now."""
        lowest: dict[tuple[str, int], int] = {}
        for poll in polls:
            for topic, partition, offset in poll.positions:
                key = (topic, partition)
                if key not in lowest or offset < lowest[key]:
                    lowest[key] = offset
        with self._lock:
            recent = list(self._recent.items())
        expired, gone = [], []
        for key, parked_at in recent:
            if now - parked_at > RECENT_S:
                expired.append(key)
            elif key not in lowest:
                try:
                    lowest[key] = self._log.high_watermark(*key)
                except StoreError:
                    gone.append(key)
        if expired or gone:
            with self._lock:
                for key in expired:
                    if now - self._recent.get(key, now) > RECENT_S:  # not parked again since
                        del self._recent[key]
                for key in gone:
                    self._recent.pop(key, None)
        return list(lowest.items())

    def _ready(self, poll: _Poll, watermarks: dict[tuple[str, int], int | None]) -> bool:
        if time.monotonic() >= poll.deadline or poll.future.done():
            return True
        for topic, partition, offset in poll.positions:
            key = (topic, partition)
            if key not in watermarks:
                try:
                    watermarks[key] = self._log.high_watermark(topic, partition)
                except StoreError:
                    watermarks[key] = None  # gone: the Fetch's next pass reports it
            mark = watermarks[key]
            if mark is None or mark > offset:
                return True
        return False

    def _release(self, futures: list[asyncio.Future[None]]) -> None:
        if not futures:
            return
        try:
            self._loop.call_soon_threadsafe(_resolve, futures)
        except RuntimeError:
            pass  # the loop is closed: nobody awaits them any more


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
