"""The Appender (commitlog/appender.py): the C type against its pure-Python twin
(same bytes, results, feed entries and state after every call, and nothing changed
when either leaves an append to the general path), the CommitLog's one-call path
against its general path, the AppendLock, and feed_columns' twins."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.commitlog import appender as appender_module
from mqstore.commitlog.appender import (
    FEED_BORN,
    FEED_KEYED,
    FEED_TAGGED,
    AppendResult,
    PyAppender,
    feed_columns_py,
    new_append_lock,
)
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.config import CommitLogConfig
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.record import BLANK_SIZE, HEADER_SIZE, encode_keys, encode_properties

native = pytest.mark.skipif(NATIVE is None, reason="mqstore.commitlog._native is not built")

TOPICS = {"orders": b"orders", "a": b"a"}  # validated: in the appenders' topic cache
FILE_BYTES = 2048  # a few records per file: rolls (None) come often
FEED_MAX = 4  # the feed overflows within a sequence


def _mostly(sane: Any, rare: Any) -> Any:
    """``sane`` four times in five: most calls get through to the append."""
    return st.integers(0, 4).flatmap(lambda k: rare if k == 0 else sane)


_queues = _mostly(
    st.sampled_from([("orders", 0), ("orders", 1), ("a", 2), ("orders", 2)]),
    st.sampled_from([("orders", 3), ("orders", 4), ("unknown", 0),
                     (b"orders", 0), ("orders", -1), ("orders", True), ("orders", 2**31)]),
)  # fmt: skip
_bodies = _mostly(
    st.binary(max_size=300) | st.none() | st.binary(max_size=40).map(bytearray),
    st.binary(max_size=40).map(memoryview) | st.just("text"),
)
_tags = _mostly(
    st.none() | st.sampled_from(["", "t", "é" * 10]),
    st.sampled_from(["x" * 256, "\ud800", 7]),
)
_borns = _mostly(st.none() | st.integers(0, 2**40), st.sampled_from([-1, True, 2**63]))
_calls = st.tuples(
    _queues,
    _bodies,
    _tags,
    _borns,
    st.sampled_from([b"", encode_keys(["k1", "k2"])]),
    st.sampled_from([b"", encode_properties({"p": b"v"})]),
).map(lambda c: (*c[0], *c[1:]))
_events = _mostly(
    _calls,
    st.sampled_from(
        ["close", "reopen", "drain", "no-feed", "threshold", "move", "once", "always", "arm"]
    ),
)


class Clock:
    """A store clock that sometimes steps back (the appender keeps stamps monotonic)."""

    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        self.now += 3 if self.now % 7 else -11
        return self.now


def _appender(factory: Any) -> tuple[Any, bytearray, list[str]]:
    calls: list[str] = []
    mapping = bytearray(FILE_BYTES)
    appender = factory(
        new_append_lock() if factory is not PyAppender else threading.Lock(),
        {("orders", 0): 0, ("orders", 1): 5, ("a", 2): 2**40},
        dict(TOPICS),
        AppendResult,
        FEED_MAX,
    )
    appender.mapping = mapping
    appender.file_start = 4096
    appender.file_size = FILE_BYTES
    appender.write_position = 4096
    appender.record_size_limit = 1000
    appender.accepting = True
    appender.feed = []
    appender.clock = Clock()
    appender.listener = lambda: calls.append("appended")
    # orders 2 is seeded at 3 (advanced in place); -1 leaves orders 0 and 1 to the
    # table and orders 3 to the general path (loaded alone), as does 4, past the seed.
    appender.seeds = {"orders": np.array([-1, -1, 3, -1], dtype=np.int64)}
    return appender, mapping, calls


_STATE = (
    "write_position", "last_store_ts_ms", "feed_overflow", "file_start", "prepare_next_at",
    "listen", "listen_once",
)  # fmt: skip


def _state(appender: Any, mapping: bytearray, calls: list[str]) -> Any:
    feed = None if appender.feed is None else list(appender.feed)
    fields = tuple(getattr(appender, name) for name in _STATE)
    table = (dict(appender.queue_offsets), {t: bytes(v) for t, v in appender.seeds.items()})
    return (bytes(mapping), table, feed, fields, len(calls))


def _apply(appender: Any, mapping: bytearray, event: Any) -> Any:
    """One event on one appender; returns what append returned (or None)."""
    if event == "close":
        appender.accepting = False
    elif event == "reopen":
        appender.accepting = True
    elif event == "drain":
        appender.feed, appender.feed_overflow = [], False
    elif event == "no-feed":
        appender.feed = None
    elif event == "threshold":
        appender.prepare_next_at = appender.write_position + 200
    elif event == "once":  # the listener's gate (CommitLog.set_append_listener's once)
        appender.listen_once = True
    elif event == "always":
        appender.listen_once = False
    elif event == "arm":
        appender.listen = True
    elif event == "move":  # the CommitLog rolled: a fresh file
        mapping[:] = bytes(len(mapping))
        appender.file_start += FILE_BYTES
        appender.write_position = appender.file_start
        appender.prepare_next_at = 2**62
    else:
        return appender.append(*event)
    return None


@native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_events, max_size=40))
def test_c_appender_is_its_python_twin(events: list[Any]) -> None:
    """Same result, bytes, table, feed, state and listener calls after every event;
    an append either returns None with nothing changed or appends."""
    assert NATIVE is not None
    twins = [_appender(NATIVE.Appender), _appender(PyAppender)]
    for event in events:
        outcomes = []
        for appender, mapping, calls in twins:
            before = _state(appender, mapping, calls)
            result = _apply(appender, mapping, event)
            after = _state(appender, mapping, calls)
            if isinstance(event, tuple) and result is None:
                assert after == before  # left to the general path: nothing changed
            if result is not None:
                assert type(result) is AppendResult
                armed = before[3][5]  # listen: the listener runs once, or not (gated)
                assert after[4] == before[4] + armed
                assert after[3][5] == (armed and not before[3][6])  # once: disarmed
            outcomes.append((result, after))
        assert outcomes[0] == outcomes[1]


@native
def test_a_listener_called_once_per_arming_is_called_again_only_when_rearmed() -> None:
    """listen_once: the first append after arming calls the listener and disarms it;
    the appends after make no call until ``listen`` is set again; a call that left
    the append to the general path neither calls nor disarms."""
    assert NATIVE is not None
    for factory in (NATIVE.Appender, PyAppender):
        appender, _, calls = _appender(factory)
        assert appender.listen and not appender.listen_once  # as built: every append
        appender.listen_once = True
        assert appender.append("orders", 9, b"x", None, None, b"", b"") is None
        assert calls == [] and appender.listen
        for _ in range(3):
            assert appender.append("orders", 0, b"x", None, None, b"", b"") is not None
        assert calls == ["appended"] and not appender.listen
        appender.listen = True
        appender.append("orders", 0, b"x", None, None, b"", b"")
        appender.append("orders", 0, b"x", None, None, b"", b"")
        assert calls == ["appended"] * 2


@native
def test_a_listener_that_raises_stays_armed() -> None:
    """An error from the listener propagates (the record is appended) and leaves the
    gate open: the next append calls it again instead of leaving the wake-up lost."""
    assert NATIVE is not None
    for factory in (NATIVE.Appender, PyAppender):
        appender, _, _ = _appender(factory)
        calls: list[int] = []

        def listener(calls: list[int] = calls) -> None:
            calls.append(1)
            if len(calls) == 1:
                raise KeyboardInterrupt

        appender.listener, appender.listen_once = listener, True
        end = appender.write_position
        with pytest.raises(KeyboardInterrupt):
            appender.append("orders", 0, b"x", None, None, b"", b"")
        assert appender.write_position > end and appender.listen
        appender.append("orders", 0, b"x", None, None, b"", b"")
        assert calls == [1, 1] and not appender.listen


@native
def test_the_clock_is_called_only_for_an_append() -> None:
    """A roll or a queue not loaded is decided before the clock is read: the general
    path reads it once for the record it appends."""
    assert NATIVE is not None
    for factory in (NATIVE.Appender, PyAppender):
        appender, _, _ = _appender(factory)
        reads: list[int] = []
        appender.clock = lambda reads=reads: reads.append(1) or 5_000
        assert appender.append("orders", 9, b"x", None, None, b"", b"") is None  # not loaded
        appender.write_position = appender.file_start + FILE_BYTES - BLANK_SIZE
        assert appender.append("orders", 0, b"x", None, None, b"", b"") is None  # a roll
        assert reads == []


@native
def test_hostile_state_is_a_value_error_never_a_wild_write() -> None:
    assert NATIVE is not None
    for factory in (NATIVE.Appender, PyAppender):
        appender, mapping, _ = _appender(factory)
        appender.write_position = appender.file_start - 1
        with pytest.raises(ValueError):
            appender.append("orders", 0, b"x", None, None, b"", b"")
        appender.write_position = appender.file_start
        appender.file_size = 1 << 40  # longer than the mapping
        with pytest.raises(ValueError):
            appender.append("orders", 0, b"x", None, None, b"", b"")
        assert bytes(mapping) == bytes(len(mapping))
        appender.file_size = FILE_BYTES
        appender.mapping = bytes(FILE_BYTES)  # read-only
        with pytest.raises(TypeError):
            appender.append("orders", 0, b"x", None, None, b"", b"")
        with pytest.raises(TypeError):
            appender.append("orders", 0, b"x", None, None, "keys", b"")


def test_a_seeded_queue_is_appended_to_in_its_seed_and_never_enters_the_table() -> None:
    """Issue 15: a queue whose topic's seed holds an offset (>= 0) takes the common
    path at that offset, and the seed is advanced in place (no key enters the table);
    -1, an id past the seed, a topic without one or no seeds at all leave the queue to
    the table, then the general path; a seed that is not a writable int64 buffer is
    refused, and a seed replaced from Python is the one read next."""
    factories: list[Any] = [PyAppender] + ([NATIVE.Appender] if NATIVE is not None else [])
    for factory in factories:
        appender, _, _ = _appender(factory)
        seed = appender.seeds["orders"]
        for expected in (3, 4, 5):
            assert appender.append("orders", 2, b"x", None, None, b"", b"")[1] == expected
        assert seed.tolist() == [-1, -1, 6, -1]
        assert ("orders", 2) not in appender.queue_offsets
        assert appender.append("orders", 1, b"x", None, None, b"", b"")[1] == 5  # the table's
        assert appender.queue_offsets[("orders", 1)] == 6 and seed[1] == -1
        appender.seeds["orders"] = np.array([-1, -1, 50, -1], dtype=np.int64)  # replaced
        assert appender.append("orders", 2, b"x", None, None, b"", b"")[1] == 50
        assert appender.seeds["orders"][2] == 51 and seed[2] == 6
        for queue in (("orders", 3), ("orders", 4), ("a", 0)):
            assert appender.append(*queue, b"x", None, None, b"", b"") is None
            assert queue not in appender.queue_offsets
        appender.seeds = None
        assert appender.append("orders", 1, b"x", None, None, b"", b"")[1] == 6
        assert appender.append("orders", 2, b"x", None, None, b"", b"") is None
        read_only = np.zeros(2, dtype=np.int64)
        read_only.flags.writeable = False
        for bad, error in (
            ([1, 2], TypeError), (b"12345678", TypeError), (read_only, TypeError),
            (bytearray(7), ValueError),
        ):  # fmt: skip
            appender.seeds = {"a": bad}
            with pytest.raises(error):
                appender.append("a", 7, b"x", None, None, b"", b"")
        appender.seeds = [1]
        with pytest.raises(TypeError):
            appender.append("a", 7, b"x", None, None, b"", b"")
        assert ("a", 7) not in appender.queue_offsets
        appender.seeds = {"a": bytearray(16)}  # any writable buffer of int64
        assert appender.append("a", 1, b"x", None, None, b"", b"")[1] == 0
        assert appender.seeds["a"][8:] == (1).to_bytes(8, sys.byteorder)


def test_the_python_appender_is_the_one_without_the_c_module(monkeypatch) -> None:
    monkeypatch.setattr(appender_module, "NATIVE", None)
    lock = appender_module.new_append_lock()
    assert type(lock) is type(threading.Lock())
    assert type(appender_module.new_appender(lock, {})) is PyAppender


# ------------------------------------------------------------------ the CommitLog paths

_log_calls = st.tuples(
    st.sampled_from(["orders", "a"]),
    st.integers(0, 2),
    st.binary(max_size=900) | st.none() | st.binary(max_size=50).map(bytearray),
    st.none() | st.sampled_from(["t", "tag-é"]),
    st.none() | st.integers(0, 2**40),
    st.sampled_from([(), "k", ("k1", "k2")]),
    st.sampled_from([None, {"p": b"v"}]),
)


def _seed(topic: str) -> np.ndarray:
    """The ConsumeQueue's next offsets of a topic: orders 1 left to the queue loader."""
    return np.array([3, -1] if topic == "orders" else [], dtype=np.int64)


