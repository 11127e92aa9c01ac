"""The dispatcher's read of the log (dispatch/log_scan.py), above all the re-dispatch
after a crash: units, timestamps and index entries equal what the log says, with the
C header scan and with its pure-Python twin alike, over random stores, torn tails and
writers killed with SIGKILL mid-write."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import MessageStore, StoreConfig
from mqstore.commitlog import recovery
from mqstore.commitlog.checkpoint import CheckpointFile
from mqstore.commitlog.header_scan import dispatch_columns_py
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.record import scan_records_py, tag_hash
from mqstore.consumequeue import reput_check
from mqstore.consumequeue.consume_queue import ConsumeQueue
from mqstore.consumequeue.reput_check import units_in_place_py
from mqstore.dispatch import log_scan

FILE_BYTES = 64 * 1024  # small CommitLog files: re-dispatch crosses blank records
TOPICS = ("orders", "audit", "x")
_NEEDS_C = pytest.mark.skipif(NATIVE is None, reason="the C module is not built")
SCANS = [
    pytest.param("python", id="python"),
    pytest.param("c", id="c", marks=_NEEDS_C),
    pytest.param("c-ahead", id="c-ahead", marks=_NEEDS_C),
    pytest.param("fused-python", id="fused-python"),
    pytest.param("fused-c", id="fused-c", marks=_NEEDS_C),
]


def _config(**overrides: Any) -> StoreConfig:
    settings_ = {
        "commitlog_file_size_bytes": FILE_BYTES,
        "prewarm": False,
        "consumequeue_units_per_file": 64,
        "consumequeue_shared_units_max": 16,  # some queues stay shared, some graduate
        "index_slot_count": 64,
        "index_entry_count": 4096,
        **overrides,
    }
    return StoreConfig(**settings_)


@pytest.fixture(params=SCANS)
def scan(request, monkeypatch) -> Iterator[str]:
    """Run the test with the C header scan (and check of kept units), with their
    pure-Python twins, and with the C scan parsing ahead in a thread (``Prefetch``) on
    every scan, in runs of 16 records (so a scan is many runs, and the thread waits on
    its full queue): those three with the re-dispatch after a crash left to the
    dispatcher. The "fused" ones re-dispatch during the recovery scan
    (dispatch/scan_dispatch.py), in runs of 16 records, with the C scan or the twins;
    a test that crashes checks that it did (``_assert_redispatched_in_scan``)."""
    started: list[int] = []
    if request.param.startswith("fused"):
        monkeypatch.setattr(recovery, "SCAN_ROWS", 16)
        if request.param == "fused-python":
            monkeypatch.setattr(recovery, "scan_records", scan_records_py)
            monkeypatch.setattr(log_scan, "dispatch_columns", dispatch_columns_py)
            monkeypatch.setattr(reput_check, "units_in_place", units_in_place_py)
    else:
        monkeypatch.setattr(MessageStore, "_scan_dispatch", lambda store, checkpoint: None)
    if request.param == "python":
        monkeypatch.setattr(log_scan, "dispatch_columns", dispatch_columns_py)
        monkeypatch.setattr(reput_check, "units_in_place", units_in_place_py)
    elif request.param == "c-ahead":
        monkeypatch.setattr(log_scan, "PARSE_AHEAD_MIN_BYTES", 0)
        monkeypatch.setattr(log_scan, "SCAN_ROWS", 16)
        real = log_scan.Prefetch

        def counting(produce: Any, depth: int, name: str) -> Any:
            started.append(depth)
            return real(produce, depth, name)

        monkeypatch.setattr(log_scan, "Prefetch", counting)
    yield request.param
    if request.param == "c-ahead":
        assert started, "no scan parsed ahead"


def _snapshot(store: MessageStore) -> dict[str, Any]:
    """Every queue's units and timestamps, and every key's index hits, from the log's
    records: what a re-dispatch must have rebuilt."""
    out: dict[str, Any] = {}
    for record in store.commitlog.iter_records(store.commitlog.min_position):
        key = f"{record.topic}/{record.queue_id}"
        if key in out:
            continue
        # (through the store's reads, which dispatch what was put first)
        low = store.min_offset(record.topic, record.queue_id)
        high = store.max_offset(record.topic, record.queue_id)
        queue = store.consume_queues.queue(record.topic, record.queue_id)
        units = [tuple(int(v) for v in queue.get(o).item()) for o in range(low, high)]
        times = queue.timestamps(low, high - low).tolist()
        out[key] = (low, high, units, times)
    return out


def _expected(store: MessageStore, create_time: bool) -> dict[str, Any]:
    """The snapshot the log's records call for."""
    out: dict[str, Any] = {}
    for record in store.commitlog.iter_records(store.commitlog.min_position):
        low, _, units, times = out.setdefault(
            f"{record.topic}/{record.queue_id}", (record.queue_offset, 0, [], [])
        )
        assert record.queue_offset == low + len(units)
        code = tag_hash(record.tag.encode()) if record.tag else 0
        units.append((record.physical_offset, record.size, code))
        times.append(record.born_ts_ms if create_time else record.store_ts_ms)
        out[f"{record.topic}/{record.queue_id}"] = (low, record.queue_offset + 1, units, times)
    return out


