"""Flush policies, checked with counting and blocking syncers, never with sleeps."""

from __future__ import annotations

import threading
import time

import pytest

from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.config import CommitLogConfig
from mqstore.commitlog.errors import FlushFailedError, FlushTimeoutError
from mqstore.commitlog.flush import GroupCommitService
from mqstore.commitlog.mapped_file import MappedFile

FILE = 64 * 1024


class GatedSyncer:
    """A syncer that counts calls and blocks each one until the test opens the gate."""

    def __init__(self) -> None:
        self.calls = 0
        self.durable_positions: list[int] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.log: CommitLog | None = None

    def __call__(self, mapped: MappedFile) -> None:
        self.entered.set()
        assert self.gate.wait(10), "test never opened the gate"
        MappedFile.flush(mapped)
        self.calls += 1


def _sync_log(tmp_path, syncer, timeout_ms=5_000) -> CommitLog:
    config = CommitLogConfig(
        file_size_bytes=FILE, prewarm=False, flush_mode="sync", sync_flush_timeout_ms=timeout_ms
    )
    return CommitLog.open(str(tmp_path / "cl"), config, syncer=syncer)


def test_sync_put_returns_only_after_the_sync(tmp_path):
    syncer = GatedSyncer()
    syncer.gate.set()  # let open's recovery sync (if any) through
    log = _sync_log(tmp_path, syncer)
    syncer.gate.clear()
    syncer.entered.clear()
    calls_before = syncer.calls
    done = threading.Event()
    results = []

    def put() -> None:
        results.append(log.append("t", 0, b"durable"))
        done.set()

    producer = threading.Thread(target=put)
    producer.start()
    assert syncer.entered.wait(10)  # the flush has started...
    assert not done.is_set()  # ...and the put has not returned
    assert log.flushed_position < log.write_position
    syncer.gate.set()
    producer.join(10)
    assert done.is_set()
    assert syncer.calls > calls_before
    assert log.flushed_position >= results[0].physical_offset + results[0].size
    log.close()


def test_group_commit_one_sync_covers_many_waiting_producers(tmp_path):
    syncer = GatedSyncer()
    syncer.gate.set()
    log = _sync_log(tmp_path, syncer)
    syncer.gate.clear()
    syncer.entered.clear()
    # Producer 0 starts a flush that blocks; while it blocks, 7 more producers append
    # and wait. When the gate opens, the blocked flush completes (covering producer 0)
    # and ONE more flush covers all 7 others.
    first = threading.Thread(target=lambda: log.append("t", 0, b"first"))
    first.start()
    assert syncer.entered.wait(10)
    others = [threading.Thread(target=lambda i=i: log.append("t", 0, b"x%d" % i)) for i in range(7)]
    for thread in others:
        thread.start()
    # Wait until all 7 have appended (their records are in the log) before opening the gate.
    for _ in range(1000):
        if log.queue_offsets().get(("t", 0)) == 8:
            break
        threading.Event().wait(0.005)
    assert log.queue_offsets()[("t", 0)] == 8
    group = log._flusher
    flushes_before = group.flush_count
    syncer.gate.set()
    first.join(10)
    for thread in others:
        thread.join(10)
    assert all(not thread.is_alive() for thread in [first, *others])
    assert group.flush_count - flushes_before <= 2  # 8 producers, at most 2 groups
    assert log.flushed_position == log.write_position
    log.close()


