"""A generator run in a background thread, a bounded number of items ahead of its
reader: for scans whose C calls run without the GIL (the recovery scan,
commitlog/recovery.py, and the re-dispatch's header parse, dispatch/log_scan.py), so
that the next items are made while the reader works on the one before.

Items that point into reused buffers are safe when the generator takes its buffers
round a ring of at least ``depth + 2``: ``depth`` items queued, one being read (the
reader is done with an item when it asks for the next), one being made.

Errors: an exception of the generator is raised in the reader's thread, after the
items made before it. ``close`` stops the thread (within POLL_S of a full queue) and
joins it; call it on every exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Final, Generic, TypeVar

__all__ = ["Prefetch"]

T = TypeVar("T")
POLL_S: Final = 0.05  # how often a generator blocked on a full queue checks for close


class _Raised:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE: Final = object()


class Prefetch(Generic[T]):
    """Iterate it (once) for the items of ``produce``, made in a thread named ``name``,
    at most ``depth`` ahead."""

    def __init__(self, produce: Iterator[T], depth: int, name: str) -> None:
        assert depth >= 1
        self._items: queue.Queue[object] = queue.Queue(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(produce,), name=name, daemon=True)
        self._thread.start()

    def _run(self, produce: Iterator[T]) -> None:
        try:
            for item in produce:
                if not self._put(item):
                    return  # closed
        except BaseException as error:  # raised in the reader's thread
            self._put(_Raised(error))
            return
        self._put(_DONE)

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._items.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[T]:
        while True:
            item = self._items.get()
            if item is _DONE:
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item  # type: ignore[misc]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