def _assert_index_complete(store: MessageStore) -> None:
    for record in store.commitlog.iter_records(store.commitlog.min_position):
        for key in record.keys:
            hits = store.query_by_key(record.topic, key, max_results=64)
            assert record.physical_offset in [m.physical_offset for m in hits]


def _assert_redispatched_in_scan(store: MessageStore, scan: str) -> None:
    """With a "fused" scan, the open re-dispatched during the recovery scan (and the
    dispatcher had nothing left); else the dispatcher re-dispatched."""
    assert store._dispatcher is not None
    assert store.redispatched_at_open > 0
    if scan.startswith("fused"):
        assert store._dispatcher.dispatched_records == 0
    else:
        assert store._dispatcher.dispatched_records == store.redispatched_at_open


def _write(store: MessageStore, messages: list[tuple[int, int, int, bool, bool]]) -> None:
    for number, (topic, queue_id, size, tagged, keyed) in enumerate(messages):
        store.put(TOPICS[topic], queue_id, bytes([number % 251]) * size,
                  tag=f"tag{number % 3}" if tagged else None,
                  keys=[f"k{number}", f"common{number % 4}"] if keyed else (),
                  born_timestamp_ms=10_000 + number)  # fmt: skip


def _rebuild(path: str) -> None:
    """Lose every derived file: open rebuilds them all from the CommitLog."""
    shutil.rmtree(os.path.join(path, "consumequeue"))
    shutil.rmtree(os.path.join(path, "index"))


messages_strategy = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 600), st.booleans(),
              st.booleans()),
    min_size=1, max_size=300,
)  # fmt: skip


SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]  # fixture: the scan


@settings(max_examples=15, deadline=None, suppress_health_check=SLOW_OK)
@given(messages=messages_strategy, create_time=st.booleans())
def test_rebuild_from_the_log_gives_what_the_log_says(scan, messages, create_time):
    """Random stores (3 topics, 41 queues, tags, keys, shared and own queue files):
    ConsumeQueues and index rebuilt by the re-dispatch equal the log's records."""
    path = tempfile.mkdtemp()
    try:
        kind = "CreateTime" if create_time else "LogAppendTime"
        with MessageStore.open(path, _config(default_timestamp_type=kind)) as store:
            _write(store, messages)
            live = _snapshot(store)
        _rebuild(path)
        with MessageStore.open(path, _config()) as store:
            rebuilt = _snapshot(store)
            assert rebuilt == live
            assert rebuilt == _expected(store, create_time)
            _assert_index_complete(store)
    finally:
        shutil.rmtree(path)


@pytest.mark.skipif(NATIVE is None, reason="the C module is not built")
@settings(max_examples=10, deadline=None)
@given(messages=messages_strategy)
def test_c_and_python_rebuild_the_same_files(messages):
    """The same store rebuilt with each header scan: byte-for-byte the same units."""
    path = tempfile.mkdtemp()
    try:
        with MessageStore.open(path, _config()) as store:
            _write(store, messages)
        snapshots = []
        for twin in (False, True):
            _rebuild(path)
            original = log_scan.dispatch_columns
            if twin:
                log_scan.dispatch_columns = dispatch_columns_py
            try:
                with MessageStore.open(path, _config()) as store:
                    snapshots.append(_snapshot(store))
            finally:
                log_scan.dispatch_columns = original
        assert snapshots[0] == snapshots[1]
    finally:
        shutil.rmtree(path)