def _log(path: str, general_only: bool, seeded: bool = False) -> CommitLog:
    clock = Clock()
    config = CommitLogConfig(file_size_bytes=64 * 1024, prewarm=False, prepare_next_percent=30)
    loaders: dict[str, Any] = {}
    if seeded:  # queue offsets from "the ConsumeQueue": seeds, and one by one
        loaders = {"topic_offsets_loader": _seed, "queue_offset_loader": lambda t, q: 40 + q}
    log = CommitLog.open(path, config, clock_ms=clock, **loaders)
    if general_only:  # every append through the general path, as without the Appender
        log._append_common = lambda *args: None  # type: ignore[method-assign]
    log.enable_feed()
    return log


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_log_calls, min_size=1, max_size=250), st.booleans())
def test_one_call_path_writes_what_the_general_path_writes(tmp_path_factory, calls, seeded) -> None:
    """Files (rolls included), results, feed entries and queue offsets, call for call;
    ``seeded``: queue offsets come from loaders (the fast path advances seeded queues
    in their seed, the general path moves them into the table)."""
    root = tmp_path_factory.mktemp("paths")
    logs = [_log(str(root / "fast"), False, seeded), _log(str(root / "general"), True, seeded)]
    try:
        results: list[list[Any]] = [[], []]
        for topic, queue_id, body, tag, born, keys, properties in calls:
            for index, log in enumerate(logs):
                results[index].append(
                    log.append(topic, queue_id, body, keys=keys, tag=tag,
                               properties=properties, born_ts_ms=born)
                )  # fmt: skip
        assert results[0] == results[1]
        feeds = [log.take_feed() for log in logs]
        assert feeds[0] == feeds[1]
        assert logs[0].queue_offsets() == logs[1].queue_offsets()
        assert logs[0].write_position == logs[1].write_position
        files = [[bytes(m.mapping) for m in log.files()] for log in logs]
        assert files[0] == files[1]
    finally:
        for log in logs:
            log.close()


