"""Waiters: each reader is released only when its own condition holds, never lost
between its check and its block, and bounded by its timeout, a failure or a stop."""

from __future__ import annotations

import threading
import time

import pytest

from mqstore.commitlog.errors import DispatchFailedError, LimitExceededError
from mqstore.dispatch import waiters as waiters_module
from mqstore.dispatch.waiters import Waiters

JOIN_S = 10.0  # a thread not done by then is stuck


def _never_failed() -> None:
    pass


def _not_stopped() -> bool:
    return False


class Counter:
    """A queue's max offset, moved by a "dispatcher" thread."""

    def __init__(self) -> None:
        self.value = 0


def _start_waiting(waiters: Waiters, ready, timeout_ms: int, out: list) -> threading.Thread:
    def run() -> None:
        started = time.monotonic()
        try:
            out.append((waiters.wait(ready, timeout_ms, _never_failed, _not_stopped),
                        time.monotonic() - started))  # fmt: skip
        except Exception as error:
            out.append((error, time.monotonic() - started))

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + JOIN_S
    while len(waiters) == 0 and not out:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    return thread


def test_a_waiter_is_released_only_when_its_condition_holds():
    waiters = Waiters()
    mine, other = Counter(), Counter()
    out: list = []
    thread = _start_waiting(waiters, lambda: mine.value > 0, 30_000, out)
    for _ in range(50):  # rounds that reach only the other queue
        other.value += 1
        waiters.notify()
    assert waiters.released == 0
    assert waiters.notified_rounds == 50
    time.sleep(0.05)
    assert out == []  # still asleep
    mine.value = 1
    waiters.notify()
    thread.join(JOIN_S)
    assert out[0][0] is True
    assert waiters.released == 1
    assert len(waiters) == 0  # unregistered


def test_the_timeout_is_honoured_when_nothing_comes():
    waiters = Waiters()
    out: list = []
    thread = _start_waiting(waiters, lambda: False, 80, out)
    thread.join(JOIN_S)
    result, elapsed_s = out[0]
    assert result is False
    assert elapsed_s >= 0.08
    assert len(waiters) == 0


def test_a_ready_condition_returns_at_once_without_registering():
    waiters = Waiters()
    assert waiters.wait(lambda: True, 0, _never_failed, _not_stopped) is True
    assert waiters.wait(lambda: False, 0, _never_failed, _not_stopped) is False
    assert len(waiters) == 0


def test_no_wake_up_is_lost_under_a_hammering_notifier():
    """A notifier moves a counter and notifies as fast as it can; a reader waits for
    each next value in turn. A lost wake-up would leave one wait asleep until its
    30 s timeout; every wait must instead return True well before."""
    waiters = Waiters()
    counter = Counter()
    stop = threading.Event()
    total = 3_000

    def hammer() -> None:
        while not stop.is_set() and counter.value < total:
            counter.value += 1
            waiters.notify()
            if counter.value % 64 == 0:
                time.sleep(0)  # let the reader in now and then, mid-stream

    thread = threading.Thread(target=hammer)
    thread.start()
    worst_s = 0.0
    try:
        seen = 0
        while seen < total:
            started = time.monotonic()
            ready = lambda want=seen: counter.value > want  # noqa: E731
            assert waiters.wait(ready, 30_000, _never_failed, _not_stopped)
            worst_s = max(worst_s, time.monotonic() - started)
            seen = counter.value
    finally:
        stop.set()
        thread.join(JOIN_S)
    assert worst_s < 5.0


def test_many_waiters_on_many_queues_each_woken_by_its_own():
    waiters = Waiters()
    queues = [Counter() for _ in range(8)]
    outs: list[list] = [[] for _ in queues]
    threads = [
        _start_waiting(waiters, lambda q=q: q.value > 0, 30_000, out)
        for q, out in zip(queues, outs, strict=True)
    ]
    deadline = time.monotonic() + JOIN_S
    while len(waiters) < len(queues):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    for index, queue in enumerate(queues):
        queue.value = 1
        waiters.notify()
        threads[index].join(JOIN_S)
        assert outs[index][0][0] is True
        assert all(not out for out in outs[index + 1 :])  # the others still sleep
    assert waiters.released == len(queues)


