"""The allocation service: prepares the NEXT CommitLog file before it is needed.

When the log has written ``prepare_next_percent`` of file k (0: as soon as it starts
file k, RocketMQ's way), it asks for file k+1. One background thread creates it at
full size, pre-warms it (MappedFile.create) and parks it, one file at a time (the
log requests file k+1 only once it writes file k, so two files are never pre-warmed
at once). The pre-warm is paced (at most half a CPU: MappedFile.prewarm), so that
faulting in a whole file does not stall the writers on a small machine. At the roll,
``take`` hands the parked file over at once; it waits for the build in progress if
the writer outruns allocation (and ends the pacing: ``hurry``), and creates the file
itself if no request was made (the first file, or with ``preallocate_next`` off).

Crash policy: a half-built file carries the suffix ``.allocating`` and is removed at
the next load; a finished, parked file is an all-zero file that recovery keeps or
removes like any other file past the end of the log. A log cut back while running (a
follower's truncation) first discards the files parked past the cut (``discard_from``):
left on disk, one would sit past a gap that the next load refuses.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from mqstore.commitlog.durable import fsync_directory
from mqstore.commitlog.errors import StoreClosedError, StoreError
from mqstore.commitlog.mapped_file import MappedFile

__all__ = ["AllocationService"]

log = logging.getLogger(__name__)


class AllocationService:
    """One background thread that builds the next file of one CommitLog directory."""

    def __init__(
        self,
        directory: str,
        file_size_bytes: int,
        prewarm: bool,
        mlock: bool,
        write_back: bool = False,
    ) -> None:
        self.directory = directory
        self.file_size_bytes = file_size_bytes
        self.prewarm = prewarm
        self.mlock = mlock
        self.write_back = write_back
        self._condition = threading.Condition()
        self._requested: int | None = None
        self._building: int | None = None  # the start of the file being built
        self._ready: dict[int, MappedFile] = {}
        self._failed: dict[int, BaseException] = {}
        self._closed = False
        #: Set while a writer waits for the file being built: its prewarm stops pacing.
        self._hurry = threading.Event()
        self._waiting = 0  # writers in take() waiting for a build
        self.allocate_ns: list[int] = []  # time to build each file, for reports
        self._thread = threading.Thread(target=self._run, name="mqstore-allocate", daemon=True)
        self._thread.start()

    def request(self, start_offset: int) -> None:
        """Ask for the file starting at ``start_offset`` to be prepared."""
        with self._condition:
            if start_offset in self._ready or self._requested == start_offset:
                return
            self._requested = start_offset
            self._failed.pop(start_offset, None)
            self._condition.notify_all()

    def take(self, start_offset: int) -> MappedFile:
        """The file starting at ``start_offset``: the parked one, or one made now.

        Raises:
            DiskFullError: there is no room for the file (from the background build or
                from a build made here).
        """
        with self._condition:
            while self._requested == start_offset and start_offset not in self._ready:
                if self._closed:
                    raise StoreClosedError("the allocation service is closed")
                self._hurry.set()  # the writer outran the paced prewarm
                self._waiting += 1
                try:
                    self._condition.wait()
                finally:
                    self._waiting -= 1
            mapped = self._ready.pop(start_offset, None)
            self._failed.pop(start_offset, None)
        if mapped is not None:
            return mapped
        return self._build(start_offset)

    def _build(self, start_offset: int, hurry: threading.Event | None = None) -> MappedFile:
        started_ns = time.perf_counter_ns()
        mapped = MappedFile.create(
            self.directory,
            start_offset,
            self.file_size_bytes,
            self.prewarm,
            self.mlock,
            self.write_back,
            hurry,
        )
        self.allocate_ns.append(time.perf_counter_ns() - started_ns)
        return mapped

    def _run(self) -> None:
        while True:
            with self._condition:
                while self._requested is None and not self._closed:
                    self._condition.wait()
                if self._closed:
                    return
                start_offset = self._requested
                self._building = start_offset
                if not self._waiting:  # else a writer already waits for this build
                    self._hurry.clear()
            assert start_offset is not None
            try:
                mapped = self._build(start_offset, self._hurry)  # paced: see MappedFile
            except BaseException as error:  # reported to the writer at take(); never lost
                log.warning("allocating the CommitLog file at %d failed: %s", start_offset, error)
                with self._condition:
                    self._building = None
                    self._failed[start_offset] = error
                    if self._requested == start_offset:
                        self._requested = None
                    self._condition.notify_all()
                continue
            with self._condition:
                self._building = None
                if self._closed:
                    self._condition.notify_all()
                    mapped.close()
                    return
                self._ready[start_offset] = mapped
                if self._requested == start_offset:
                    self._requested = None
                self._condition.notify_all()

    def discard_from(self, start_offset: int) -> int:
        """Forget every file starting at or past ``start_offset`` (the log was cut back
        below it): a pending request is dropped, a build in progress is finished
        (unpaced), and the parked files are closed and unlinked, newest first, and the
        directory synced. Returns the number of files removed.

        Raises:
            DiskFullError, StoreError: syncing the directory failed.
        """
        with self._condition:
            if self._requested is not None and self._requested >= start_offset:
                self._requested = None
            self._waiting += 1
            try:
                while self._building is not None and self._building >= start_offset:
                    self._hurry.set()
                    self._condition.wait()
            finally:
                self._waiting -= 1
            doomed = sorted((s for s in self._ready if s >= start_offset), reverse=True)
            parked = [self._ready.pop(start) for start in doomed]
            for start in [s for s in self._failed if s >= start_offset]:
                del self._failed[start]
        failure: OSError | None = None
        for mapped in parked:  # every one closed, even past a failed unlink
            path = mapped.path
            mapped.close()
            if failure is not None:
                continue
            try:
                os.unlink(path)
            except OSError as error:
                failure = error
                continue
            log.info("removed the parked CommitLog file %s: the log was cut back", path)
        if failure is not None:
            raise StoreError(f"removing a parked CommitLog file failed: {failure}") from failure
        if parked:
            fsync_directory(self.directory)
        return len(parked)

    def close(self) -> None:
        """Stop the thread; parked files stay on disk (all zeros) for recovery to keep."""
        with self._condition:
            self._closed = True
            self._hurry.set()
            self._condition.notify_all()
        self._thread.join()
        with self._condition:
            for mapped in self._ready.values():
                mapped.close()
            self._ready.clear()
