"""The floor of a group commit in Python threads: what 8 sync writers can reach here
whatever the store does, measured beside the store (bench/put.py's
``python-groups-8t``).

``threads`` closed-loop writers, each doing ``count / threads`` "puts" and no other
work: a put joins the group being gathered, or leads one. A leader waits (at most
GATHER_MAX_S) until every writer has joined, then writes the group's records with one
``pwrite`` and one ``fdatasync`` on a plain file (the same bytes and file as
``disk-groups-8``), then releases each follower's own lock, as the store's
GroupCommitService does. There is no record to encode, no CommitLog, no dispatch: what
is left is one blocking wait and one wake-up per put, each of them a GIL hand-off.
The gap between this case and ``disk-groups-8`` (one thread, no wake-ups) is what
the threads cost; the gap between ``mqstore-sync-8t`` and this case is what the store
adds to them.
"""

from __future__ import annotations

import os
import threading

from bench.common import timed_threads

#: The longest a leader waits for the rest of its group: two fdatasyncs of a fast disk
#: (the store's GroupCommitService uses the same bound).
GATHER_MAX_S = 0.002


class _Waiter:
    __slots__ = ("lead", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()  # released once: acknowledged, or told to lead
        self.lead = False


class _Groups:
    """Leader and followers over one file: the smallest correct group commit. A
    writer that joins while a sync runs waits for the next one, which the first of
    them leads (handed over by the finishing leader, as GroupCommitService does)."""

    def __init__(self, fd: int, record_bytes: int, threads: int) -> None:
        self._fd = fd
        self._record = b"g" * record_bytes
        self._threads = threads
        self._mutex = threading.Lock()
        self._leading = False
        self._waiting: list[_Waiter] = []
        self._gathering: threading.Lock | None = None
        self._position_bytes = 0
        self.syncs = 0

    def put(self) -> None:
        with self._mutex:
            if self._leading:
                mine: _Waiter | None = _Waiter()
                self._waiting.append(mine)  # type: ignore[arg-type]
                gathering = self._gathering
                if gathering is not None and len(self._waiting) + 1 >= self._threads:
                    self._gathering = None
                    gathering.release()  # everyone joined: the leader goes on
            else:
                self._leading, mine = True, None
        if mine is not None:
            mine.lock.acquire()  # released by the sync that covered this put, or to lead
            if not mine.lead:
                return
        self._lead()

    def _lead(self) -> None:
        with self._mutex:
            gathering = None
            if len(self._waiting) + 1 < self._threads:
                gathering = threading.Lock()
                gathering.acquire()
                self._gathering = gathering
        if gathering is not None:
            gathering.acquire(timeout=GATHER_MAX_S)
        with self._mutex:
            self._gathering = None
            group, self._waiting = self._waiting, []
        data = self._record * (len(group) + 1)
        os.pwrite(self._fd, data, self._position_bytes)
        os.fdatasync(self._fd)
        with self._mutex:
            self._position_bytes += len(data)
            self.syncs += 1
            successor = self._waiting.pop(0) if self._waiting else None
            if successor is None:
                self._leading = False
        for follower in group:
            follower.lock.release()
        if successor is not None:  # joined during the sync: it leads the next one
            successor.lead = True
            successor.lock.release()


def python_groups(path: str, count: int, threads: int, record_bytes: int) -> float:
    """``count`` puts from ``threads`` threads through ``_Groups`` on a new file at
    ``path``, written with zeros and synced first (as a prewarmed sync-mode CommitLog
    file is). Returns puts per second."""
    per_thread = count // threads
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, bytes(record_bytes * per_thread * threads))
        os.fsync(fd)
        groups = _Groups(fd, record_bytes, threads)

        def writer(_index: int) -> None:
            for _ in range(per_thread):
                groups.put()

        elapsed = timed_threads(writer, threads)
    finally:
        os.close(fd)
    assert groups.syncs > 0
    return per_thread * threads / elapsed