def test_redispatch_after_a_crash_over_lost_and_kept_units(scan, tmp_path):
    """A crash with the checkpoint far behind: some queues kept their units (page
    cache), others lost their tails (dropped here by hand); the re-dispatch compares
    the kept ones in bulk and writes the lost ones back."""
    path = str(tmp_path)
    config = _config(checkpoint_interval_ms=600_000, consumequeue_flush_interval_ms=3_600_000)
    store = MessageStore.open(path, config)
    _write(store, [(0, q % 5, 100, q % 2 == 0, q % 3 == 0) for q in range(40)])
    store.close()  # the checkpoint now covers these
    store = MessageStore.open(path, config)
    _write(store, [(q % 2, q % 7, 300, q % 4 == 0, q % 5 == 0) for q in range(600)])
    before = _snapshot(store)
    assert store.wait_for("orders", 0, store.max_offset("orders", 0) - 1, 1_000)
    store.consume_queues.queue("orders", 1).truncate(20)  # the checkpoint covers 8
    store.consume_queues.queue("audit", 2).truncate(0)
    store._crash()
    with MessageStore.open(path, _config()) as store:
        assert store.recovered_from_crash
        _assert_redispatched_in_scan(store, scan)
        assert _snapshot(store) == before
        _assert_index_complete(store)


def test_redispatch_confirms_kept_shared_units_in_bulk(scan, tmp_path, monkeypatch):
    """Many small queues kept their shared units through the crash: the re-dispatch
    confirms them in one lookup (ConsumeQueueStore.confirm_shared), none takes a
    ConsumeQueue.put, and the queues read as before."""
    path = str(tmp_path)
    config = _config(checkpoint_interval_ms=600_000, consumequeue_flush_interval_ms=3_600_000)
    store = MessageStore.open(path, config)
    _write(store, [(0, q, 50, q % 2 == 0, False) for q in range(60)])
    store.close()  # the checkpoint now covers these
    store = MessageStore.open(path, config)
    _write(store, [(0, q % 60, 50, q % 3 == 0, q % 5 == 0) for q in range(180)])
    before = _snapshot(store)
    assert store.wait_for("orders", 59, store.max_offset("orders", 59) - 1, 1_000)
    store._crash()
    puts: list[tuple[int, ...]] = []
    original = ConsumeQueue.put

    def counted(queue: ConsumeQueue, *unit: int) -> None:
        puts.append(unit)
        original(queue, *unit)

    monkeypatch.setattr(ConsumeQueue, "put", counted)
    with MessageStore.open(path, _config()) as store:
        assert store.recovered_from_crash
        assert store.redispatched_at_open >= 180
        _assert_redispatched_in_scan(store, scan)
        assert puts == []
        assert _snapshot(store) == before
        _assert_index_complete(store)


