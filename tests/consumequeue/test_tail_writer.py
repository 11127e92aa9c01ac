"""TailWriter (the dispatcher's many-queue fast path) against ConsumeQueue.put: the
same units written either way leave byte-identical files, through file rolls, map
cache evictions, re-puts of stored units, truncations and reopening."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import CorruptDataError, InvalidArgumentError
from mqstore.commitlog.native import NATIVE
from mqstore.consumequeue import ConsumeQueueConfig, ConsumeQueueStore
from mqstore.consumequeue.tail_writer import PUBLISH_LIST_UNITS_MAX, TailWriter, _distinct

TOPIC = "t"

# An operation: ("write", [queue ids of the next units, in order]) appends one unit to
# each listed queue; ("reput", queue, back) re-puts its unit `back` below the tail;
# ("truncate", queue, back) drops its last `back` units.
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.lists(st.integers(0, 3), min_size=1, max_size=30)),
        st.tuples(st.just("reput"), st.integers(0, 3), st.integers(1, 5)),
        st.tuples(st.just("truncate"), st.integers(0, 3), st.integers(1, 5)),
    ),
    min_size=1,
    max_size=12,
)


class _Model:
    """The units each queue holds; commitlog offsets grow across the whole log."""

    def __init__(self) -> None:
        self.units: dict[int, list[tuple[int, int, int, int]]] = {}
        self.clog = 1000

    def next_units(self, queues: list[int]) -> list[tuple[int, int, int, int, int, int]]:
        out = []
        for queue in queues:
            held = self.units.setdefault(queue, [])
            self.clog += 97
            unit = (self.clog, 90 + len(held) % 7, (len(held) * 31) % 5 - 2, 5000 + self.clog % 13)
            out.append((queue, len(held), *unit))
            held.append(unit)
        return out


def _files(root: str) -> dict[str, bytes]:
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as file:
                found[os.path.relpath(path, root)] = file.read()
    return found


def _run(tmp_path: str, ops: list, max_open_files: int, chunked: bool) -> None:
    config = ConsumeQueueConfig(
        units_per_file=8, max_open_files=max_open_files, time_index_interval_units=3
    )
    fast_root, slow_root = os.path.join(tmp_path, "fast"), os.path.join(tmp_path, "slow")
    fast = ConsumeQueueStore.open(fast_root, config)
    slow = ConsumeQueueStore.open(slow_root, config)
    tail = TailWriter(fast)
    model = _Model()
    try:
        for op in ops:
            if op[0] == "write":
                units = model.next_units(op[1])
                columns = list(zip(*units, strict=True))
                slots = np.array([tail.slot_of(TOPIC, q) for q in columns[0]], dtype=np.int32)
                arrays = (
                    slots,
                    np.array(columns[1], dtype=np.int64),
                    np.array(columns[2], dtype=np.int64),
                    np.array(columns[3], dtype=np.int32),
                    np.array(columns[4], dtype=np.int64),
                    np.array(columns[5], dtype=np.int64),
                )
                if chunked:  # one call per unit, as rounds of one record would do
                    for i in range(len(units)):
                        tail.write(*(array[i : i + 1] for array in arrays))
                else:
                    tail.write(*arrays)
                for queue, offset, clog, size, tag, stamp in units:
                    slow.queue(TOPIC, queue).put(offset, clog, size, tag, stamp)
            else:
                _, queue, back = op
                held = model.units.get(queue, [])
                if len(held) < back:
                    continue
                if op[0] == "reput":
                    offset = len(held) - back
                    clog, size, tag, stamp = held[offset]
                    slot = np.array([tail.slot_of(TOPIC, queue)], dtype=np.int32)
                    tail.write(slot, *(np.array([v], dtype=np.int64) for v in (offset, clog)),
                               np.array([size], dtype=np.int32),
                               *(np.array([v], dtype=np.int64) for v in (tag, stamp)))  # fmt: skip
                    slow.queue(TOPIC, queue).put(offset, clog, size, tag, stamp)
                else:
                    for store in (fast, slow):
                        store.queue(TOPIC, queue).truncate(len(held) - back)
                    del held[len(held) - back :]
            for queue, held in model.units.items():
                for store in (fast, slow):
                    assert store.queue(TOPIC, queue).max_offset == len(held)
        for queue, held in model.units.items():
            if held:
                parts, offset = [], 0
                while offset < len(held):  # get_range stops at a file's end
                    parts.append(fast.queue(TOPIC, queue).get_range(offset, len(held) - offset))
                    offset += len(parts[-1])
                got = np.concatenate(parts)
                assert got["commitlog_offset"].tolist() == [u[0] for u in held]
                assert got["size"].tolist() == [u[1] for u in held]
                assert got["tag_hash"].tolist() == [u[2] for u in held]
        fast.flush()
        slow.flush()
    finally:
        tail.detach_all()
        fast.close()
        slow.close()
    fast_files, slow_files = _files(fast_root), _files(slow_root)
    assert fast_files.keys() == slow_files.keys()
    for name, data in fast_files.items():
        assert data == slow_files[name], name


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_ops, max_open_files=st.sampled_from([2, 4, 9, 64]), chunked=st.booleans())
def test_tail_writer_writes_what_put_writes(tmp_path_factory, ops, max_open_files, chunked) -> None:
    _run(str(tmp_path_factory.mktemp("tail")), ops, max_open_files, chunked)


@pytest.mark.skipif(NATIVE is None, reason="the fast path needs mqstore.commitlog._native")
def test_rows_attach_and_take_the_fast_path(tmp_path) -> None:
    """With few queues the rows attach: after the first unit of a file, later units
    of that file do not go through ConsumeQueue.put."""
    store = ConsumeQueueStore.open(
        str(tmp_path), ConsumeQueueConfig(units_per_file=1000, max_open_files=64)
    )
    tail = TailWriter(store)
    calls = []
    queue = store.queue(TOPIC, 0)
    original = type(queue).put

    def counting_put(self, *args):
        calls.append(args[0])
        return original(self, *args)

    try:
        type(queue).put = counting_put  # type: ignore[method-assign]
        slot = tail.slot_of(TOPIC, 0)
        for offset in range(100):
            tail.write(np.array([slot], np.int32), np.array([offset]), np.array([10 + offset]),
                       np.array([5], np.int32), np.array([0]), np.array([7]))  # fmt: skip
    finally:
        type(queue).put = original  # type: ignore[method-assign]
        tail.detach_all()
        store.close()
    assert calls == [0]  # the first unit creates the file and attaches the row; C does the rest


def test_a_conflicting_unit_is_refused_by_put(tmp_path) -> None:
    """A unit that differs from the stored one at its offset still raises, as put does."""
    store = ConsumeQueueStore.open(str(tmp_path), ConsumeQueueConfig(units_per_file=100))
    tail = TailWriter(store)
    slot = np.array([tail.slot_of(TOPIC, 0)] * 3, np.int32)
    try:
        tail.write(slot, np.arange(3), np.array([10, 20, 30]), np.full(3, 5, np.int32),
                   np.zeros(3, np.int64), np.full(3, 9))  # fmt: skip
        with pytest.raises(CorruptDataError):
            tail.write(slot[:1], np.array([1]), np.array([21]), np.array([5], np.int32),
                       np.array([0]), np.array([9]))  # fmt: skip
        assert store.queue(TOPIC, 0).max_offset == 3
    finally:
        tail.detach_all()
        store.close()


def test_shared_queues_get_no_object_until_one_graduates(tmp_path) -> None:
    """Issue 15: slots of new queues, and their units in the shared log, build no
    ConsumeQueue object; a queue that graduates to own files gets one; every unit reads
    back either way, from a reopened store too."""
    config = ConsumeQueueConfig(units_per_file=8, max_open_files=64, shared_units_max=3)
    root = str(tmp_path)
    store = ConsumeQueueStore.open(root, config)
    tail = TailWriter(store)
    keys = [(TOPIC, q) for q in (5, 1, 5, 2, 1, 5)]
    slots = tail.slots_of(keys)
    assert slots == [tail.slot_of(*key) for key in keys]
    assert len(set(slots)) == 3 and slots[0] == slots[2] == slots[5]
    held: dict[int, list[int]] = {}
    clog = 1000
    for round_ in range(2):  # queue 5: 3 units shared, then 3 own; 1: 3 + 1; 2: 2 shared
        queue_ids = [q for _, q in keys]
        offsets = []
        for q in queue_ids:
            offsets.append(len(held.setdefault(q, [])))
            clog += 50
            held[q].append(clog)
        tail.write(
            np.array(slots, dtype=np.int32), np.array(offsets, dtype=np.int64),
            np.array([held[q][o] for q, o in zip(queue_ids, offsets, strict=True)]),
            np.full(6, 40, dtype=np.int32), np.zeros(6, dtype=np.int64),
            np.full(6, 7, dtype=np.int64),
        )  # fmt: skip
        if round_ == 0:
            assert not store._queues  # all shared: no object
    assert set(store._queues) == {(TOPIC, 5), (TOPIC, 1)}  # graduated at their 4th unit
    assert store.queue(TOPIC, 5).append_limit() == store.queue(TOPIC, 1).append_limit() == -1
    tail.detach_all()
    store.close()
    for reopened in (False, True):
        store = ConsumeQueueStore.open(root, config)
        for q, clogs in held.items():
            assert store.max_offset_of(TOPIC, q) == len(clogs)
            got = []
            while len(got) < len(clogs):
                got += store.queue(TOPIC, q).get_range(len(got), 10)["commitlog_offset"].tolist()
            assert got == clogs, (reopened, q)
        store.close()


def test_slots_of_refuses_a_bad_queue(tmp_path) -> None:
    store = ConsumeQueueStore.open(str(tmp_path), ConsumeQueueConfig(shared_units_max=3))
    tail = TailWriter(store)
    try:
        with pytest.raises(InvalidArgumentError):
            tail.slots_of([(TOPIC, 0), ("a/b", 1)])
        with pytest.raises(InvalidArgumentError):
            tail.slots_of([(TOPIC, -1)])
        assert tail.slots_of([(TOPIC, 0)]) == [0]
    finally:
        store.close()


@pytest.mark.parametrize("shared_units_max", [0, 3])
def test_new_slots_are_slots_of_given_as_columns(tmp_path, shared_units_max: int) -> None:
    """new_slots (the dispatcher's new queues of a round) gives what slots_of gives:
    repeats share a slot, other topics and bad queues go through slots_of, and the
    limits are those of the queues (one with an object, one with units shared)."""
    config = ConsumeQueueConfig(shared_units_max=shared_units_max)
    store = ConsumeQueueStore.open(str(tmp_path), config)
    try:
        store.queue(TOPIC, 9)  # an object: its limit comes from it
        for tail_ in (TailWriter(store), TailWriter(store)):
            assert tail_.new_slots([TOPIC] * 3, [4, 9, 6]) == range(0, 3)
        tail = TailWriter(store)
        expected = TailWriter(store)
        rounds = ([4, 4, 9, 6, 4], [7, 8, 7])
        for queue_ids in rounds:
            keys = [(TOPIC, q) for q in queue_ids]
            assert list(tail.new_slots([TOPIC] * len(keys), queue_ids)) == expected.slots_of(keys)
        mixed = tail.new_slots([TOPIC, "other", TOPIC], [1, 1, 2])
        assert list(mixed) == expected.slots_of([(TOPIC, 1), ("other", 1), (TOPIC, 2)])
        assert tail._limits.tolist() == expected._limits.tolist()
        for key in [(TOPIC, q) for q in range(12)] + [("other", 1)]:
            assert tail._slot(*key) == expected._slot(*key)
        with pytest.raises(InvalidArgumentError):
            tail.new_slots([TOPIC, TOPIC], [3, -1])
    finally:
        store.close()


def test_slots_below_and_past_the_array_ids(tmp_path) -> None:
    """Queue ids below SLOT_ARRAY_IDS_MAX keep their slot in their topic's int32 array
    (no key per queue), higher ones under (topic, queue id); feed_columns reads both
    (C and twin), and an id the array does not hold reads -1."""
    from mqstore.commitlog.appender import feed_columns_py
    from mqstore.consumequeue.tail_writer import SLOT_ARRAY_IDS_MAX

    store = ConsumeQueueStore.open(str(tmp_path), ConsumeQueueConfig(shared_units_max=3))
    try:
        tail = TailWriter(store)
        high = SLOT_ARRAY_IDS_MAX + 5
        assert list(tail.new_slots([TOPIC] * 4, [3, high, 0, 3])) == [0, 1, 2, 0]
        assert tail.slots_of([(TOPIC, 0), (TOPIC, high), (TOPIC, 70)]) == [2, 1, 3]
        assert tail.slot_of(TOPIC, 3) == 0 and tail._slot(TOPIC, 4) == -1
        assert tail.slot_of(TOPIC, np.int64(3)) == 0  # a numpy id finds the same slot
        assert (TOPIC, high) in tail.slots and (TOPIC, 3) not in tail.slots
        assert isinstance(tail.slots[TOPIC], np.ndarray) and len(tail.slots[TOPIC]) == 128
        entries = [(100 * k, 100, TOPIC, q, 0, 5, 5, b"", b"") for k, q in
                   enumerate([3, high, 0, 70, 71, 500, 3])]  # fmt: skip
        functions = [feed_columns_py] + ([NATIVE.feed_columns] if NATIVE is not None else [])
        for function in functions:
            columns = [np.zeros(8, dtype) for dtype in
                       (np.int32, np.int64, np.int32, np.int64, np.int64, np.int64)]  # fmt: skip
            assert function(entries, 0, 10_000, tail.slots, *columns) == (7, 0)
            assert columns[0][:7].tolist() == [0, 1, 2, 3, -1, -1, 0]
    finally:
        store.close()


def test_a_write_past_the_list_bound_writes_what_put_writes(tmp_path) -> None:
    """_publish sorts the slots past PUBLISH_LIST_UNITS_MAX units (_distinct), takes a
    list below it: both leave the files put would leave."""
    queues = [index % 5 for index in range(PUBLISH_LIST_UNITS_MAX + 40)]
    _run(str(tmp_path / "long"), [("write", queues), ("write", queues[:9])], 64, False)


@pytest.mark.skipif(NATIVE is None, reason="the fast path needs mqstore.commitlog._native")
def test_a_round_below_the_list_bound_calls_no_numpy_that_drops_the_gil(
    tmp_path, monkeypatch
) -> None:
    """np.sort and np.unique release the GIL for any length (numpy 2.x), which hands it
    to the writer thread: a write of up to PUBLISH_LIST_UNITS_MAX units calls neither."""
    store = ConsumeQueueStore.open(
        str(tmp_path), ConsumeQueueConfig(units_per_file=4096, max_open_files=64)
    )
    tail = TailWriter(store)
    try:
        slots = np.array([tail.slot_of(TOPIC, index % 3) for index in range(6)], np.int32)
        offsets = np.array([0, 0, 0, 1, 1, 1])
        # The first units of each queue open its file and attach its row.
        tail.write(slots, offsets, np.arange(6) * 100, np.full(6, 90, np.int32),
                   np.zeros(6, np.int64), np.full(6, 7))  # fmt: skip

        def no_sort(*args, **kwargs):
            raise AssertionError("np.sort or np.unique in a small round")

        monkeypatch.setattr(np, "unique", no_sort)
        monkeypatch.setattr(np, "sort", no_sort)
        count = PUBLISH_LIST_UNITS_MAX // 3 * 3  # whole turns of the three queues
        slots = np.array([tail.slot_of(TOPIC, index % 3) for index in range(count)], np.int32)
        offsets = np.arange(count) // 3 + 2
        tail.write(slots, offsets, np.arange(count) * 100 + 1000, np.full(count, 90, np.int32),
                   np.zeros(count, np.int64), np.full(count, 7))  # fmt: skip
        for queue_id in range(3):
            assert store.queue(TOPIC, queue_id).max_offset == count // 3 + 2
    finally:
        tail.detach_all()
        store.close()


@given(
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=600), st.sampled_from([np.int32, np.int64])
)
def test_distinct_is_np_unique(values, dtype) -> None:
    array = np.array(values, dtype=dtype)
    got = _distinct(array)
    assert got.dtype == array.dtype
    assert got.tolist() == np.unique(array).tolist()


def test_a_long_round_imports_nothing(tmp_path) -> None:
    """np.unique imported numpy.ma on its first call in a process: 15-30 ms inside the
    first dispatch round past PUBLISH_LIST_UNITS_MAX units, while readers waited
    (docs/VISIBILITY.md, stop 31). A fresh process writes and dispatches such rounds;
    nothing may be imported meanwhile."""
    script = f"""
import sys
from mqstore import MessageStore, StoreConfig
store = MessageStore.open({str(tmp_path)!r}, StoreConfig(prewarm=False))
store.put("t", 0, b"warm")
store._dispatcher.dispatch_available()
for index in range({PUBLISH_LIST_UNITS_MAX} * 4):  # both queues get files of their own,
    store.put("t", index % 2, b"x")  # in rounds below the bound
    if index % 64 == 0:
        store._dispatcher.dispatch_available()
store._dispatcher.dispatch_available()
before = set(sys.modules)
for round_ in range(3):
    for index in range({PUBLISH_LIST_UNITS_MAX} * 2):
        store.put("t", index % 2, b"y")
    store._dispatcher.dispatch_available()
late = sorted(set(sys.modules) - before)
store.close()
print(late)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
