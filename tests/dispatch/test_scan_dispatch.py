"""The re-dispatch during the recovery scan (dispatch/scan_dispatch.py): it takes only
verified records, stops at a tear, leaves nothing of an append group cut short, hands
over to the dispatcher where it stops, and starts over in the dispatcher when a write
fails. Each test runs with the C scan and with the pure-Python twins, in runs of 16
records (so a scan is many runs, and batches straddle them)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np
import pytest

from mqstore import MessageStore, StoreConfig
from mqstore.commitlog import recovery
from mqstore.commitlog.batch import Trailer
from mqstore.commitlog.checkpoint import CheckpointFile
from mqstore.commitlog.header_scan import dispatch_columns_py
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.record import scan_records_py
from mqstore.consumequeue import reput_check
from mqstore.consumequeue.consume_queue import ConsumeQueue
from mqstore.consumequeue.reput_check import units_in_place_py
from mqstore.consumequeue.tail_writer import TailWriter
from mqstore.dispatch import log_scan, scan_dispatch
from mqstore.indexfile.index_service import IndexService

FILE_BYTES = 64 * 1024  # small CommitLog files: the scan crosses blank records
QUEUES = 3


@pytest.fixture(params=["c", "python"])
def twin(request, monkeypatch) -> Iterator[str]:
    if request.param == "c" and NATIVE is None:
        pytest.skip("the C module is not built")
    monkeypatch.setattr(recovery, "SCAN_ROWS", 16)
    if request.param == "python":
        monkeypatch.setattr(recovery, "scan_records", scan_records_py)
        monkeypatch.setattr(log_scan, "dispatch_columns", dispatch_columns_py)
        monkeypatch.setattr(reput_check, "units_in_place", units_in_place_py)
    yield request.param


def _config(**overrides: Any) -> StoreConfig:
    return StoreConfig(**{
        "commitlog_file_size_bytes": FILE_BYTES, "prewarm": False,
        "consumequeue_units_per_file": 64, "consumequeue_shared_units_max": 16,
        "index_slot_count": 64, "index_entry_count": 4096, **overrides,
    })  # fmt: skip


_FROZEN = {"checkpoint_interval_ms": 600_000, "consumequeue_flush_interval_ms": 3_600_000}


#: Every batch is an append group: its 5 records, then a trailer record in "state".
_TRAILER = Trailer("state", 0, lambda first_queue_offset: (b"s%d" % first_queue_offset, None))


def _crashed_store(path: str, batches: int, lose_units: bool, **overrides: Any
                   ) -> list[list[Any]]:  # fmt: skip
    """A store whose checkpoint covers a preamble, then ``batches`` keyed batches of
    5 round the queues of "t", each with a trailer (one append group), then a crash
    (SIGKILL-like: the page cache keeps everything); ``lose_units``: the queues' units
    past the preamble are dropped first, so the re-dispatch must write them;
    ``overrides``: of the config. Returns the batches' results (the trailers' are not
    among them)."""
    store = MessageStore.open(path, _config(**_FROZEN, **overrides))
    store.put_batch("t", 0, [b"pre"] * 3, keys=[[f"pre{i}"] for i in range(3)])
    store.put("state", 0, b"pre")
    store.close()
    store = MessageStore.open(path, _config(**_FROZEN, **overrides))
    results = []
    for number in range(batches):
        keys = [[f"k{number}-{i}", "common"] for i in range(5)]
        bodies = [bytes([number % 251]) * (200 + number % 7)] * 5
        results.append(store.put_batch("t", number % QUEUES, bodies, keys=keys,
                                       tags=f"tag{number % 2}", trailer=_TRAILER))  # fmt: skip
    for queue_id in range(QUEUES):  # every unit dispatched (the last batch's of each queue)
        last = max(batch[-1].queue_offset for batch in results[queue_id::QUEUES])
        assert store.wait_for("t", queue_id, last, 5_000)
    if lose_units:
        store.consume_queues.queue("t", 0).truncate(3)
        for queue_id in range(1, QUEUES):
            store.consume_queues.queue("t", queue_id).truncate(0)
    store._crash()
    return results


def _file_and_offset(path: str, physical: int) -> tuple[str, int]:
    start = physical - physical % FILE_BYTES
    return os.path.join(path, "commitlog", f"{start:020d}"), physical - start


def _flip(path: str, physical: int) -> None:
    name, in_file = _file_and_offset(path, physical)
    with open(name, "r+b") as handle:
        handle.seek(in_file)
        byte = handle.read(1)
        handle.seek(in_file)
        handle.write(bytes([byte[0] ^ 0x10]))


def _assert_agrees_with_log(store: MessageStore) -> None:
    """Every queue's units are the log's records, and every key finds its record."""
    seen: dict[tuple[str, int], int] = {}
    for record in store.commitlog.iter_records(store.commitlog.min_position):
        queue = store.consume_queues.queue(record.topic, record.queue_id)
        unit = [int(v) for v in queue.get(record.queue_offset).item()]
        assert unit[:2] == [record.physical_offset, record.size]
        seen[record.topic, record.queue_id] = record.queue_offset + 1
        for key in record.keys:
            if key != "common":  # (more hits than a query returns)
                hits = store.query_by_key(record.topic, key, max_results=64)
                assert [m.physical_offset for m in hits] == [record.physical_offset]
    assert {name: store.max_offset(*name) for name in seen} == seen


def _watch_writes(monkeypatch) -> list[int]:
    """The physical offsets of every unit the open writes (put, put_batch, TailWriter),
    each once: a put that TailWriter.write makes for a unit it was handed (a new
    file, a re-put) is that unit's, counted by the write."""
    written: list[int] = []
    inside = [0]  # TailWriter.write calls running
    put, put_batch, write = ConsumeQueue.put, ConsumeQueue.put_batch, TailWriter.write

    def watched_put(queue: ConsumeQueue, offset: int, physical: int, *rest: Any) -> None:
        if not inside[0]:
            written.append(physical)
        put(queue, offset, physical, *rest)

    def watched_batch(queue: ConsumeQueue, first: int, physicals: Any, *rest: Any) -> None:
        if not inside[0]:
            written.extend(np.asarray(physicals).tolist())
        put_batch(queue, first, physicals, *rest)

    def watched_write(tail: TailWriter, slots: Any, offsets: Any, physicals: Any, *rest: Any
                      ) -> Any:  # fmt: skip
        written.extend(np.asarray(physicals).tolist())
        inside[0] += 1
        try:
            return write(tail, slots, offsets, physicals, *rest)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(ConsumeQueue, "put", watched_put)
    monkeypatch.setattr(ConsumeQueue, "put_batch", watched_batch)
    monkeypatch.setattr(TailWriter, "write", watched_write)
    return written


