"""The dispatcher: builds ConsumeQueue units and IndexFile entries from the CommitLog.

A service thread waits up to ``interval_ms`` (1 ms) or until an append wakes it,
then reads every record from the dispatched position to the readable end (the write
position, or in sync-flush mode the flushed position, so that only durable bytes
are ever exposed), groups them per queue, and hands each group to its ConsumeQueue
in one ``put_batch``, and every keyed record to the IndexService in one
``put_batch``. It then advances
the dispatched position, wakes the long-polling readers whose queue the round
reached (dispatch/waiters.py) and calls the round listener (the store's cross-process
notice to read-only followers, dispatch/notify.py).

Records are parsed header-only, without checksum verification, like RocketMQ's
ReputMessageService: every record before the write position was written by this
process or verified by recovery, and readers verify each record they return. What the
appends' feed does not describe (after a crash: everything from the checkpoint) is
read from the log in columns, one C call per run of headers (dispatch/log_scan.py).

Crash policy: the dispatched position is saved in the checkpoint only after the
ConsumeQueues and the index are flushed. After a crash, dispatch restarts at the
checkpointed position and re-dispatches; ConsumeQueue and index writes are
idempotent, so nothing is duplicated or shifted.

Failure policy: a record the dispatcher cannot parse (a bad magic, a size below a
header or past its file or the written range, a blank record that does not end its
file) is corrupt data; parsing never trusts such a size, so it can never spin. What
precedes the record is dispatched, the position stops at the record's start, and
the dispatcher fails at once: re-reading the same bytes gives the same answer. Any
other failing round is retried with a doubling pause, for at most ``retry_window_ms``
of consecutive failures, then the dispatcher fails too. Failed, it stops for good:
``failure`` holds a DispatchFailedError (cause chained), and ``dispatch_available``
and ``wait_for`` raise one, so no reader waits forever or reads stale data unknowingly.
Reopening the store (once the cause is fixed) starts a fresh dispatcher.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple, NoReturn, Protocol

import numpy as np

from mqstore.commitlog.appender import FEED_BORN, FEED_KEYED, FEED_TAGGED, feed_columns
from mqstore.commitlog.commitlog import BatchFeed, CommitLog
from mqstore.commitlog.errors import (
    ConfigError,
    CorruptDataError,
    DispatchFailedError,
)
from mqstore.commitlog.record import decode_keys, tag_hash
from mqstore.consumequeue.queue_store import ConsumeQueueStore
from mqstore.consumequeue.tail_writer import SMALL_WRITE_UNITS, TailWriter
from mqstore.dispatch.log_scan import SMALL_GROUP_UNITS, LogScan, QueueLike
from mqstore.dispatch.waiters import Waiters

__all__ = ["Dispatcher", "TimestampChooser"]


def _no_arm() -> None:
    """The default of ``Dispatcher.set_arm``: a listener called after every append."""


#: The longest the dispatcher thread sleeps on an idle store between rounds it was not
#: woken for (the dispatch interval doubles up to it while rounds find nothing).
IDLE_WAIT_MAX_S = 0.05

log = logging.getLogger(__name__)

ROUND_BYTES_MAX: Final = 8 << 20  # one round's parse; bounds reader latency per round
# A failing round is retried after a pause that doubles from MIN to MAX: the first
# retries are quick (a transient error costs readers little), later ones cheap.
RETRY_BACKOFF_MS_MIN: Final = 50
RETRY_BACKOFF_MS_MAX: Final = 2_000  # a cleared fault is noticed within 2 s
# Consecutive failing time before the dispatcher gives up: three retention checks at
# their default 10 s interval, so a full disk has time to be cleaned before readers
# are failed; short enough that a permanent fault is visible within half a minute.
RETRY_WINDOW_MS: Final = 30_000
RETRY_WINDOW_MS_MAX: Final = 3_600_000  # a bound that is still a bound
_TAG_CACHE_MAX: Final = 4096  # distinct tags whose hashes are remembered
# One-record feed entries written per TailWriter call: the per-call cost is spread over
# this many, and the columns a dispatcher keeps stay small (44 B a row, 176 KiB).
RUN_ROWS_MAX: Final = 4096
#: feed_columns' columns: slots, positions, sizes, queue offsets, born, stored.
_RUN_DTYPES: Final = (np.int32, np.int64, np.int32, np.int64, np.int64, np.int64)


_TOPIC: Final = operator.itemgetter(2)  # of a feed entry (commitlog/appender.py)
_QUEUE_ID: Final = operator.itemgetter(3)


class QueueStoreLike(Protocol):
    def queue(self, topic: str, queue_id: int) -> QueueLike: ...


class IndexLike(Protocol):
    def put_batch(
        self,
        topics: Sequence[str],
        keys: Sequence[Sequence[str]],
        physical_offsets: Sequence[int],
        store_ts_ms: Sequence[int],
    ) -> None: ...


#: Given a topic, True when its ConsumeQueue time is CreateTime (the born timestamp),
#: False for LogAppendTime (the store timestamp).
TimestampChooser = Callable[[str], bool]


class _Group:
    """Units of one queue collected in one round (queue offsets are consecutive).

    Single records go to the lists; batches arrive as arrays and are kept as chunks,
    in order, so a round concatenates once."""

    __slots__ = ("chunks", "create_time", "first_queue_offset", "offsets", "sizes", "tags", "times")

    def __init__(self, first_queue_offset: int, create_time: bool) -> None:
        self.first_queue_offset = first_queue_offset
        self.create_time = create_time
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.tags: list[int] = []
        self.times: list[int] = []
        self.chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def seal_lists(self) -> None:
        """Move the single-record lists into the chunk list (keeps log order)."""
        if self.offsets:
            self.chunks.append(
                (
                    np.array(self.offsets, dtype=np.int64),
                    np.array(self.sizes, dtype=np.int32),
                    np.array(self.tags, dtype=np.int64),
                    np.array(self.times, dtype=np.int64),
                )
            )
            self.offsets, self.sizes, self.tags, self.times = [], [], [], []

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        self.seal_lists()
        if len(self.chunks) == 1:
            return self.chunks[0]
        offsets, sizes, tags, times = zip(*self.chunks, strict=True)
        return (np.concatenate(offsets), np.concatenate(sizes), np.concatenate(tags),
                np.concatenate(times))  # fmt: skip


class _ReadLog(NamedTuple):
    """Work item: records in [start, stop) that the feed does not describe."""

    start: int
    stop: int


class Dispatcher:
    """Dispatch service of one store.

    Attributes:
        failure: why it stopped for good (a DispatchFailedError, cause chained), or
            None while it runs. Set once, never cleared; read only.
        last_error: the last failed round's error while it retries, else None.
    """

    def __init__(
        self,
        commitlog: CommitLog,
        queues: QueueStoreLike,
        index: IndexLike,
        *,
        start_position: int,
        start_ts_ms: int = 0,
        sync_mode: bool,
        uses_create_time: TimestampChooser,
        interval_ms: int = 1,
        retry_window_ms: int = RETRY_WINDOW_MS,
    ) -> None:
        """Args:
            start_ts_ms: the store timestamp of the record before ``start_position``
                (0: unknown), until a round dispatches one.
            retry_window_ms: how long rounds may keep failing before the dispatcher
                gives up (see the module docstring), 1 to RETRY_WINDOW_MS_MAX.

        Raises:
            ConfigError: ``retry_window_ms`` out of bounds.
        """
        if not 1 <= retry_window_ms <= RETRY_WINDOW_MS_MAX:
            raise ConfigError(
                f"retry_window_ms {retry_window_ms} is outside [1, {RETRY_WINDOW_MS_MAX}]"
            )
        self._commitlog = commitlog
        self._queues = queues
        # The fast path for one-unit-per-queue rounds (many queues); the real store only.
        self._tail = TailWriter(queues) if isinstance(queues, ConsumeQueueStore) else None
        self._log_scan = LogScan(
            commitlog, queues.queue, self._tail, uses_create_time, self._tag_hash
        )
        self._index = index
        self._sync_mode = sync_mode
        self._commit_limit: Callable[[], int] | None = None  # see set_commit_limit
        self._uses_create_time = uses_create_time
        self._interval_s = interval_ms / 1000
        self._retry_window_ms = retry_window_ms
        # Why the dispatcher stopped for good (cause chained), or None; set once, read
        # only. A plain attribute, not a property: every put checks it.
        self.failure: DispatchFailedError | None = None
        self._position = start_position
        self._dispatched_ts_ms = start_ts_ms
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._waiters = Waiters()
        self._registered = self._waiters.registered  # see appended
        # Re-arms the append listener when it is called once per arming (set_arm).
        self._arm: Callable[[], None] = _no_arm
        self._round_listener: Callable[[], None] | None = None
        self._before_publish: Callable[[], object] | None = None  # see set_before_publish
        self._round_lock = threading.Lock()
        self._fail_lock = threading.Lock()
        self._tag_hashes: dict[bytes, int] = {}
        self._thread: threading.Thread | None = None
        # Work not yet dispatched, in log order: feed entries and _ReadLog ranges.
        self._work: list[Any] = []
        # _write_run's columns (feed_columns fills them), and its tag hashes of none.
        self._run_columns: tuple[np.ndarray, ...] = tuple(
            np.zeros(RUN_ROWS_MAX, dtype) for dtype in _RUN_DTYPES
        )  # fmt: skip
        self._run_tags = np.zeros(RUN_ROWS_MAX, dtype=np.int64)
        self._work_end = start_position
        self._use_feed = False
        self.rounds = 0
        self.dispatched_records = 0
        self.last_error: BaseException | None = None

    # ------------------------------------------------------------------ service

    def start(self) -> None:
        assert self._thread is None
        self._thread = threading.Thread(target=self._run, name="mqstore-dispatch", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Called after every append (and flush): dispatch without waiting the interval.

        Setting an Event takes its lock; checking the flag first keeps a burst of
        appends within one round to one set."""
        wake = self._wake
        if not wake.is_set():
            wake.set()

    def set_arm(self, arm: Callable[[], None]) -> None:
        """``arm()`` has the next append call ``appended`` again: the listener is then
        called once per arming (CommitLog.set_append_listener's ``once``). This
        dispatcher arms it when its thread goes back to sleep (before its rounds read
        the log's end), while readers wait, and when one starts waiting. Appends
        between make no Python call: the thread is awake already."""
        self._arm = arm

    def appended(self) -> None:
        """The async-flush append listener: while readers of this process wait, kick
        one of them to dispatch in its own thread (dispatch/waiters.py: its wake-up
        replaces the dispatcher thread's, one hop fewer); else wake the thread."""
        if self._registered:  # a dict's truthiness: no call
            self._arm()  # every append kicks while readers wait
            if self._waiters.kick():
                return
        wake = self._wake
        if not wake.is_set():
            wake.set()

    def _help_from_reader(self) -> None:
        """A kicked reader's round (at most ROUND_BYTES_MAX), in the reader's thread.
        Errors are left to the dispatcher thread, which retries: the reader's wait
        goes on (and a failure is raised to it by its failure check)."""
        if self.failure is not None:
            self.wake()  # nothing will be dispatched: the thread's state says why
            return
        if self._round_in_caller(ROUND_BYTES_MAX, "in a reader's thread") and (
            self._position < self.readable_end()
        ):
            self.wake()  # more than one round's budget: the thread takes the rest

    def _round_in_caller(self, bytes_max: int | None, where: str) -> bool:
        """One round in the calling thread, unless one runs already (then the thread is
        woken). Errors are logged and left to the dispatcher thread, which retries.
        Returns whether the round ran without error."""
        if not self._round_lock.acquire(blocking=False):
            self.wake()
            return False
        try:
            count = self._round(bytes_max)
        except Exception as error:
            log.warning("dispatch %s failed (the dispatcher retries): %r", where, error)
            self.wake()
            return False
        finally:
            self._round_lock.release()
        if count:
            self._after_round()
        return True

    def close(self) -> None:
        """Dispatch what is readable (unless failed), then stop."""
        self._stop.set()
        self._wake.set()
        self._waiters.wake_all()  # they return False: nothing more is dispatched
        if self._thread is not None:
            self._thread.join()
        try:
            if self.failure is None:
                self.dispatch_available()
        finally:
            if self._tail is not None:
                self._tail.detach_all()

    def _run(self) -> None:
        failing_since_s: float | None = None  # monotonic time of the first failure in a row
        backoff_ms = RETRY_BACKOFF_MS_MIN
        attempts = 0
        idle_s = self._interval_s
        while not self._stop.is_set():
            self._wake.wait(idle_s)
            self._wake.clear()
            self._arm()  # after the clear, before the rounds read the log's end
            try:
                dispatched = 0
                while count := self.dispatch_available(ROUND_BYTES_MAX):
                    dispatched += count
                # Every append and flush wakes this thread (wake, appended), so the timed
                # wait is only a safety net: an idle store backs it off to IDLE_WAIT_MAX_S
                # instead of taking the GIL every interval from the threads that work.
                idle_s = self._interval_s if dispatched else min(idle_s * 2, IDLE_WAIT_MAX_S)
            except DispatchFailedError:
                return  # failed for good (corrupt data): the state says why
            except Exception as error:
                attempts += 1
                now_s = time.monotonic()
                if failing_since_s is None:
                    failing_since_s = now_s
                failing_ms = (now_s - failing_since_s) * 1000
                self.last_error = error
                if failing_ms >= self._retry_window_ms:
                    self._fail(error, f"{attempts} rounds failed over {failing_ms:.0f} ms")
                    return
                log.warning(
                    "dispatch round failed at %d (attempt %d); retrying in %d ms: %r",
                    self._position, attempts, backoff_ms, error,
                    exc_info=attempts == 1,
                )  # fmt: skip
                self._stop.wait(backoff_ms / 1000)
                backoff_ms = min(backoff_ms * 2, RETRY_BACKOFF_MS_MAX)
                continue
            if attempts:
                log.info(
                    "dispatch recovered at %d after %d failed rounds", self._position, attempts
                )
            failing_since_s, backoff_ms, attempts = None, RETRY_BACKOFF_MS_MIN, 0
            self.last_error = None

    def check_failed(self) -> None:
        """Raise the failure, if any, as a fresh DispatchFailedError.

        Raises:
            DispatchFailedError: the dispatcher failed.
        """
        if self.failure is not None:
            self._raise_failed()

    def _raise_failed(self) -> NoReturn:
        failure = self.failure
        assert failure is not None
        # A fresh error per raise: re-raising one instance from many threads would
        # grow and share its traceback.
        raise DispatchFailedError(failure.position, failure.reason) from failure.__cause__

    def _fail(self, cause: BaseException, reason: str) -> None:
        """Enter the failed state and wake every waiting reader to see it."""
        failure = DispatchFailedError(self._position, f"{reason}: {cause}")
        failure.__cause__ = cause
        with self._fail_lock:
            if self.failure is not None:
                return
            self.failure = failure
        self._waiters.wake_all()
        log.critical("%s", failure, exc_info=cause)

    @property
    def position(self) -> int:
        """Every record before this physical offset is in the ConsumeQueues and index."""
        return self._position

    @property
    def dispatched_ts_ms(self) -> int:
        return self._dispatched_ts_ms

    def readable_end(self) -> int:
        log_ = self._commitlog
        end = log_.flushed_position if self._sync_mode else log_.write_position
        limit = self._commit_limit
        return end if limit is None else min(end, limit())

    def set_commit_limit(self, limit: Callable[[], int] | None) -> None:
        """Dispatch (expose to readers) only below ``limit()``: replication's high
        watermark, RocketMQ 5's confirmOffset (mqstore.replication). It must be a
        record boundary that never moves back; None removes the limit. Whoever moves
        it calls ``wake``; the thread's round every ``interval_ms`` also sees it."""
        self._commit_limit = limit
        self.wake()

    @contextlib.contextmanager
    def truncating(self) -> Iterator[Callable[..., None]]:
        """Hold off rounds while a follower's log and derived files are cut; the
        yielded ``rewind(position)`` moves the dispatch position back to the cut
        (dispatch resumes from there; ``exactly``: to ``position`` itself, a log
        started again there) and drops the work queued past it."""

        def rewind(position: int, exactly: bool = False) -> None:
            self._position = position if exactly else min(self._position, position)
            self._work = []
            self._work_end = self._position
            if self._tail is not None:  # its cached tails point past the cut
                self._tail.detach_all()
                self._tail = TailWriter(self._queues)  # type: ignore[arg-type]
                self._log_scan = LogScan(
                    self._commitlog, self._queues.queue, self._tail, self._uses_create_time,
                    self._tag_hash,
                )  # fmt: skip

        with self._round_lock:
            yield rewind
        self.wake()

    def lag_bytes(self) -> int:
        return self.readable_end() - self._position

    # ------------------------------------------------------------------ dispatch

    def use_feed(self) -> None:
        """Take what appends wrote from the CommitLog's feed instead of re-reading it."""
        self._commitlog.enable_feed()
        self._use_feed = True

    def dispatch_available(self, bytes_max: int | None = None) -> int:
        """Dispatch records up to the readable end (at most about ``bytes_max`` bytes).

        Returns:
            The number of records dispatched (0 when there was nothing new).

        Raises:
            DispatchFailedError: the dispatcher failed (now, on corrupt data, or before).
        """
        if self.failure is not None:
            self._raise_failed()
        with self._round_lock:
            count = self._round(bytes_max)
        if count:
            self._after_round()
        return count

    def dispatch_now(self) -> None:
        """The sync-flush listener: with writers waiting for syncs, dispatch what is
        readable in the calling thread; else (or when a round is running already)
        wake the dispatcher thread.

        Under load a group commit leader holds the GIL after its sync, and the GIL is
        what writers queue for: dispatching here saves the hop to the dispatcher
        thread (a fifth of the throughput of 8 sync writers). A writer alone gains
        from the thread instead, which dispatches while the writer's next sync runs.
        Errors are logged and left to the thread, which retries; a put is never
        failed by the dispatch it helps."""
        if self.failure is not None:
            return
        if not self._commitlog.sync_waiting:
            self.wake()
            return
        self._round_in_caller(None, "after a sync")

    def set_before_publish(self, prepare: Callable[[], object] | None) -> None:
        """Call ``prepare()`` in every round that has records to dispatch, after the
        round fixed its end and before it writes a unit: what the appends below that
        end registered (a topic ``put`` grew) is persisted before their records become
        readable. If it raises, the round fails and is retried as any round is."""
        self._before_publish = prepare

    def set_round_listener(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener()`` after every round that dispatched records (after the
        in-process waiters are woken); it must not raise."""
        self._round_listener = listener

    def _after_round(self) -> None:
        """Wake the readers whose condition the round made true, then the listener."""
        self._waiters.notify()
        listener = self._round_listener
        if listener is not None:
            listener()

    def _round(self, bytes_max: int | None) -> int:
        """One round up to the readable end, under the round lock."""
        if self.failure is not None:  # failed while this call waited for the lock
            self._raise_failed()
        end = self.readable_end()
        if bytes_max is not None:
            end = min(end, self._position + bytes_max)
        if end <= self._position:
            return 0
        prepare = self._before_publish
        if prepare is not None:
            prepare()  # every append below ``end`` made its changes before ``end`` was read
        try:
            return self._dispatch_until(end)
        except CorruptDataError as error:  # the same bytes would fail the same way
            self._fail(error, "the CommitLog holds a record dispatch cannot parse")
            self._raise_failed()

    def _refill(self) -> None:
        """Move the CommitLog's feed into the work queue, with _ReadLog ranges for
        whatever the feed does not cover (before it, or after an overflow)."""
        if not self._use_feed:
            stop = self._commitlog.write_position
            if stop > self._work_end:
                self._work.append(_ReadLog(self._work_end, stop))
                self._work_end = stop
            return
        start, entries, stop = self._commitlog.take_feed()
        if start > self._work_end:
            self._work.append(_ReadLog(self._work_end, start))
        if entries:
            self._work.extend(entries)
            last = entries[-1]
            covered = (
                int(last.positions[-1] + last.sizes[-1]) if type(last) is BatchFeed
                else last[0] + last[1]
            )  # fmt: skip
        else:
            covered = start
        if stop > covered:
            self._work.append(_ReadLog(covered, stop))
        self._work_end = max(self._work_end, stop)

    def _dispatch_until(self, end: int) -> int:
        groups: dict[tuple[str, int], _Group] = {}
        keyed: list[tuple[str, list[str], int, int]] = []
        if self._work_end < end:
            self._refill()
        position, store_ts_ms, count = self._position, 0, 0
        corruption: CorruptDataError | None = None
        work = self._work
        head = 0  # work[:head] is done; dropped once the round succeeds
        tail = self._tail
        try:
            while head < len(work) and position < end:
                item = work[head]
                kind = type(item)
                if kind is tuple and tail is not None:
                    # A run of one-record feed entries, through the TailWriter.
                    if groups:  # per-queue order: what came before is written first
                        self._write_groups(groups)
                        groups = {}
                    taken = self._write_run(work, head, end, keyed)
                    if not taken:
                        break  # the next record ends past this round
                    head += taken
                    count += taken
                    last = work[head - 1]
                    position = last[0] + last[1]
                    store_ts_ms = last[6]
                    continue
                if kind is _ReadLog:
                    if groups:  # per-queue order: what came before is written first
                        self._write_groups(groups)
                        groups = {}
                    parsed = self._log_scan.scan(
                        max(item.start, position), min(item.stop, end), item.stop, keyed
                    )
                    position = parsed.position
                    count += parsed.records
                    store_ts_ms = parsed.store_ts_ms or store_ts_ms
                    if parsed.corruption is not None:
                        corruption = parsed.corruption  # dispatch what came before it
                        break
                    if position >= item.stop:
                        head += 1
                    continue
                if kind is BatchFeed:
                    item_end = int(item.positions[-1] + item.sizes[-1])
                    if item_end > end:
                        break
                    self._add_batch(item, groups, keyed)
                    count += len(item.positions)
                    store_ts_ms = item.store_ts_ms
                else:  # one record, no TailWriter (a test's queue store)
                    item_end = item[0] + item[1]
                    if item_end > end:
                        break
                    self._add_record(item, groups, keyed)
                    count += 1
                    store_ts_ms = item[6]
                position = item_end
                head += 1
            self._write_groups(groups)
            if keyed:
                topics, keys, offsets_, stamps = zip(*keyed, strict=True)
                self._index.put_batch(topics, keys, offsets_, stamps)
        except BaseException:
            # The items taken above were not all written (a full disk...): read them
            # again from the log next round; ConsumeQueue and index writes are idempotent.
            work.clear()
            work.append(_ReadLog(self._position, self._work_end))
            raise
        del work[:head]
        assert position >= self._position
        self._position = position
        if store_ts_ms:
            self._dispatched_ts_ms = store_ts_ms
        self.rounds += 1
        self.dispatched_records += count
        if corruption is not None:
            raise corruption
        return count

    def _write_run(
        self, work: list[Any], head: int, end: int, keyed: list[tuple[str, list[str], int, int]]
    ) -> int:
        """Write the run of one-record feed entries at ``work[head:]`` that ends by
        ``end`` (at most RUN_ROWS_MAX) through the TailWriter; return how many.

        The columns come from one ``feed_columns`` call (C when built) into arrays the
        dispatcher keeps; Python looks at single entries only for what the run has:
        a queue without a slot yet, tags, keys, born timestamps of their own."""
        tail = self._tail
        assert tail is not None
        slots, positions, sizes, queue_offsets, born, stored = self._run_columns
        taken, flags = feed_columns(work, head, end, tail.slots, *self._run_columns)
        if not taken:
            return 0
        slots, positions, sizes = slots[:taken], positions[:taken], sizes[:taken]
        queue_offsets, born, stored = queue_offsets[:taken], born[:taken], stored[:taken]
        if (min(slots.tolist()) if taken <= SMALL_WRITE_UNITS else slots.min()) < 0:
            # Queues new to the TailWriter: their slots in one call.
            missing = np.flatnonzero(slots < 0)
            entries = [work[head + index] for index in missing.tolist()]
            topics, queue_ids = list(map(_TOPIC, entries)), list(map(_QUEUE_ID, entries))
            slots[missing] = tail.new_slots(topics, queue_ids)
        if flags & FEED_TAGGED:
            tag_hash_ = self._tag_hash
            tag_codes = np.fromiter(
                (tag_hash_(work[i][7]) if work[i][7] else 0 for i in range(head, head + taken)),
                dtype=np.int64,
                count=taken,
            )
        else:
            tag_codes = self._run_tags[:taken]  # zeros: no tag
        times = stored
        if flags & FEED_BORN:  # per topic: CreateTime takes the born timestamp
            topics = [work[i][2] for i in range(head, head + taken)]
            create = {topic: self._uses_create_time(topic) for topic in set(topics)}
            mask = np.fromiter(map(create.__getitem__, topics), dtype=bool, count=taken)
            times = np.where(mask, born, stored)
        tail.write(slots, queue_offsets, positions, sizes, tag_codes, times)
        if flags & FEED_KEYED:
            for entry in work[head : head + taken]:
                if entry[8]:
                    keyed.append((entry[2], list(decode_keys(entry[8])), entry[0], entry[6]))
        return int(taken)

    def _group(self, groups: dict[tuple[str, int], _Group], topic: str, queue_id: int,
               queue_offset: int) -> _Group:  # fmt: skip
        group = groups.get((topic, queue_id))
        if group is None:
            group = groups[(topic, queue_id)] = _Group(queue_offset, self._uses_create_time(topic))
        return group

    def _add_record(self, item: tuple[Any, ...], groups: dict[tuple[str, int], _Group],
                    keyed: list[tuple[str, list[str], int, int]]) -> None:  # fmt: skip
        position, size, topic, queue_id, queue_offset, born_ts, store_ts, tag, keys = item
        group = self._group(groups, topic, queue_id, queue_offset)
        group.offsets.append(position)
        group.sizes.append(size)
        group.tags.append(self._tag_hash(tag) if tag else 0)
        group.times.append(born_ts if group.create_time else store_ts)
        if keys:
            keyed.append((topic, list(decode_keys(keys)), position, store_ts))

    def _add_batch(self, item: BatchFeed, groups: dict[tuple[str, int], _Group],
                   keyed: list[tuple[str, list[str], int, int]]) -> None:  # fmt: skip
        group = self._group(groups, item.topic, item.queue_id, item.first_queue_offset)
        group.seal_lists()
        count = len(item.positions)
        encoded = item.encoded
        store_ts = item.store_ts_ms
        if encoded is None:  # a plain batch: one tag, no keys, born times as columns
            code = self._tag_hash(item.tag) if item.tag else 0
            born = item.born_ts_ms if group.create_time else None
            if isinstance(born, np.ndarray):
                times = born
            else:
                times = np.full(count, store_ts if born is None else born, dtype=np.int64)
            group.chunks.append(
                (item.positions, item.sizes, np.full(count, code, dtype=np.int64), times)
            )
            return
        tags = np.fromiter(
            (self._tag_hash(e[2]) if e[2] else 0 for e in encoded), dtype=np.int64, count=count
        )
        if group.create_time:
            times = np.fromiter(
                (store_ts if e[6] is None else e[6] for e in encoded), dtype=np.int64, count=count
            )
        else:
            times = np.full(count, store_ts, dtype=np.int64)
        group.chunks.append((item.positions, item.sizes, tags, times))
        positions = item.positions
        for index, entry in enumerate(encoded):
            if entry[3]:
                keyed.append(
                    (item.topic, list(decode_keys(entry[3])), int(positions[index]), store_ts)
                )

    def _write_groups(self, groups: dict[tuple[str, int], _Group]) -> None:
        tail = self._tail
        for (topic, queue_id), group in groups.items():
            queue = self._queues.queue(topic, queue_id)
            if not group.chunks and len(group.offsets) <= SMALL_GROUP_UNITS:
                # Many queues, few units each: numpy's per-call cost would dominate.
                queue_offset = group.first_queue_offset
                for unit in zip(group.offsets, group.sizes, group.tags, group.times, strict=True):
                    queue.put(queue_offset, *unit)
                    queue_offset += 1
            else:
                offsets, sizes, tags, times = group.columns()
                queue.put_batch(group.first_queue_offset, offsets, sizes, tags, times)
            if tail is not None:
                tail.forget(topic, queue_id)  # its row no longer points at the tail

    def _tag_hash(self, raw: bytes) -> int:
        value = self._tag_hashes.get(raw)
        if value is None:
            value = tag_hash(raw)
            if len(self._tag_hashes) < _TAG_CACHE_MAX:
                self._tag_hashes[raw] = value
        return value

    # ------------------------------------------------------------------ long polling

    def wait_for(self, has_data: Callable[[], bool], timeout_ms: int) -> bool:
        """Block until ``has_data()`` is true or the timeout passes; return which.

        ``has_data`` is evaluated by every dispatch round that added records, and the
        caller is woken only when it holds (dispatch/waiters.py): a reader of one queue
        sleeps through rounds for the others.

        Raises:
            DispatchFailedError: the dispatcher failed before ``has_data()`` came true
                (it never will: nothing more is dispatched).
            LimitExceededError: too many readers wait at once (waiters.WAITERS_MAX).
        """
        self._arm()  # the appends from now on kick (appended), once registered
        return self._waiters.wait(
            has_data, timeout_ms, self.check_failed, self._stop.is_set,
            helper=self._help_from_reader, kick_lost=self.wake,
        )  # fmt: skip

    @property
    def waiting(self) -> int:
        """How many readers are blocked in ``wait_for`` now."""
        return len(self._waiters)
