"""Where a visibility miss goes: one more run of a case, with the stages of every
message stamped (``bench.visibility`` calls it for a missed target; the text becomes
the target's ``profile`` in visibility.json and bench/REPORT.md).

Same process (``same``): the writer stamps put returns; the kicked reader's dispatch
round (``Dispatcher._help_from_reader``) stamps its start and end; the reader stamps
``wait_for`` returning and ``get_batch`` returning. Per message:

- put -> round start: the reader's wake-up and its wait for the GIL;
- round: the dispatch round the reader ran (all the messages it covered);
- round end -> wait_for returned: the reader's re-check;
- get_batch: the read of the batch holding the message.

Other process (``other``): the writer stamps put returns and the end of every round
(a round listener in front of the ``notify`` bump); the follower stamps each return
from its futex sleep (``Follower.wait``), ``wait_for`` returning and ``get_batch``
returning. Per message: put -> the round that made it readable ends (the dispatcher
thread's wake-up, the GIL, the round), round end -> the follower wakes, wake ->
``wait_for`` returned, and the read.

A stage's figure for a message is the stage of the round or read that covered it. A
read that did not sleep (the message was there when the reader asked) counts no round
(same process) or no wake (other process): its wait is then in the first stage. A
message covered by a round that started before its put returned shows a negative
first stage.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from mqstore import MessageStore

__all__ = ["follower_process", "stages_text"]


def _table(title: str, names: tuple[str, ...], stamps: list[np.ndarray], warmup: int) -> str:
    """Per stage (``names``, then "get_batch": the differences of consecutive
    ``stamps``, ns per message) p50, p90, p99 in µs, and the stages' means over the
    slowest 1% of messages."""
    stages = {name: (later - earlier) / 1e3
              for name, earlier, later in zip((*names, "get_batch"), stamps[:-1], stamps[1:],
                                              strict=True)}  # fmt: skip
    total = (stamps[-1] - stamps[0]) / 1e3
    slow = np.argsort(total[warmup:])[-max(1, (len(total) - warmup) // 100) :] + warmup
    lines = [title, f"{'stage':28} {'p50 us':>9} {'p90 us':>9} {'p99 us':>9} {'slowest 1%':>11}"]
    for name, values in stages.items():
        kept = values[warmup:]
        p50, p90, p99 = np.percentile(kept, [50, 90, 99])
        lines.append(f"{name:28} {p50:9.1f} {p90:9.1f} {p99:9.1f} {values[slow].mean():11.1f}")
    return "\n".join(lines)


def _read_stamped(
    store: MessageStore, topic: str, count: int, stamp: Callable[[slice, int, int, int], None]
) -> None:
    """Read offsets 1 .. count of (topic, 0) by ``wait_for`` then ``get_batch``; after
    each read ``stamp(rows, wait_for returned, get_batch returned, the read before
    returned)``, ``rows`` the messages' indexes (offset - 1)."""
    offset, last, previous = 1, count + 1, 0
    while offset < last:
        if not store.wait_for(topic, 0, offset, 2_000):
            continue
        returned = time.perf_counter_ns()
        got = len(store.get_batch(topic, 0, offset, min(1_000, last - offset)))
        now = time.perf_counter_ns()
        stamp(slice(offset - 1, offset - 1 + got), returned, now, previous)
        previous = now
        offset += got


def _writer(config: Any, topic: str, body: bytes) -> tuple[str, MessageStore, Any]:
    """A fresh store in a temp dir with (topic, 0) created by one put: (root, store,
    its dispatcher)."""
    root = tempfile.mkdtemp(prefix="mqstore-vis-stages-")
    store = MessageStore.open(root, config)
    store.put(topic, 0, body)
    assert store._dispatcher is not None
    return root, store, store._dispatcher