def test_a_crash_is_redispatched_during_the_scan(twin, tmp_path, monkeypatch):
    """Lost units come back and kept keys are indexed again, all during the scan:
    the dispatcher has nothing left, and the checkpoint's claim stands."""
    path = str(tmp_path)
    results = _crashed_store(path, 60, lose_units=True)
    claim = CheckpointFile(path, read_only=True).load()
    assert claim is not None
    written = _watch_writes(monkeypatch)
    with MessageStore.open(path, _config()) as store:
        assert store.recovered_from_crash
        assert store.redispatched_at_open == 360  # (60 trailers)
        assert store._dispatcher is not None and store._dispatcher.dispatched_records == 0
        assert store._dispatcher.position == store.commitlog.write_position
        assert store._dispatcher.dispatched_ts_ms == results[-1][-1].store_timestamp_ms
        # every lost unit once, and no trailer's: "state" kept its units (own files),
        # which the re-puts' check confirms in place (one C call per queue file)
        assert sorted(written) == sorted(r.physical_offset for batch in results for r in batch)
        _assert_agrees_with_log(store)
    after = CheckpointFile(path, read_only=True).load()
    assert after is not None and after.dispatched_position >= claim.dispatched_position


def test_a_tear_mid_log_stops_the_dispatch_at_the_tear(twin, tmp_path, monkeypatch):
    """A flipped bit in a record in the middle of the log (and of a scan run, and of
    an append group): the log ends at its group's start, no unit is written for a
    record at or past it, and nothing past it is left in a queue or the index."""
    path = str(tmp_path)
    results = _crashed_store(path, 60, lose_units=True)
    torn = results[31][2]  # the third record of batch 31: its group starts two before
    group_start = results[31][0].physical_offset
    _flip(path, torn.physical_offset + 100)  # in the body: the header still parses
    written = _watch_writes(monkeypatch)
    with MessageStore.open(path, _config()) as store:
        assert store.commitlog.write_position == group_start
        # (the group's records before the tear were dispatched, then cut with it)
        assert written and max(written) < torn.physical_offset
        assert store.max_offset("t", 31 % QUEUES) == results[31][0].queue_offset
        assert store.query_by_key("t", "k40-0", max_results=4) == []
        assert store.query_by_key("t", "k31-0", max_results=4) == []
        _assert_agrees_with_log(store)
        again = store.put("t", 31 % QUEUES, b"again")
        assert (again.physical_offset, again.queue_offset) == (
            group_start,
            results[31][0].queue_offset,
        )