def test_sync_flush_timeout_raises(tmp_path):
    syncer = GatedSyncer()
    syncer.gate.set()
    log = _sync_log(tmp_path, syncer, timeout_ms=50)
    syncer.gate.clear()
    syncer.entered.clear()
    # A first writer leads a flush that hangs (a stalled disk)...
    leader = threading.Thread(target=lambda: log.append("t", 0, b"leader"))
    leader.start()
    assert syncer.entered.wait(10)
    # ...so a second writer cannot become durable in time.
    with pytest.raises(FlushTimeoutError) as single:
        log.append("t", 0, b"never durable in time")
    assert single.value.first_queue_offset is None  # a single record's: not told
    # A batch's error says where it went: it was appended, only not durable in time
    # (the broker remembers an idempotent batch by it, so its retry is a duplicate).
    with pytest.raises(FlushTimeoutError) as batch:
        log.append_batch("t", 0, [b"b0", b"b1"])
    assert batch.value.first_queue_offset == 2
    syncer.gate.set()
    leader.join(10)
    log.close()
    assert log.flushed_position == log.write_position  # close still flushed it


class FailOnce:
    """A syncer whose first call fails with EIO and whose later calls succeed: what
    Linux does after a writeback error (reported once, pages marked clean), so a retry
    "succeeds" over bytes that never reached the disk."""

    def __init__(self) -> None:
        self.calls = 0
        self.failed = 0

    def __call__(self, mapped: MappedFile) -> None:
        self.calls += 1
        if self.failed == 0:
            self.failed += 1
            raise OSError(5, "Input/output error")
        MappedFile.flush(mapped)


def test_failed_sync_poisons_the_log_and_is_never_retried(tmp_path):
    syncer = FailOnce()
    config = CommitLogConfig(
        file_size_bytes=FILE, prewarm=False, flush_mode="sync", sync_flush_timeout_ms=2_000
    )
    log = CommitLog.open(str(tmp_path / "cl"), config, syncer=MappedFile.flush)
    durable = log.append("t", 0, b"durable before the failure")
    log._syncer = syncer
    flushed = log.flushed_position
    assert flushed == durable.physical_offset + durable.size
    with pytest.raises(FlushFailedError, match="Input/output error") as caught:
        log.append("t", 0, b"never acknowledged")
    assert isinstance(caught.value.__cause__, OSError)
    assert syncer.calls == 1  # no retry that would "succeed" over lost bytes
    assert log.flushed_position == flushed
    end = log.write_position
    with pytest.raises(FlushFailedError):  # refused before a byte is written
        log.append("t", 0, b"after the failure")
    with pytest.raises(FlushFailedError):
        log.append_batch("t", 0, [b"a", b"b"])
    assert log.write_position == end
    with pytest.raises(FlushFailedError):
        log.flush_to(end)
    assert syncer.calls == 1 and log.flushed_position == flushed
    log.close()  # closes without a flush
    assert syncer.calls == 1
    # A reopen recovers from a position known durable and verifies what follows.
    again = CommitLog.open(str(tmp_path / "cl"), config, recover_from=flushed)
    records = list(again.iter_records(0))
    assert bytes(records[0].body) == b"durable before the failure"
    again.append("t", 0, b"writable again")
    again.close()


def _writer(log, outcomes: list[BaseException | None]):
    """A thread body that appends ``body`` and records what the writer got."""

    def write(body: bytes) -> None:
        try:
            log.append("t", 0, body)
            outcomes.append(None)
        except BaseException as error:  # the test inspects what each writer got
            outcomes.append(error)

    return write


def test_a_failed_group_sync_fails_every_waiting_writer(tmp_path):
    syncer = GatedSyncer()
    syncer.gate.set()
    log = _sync_log(tmp_path, syncer)
    syncer.gate.clear()
    syncer.entered.clear()
    outcomes: list[BaseException | None] = []

    write = _writer(log, outcomes)

    leader = threading.Thread(target=write, args=(b"leader",))
    leader.start()
    assert syncer.entered.wait(10)  # the leader's sync is under way
    followers = [threading.Thread(target=write, args=(b"f%d" % i,)) for i in range(4)]
    for thread in followers:
        thread.start()

    def failing(mapped: MappedFile) -> None:
        raise OSError(5, "Input/output error")

    log._syncer = failing  # the followers' group (if any) fails outright
    original_flush = MappedFile.flush
    try:
        MappedFile.flush = staticmethod(failing)  # type: ignore[method-assign]
        syncer.gate.set()  # the leader's own sync now fails too
        for thread in [leader, *followers]:
            thread.join(10)
    finally:
        MappedFile.flush = original_flush  # type: ignore[method-assign]
    assert len(outcomes) == 5
    assert all(isinstance(outcome, FlushFailedError) for outcome in outcomes), outcomes
    assert log.flushed_position < log.write_position
    log.close()