def test_appends_and_batches_from_threads_share_the_one_lock(open_log) -> None:
    """The one-call path and the batch path (Python, under the same lock) from many
    threads: dense queue offsets, no two records in one place, all recovered."""
    log = open_log()
    written: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def produce(queue_id: int) -> None:
        try:
            for round_ in range(150):
                if round_ % 10 == 0:
                    batch = log.append_batch("t", queue_id, [b"batch"] * 5)
                    written.extend((int(p), queue_id) for p in batch.physical_offsets)
                else:
                    result = log.append("t", queue_id, b"one" * (round_ % 40))
                    written.append((result.physical_offset, queue_id))
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=produce, args=(i % 2,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len({position for position, _ in written}) == len(written)
    records = list(log.iter_records(0))
    assert len(records) == len(written)
    for queue_id in (0, 1):
        offsets = [r.queue_offset for r in records if r.queue_id == queue_id]
        assert offsets == list(range(len(offsets)))


# ------------------------------------------------------------------ AppendLock


@native
def test_append_lock_is_a_lock() -> None:
    assert NATIVE is not None
    lock = NATIVE.AppendLock()
    assert not lock.locked()
    with lock:
        assert lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()
    with pytest.raises(TypeError):
        NATIVE.AppendLock(1)


@native
def test_append_lock_waits_without_the_gil() -> None:
    """A waiter releases the GIL, so the holder (Python) runs on and releases."""
    assert NATIVE is not None
    lock = NATIVE.AppendLock()
    lock.acquire()
    got = threading.Event()

    def waiter() -> None:
        with lock:
            got.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.05)  # the waiter blocks in C; this thread still runs Python
    assert not got.is_set()
    lock.release()
    thread.join(5)
    assert got.is_set()