def test_a_group_cut_short_at_the_tail_leaves_nothing(twin, tmp_path, monkeypatch):
    """The last append group lost its trailer: its batch's records were verified and
    handed to the re-dispatch during the scan, but the group is not part of the log.
    No unit is ever written for them, not even for the moment between the scan and
    the cut at the recovered end: a read-only follower open then saw queue offsets
    that never existed (review of the merge). Groups that straddle runs (batches of 6
    in runs of 16) are held and taken whole (every other test here checks that)."""
    path = str(tmp_path)
    results = _crashed_store(path, 20, lose_units=True)
    last = results[-1]
    trailer_at = last[-1].physical_offset + last[-1].size
    name, in_file = _file_and_offset(path, trailer_at)
    with open(name, "r+b") as handle:  # the group's last record: gone
        handle.seek(in_file)
        handle.write(b"\0" * 64)
    written = _watch_writes(monkeypatch)
    with MessageStore.open(path, _config()) as store:
        assert store.commitlog.write_position == last[0].physical_offset
        assert not {r.physical_offset for r in last} & set(written)  # never written
        assert store.max_offset("t", 19 % QUEUES) == last[0].queue_offset
        assert store.query_by_key("t", "k19-0", max_results=4) == []
        _assert_agrees_with_log(store)


def test_a_failed_write_leaves_the_redispatch_to_the_dispatcher(twin, tmp_path, monkeypatch,
                                                                caplog):  # fmt: skip
    """A ConsumeQueue write that fails during the scan: the open goes on, the
    dispatcher re-dispatches from the checkpoint (idempotent), and the store is whole."""
    path = str(tmp_path)
    _crashed_store(path, 60, lose_units=True)
    original = TailWriter.write
    calls = []

    def failing_once(tail: TailWriter, *args: Any) -> Any:
        calls.append(len(args[0]))
        if len(calls) == 1:
            raise OSError("injected")
        return original(tail, *args)

    # The scan's small queues go in one TailWriter call (dispatch/log_scan.py).
    monkeypatch.setattr(TailWriter, "write", failing_once)
    with caplog.at_level(logging.WARNING), MessageStore.open(path, _config()) as store:
        assert "starts over" in caplog.text
        assert store._dispatcher is not None and store._dispatcher.dispatched_records == 360
        _assert_agrees_with_log(store)