def test_async_flusher_stops_at_a_failed_sync(tmp_path):
    syncer = FailOnce()
    config = CommitLogConfig(
        file_size_bytes=1 << 20,
        prewarm=False,
        flush_interval_ms=5,
        flush_least_pages=0,
        flush_thorough_interval_ms=5,
    )
    log = CommitLog.open(str(tmp_path / "cl"), config, syncer=syncer)
    log.append("t", 0, b"x" * 100)
    flusher = log._flusher
    assert flusher is not None
    deadline = time.monotonic() + 10
    # The flusher records the failure after the log does: wait for both.
    while (log.failure is None or flusher.failure is None) and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.005)
    assert log.failure is not None
    assert flusher.failure is not None  # type: ignore[union-attr]
    time.sleep(0.05)  # several intervals: a retry would call the syncer again
    assert syncer.calls == 1
    assert log.flushed_position == 0
    with pytest.raises(FlushFailedError):
        log.append("t", 0, b"refused")
    log.close()


def test_async_flush_by_least_pages(tmp_path):
    synced = threading.Event()

    def syncer(mapped: MappedFile) -> None:
        MappedFile.flush(mapped)
        synced.set()

    config = CommitLogConfig(
        file_size_bytes=1 << 20,
        prewarm=False,
        flush_interval_ms=5,
        flush_least_pages=4,
        flush_thorough_interval_ms=3_600_000,
    )
    log = CommitLog.open(str(tmp_path / "cl"), config, syncer=syncer)
    log.append("t", 0, b"small")  # < 4 pages: no flush (thorough interval is an hour)
    assert not synced.wait(0.1)
    assert log.flushed_position == 0
    log.append_batch("t", 0, [b"x" * 4096] * 5)  # > 4 pages dirty
    assert synced.wait(5)
    log.close()


def test_a_failure_after_a_successful_sync_does_not_poison(tmp_path):
    """Review finding: the append listener runs after the sync; when it raised, the
    group commit remembered that as a failed sync and failed every later writer."""
    log = _sync_log(tmp_path, MappedFile.flush)
    calls = {"n": 0}

    def listener() -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # 1: after the append; 2: after its sync, inside flush_to
            raise RuntimeError("listener failed")

    log.set_append_listener(listener)
    first = log.append("t", 0, b"synced")  # its sync succeeded: acknowledged
    assert log.flushed_position >= first.physical_offset + first.size
    log.append("t", 0, b"later")  # not refused: the log is not poisoned
    assert log.failure is None
    log.close()


class CountingGate:
    """A syncer that lets through as many syncs as the test allows, counting them."""

    def __init__(self) -> None:
        self.allowed = threading.Semaphore(0)
        self.entered = threading.Semaphore(0)
        self.calls = 0
        self.fail_with: BaseException | None = None

    def allow(self, count: int = 1) -> None:
        for _ in range(count):
            self.allowed.release()

    def __call__(self, mapped: MappedFile) -> None:
        self.entered.release()
        assert self.allowed.acquire(timeout=10), "test never allowed the sync"
        self.calls += 1
        failure, self.fail_with = self.fail_with, None
        if failure is not None:
            raise failure
        MappedFile.flush(mapped)


def _open_gated(tmp_path) -> tuple[CommitLog, CountingGate]:
    gate = CountingGate()
    log = _sync_log(tmp_path, gate)
    while gate.entered.acquire(blocking=False):  # open's recovery sync, if any
        pass
    return log, gate