# ------------------------------------------------------------------ feed_columns

_entries = st.lists(
    st.tuples(
        st.integers(0, 10_000),
        st.integers(68, 500),
        st.sampled_from(["orders", "a", "b"]),
        st.integers(0, 3),
        st.integers(0, 2**40),
        st.integers(0, 2**40),
        st.integers(0, 2**40),
        st.sampled_from([b"", b"tag"]),
        st.sampled_from([b"", b"k"]),
    ).map(lambda e: (e[0], *e[1:5], e[5] if e[0] % 3 else e[6], *e[6:])),
    max_size=12,
)


def _columns(capacity: int) -> list[np.ndarray]:
    dtypes = (np.int32, np.int64, np.int32, np.int64, np.int64, np.int64)
    return [np.zeros(capacity, dtype) for dtype in dtypes]


@settings(max_examples=200, deadline=None)
@given(_entries, st.integers(0, 12), st.integers(0, 20_000), st.integers(0, 14),
       st.booleans())  # fmt: skip
def test_feed_columns_twins(entries, start, end, capacity, batch_inside) -> None:
    if batch_inside and entries:
        entries = [*entries[: len(entries) // 2], ("a BatchFeed",), *entries[len(entries) // 2 :]]
    start = min(start, len(entries))
    # "b": a slot array (queue 0: slot 4, 1: none) that does not hold ids 2-3: (b, 3)
    slot_map = {("orders", 0): 3, ("a", 1): 7, "b": np.array([4, -1], np.int32), ("b", 3): 9}
    outs = []
    functions = [feed_columns_py] + ([NATIVE.feed_columns] if NATIVE is not None else [])
    for function in functions:
        columns = _columns(capacity)
        count, flags = function(entries, start, end, slot_map, *columns)
        outs.append(((count, flags), [c[:count].tolist() for c in columns]))
    assert all(out == outs[0] for out in outs)
    (count, flags), columns = outs[0]
    taken = entries[start : start + count]
    assert all(type(e) is tuple and len(e) == 9 and e[0] + e[1] <= end for e in taken)
    expected = {("b", 0): 4, ("b", 1): -1}
    assert columns[0] == [expected.get((e[2], e[3]), slot_map.get((e[2], e[3]), -1)) for e in taken]
    assert bool(flags & FEED_TAGGED) == any(e[7] for e in taken)
    assert bool(flags & FEED_KEYED) == any(e[8] for e in taken)
    assert bool(flags & FEED_BORN) == any(e[5] != e[6] for e in taken)


def test_feed_columns_refuses_bad_columns() -> None:
    functions = [feed_columns_py] + ([NATIVE.feed_columns] if NATIVE is not None else [])
    entry = (0, 100, "orders", 0, 0, 1, 1, b"", b"")
    for function in functions:
        columns = _columns(4)
        with pytest.raises(ValueError):
            function([entry], 0, 100, {}, *columns[:5], np.zeros(3, np.int64))
        with pytest.raises(TypeError):
            function([entry], 0, 100, {}, np.zeros(4, np.int64), *columns[1:])
        with pytest.raises(ValueError):
            function([entry], 2, 100, {}, *columns)
        with pytest.raises(TypeError):
            function([(0, 100, "orders", 0, 0, "1", 1, b"", b"")], 0, 100, {}, *columns)
    assert HEADER_SIZE == 68