def test_kept_units_and_a_damaged_one(twin, tmp_path, monkeypatch):
    """Units the page cache kept are confirmed, not written; a damaged one (its size
    zeroed) is written again, with the rest of its chunk from it, and nothing else.

    Queue t-0 holds 3 preamble units (the checkpoint covers them), then 300 (30 batches
    of 10). The scan's runs are 16 records from the checkpoint, each a small group
    (at most BATCH_GROUP_UNITS), so the scan collects them all and writes them at its
    end as re-puts (below the queue's end): [3, 16), in the topic's shared unit log,
    are confirmed there (``confirm_shared``); the rest, in own files, go by
    ``_put_batch`` in chunks of BATCH_GROUP_UNITS from offset 16: in the damaged
    unit's chunk the units before it are confirmed and ``put_batch`` takes it and the
    rest of the chunk. Nothing is cut."""
    path = str(tmp_path)
    store = MessageStore.open(path, _config(**_FROZEN))
    preamble = store.put_batch("t", 0, [b"pre"] * 3)
    store.close()
    store = MessageStore.open(path, _config(**_FROZEN))
    results = list(preamble)
    for number in range(30):
        results += store.put_batch("t", 0, [bytes([number]) * 90] * 10)
    assert [r.queue_offset for r in results] == list(range(303))
    assert store.wait_for("t", 0, 302, 5_000)  # every unit is in place before the crash
    damaged = 200
    queue = store.consume_queues.queue("t", 0)
    first_own = queue._first_offset  # the first offset in own files
    assert first_own == 16  # ([0, 16) in the shared log: consumequeue_shared_units_max)
    queue._files.units(damaged // 64).sizes[damaged % 64] = 0
    store._crash()
    written = _watch_writes(monkeypatch)
    offset_of = {r.physical_offset: r.queue_offset for r in results}
    with MessageStore.open(path, _config()) as store:
        assert store.recovered_from_crash
        assert store.redispatched_at_open == 300  # all during the scan:
        assert store._dispatcher is not None and store._dispatcher.dispatched_records == 0
        written_offsets = [offset_of[physical] for physical in written]
        assert len(written_offsets) == len(set(written_offsets))  # each at most once
        chunk = log_scan.BATCH_GROUP_UNITS
        chunk_end = first_own + chunk * ((damaged - first_own) // chunk + 1)
        assert chunk_end == 272
        assert set(written_offsets) == set(range(damaged, chunk_end))
        # kept: [3, 200) and [272, 303) never written; repaired: the damaged unit
        units = store.consume_queues.queue("t", 0)
        assert store.max_offset("t", 0) == 303  # nothing cut
        assert store.commitlog.write_position == results[-1].physical_offset + results[-1].size
        for result in results:
            unit = [int(v) for v in units.get(result.queue_offset).item()]
            assert unit[:2] == [result.physical_offset, result.size], result.queue_offset
        bodies = [b"pre"] * 3 + [bytes([n]) * 90 for n in range(30) for _ in range(10)]
        read = [m for start in range(0, 303, 32) for m in store.get("t", 0, start, 32)]
        assert [m.queue_offset for m in read] == list(range(303))
        assert [m.physical_offset for m in read] == [r.physical_offset for r in results]
        assert [bytes(m.body) for m in read] == bodies
        _assert_agrees_with_log(store)


def test_a_scan_from_below_the_dispatched_position(twin, tmp_path):
    """The checkpoint's flushed position lags its dispatched one (async flush): the
    scan starts at the flushed position, the re-dispatch during it at the dispatched
    one, mid-run, so the records between are folded but not dispatched again (their
    keys keep one index entry each)."""
    path = str(tmp_path)
    _crashed_store(path, 30, lose_units=True)
    checkpoints = CheckpointFile(path)
    claim = checkpoints.load()
    assert claim is not None and claim.dispatched_position > 0
    checkpoints.store(attrs.evolve(claim, flushed_position=0))  # the log's first record
    checkpoints.close()
    with MessageStore.open(path, _config()) as store:
        assert store.redispatched_at_open == 180  # not the preamble's 4
        assert store._dispatcher is not None and store._dispatcher.dispatched_records == 0
        _assert_agrees_with_log(store)  # (one hit per key: no entry made twice)


def _index_hits(store: MessageStore, key: str) -> list[int]:
    """The physical offsets the index itself holds for ``key`` of "t", each entry once
    (``query_by_key`` would verify each against its record: this counts entries)."""
    return store.index.query("t", key, 0, 2**63 - 1, 1_000, lambda physical: True)


def test_keyed_records_put_mid_scan_are_indexed_once(twin, tmp_path, monkeypatch):
    """The keyed records' index entries go to the index whenever KEYED_MAX are
    collected, in the middle of the scan (a bound read at each run), and across index
    files (64 entries each): every key is found exactly once at its record, during the
    open, after a clean reopen, and so is each record under the key all share."""
    monkeypatch.setattr(scan_dispatch, "KEYED_MAX", 7)  # a run of 16 holds 10-15 keyed
    path = str(tmp_path)
    small_index = {"index_entry_count": 64}  # 63 entries a file: ~10 files of 600 entries
    results = _crashed_store(path, 60, lose_units=True, **small_index)
    keyed = [r for batch in results for r in batch]
    assert len(keyed) == 300
    batches: list[list[int]] = []
    put_batch = IndexService.put_batch

    def watched(index: IndexService, topics: Any, keys: Any, physicals: Any, *rest: Any
                ) -> None:  # fmt: skip
        batches.append(list(physicals))
        put_batch(index, topics, keys, physicals, *rest)

    monkeypatch.setattr(IndexService, "put_batch", watched)
    with MessageStore.open(path, _config(**small_index)) as store:
        assert store.redispatched_at_open == 360  # all during the scan
        assert store._dispatcher is not None and store._dispatcher.dispatched_records == 0
        # put mid-scan: many batches, each (but the last) at the bound, none repeated
        assert len(batches) > 10
        assert all(len(batch) >= 7 for batch in batches[:-1])
        put = [physical for batch in batches for physical in batch]
        assert put == [r.physical_offset for r in keyed]  # each once, in log order
        assert len(store.index.file_names) > 5
        _assert_keys_found_once(store, results)
    batches.clear()
    with MessageStore.open(path, _config(**small_index)) as store:  # clean: nothing put
        assert not store.recovered_from_crash and batches == []
        _assert_keys_found_once(store, results)


def _assert_keys_found_once(store: MessageStore, results: list[list[Any]]) -> None:
    for number, batch in enumerate(results):
        for i, result in enumerate(batch):
            assert _index_hits(store, f"k{number}-{i}") == [result.physical_offset]
            hits = store.query_by_key("t", f"k{number}-{i}", max_results=4)
            assert [(m.queue_id, m.queue_offset) for m in hits] == [
                (number % QUEUES, result.queue_offset)
            ]
    everyone = sorted(r.physical_offset for batch in results for r in batch)
    assert sorted(_index_hits(store, "common")) == everyone


# ------------------------------------------------------- a crash during the recovery

#: A writer reopening the crashed store in the folder argv[1] as the tests here do
#: (``twin`` argv[2]) that SIGKILLs itself at argv[3]: "run:N", right after the Nth
#: run of the scan it took, or "finish", after ``ScanDispatch.finish``. It prints
#: where the re-dispatch during the scan stood and the queues' ends, then dies. The
#: kill points are test code wrapping ScanDispatch, not hooks in the store: the point
#: is exact, so every run kills mid-recovery. Collected units are written every 20
#: rows (PENDING_ROWS_MAX) and index entries every 7 (KEYED_MAX), so a kill mid-scan
#: leaves both half re-dispatched.
RECOVERING_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from mqstore import MessageStore
    from mqstore.commitlog import recovery
    from mqstore.commitlog.header_scan import dispatch_columns_py
    from mqstore.commitlog.record import scan_records_py
    from mqstore.consumequeue import reput_check
    from mqstore.dispatch import log_scan, scan_dispatch
    from tests.dispatch.test_scan_dispatch import _config

    path, twin, kill_at = sys.argv[1:]
    recovery.SCAN_ROWS = 16
    if twin == "python":
        recovery.scan_records = scan_records_py
        log_scan.dispatch_columns = dispatch_columns_py
        reput_check.units_in_place = reput_check.units_in_place_py
    log_scan.PENDING_ROWS_MAX = 20
    scan_dispatch.KEYED_MAX = 7
    ScanDispatch = scan_dispatch.ScanDispatch
    opening = []  # the store being opened
    make_hook = MessageStore._scan_dispatch

    def keep_store(store, checkpoint):
        opening.append(store)
        return make_hook(store, checkpoint)

    def die(hook):
        queues = {}
        for queue_id in range(3):
            queues[queue_id] = opening[0].consume_queues.queue("t", queue_id).max_offset
        print(json.dumps({"from": hook.from_position, "position": hook.position,
                          "records": hook.records, "queues": queues}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    runs_taken = 0
    call, finish = ScanDispatch.__call__, ScanDispatch.finish

    def killing_call(hook, *args):
        global runs_taken
        before = hook.position
        call(hook, *args)
        runs_taken += hook.position != before
        if kill_at.startswith("run:") and runs_taken == int(kill_at[4:]):
            die(hook)

    def killing_finish(hook):
        finish(hook)
        if kill_at == "finish":
            die(hook)

    MessageStore._scan_dispatch = keep_store
    ScanDispatch.__call__ = killing_call
    ScanDispatch.finish = killing_finish
    MessageStore.open(path, _config())
    print("no kill", flush=True)
    """
)


def _reopen_killed(path: str, twin: str, kill_at: str) -> dict[str, Any]:
    """Reopen the crashed store in a child process SIGKILLed at ``kill_at`` during
    its recovery (``RECOVERING_CHILD``); returns where its re-dispatch stood."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # (cwd: "-c" imports tests.dispatch from there)
    child = subprocess.run(
        [sys.executable, "-c", RECOVERING_CHILD, path, twin, kill_at],
        cwd=root, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, (child.stdout, child.stderr[-3000:])
    stood: dict[str, Any] = json.loads(child.stdout.splitlines()[-1])
    return stood


@pytest.mark.parametrize("kill_at", [["run:2"], ["run:18"], ["finish"], ["run:18", "run:4"]])
def test_a_kill_during_the_recovery_loses_and_repeats_nothing(twin, tmp_path, kill_at):
    """A writer SIGKILLed while it re-dispatches during the recovery scan of a crashed
    store (early, late, after the last run: once or twice): the next open recovers
    every acknowledged message at its queue offset, each key indexed once."""
    path = str(tmp_path)
    results = _crashed_store(path, 60, lose_units=True)
    ends = {q: max(b[-1].queue_offset for b in results[q::QUEUES]) + 1 for q in range(QUEUES)}
    for point in kill_at:
        stood = _reopen_killed(path, twin, point)
        assert stood["from"] < stood["position"]  # it had re-dispatched some records
        queues = {int(q): end for q, end in stood["queues"].items()}
        if point == "finish":
            assert stood["records"] == 360 and queues == ends  # all of it, then killed
        else:  # killed in the middle: some units and keys are back, not all
            assert 0 < stood["records"] < 360
            assert any(0 < queues[q] < ends[q] for q in range(1, QUEUES)), (queues, ends)
    with MessageStore.open(path, _config()) as store:
        assert store.recovered_from_crash
        assert {q: store.max_offset("t", q) for q in range(QUEUES)} == ends
        for queue_id in range(QUEUES):
            acked = [r for batch in results[queue_id::QUEUES] for r in batch]
            read = [m for at in range(0, ends[queue_id], 32)
                    for m in store.get("t", queue_id, at, 32)]  # fmt: skip
            assert [m.queue_offset for m in read] == list(range(ends[queue_id]))
            preamble = 3 if queue_id == 0 else 0
            assert [bytes(m.body) for m in read[:preamble]] == [b"pre"] * preamble
            assert [m.physical_offset for m in read[preamble:]] == [
                r.physical_offset for r in acked
            ]
        for number, batch in enumerate(results):
            body = bytes([number % 251]) * (200 + number % 7)
            messages = store.get("t", number % QUEUES, batch[0].queue_offset, 5)
            assert [bytes(m.body) for m in messages] == [body] * 5
        _assert_keys_found_once(store, results)
        _assert_agrees_with_log(store)