def _same_process(count: int, rate: int, warmup: int, config: Any, paced: Callable[..., Any],
                  topic: str, body: bytes) -> str:  # fmt: skip
    root, store, dispatcher = _writer(config, topic, body)
    try:
        round_starts: list[int] = []
        round_ends: list[int] = []
        helper = dispatcher._help_from_reader

        def stamped_helper() -> None:
            round_starts.append(time.perf_counter_ns())
            helper()
            round_ends.append(time.perf_counter_ns())

        dispatcher._help_from_reader = stamped_helper  # type: ignore[method-assign]
        ready = np.zeros(count, dtype=np.int64)
        read = np.zeros(count, dtype=np.int64)
        start = np.zeros(count, dtype=np.int64)
        end = np.zeros(count, dtype=np.int64)

        def stamp(rows: slice, returned: int, now: int, previous: int) -> None:
            ready[rows], read[rows] = returned, now
            if round_ends and round_ends[-1] > previous:  # this wait ran a round
                start[rows], end[rows] = round_starts[-1], round_ends[-1]
            else:  # another thread's round: no round in this reader's wait
                start[rows] = end[rows] = returned

        def reader() -> None:
            _read_stamped(store, topic, count, stamp)

        thread = threading.Thread(target=reader)
        thread.start()
        put = paced(count, rate, lambda _i: store.put(topic, 0, body))
        thread.join(60)
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    title = (f"Stages of a same-process run ({count:,} messages at {rate:,} msg/s; "
             f"{len(round_starts):,} rounds in the reader's thread):")  # fmt: skip
    names = ("put -> round start", "round (reader's thread)", "round end -> wait_for")
    return _table(title, names, [put, start, end, ready, read], warmup)


def follower_process(root: str, count: int, topic: str) -> None:
    """The follower of the ``other`` run (a child process): read ``count`` messages,
    save (wake, wait_for returned, get_batch returned) per message."""
    import mqstore.dispatch.notify as notify

    wakes: list[int] = []
    sleep = notify.Follower.wait

    def stamped_wait(self: Any, sequence: int, timeout_s: float) -> None:
        sleep(self, sequence, timeout_s)
        wakes.append(time.perf_counter_ns())

    notify.Follower.wait = stamped_wait  # type: ignore[method-assign]
    store = MessageStore.open(root, read_only=True)
    print("ready", flush=True)
    stamps = np.zeros((3, count), dtype=np.int64)

    def stamp(rows: slice, returned: int, now: int, previous: int) -> None:
        slept = bool(wakes) and wakes[-1] > previous  # else it found the message awake
        stamps[0, rows] = wakes[-1] if slept else returned
        stamps[1, rows], stamps[2, rows] = returned, now

    _read_stamped(store, topic, count, stamp)
    store.close()
    np.save(os.path.join(root, "stages.npy"), stamps)


def _other_process(count: int, rate: int, warmup: int, config: Any, paced: Callable[..., Any],
                   topic: str, body: bytes) -> str:  # fmt: skip
    root, store, dispatcher = _writer(config, topic, body)
    try:
        queue = store.consume_queues.queue(topic, 0)
        rounds: list[tuple[int, int]] = []
        bump = dispatcher._round_listener

        def stamped_bump() -> None:
            rounds.append((time.perf_counter_ns(), queue.max_offset))
            if bump is not None:
                bump()

        dispatcher.set_round_listener(stamped_bump)
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.visibility", "--role", "store-reader-stages",
             "--root", root, "--messages", str(count)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            child.kill()
            raise RuntimeError("the follower process did not start")
        put = paced(count, rate, lambda _i: store.put(topic, 0, body))
        if child.wait(60) != 0:
            raise RuntimeError(f"the follower process failed ({child.returncode})")
        wake, ready, read = np.load(os.path.join(root, "stages.npy"))
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    ends = np.array([stamp for stamp, _ in rounds], dtype=np.int64)
    highs = np.array([high for _, high in rounds], dtype=np.int64)
    # Message i is offset i + 1: readable after the first round whose max offset passed it.
    covering = np.minimum(np.searchsorted(highs, np.arange(count) + 2), len(ends) - 1)
    round_end = ends[covering]
    title = (f"Stages of an other-process run ({count:,} messages at {rate:,} msg/s; "
             f"{len(rounds):,} rounds):")  # fmt: skip
    names = ("put -> round end", "round end -> follower wakes", "wake -> wait_for")
    return _table(title, names, [put, round_end, wake, ready, read], warmup)


def stages_text(kind: str, count: int, rate: int, warmup: int, config: Any,
                paced: Callable[..., Any], topic: str, body: bytes) -> str:  # fmt: skip
    """The stage table of one more run: ``kind`` "same" or "other"."""
    run = _same_process if kind == "same" else _other_process
    return run(count, rate, warmup, config, paced, topic, body)
