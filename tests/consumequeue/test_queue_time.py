"""The ConsumeQueue time look-up (consumequeue/queue_time.py) against a list model.

Each test runs twice: with the C search and scan (``time_search``, ``first_reaching``)
and with their pure-Python twins, so both are checked against the same model
(``MQSTORE_PURE_PYTHON=1`` runs the twins alone).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import CorruptDataError
from mqstore.commitlog.native import NATIVE
from mqstore.consumequeue import (
    ConsumeQueue,
    ConsumeQueueConfig,
    ConsumeQueueStore,
    queue_time,
    time_index,
)
from mqstore.consumequeue.format import (
    UNIT,
    block_max_position_bytes,
    time_file_name,
    unit_file_name,
)

StoreFactory = Callable[..., ConsumeQueueStore]
UPF = 8  # units per file (the conftest default): blocks and files roll often
HYPOTHESIS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(params=["c", "python"])
def search(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test with queue_time using the C functions, then the Python twins."""
    if request.param == "c":
        if NATIVE is None:
            pytest.skip("mqstore.commitlog._native is not built")
        monkeypatch.setattr(queue_time, "time_search", NATIVE.time_search)
        monkeypatch.setattr(queue_time, "first_reaching", NATIVE.first_reaching)
    else:
        monkeypatch.setattr(queue_time, "time_search", time_index.time_search_py)
        monkeypatch.setattr(queue_time, "first_reaching", time_index.first_reaching_py)
    yield request.param


def cl_of(offset: int) -> int:
    return 1000 + 100 * offset


def append(queue: ConsumeQueue, start: int, stamps: list[int]) -> None:
    offsets = np.arange(start, start + len(stamps))
    queue.put_batch(start, cl_of(offsets), 10 + offsets, 7 * offsets, np.array(stamps))  # type: ignore[arg-type]


def model(stamps: list[int], low: int, target: int) -> int | None:
    """The first offset >= low (offsets from 0) whose timestamp >= target."""
    return next((at for at in range(low, len(stamps)) if stamps[at] >= target), None)


@HYPOTHESIS
@given(
    chunks=st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=12), min_size=1, max_size=5),
    shared=st.sampled_from([0, 3, 10]),
    interval=st.sampled_from([1, 3, 8]),
    retained=st.integers(0, 70),
    targets=st.lists(st.integers(-1, 32), min_size=1, max_size=6),
)
def test_offset_for_time_matches_the_model(
    search: str,
    chunks: list[list[int]],
    shared: int,
    interval: int,
    retained: int,
    targets: list[int],
) -> None:
    """Out-of-order and equal timestamps, a shared run or none, any block size; look-ups
    between appends (the index is reused, then extended), then after retention."""
    config = ConsumeQueueConfig(
        units_per_file=UPF, time_index_interval_units=interval, shared_units_max=shared
    )
    with tempfile.TemporaryDirectory() as directory:
        store = ConsumeQueueStore.open(directory, config, read_only=False)
        try:
            check_against_model(store, chunks, retained, targets)
        finally:
            store.close()


def check_against_model(
    store: ConsumeQueueStore, chunks: list[list[int]], retained: int, targets: list[int]
) -> None:
    queue = store.queue("t", 0)
    stamps: list[int] = []
    for chunk in chunks:
        append(queue, len(stamps), chunk)
        stamps += chunk
        for target in targets:
            assert queue.offset_for_time(target) == model(stamps, 0, target)
    low = min(retained, len(stamps))
    store.correct_min_offsets(cl_of(low))
    assert queue.min_offset == low
    for target in targets:
        assert queue.offset_for_time(target) == model(stamps, low, target)
        probe = queue.time_probe(target)
        assert probe.offset == model(stamps, low, target)
        check_probe(probe, stamps, low)


def check_probe(probe: queue_time.TimeProbe, stamps: list[int], low: int) -> None:
    """The probe holds the answer and the unit before it (the last two units when there
    is no answer), as the queue's own reads give them."""
    if low == len(stamps):
        assert list(probe.timestamps_ms) == list(probe.sizes) == []
        return
    last = len(stamps) - 1 if probe.offset is None else probe.offset
    start = max(low, last - 1)
    assert probe.start == start
    assert probe.timestamps_ms == stamps[start : last + 1]
    expected = [(cl_of(at), 10 + at) for at in range(start, last + 1)]
    assert list(zip(probe.commitlog_offsets, probe.sizes, strict=True)) == expected


def test_equal_timestamps_answer_the_first_of_the_run(
    open_store: StoreFactory, search: str
) -> None:
    """A run of equal timestamps across blocks and files: the first of them."""
    queue = open_store(shared_units_max=2).queue("t", 0)
    stamps = [5] * 3 + [7] * (3 * UPF) + [9]
    append(queue, 0, stamps)
    assert queue.offset_for_time(6) == 3
    assert queue.offset_for_time(7) == 3
    assert queue.offset_for_time(8) == len(stamps) - 1
    assert queue.offset_for_time(5) == 0
    assert queue.offset_for_time(-(2**63)) == 0  # before the start: the first unit
    assert queue.offset_for_time(2**63 - 1) is None  # after the end


def test_empty_queue(open_store: StoreFactory, search: str) -> None:
    queue = open_store(shared_units_max=4).queue("t", 0)
    assert queue.offset_for_time(0) is None
    probe = queue.time_probe(0)
    assert (probe.offset, probe.start, probe.timestamps_ms) == (None, 0, [])