def _wait_for(check, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not true in time"
        time.sleep(0.002)


def test_a_leader_returns_after_its_sync_and_the_next_leader_is_a_waiter(tmp_path):
    """The writers a sync did not cover wait on; the first of them leads the next sync
    (one wake-up), while the leader of the first is already back."""
    log, gate = _open_gated(tmp_path)
    group = log._flusher
    assert isinstance(group, GroupCommitService)
    flushes = group.flush_count
    done: list[str] = []
    leader = threading.Thread(target=lambda: (log.append("t", 0, b"L"), done.append("L")))
    leader.start()
    assert gate.entered.acquire(timeout=10)  # the leader's sync started
    followers = [
        threading.Thread(target=lambda i=i: (log.append("t", 0, b"f"), done.append(f"f{i}")))
        for i in range(3)
    ]
    for thread in followers:
        thread.start()
    _wait_for(lambda: group.waiting == 3)
    gate.allow(1)  # the leader's sync ends: it covered the leader's record only
    leader.join(10)
    assert done == ["L"]
    assert gate.entered.acquire(timeout=10)  # a follower leads the next sync
    assert group.waiting == 2  # the other two follow it
    gate.allow(1)
    for thread in followers:
        thread.join(10)
    assert sorted(done) == ["L", "f0", "f1", "f2"]
    assert group.flush_count - flushes == 2
    assert log.flushed_position == log.write_position
    gate.allow(10)
    log.close()


def test_a_timed_out_writer_leaves_the_group(tmp_path):
    """A follower that times out is never resolved later; the groups after it work."""
    gate = CountingGate()
    log = _sync_log(tmp_path, gate, timeout_ms=100)
    while gate.entered.acquire(blocking=False):
        pass
    leader = threading.Thread(target=lambda: log.append("t", 0, b"L"))
    leader.start()
    assert gate.entered.acquire(timeout=10)
    with pytest.raises(FlushTimeoutError):
        log.append("t", 0, b"late")
    assert log._flusher.waiting == 0  # type: ignore[union-attr]
    gate.allow(10)
    leader.join(10)
    result = log.append("t", 0, b"after")
    assert log.flushed_position >= result.physical_offset + result.size
    log.close()


class Interrupt(BaseException):
    """Not an Exception: what a KeyboardInterrupt in the leader's sync looks like."""


def test_an_interrupted_leader_hands_the_lead_on(tmp_path):
    """The leader's own put raises; its followers are neither stranded nor failed."""
    log, gate = _open_gated(tmp_path)
    outcomes: list[BaseException | None] = []

    write = _writer(log, outcomes)

    leader = threading.Thread(target=write, args=(b"L",))
    leader.start()
    assert gate.entered.acquire(timeout=10)
    followers = [threading.Thread(target=write, args=(b"f%d" % i,)) for i in range(3)]
    for thread in followers:
        thread.start()
    _wait_for(lambda: log._flusher.waiting == 3)  # type: ignore[union-attr]
    gate.fail_with = Interrupt()
    gate.allow(10)
    for thread in [leader, *followers]:
        thread.join(10)
    assert len(outcomes) == 4
    assert sum(isinstance(outcome, Interrupt) for outcome in outcomes) == 1
    assert outcomes.count(None) == 3
    assert log.failure is None
    assert log.flushed_position == log.write_position
    log.close()


def test_a_leader_gathers_its_group_for_a_bounded_time(tmp_path):
    """After a group of 8, a leader waits for 7 followers, but not longer than the
    last sync took: a writer alone is not held up."""
    log = _sync_log(tmp_path, MappedFile.flush)
    group = log._flusher
    assert isinstance(group, GroupCommitService)
    group._group_size, group._sync_s = 8, 0.05
    started = time.monotonic()
    result = log.append("t", 0, b"alone")
    assert time.monotonic() - started < 2
    assert log.flushed_position >= result.physical_offset + result.size
    assert group._group_size == 1  # the group that came: the next leader waits for none
    log.close()
