"""Periodic jobs of a store (checkpoint, retention, inbox), scheduled with apscheduler.

Each job runs on one worker thread, never overlaps itself, and coalesces missed
runs: a slow checkpoint delays the next one instead of piling up. A tick that finds
the job still running returns at once (a lock of the job's own; apscheduler's own
max_instances check would log a warning for every such tick, and long jobs such as a
cleaner pass or a compaction copy have many; 3 instances leave room for two ticks
that only look at the lock). A failing job is logged and runs
again at its next tick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)

#: Threads are started on demand, up to this many: one per job of the busiest store
#: (a MessageStore has checkpoint, retention, inbox and compaction-copy; a segmented
#: store flush, recovery-point checkpoint, retention, delete and cleaner), so a long
#: cleaner pass never delays a flush.
WORKERS = 6


class Scheduler:
    """A small wrapper that gives each store its own BackgroundScheduler."""

    def __init__(self) -> None:
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(WORKERS)},
            job_defaults={"coalesce": True, "max_instances": 3, "misfire_grace_time": None},
        )

    def every_ms(self, interval_ms: int, job: Callable[[], object], name: str) -> None:
        running = threading.Lock()

        def run() -> None:
            if not running.acquire(blocking=False):
                return  # the previous tick's run is still going
            try:
                job()
            except Exception:  # logged; the job runs again at its next tick
                log.exception("scheduled job %s failed", name)
            finally:
                running.release()

        self._scheduler.add_job(run, "interval", seconds=interval_ms / 1000, id=name, name=name)

    def start(self) -> None:
        self._scheduler.start()

    def shutdown(self) -> None:
        """Stop, waiting for a running job to finish."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
