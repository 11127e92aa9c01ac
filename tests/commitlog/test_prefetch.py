"""A generator run ahead in a thread (commitlog/prefetch.py): order, buffers reused
round a ring of depth + 2 never overwritten while read, errors raised in the
reader's thread after the items before them, and close stopping a blocked thread."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from mqstore.commitlog.prefetch import Prefetch


@pytest.mark.parametrize("depth", [1, 3])
def test_items_come_in_order_and_a_ring_of_depth_plus_2_is_never_overwritten(depth):
    ring = itertools.cycle([[0] for _ in range(depth + 2)])

    def produce():
        for number in range(500):
            buffer = next(ring)
            buffer[0] = number
            yield buffer

    prefetch = Prefetch(produce(), depth, "test-prefetch")
    try:
        seen = []
        for buffer in prefetch:
            first = buffer[0]
            time.sleep(0.0001 if first % 50 == 0 else 0)  # let the thread fill the queue
            assert buffer[0] == first  # not overwritten while read
            seen.append(first)
    finally:
        prefetch.close()
    assert seen == list(range(500))


def test_an_error_is_raised_in_the_reader_after_the_items_before_it():
    def produce():
        yield 1
        yield 2
        raise MemoryError("made up")

    prefetch = Prefetch(produce(), 1, "test-prefetch")
    got = []
    try:
        with pytest.raises(MemoryError, match="made up"):
            for item in prefetch:
                got.append(item)
    finally:
        prefetch.close()
    assert got == [1, 2]


def test_close_stops_a_thread_blocked_on_a_full_queue():
    prefetch = Prefetch(itertools.count(), 2, "test-prefetch-blocked")
    assert next(iter(prefetch)) == 0
    prefetch.close()
    assert not [t for t in threading.enumerate() if t.name == "test-prefetch-blocked"]
