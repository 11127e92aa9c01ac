"""The store's scheduler (mqstore.services): a job never overlaps itself, and a
tick that finds it running is skipped quietly."""

from __future__ import annotations

import logging
import threading
import time

from mqstore.services import Scheduler


def test_a_long_job_never_overlaps_itself_and_its_skipped_ticks_log_nothing(caplog) -> None:
    active = 0
    most = 0
    runs = 0
    guard = threading.Lock()

    def slow() -> None:
        nonlocal active, most, runs
        with guard:
            active += 1
            most = max(most, active)
            runs += 1
        time.sleep(0.15)  # many 10 ms ticks pass meanwhile
        with guard:
            active -= 1

    scheduler = Scheduler()
    scheduler.every_ms(10, slow, "slow")
    with caplog.at_level(logging.WARNING):
        scheduler.start()
        time.sleep(0.8)
        scheduler.shutdown()
    assert runs >= 2  # it ran again after each run ended
    assert most == 1
    skipped = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert skipped == []


def test_a_failing_job_is_logged_and_runs_again(caplog) -> None:
    calls = []

    def failing() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    scheduler = Scheduler()
    scheduler.every_ms(20, failing, "failing")
    with caplog.at_level(logging.ERROR):
        scheduler.start()
        time.sleep(0.3)
        scheduler.shutdown()
    assert len(calls) >= 2
    assert any("scheduled job failing failed" in r.getMessage() for r in caplog.records)
