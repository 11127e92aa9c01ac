"""Periodic jobs of a store (checkpoint, retention, inbox), scheduled with apscheduler.

Each job runs on one worker thread, never overlaps itself (max_instances=1), and
coalesces missed runs: a slow checkpoint delays the next one instead of piling up.
A failing job is logged and runs again at its next tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)

WORKERS = 3  # checkpoint, retention and inbox may run at once; nothing else is scheduled


class Scheduler:
    """A small wrapper that gives each store its own BackgroundScheduler."""

    def __init__(self) -> None:
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(WORKERS)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )

    def every_ms(self, interval_ms: int, job: Callable[[], object], name: str) -> None:
        def run() -> None:
            try:
                job()
            except Exception:  # logged; the job runs again at its next tick
                log.exception("scheduled job %s failed", name)

        self._scheduler.add_job(run, "interval", seconds=interval_ms / 1000, id=name, name=name)

    def start(self) -> None:
        self._scheduler.start()

    def shutdown(self) -> None:
        """Stop, waiting for a running job to finish."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