def test_every_unit_removed_by_retention(open_store: StoreFactory, search: str) -> None:
    store = open_store(shared_units_max=3)
    queue = store.queue("t", 0)
    append(queue, 0, list(range(2 * UPF)))
    store.correct_min_offsets(cl_of(2 * UPF))
    assert queue.min_offset == queue.max_offset == 2 * UPF
    assert queue.offset_for_time(0) is None
    assert queue.time_probe(0).timestamps_ms == []


@pytest.mark.parametrize("shared", [0, 3])
def test_probe_across_a_file_or_the_shared_run(
    open_store: StoreFactory, search: str, shared: int
) -> None:
    """The answer's previous unit in the shared run, or in the previous file."""
    queue = open_store(shared_units_max=shared).queue("t", 0)
    stamps = list(range(0, 4 * UPF))
    append(queue, 0, stamps)
    for answer in (3, UPF, 2 * UPF, 0, len(stamps) - 1):
        probe = queue.time_probe(stamps[answer])
        assert probe.offset == answer
        check_probe(probe, stamps, 0)
    check_probe(queue.time_probe(10**6), stamps, 0)


def test_index_is_reused_until_the_queue_changes(open_store: StoreFactory, search: str) -> None:
    queue = open_store(shared_units_max=3).queue("t", 0)
    append(queue, 0, list(range(20)))
    assert queue.offset_for_time(15) == 15
    built = queue._time_index
    assert queue.offset_for_time(4) == 4 and queue._time_index is built
    append(queue, 20, [30, 1, 40])  # a later, smaller one: the running maximum holds
    assert queue.offset_for_time(25) == 20
    assert queue.offset_for_time(35) == 22
    queue.truncate(21)
    assert queue.offset_for_time(35) is None


def test_a_block_maximum_without_its_timestamp_is_corrupt(
    open_store: StoreFactory, search: str
) -> None:
    """A stored block maximum that no timestamp of its block reaches (a lost page of
    timestamps): CorruptDataError naming the time file, never a wrong answer."""
    store = open_store()
    queue = store.queue("t", 0)
    append(queue, 0, [10, 20, 30, 40, 50, 60, 70, 80])  # blocks [0,3) [3,6) [6,8)
    store.close()
    path = f"{queue.directory}/{time_file_name(unit_file_name(0, UPF))}"
    with open(path, "r+b") as file:  # block 1's maximum says 65: none of 40, 50, 60 is
        file.seek(block_max_position_bytes(UPF) + 8)
        file.write((65).to_bytes(8, "little"))
    queue = open_store().queue("t", 0)
    with pytest.raises(CorruptDataError) as raised:
        queue.offset_for_time(62)
    assert raised.value.path == path
    assert queue.offset_for_time(20) == 1  # before it: still answered


@pytest.mark.parametrize("lost", [4, 5])
def test_an_unwritten_probed_unit_is_corrupt(
    open_store: StoreFactory, search: str, lost: int
) -> None:
    """A lost page zeroed the answer's unit or the one before it (the probe's two units,
    read from the file the block scan found): CorruptDataError, never a probe that the
    store's spot check would then read garbage for."""
    store = open_store(shared_units_max=0)
    queue = store.queue("t", 0)
    stamps = list(range(10, 10 + 2 * UPF))
    append(queue, 0, stamps)
    store.close()
    path = f"{queue.directory}/{unit_file_name(0, UPF)}"
    with open(path, "r+b") as file:
        file.seek(lost * UNIT.itemsize)
        file.write(bytes(UNIT.itemsize))
    queue = open_store(shared_units_max=0).queue("t", 0)
    assert queue.max_offset == 2 * UPF
    assert queue.offset_for_time(stamps[5]) == 5  # the search reads timestamps only
    with pytest.raises(CorruptDataError, match="unwritten"):
        queue.time_probe(stamps[5])
    probe = queue.time_probe(stamps[7])  # units 6 and 7 are intact
    assert (probe.offset, probe.start, probe.timestamps_ms) == (7, 6, stamps[6:8])


def test_remembered_files_never_keep_an_evicted_mapping(
    open_store: StoreFactory, search: str
) -> None:
    """A look-up remembers the files it read (weakly, to skip the FileCache next time);
    once the cache evicts them they are gone from the index too (the store's bound on
    mappings and descriptors holds), and answers stay right while files come and go."""
    store = open_store(max_open_files=2, shared_units_max=0)  # one file pair at a time
    queue = store.queue("t", 0)
    stamps = [3 * offset // 2 for offset in range(6 * UPF)]  # equal runs, six files
    append(queue, 0, stamps)
    for target in [stamps[5], stamps[3 * UPF + 1], stamps[UPF], stamps[-1], stamps[2] + 1]:
        probe = queue.time_probe(target)
        assert probe.offset == model(stamps, 0, target)
        check_probe(probe, stamps, 0)
    index = queue._time_index
    assert index is not None
    assert queue.offset_for_time(stamps[5]) == model(stamps, 0, stamps[5])
    assert index.files(0) is not None  # file 0 is the cache's pair now: remembered
    assert queue.offset_for_time(stamps[-1]) == model(stamps, 0, stamps[-1])
    assert index.files(0) is None  # evicted for file 5's pair: the index let it go
    assert index.files(len(stamps) // UPF - 1) is not None


def test_a_read_only_queue_reads_its_files_through_the_cache(
    open_store: StoreFactory, search: str
) -> None:
    """A reader never uses remembered files: the cache notices a file the writer removed."""
    writer = open_store(shared_units_max=0).queue("t", 0)
    stamps = list(range(100, 100 + 3 * UPF))
    append(writer, 0, stamps)
    reader = open_store(read_only=True, shared_units_max=0).queue("t", 0)
    assert reader.offset_for_time(stamps[UPF + 2]) == UPF + 2
    index = reader._time_index
    assert index is not None and index.files(1) is None