def test_wake_all_lets_a_failure_raise_in_the_waiting_thread():
    waiters = Waiters()
    failed = threading.Event()

    def check_failed() -> None:
        if failed.is_set():
            raise DispatchFailedError(0, "injected")

    out: list = []

    def run() -> None:
        try:
            waiters.wait(lambda: False, 30_000, check_failed, _not_stopped)
        except DispatchFailedError as error:
            out.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    while len(waiters) == 0:
        time.sleep(0.001)
    failed.set()
    waiters.wake_all()
    thread.join(JOIN_S)
    assert not thread.is_alive()
    assert isinstance(out[0], DispatchFailedError)


def test_a_stop_releases_waiters_with_false():
    waiters = Waiters()
    stopped = threading.Event()
    out: list = []

    def run() -> None:
        out.append(waiters.wait(lambda: False, 30_000, _never_failed, stopped.is_set))

    thread = threading.Thread(target=run)
    thread.start()
    while len(waiters) == 0:
        time.sleep(0.001)
    stopped.set()
    waiters.wake_all()
    thread.join(JOIN_S)
    assert out == [False]


def test_a_condition_raising_in_notify_is_raised_by_its_own_waiter():
    waiters = Waiters()
    broken = threading.Event()

    def ready() -> bool:
        if broken.is_set():
            raise KeyError("queue went away")
        return False

    out: list = []
    thread = _start_waiting(waiters, ready, 30_000, out)
    broken.set()
    waiters.notify()  # the notifier itself does not raise
    thread.join(JOIN_S)
    assert isinstance(out[0][0], KeyError)


def test_too_many_waiters_get_a_typed_error(monkeypatch):
    monkeypatch.setattr(waiters_module, "WAITERS_MAX", 1)
    waiters = Waiters()
    gate = Counter()
    out: list = []
    thread = _start_waiting(waiters, lambda: gate.value > 0, 30_000, out)
    with pytest.raises(LimitExceededError):
        waiters.wait(lambda: False, 10, _never_failed, _not_stopped)
    gate.value = 1
    waiters.notify()
    thread.join(JOIN_S)
    assert out[0][0] is True


def test_a_kick_releases_the_oldest_waiter_to_run_the_helper_once():
    waiters = Waiters()
    assert waiters.kick() is False  # nobody waits: the caller wakes the thread
    counter = Counter()
    helped: list[int] = []

    def helper() -> None:  # the round: it moves the queue
        helped.append(threading.get_ident())
        counter.value += 1

    out: list = []

    def run() -> None:
        out.append(waiters.wait(lambda: counter.value > 0, 30_000, _never_failed,
                                _not_stopped, helper=helper))  # fmt: skip

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + JOIN_S
    while len(waiters) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert waiters.kick() is True
    assert waiters.kick() is True  # pending: its round will cover this one too
    thread.join(JOIN_S)
    assert out == [True]
    assert helped == [thread.ident]  # the round ran in the waiter's own thread, once
    assert waiters.kicks == 1


def test_a_kick_the_waiter_leaves_unserved_is_handed_back():
    waiters = Waiters()
    lost: list[bool] = []

    def ready() -> bool:
        # An append lands while the waiter re-checks, and the check then succeeds: the
        # waiter leaves without running the round it was kicked for.
        if len(waiters) == 1 and not lost and waiters.kicks == 0:
            assert waiters.kick() is True
            return True
        return False

    result = waiters.wait(ready, 30_000, _never_failed, _not_stopped,
                          helper=lambda: None, kick_lost=lambda: lost.append(True))  # fmt: skip
    assert result is True
    assert lost == [True]
    assert waiters.kick() is False  # nothing pending any more