def test_redispatch_skips_kept_units_and_repairs_the_rest(scan, tmp_path, monkeypatch):
    """Few queues with many units each (put in batches, so a run holds more than
    SMALL_GROUP_UNITS of a queue): after the crash the re-dispatch finds the kept
    units in place (``ConsumeQueue.units_in_place``) and puts no batch for a queue
    that kept them all; a queue that lost a unit (a hole) or a timestamp, or whose
    block maximum is low, gets ``put_batch`` from there, which repairs it."""
    path = str(tmp_path)
    config = _config(checkpoint_interval_ms=600_000, consumequeue_flush_interval_ms=3_600_000)
    store = MessageStore.open(path, config)
    for queue_id in range(4):  # past consumequeue_shared_units_max: own files from here
        store.put_batch_arrays("orders", queue_id, [b"a" * 40] * 20)
    store.close()  # the checkpoint now covers these
    store = MessageStore.open(path, config)
    for number in range(24):
        store.put_batch_arrays("orders", number % 4, [bytes([number]) * 60] * 30,
                               tags=f"t{number % 2}" if number % 3 else None)  # fmt: skip
    for queue_id in range(4):
        last = store.max_offset("orders", queue_id) - 1
        assert store.wait_for("orders", queue_id, last, 1_000)  # dispatched
    before = _snapshot(store)
    damaged = {1: 77, 2: 100, 3: 131}  # queue id -> offset: a hole, a stale time, a block
    queues = {q: store.consume_queues.queue("orders", q) for q in damaged}
    upf = 64  # _config's consumequeue_units_per_file
    queues[1]._files.units(77 // upf).sizes[77 % upf] = 0
    queues[2]._files.times(100 // upf).times[100 % upf] -= 1
    times = queues[3]._files.times(131 // upf)
    times.block_max[(131 % upf) // times.interval_units] = 0
    store._crash()
    firsts: dict[int, list[int]] = {}
    original = ConsumeQueue.put_batch

    def counted(queue: ConsumeQueue, first: int, *columns: Any) -> None:
        firsts.setdefault(queue.queue_id, []).append(first)
        original(queue, first, *columns)

    monkeypatch.setattr(ConsumeQueue, "put_batch", counted)
    with MessageStore.open(path, _config()) as store:
        assert store.recovered_from_crash
        _assert_redispatched_in_scan(store, scan)
        assert 0 not in firsts  # kept every unit: no batch
        for queue_id, offset in damaged.items():
            assert firsts[queue_id], queue_id
            assert min(firsts[queue_id]) <= offset
            # the units before the run that holds the damage are skipped, not put
            assert min(firsts[queue_id]) > 20
        assert _snapshot(store) == before
        times = store.consume_queues.queue("orders", 3)._files.times(131 // upf)
        assert times.block_max[(131 % upf) // times.interval_units] > 0


def test_torn_tail_then_redispatch(scan, tmp_path):
    """The last record torn in half by the crash: it is cut from the log, its unit
    from its queue, and every record before it is dispatched."""
    path = str(tmp_path)
    config = _config(checkpoint_interval_ms=600_000, consumequeue_flush_interval_ms=3_600_000)
    store = MessageStore.open(path, config)
    store.close()
    store = MessageStore.open(path, config)
    results = [store.put("orders", i % 3, b"t" * 500, keys=[f"k{i}"]) for i in range(300)]
    store._crash()
    last = results[-1]
    mapped_path = os.path.join(
        path, "commitlog", f"{last.physical_offset // FILE_BYTES * FILE_BYTES:020d}"
    )
    with open(mapped_path, "r+b") as handle:  # zero the second half of the last record
        handle.seek(last.physical_offset % FILE_BYTES + 300)
        handle.write(b"\0" * 250)
    with MessageStore.open(path, _config()) as store:
        _assert_redispatched_in_scan(store, scan)
        assert store.commitlog.write_position == last.physical_offset
        assert store.max_offset("orders", 299 % 3) == last.queue_offset
        assert sum(store.max_offset("orders", q) for q in range(3)) == 299
        assert _snapshot(store) == _expected(store, create_time=True)
        _assert_index_complete(store)
        again = store.put("orders", 299 % 3, b"again")
        assert (again.physical_offset, again.queue_offset) == (last.physical_offset,
                                                               last.queue_offset)  # fmt: skip


_WRITER = textwrap.dedent(
    """
    import sys
    from mqstore import MessageStore, StoreConfig
    path, size = sys.argv[1], int(sys.argv[2])
    config = StoreConfig(
        commitlog_file_size_bytes=64 * 1024, prewarm=False, consumequeue_units_per_file=64,
        consumequeue_shared_units_max=16, checkpoint_interval_ms=600_000,
        consumequeue_flush_interval_ms=3_600_000,
    )
    MessageStore.open(path, config).close()  # a checkpoint before the run
    store = MessageStore.open(path, config)
    number = 0
    while True:
        bodies = [bytes([number % 251]) * size] * 8
        result = store.put_batch_arrays("t", number % 5, bodies)
        print(number % 5, result.first_queue_offset + len(result), flush=True)
        number += 1
    """
)


@pytest.mark.parametrize("size", [100, 1024])
def test_sigkill_mid_write_keeps_every_acknowledged_message(scan, tmp_path, size):
    """A child writes 8-message batches to 5 queues with the checkpoint frozen and is
    SIGKILLed mid-write: reopening finds every acknowledged message, its units equal
    the log, and the whole run was re-dispatched from the checkpoint."""
    path = str(tmp_path / "store")
    child = subprocess.Popen([sys.executable, "-c", _WRITER, path, str(size)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None
    acked: dict[int, int] = {}
    for _ in range(150):  # about 1 MiB at 1 KiB: a few dozen CommitLog files
        queue_id, next_offset = map(int, child.stdout.readline().split())
        acked[queue_id] = next_offset
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    checkpoint = CheckpointFile(path, read_only=True).load()
    assert checkpoint is not None
    with MessageStore.open(path, _config()) as store:
        assert store.recovered_from_crash
        _assert_redispatched_in_scan(store, scan)
        assert store.commitlog.write_position > checkpoint.dispatched_position + 100 * size
        for queue_id, next_offset in acked.items():
            assert store.max_offset("t", queue_id) >= next_offset
            batch = store.get("t", queue_id, next_offset - 1, 1)
            assert len(batch) == 1 and len(bytes(batch[0].body)) == size
        assert _snapshot(store) == _expected(store, create_time=True)


def test_groups_keep_run_order_per_key():
    keys = np.array([5, 5, 2, 2, 5, 9, 2, 2, 9], dtype=np.int64)
    order, groups = log_scan._groups(keys)
    assert order is not None
    assert [(key, order[lo:hi].tolist()) for key, lo, hi in groups] == [
        (5, [0, 1, 4]), (2, [2, 3, 6, 7]), (9, [5, 8]),
    ]  # fmt: skip
    assert log_scan._groups(np.array([3, 3, 3], dtype=np.int64)) == (None, [(3, 0, 3)])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=30))
def test_groups_match_a_dict_of_lists(stretches: list[tuple[int, int]]) -> None:
    """The layout from stretches (a repeat, no sort of the rows) holds each key's rows in
    run order, the keys in order of first appearance, as a dict of lists does."""
    keys = np.array([key for key, length in stretches for _ in range(length)], dtype=np.int64)
    model: dict[int, list[int]] = {}
    for row, key in enumerate(keys.tolist()):
        model.setdefault(key, []).append(row)
    for row_numbers in (None, np.arange(len(keys) + 7, dtype=np.int64)):
        order, groups = log_scan._groups(keys, row_numbers)
        laid = np.arange(len(keys)) if order is None else order
        assert [(key, laid[lo:hi].tolist()) for key, lo, hi in groups] == list(model.items())


@pytest.mark.parametrize("lose", [False, True], ids=["kept", "rebuilt"])
def test_many_small_queues_redispatch_without_an_object_each(scan, tmp_path, lose):
    """Issue 15: 400 queues of a few units each, re-dispatched after a crash (units
    kept, or every derived file lost): the scan collects them as columns and writes
    them in bulk, so no ConsumeQueue object is built for a queue that lives in its
    topic's shared log, and every queue reads back what the log says."""
    path = str(tmp_path)
    config = _config(checkpoint_interval_ms=600_000, consumequeue_flush_interval_ms=3_600_000)
    store = MessageStore.open(path, config)
    store.put("orders", 0, b"pre")
    store.close()  # the checkpoint now covers this
    store = MessageStore.open(path, config)
    store.create_topic("audit", 400)
    _write(store, [(1, q % 400, 30, q % 7 == 0, q % 11 == 0) for q in range(1200)])
    assert store.wait_for("audit", 399, 2, 1_000)
    store._crash()
    if lose:
        _rebuild(path)
    with MessageStore.open(path, _config()) as store:
        assert store.recovered_from_crash
        if not lose:  # (a rebuild from the log's start is the dispatcher's)
            _assert_redispatched_in_scan(store, scan)
        built = [key for key in store.consume_queues._queues if key[0] == "audit"]
        assert built == []  # 3 units each: all in the shared log, no object
        assert _snapshot(store) == _expected(store, create_time=True)
        _assert_index_complete(store)


def test_a_hot_queue_among_cold_ones_keeps_each_queue_in_order(scan, tmp_path):
    """Runs that hold more than BATCH_GROUP_UNITS units of one queue (put_batch) among a
    few each of 63 others, some tagged: the big queue's units go by ``put_batch``, the
    others' rows are picked out of the run and collected, and a rebuild gives what the
    log says. (The order of a queue small in one run and big in the next: the test
    after this one.)"""
    path = str(tmp_path)
    store = MessageStore.open(path, _config(consumequeue_units_per_file=1024))
    store.create_topic("audit", 64)
    for number in range(6):
        for queue_id in range(1, 64):
            store.put("audit", queue_id, bytes([number]) * 20, tag="t" if queue_id % 3 else None)
        store.put_batch_arrays("audit", 0, [bytes([number]) * 20] * 300)
        store.put("audit", number + 1, b"after the batch")
    store.close()
    _rebuild(path)
    with MessageStore.open(path, _config(consumequeue_units_per_file=1024)) as store:
        assert store.max_offset("audit", 0) == 1800
        assert _snapshot(store) == _expected(store, create_time=True)


def test_a_queue_small_in_one_run_and_big_in_the_next(scan, tmp_path):
    """Queue 0 gets large single messages that end a CommitLog file (a small group of
    that run, kept pending), then a batch of 300 in the next file (a big group): what
    was pending is written before the batch, or the queue's units would be out of
    order. (From the review of stop 31: without the write before ``_write_big`` the
    rebuild fails with OffsetOutOfRangeError.)"""
    path = str(tmp_path)
    store = MessageStore.open(path, _config(consumequeue_units_per_file=1024))
    store.create_topic("audit", 8)
    for _ in range(3):
        for index in range(30):
            store.put("audit", 0, b"s" * 1500)
            store.put("audit", 1 + index % 5, b"c" * 20)
        store.put_batch_arrays("audit", 0, [b"b" * 20] * 300)
    store.close()
    _rebuild(path)
    with MessageStore.open(path, _config(consumequeue_units_per_file=1024)) as store:
        assert store.max_offset("audit", 0) == 3 * 330
        assert _snapshot(store) == _expected(store, create_time=True)


def test_a_rebuild_keeps_young_queues_in_the_shared_log(tmp_path):
    """1,000 queues of one unit each, then a young queue's batch of 300 later in the
    same run: the rebuild writes the small ones to the shared log before the batch
    (which starts its queue there too), so only the hot queue gets own files, as live
    dispatch leaves them. (Review of stop 31: every one of the 1,000 got own files.)"""
    path = str(tmp_path)
    config = StoreConfig(prewarm=False)
    store = MessageStore.open(path, config)
    store.create_topic("t", 1001)
    for queue_id in range(1, 1001):
        store.put("t", queue_id, b"x" * 20)
    store.put_batch_arrays("t", 0, [b"b" * 20] * 300)
    store.close()
    live = sorted(name for name in os.listdir(os.path.join(path, "consumequeue", "t"))
                  if name.isdigit())  # fmt: skip
    _rebuild(path)
    with MessageStore.open(path, config) as store:
        assert store.max_offset("t", 5) == 1 and store.max_offset("t", 0) == 300
        assert [bytes(m.body) for m in store.get("t", 1000, 0, 2)] == [b"x" * 20]
    rebuilt = sorted(name for name in os.listdir(os.path.join(path, "consumequeue", "t"))
                     if name.isdigit())  # fmt: skip
    assert rebuilt == live == ["0"]


def test_a_failed_batch_write_in_the_redispatch_fails_the_open_and_loses_nothing(
    tmp_path, monkeypatch
):
    """After a crash that lost a queue's units, the open's re-dispatch writes them by
    ``put_batch`` (more than BATCH_GROUP_UNITS units in a run), and that write fails
    (a full disk): the open raises it, and the next open reads what the log says (the
    re-dispatch starts from the checkpoint again; every write is idempotent)."""
    monkeypatch.setattr(MessageStore, "_scan_dispatch", lambda store, checkpoint: None)
    path = str(tmp_path)
    config = _config(consumequeue_units_per_file=1024, checkpoint_interval_ms=600_000,
                     consumequeue_flush_interval_ms=3_600_000)  # fmt: skip
    store = MessageStore.open(path, config)
    store.create_topic("audit", 8)
    store.close()  # the checkpoint now covers the topic's creation
    store = MessageStore.open(path, config)
    for number in range(3):
        for index in range(30):
            store.put("audit", 1 + index % 5, bytes([number]) * 20)
        store.put_batch_arrays("audit", 0, [bytes([number]) * 20] * 300)
    assert store.wait_for("audit", 0, 899, 5_000)
    store.consume_queues.queue("audit", 0).truncate(0)
    store._crash()
    original = ConsumeQueue.put_batch
    calls: list[int] = []

    def failing_once(queue: ConsumeQueue, *args: Any) -> None:
        calls.append(queue.queue_id)
        if len(calls) == 1:
            raise OSError("injected")
        original(queue, *args)

    monkeypatch.setattr(ConsumeQueue, "put_batch", failing_once)
    with pytest.raises(OSError, match="injected"):
        MessageStore.open(path, _config(consumequeue_units_per_file=1024))
    assert calls[0] == 0
    with MessageStore.open(path, _config(consumequeue_units_per_file=1024)) as store:
        assert store.max_offset("audit", 0) == 900
        assert _snapshot(store) == _expected(store, create_time=True)
