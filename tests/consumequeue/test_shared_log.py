"""SharedUnitLog: appends, reads, truncations, retention and reloads against a model,
and power-cut recovery from crash states built directly on disk."""

from __future__ import annotations

import gc
import os
import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import CorruptDataError, DiskFullError
from mqstore.commitlog.native import NATIVE
from mqstore.consumequeue import shared_log, shared_published
from mqstore.consumequeue.format import (
    SHARED_RECORD,
    SHARED_RECORD_SIZE_BYTES,
    TEMP_SUFFIX,
    UNIT,
)
from mqstore.consumequeue.shared_log import SharedRun, SharedUnitLog

RECORDS_PER_FILE = 5  # small: appends, cuts and retention cross file boundaries


def _name(file_index: int) -> str:
    return f"{file_index * RECORDS_PER_FILE * SHARED_RECORD_SIZE_BYTES:020d}"


class Model:
    """The log as lists: every unit ever appended, by queue, and each queue's min."""

    def __init__(self) -> None:
        self.units: dict[int, list[tuple[int, int, int, int, int]]] = {}  # (qoff, clog, ...)
        self.mins: dict[int, int] = {}
        self.ends: dict[int, int] = {}  # each run's next offset
        self.clogs: list[int] = []  # every record's, tombstones included (they keep theirs)
        self.positions: dict[tuple[int, int], int] = {}  # (queue, offset) -> record index
        self.file_lo = 0  # files wholly before this one were deleted by retention

    def floor(self) -> int:
        return self.file_lo * RECORDS_PER_FILE

    def retention(self, commitlog_min: int) -> None:
        """Files wholly below the first record at or above ``commitlog_min`` go, never
        the newest (record index ``len(clogs) - 1``'s)."""
        first_kept = next((i for i, c in enumerate(self.clogs) if c >= commitlog_min), None)
        first_kept = len(self.clogs) if first_kept is None else first_kept
        newest = max(len(self.clogs) - 1, 0) // RECORDS_PER_FILE
        while self.file_lo < newest and (self.file_lo + 1) * RECORDS_PER_FILE <= first_kept:
            self.file_lo += 1

    clogs_gone = False  # a cut left no record on disk: the log forgot its last offset

    @property
    def last_clog(self) -> int:
        if self.clogs_gone or not self.clogs:
            return -1
        return self.clogs[-1]

    def live(self, queue_id: int) -> list[tuple[int, int, int, int, int]]:
        """The queue's units whose records are still on disk."""
        floor = self.floor()
        units = self.units.get(queue_id, [])
        return [u for u in units if self.positions[(queue_id, u[0])] >= floor]

    def end(self, queue_id: int) -> int | None:
        """The run's next offset, None when it may start anywhere (no live record)."""
        units = self.live(queue_id)
        return units[-1][0] + 1 if units else None


def _columns(units: list[tuple[int, int, int, int, int, int]]) -> list[np.ndarray]:
    """(queue_id, queue_offset, clog, size, tag, time) rows -> append's columns."""
    array = np.array(units, dtype=np.int64).reshape(-1, 6)
    return [array[:, 0].astype(np.int32), array[:, 1], array[:, 2],
            array[:, 3].astype(np.int32), array[:, 4], array[:, 5]]  # fmt: skip


def _append(shared: SharedUnitLog, model: Model, rows: list[tuple[int, ...]]) -> int:
    columns = _columns(rows)  # type: ignore[arg-type]
    taken = shared.append(*columns)
    for queue_id, queue_offset, clog, size, tag, time_ms in rows[:taken]:
        units = model.units.setdefault(queue_id, [])
        if not model.live(queue_id):  # an empty run starts afresh
            units.clear()
            model.mins[queue_id] = queue_offset
        units.append((queue_offset, clog, size, tag, time_ms))
        model.ends[queue_id] = queue_offset + 1
        model.positions[(queue_id, queue_offset)] = len(model.clogs)
        model.clogs.append(clog)
        model.clogs_gone = False
    return taken


def _check(shared: SharedUnitLog, model: Model) -> None:
    for queue_id, units in model.units.items():
        if not units:
            assert queue_id not in shared.runs or len(shared.runs[queue_id]) == 0
            continue
        run = shared.runs[queue_id]
        first = model.mins[queue_id]
        assert (run.min_offset, run.end) == (first, model.ends[queue_id])
        live = [unit for unit in units if unit[0] >= run.first_offset]
        assert all(model.positions[(queue_id, unit[0])] >= model.floor() for unit in live)
        got = shared.units(queue_id, run.first_offset, len(live))
        assert got.dtype == UNIT
        assert got["commitlog_offset"].tolist() == [unit[1] for unit in live]
        assert got["size"].tolist() == [unit[2] for unit in live]
        assert got["tag_hash"].tolist() == [unit[3] for unit in live]
        times = shared.timestamps(queue_id, run.first_offset, len(live))
        assert times.tolist() == [unit[4] for unit in live]
    assert shared.last_commitlog_offset == model.last_clog


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"), st.lists(st.integers(0, 3), min_size=1, max_size=9), st.booleans()
        ),
        st.tuples(st.just("truncate_queue"), st.integers(0, 3), st.integers(0, 12)),
        st.tuples(st.just("truncate_beyond"), st.integers(0, 60)),
        st.tuples(st.just("retention"), st.integers(0, 60)),
        st.tuples(st.just("reopen")),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_log_matches_model(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as root:
        directory = os.path.join(root, "topic", ".shared")
        shared = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=False)
        model = Model()
        clog = 0
        try:
            for op in ops:
                if op[0] == "append":
                    rows = []
                    for queue_id in op[1]:
                        expected = model.end(queue_id)
                        nexts = [row[1] + 1 for row in rows if row[0] == queue_id]
                        offset = nexts[-1] if nexts else (expected if expected is not None else 3)
                        if op[2] and queue_id == op[1][-1]:
                            offset += 1  # a gap: the append stops there
                        clog += 1
                        rows.append((queue_id, offset, clog, 10 + clog, -clog, 1000 + clog % 7))
                    taken = _append(shared, model, rows)
                    assert taken == len(rows) or op[2]
                elif op[0] == "truncate_queue":
                    queue_id, offset = op[1], op[2]
                    shared.truncate_queue(queue_id, offset)
                    units = model.units.get(queue_id, [])
                    if queue_id in model.ends and offset < model.ends[queue_id]:
                        model.units[queue_id] = [unit for unit in units if unit[0] < offset]
                        model.ends[queue_id] = offset
                        model.mins[queue_id] = min(model.mins[queue_id], offset)
                elif op[0] == "truncate_beyond":
                    shared.truncate_beyond(op[1])
                    for queue_id, units in model.units.items():
                        cut = [unit for unit in model.live(queue_id) if unit[1] >= op[1]]
                        if cut:
                            model.ends[queue_id] = cut[0][0]
                            model.mins[queue_id] = min(model.mins[queue_id], cut[0][0])
                        model.units[queue_id] = [unit for unit in units if unit[1] < op[1]]
                    cut_at = next((i for i, c in enumerate(model.clogs) if c >= op[1]), None)
                    cut_at = max(len(model.clogs) if cut_at is None else cut_at, model.floor())
                    model.clogs = model.clogs[:cut_at]
                    if cut_at == model.floor():  # nothing left on disk before the cut
                        model.clogs_gone = True
                elif op[0] == "retention":
                    shared.correct_min_offsets(op[1])
                    model.retention(op[1])
                    for queue_id in model.units:
                        live = model.live(queue_id)
                        below = sum(1 for unit in live if unit[1] < op[1])
                        first = live[0][0] if live else model.ends[queue_id]
                        model.mins[queue_id] = max(model.mins[queue_id], first + below)
                else:
                    shared.flush()
                    shared.close()
                    shared = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=False)
                    _reload_model(model)
                _check(shared, model)
        finally:
            shared.close()


def _reload_model(model: Model) -> None:
    """After a reopen a run is what its records on disk hold: its min offset is its
    first record (retention's correction is in memory only: the store redoes it at
    open), and a queue without records (truncated by hand, or its file deleted by
    retention) has no run: the ConsumeQueue must keep its max offset (QUEUES.md)."""
    for queue_id in list(model.units):
        units = model.live(queue_id)
        model.units[queue_id] = units
        if not units:
            del model.units[queue_id]
            model.mins.pop(queue_id, None)
            model.ends.pop(queue_id, None)
            continue
        model.mins[queue_id] = units[0][0]
        model.ends[queue_id] = units[-1][0] + 1


def test_reload_keeps_units_and_order(tmp_path: Any) -> None:
    directory = str(tmp_path / "t" / ".shared")
    shared = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=False)
    rows = [(q % 3, q // 3, 100 + q, 50, 7, 9) for q in range(12)]
    assert shared.append(*_columns(rows)) == 12  # type: ignore[arg-type]
    shared.flush()
    shared.close()
    names = sorted(os.listdir(directory))
    assert names == [_name(i) for i in range(3)] + [shared_published.PUBLISHED_FILE]
    again = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=True)
    assert {q: (run.first_offset, run.end) for q, run in again.runs.items()} == {
        0: (0, 4), 1: (0, 4), 2: (0, 4),
    }  # fmt: skip
    assert again.units(1, 0, 4)["commitlog_offset"].tolist() == [101, 104, 107, 110]
    assert not again.can_append(111) and again.can_append(112)
    again.close()


@pytest.mark.parametrize("appended", [0, 1, 63, 64, 65, 300])
def test_follow_takes_what_the_writer_appended_past_its_first_look(
    tmp_path: Any, appended: int
) -> None:
    """follow() looks at FOLLOW_FIRST_RECORDS (64) records first, then goes on in
    chunks: a follower sees exactly what the writer appended, however much."""
    directory = str(tmp_path / "t" / ".shared")
    shared = SharedUnitLog.open(directory, 1000, read_only=False)
    rows = [(q % 2, q // 2, 100 + q, 50, 7, 9) for q in range(10)]
    assert shared.append(*_columns(rows)) == 10  # type: ignore[arg-type]
    follower = SharedUnitLog.open(directory, 1000, read_only=True)
    rows = [(q % 2, q // 2, 100 + q, 50, 7, 9) for q in range(10, 10 + appended)]
    if rows:
        assert shared.append(*_columns(rows)) == appended  # type: ignore[arg-type]
    follower.follow()
    ends = {q: (run.first_offset, run.end) for q, run in follower.runs.items()}
    assert ends == {q: (run.first_offset, run.end) for q, run in shared.runs.items()}
    assert ends[1] == (0, (10 + appended) // 2)
    last = 9 + appended
    assert follower.units(last % 2, last // 2, 1)["commitlog_offset"].tolist() == [100 + last]
    follower.close()
    shared.close()


def test_a_new_file_has_a_durable_size_before_its_name(tmp_path: Any, syscalls: Any) -> None:
    """Regression (power-loss harness, seed 14000064): a shared file's name became
    durable (by a later fsync of its directory) while its size did not, and after the
    cut open refused "file is 0 bytes, expected ...". The size is synced before the
    rename now."""
    directory = str(tmp_path / "t" / ".shared")
    shared = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=False)
    rows = [(q % 3, q // 3, 100 + q, 50, 7, 9) for q in range(2 * RECORDS_PER_FILE)]
    shared.append(*_columns(rows))  # type: ignore[arg-type]
    shared.close()
    for index in range(2):
        final = os.path.join(directory, _name(index))
        renamed = syscalls.events.index(("rename", final))
        assert ("fsync", final + TEMP_SUFFIX) in syscalls.events[:renamed], syscalls.events


def test_append_stops_at_out_of_order_commitlog_offset(tmp_path: Any) -> None:
    shared = SharedUnitLog.open(str(tmp_path / ".shared"), RECORDS_PER_FILE, read_only=False)
    rows = [(0, 0, 10, 1, 0, 0), (1, 0, 20, 1, 0, 0), (0, 1, 15, 1, 0, 0)]
    assert shared.append(*_columns(rows)) == 2  # type: ignore[arg-type]
    assert shared.append(*_columns([(0, 1, 20, 1, 0, 0)])) == 0  # type: ignore[arg-type]
    shared.close()


def test_wrong_file_size_is_corrupt(tmp_path: Any) -> None:
    directory = str(tmp_path / ".shared")
    shared = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=False)
    shared.append(*_columns([(0, 0, 1, 1, 0, 0)]))  # type: ignore[arg-type]
    shared.close()
    path = os.path.join(directory, _name(0))
    os.truncate(path, 7)
    with pytest.raises(CorruptDataError):
        SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=False)


# ------------------------------------------------------------------ power cut


def _crash_state(directory: str, durable: int, total: int, tear: str) -> dict[int, tuple[int, ...]]:
    """Write ``total`` records (4 queues round-robin, record i at commitlog 100 * i),
    then damage what follows the first ``durable`` as a power cut may: ``zero`` (pages
    lost), ``torn`` (a record half written, later ones whole), ``garbage`` (a stale
    commitlog offset that is below the claim but was never this record's)."""
    shared = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=False)
    rows = [(i % 4, i // 4, 100 * i, 10 + i, i, 5000 + i) for i in range(total)]
    shared.append(*_columns(rows))  # type: ignore[arg-type]
    shared.flush()
    shared.close()
    by_clog = {row[2]: row for row in rows}
    for index in range(durable, total):
        file_index, in_file = divmod(index, RECORDS_PER_FILE)
        with open(os.path.join(directory, _name(file_index)), "r+b") as handle:
            if tear == "zero":
                handle.seek(in_file * SHARED_RECORD_SIZE_BYTES)
                handle.write(bytes(SHARED_RECORD_SIZE_BYTES))
            elif tear == "torn" and index == durable:  # its second half never landed
                handle.seek(in_file * SHARED_RECORD_SIZE_BYTES + 20)
                handle.write(bytes(20))
            elif tear == "garbage" and index == total - 1:
                record = np.zeros(1, dtype=SHARED_RECORD)
                record["commitlog_offset"] = 100 * (durable - 1) + 50  # below the claim
                record["size"] = 3
                record["queue_id"] = 1
                handle.seek(in_file * SHARED_RECORD_SIZE_BYTES)
                handle.write(record.tobytes())
    return by_clog


@pytest.mark.parametrize("tear", ["zero", "torn", "garbage"])
@pytest.mark.parametrize(("durable", "total"), [(0, 6), (3, 12), (5, 11), (12, 12)])
def test_recover_tail_keeps_the_claimed_prefix(
    tmp_path: Any, tear: str, durable: int, total: int
) -> None:
    directory = str(tmp_path / "t" / ".shared")
    by_clog = _crash_state(directory, durable, total, tear)
    claim = 100 * durable  # every record below it was synced

    def verify(queue_id: int, clog: int, size: int, queue_offset: int) -> bool:
        row = by_clog.get(clog)
        return row is not None and (row[0], row[1], row[3]) == (queue_id, queue_offset, size)

    shared = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=False, lenient=True)
    shared.recover_tail(claim, 0, verify)
    assert shared.end_record == durable
    for queue_id in range(4):
        expected = [row for row in by_clog.values() if row[0] == queue_id and row[2] < claim]
        run = shared.runs.get(queue_id)
        assert (len(run) if run else 0) == len(expected)
        if expected:
            got = shared.units(queue_id, 0, len(expected))
            assert got["commitlog_offset"].tolist() == [row[2] for row in expected]
    # Re-dispatch from the claim puts the rest back, and a reload sees it all.
    rest = [row for clog, row in sorted(by_clog.items()) if clog >= claim]
    if rest:
        assert shared.append(*_columns(rest)) == len(rest)  # type: ignore[arg-type]
    shared.flush()
    shared.close()
    again = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=True)
    assert again.end_record == total
    assert sum(len(run) for run in again.runs.values()) == total
    again.close()


def _appendable_reference(log: SharedUnitLog, ids: list[int], offsets: list[int],
                          clogs: list[int]) -> int:  # fmt: skip
    """append's rule, one unit at a time (the loop the vectorized check replaced)."""
    nexts: dict[int, int] = {}
    last = log.last_commitlog_offset
    for index, (queue_id, offset, clog) in enumerate(zip(ids, offsets, clogs, strict=True)):
        if clog <= last:
            return index
        run = log.runs.get(queue_id)
        expected = nexts.get(queue_id)
        if expected is None:
            expected = offset if run is None or not run.positions else run.end
        if offset != expected:
            return index
        nexts[queue_id], last = offset + 1, clog
    return len(ids)


@settings(max_examples=150, deadline=None)
@given(
    calls=st.lists(
        st.lists(
            st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(1, 3)),
            min_size=1,
            max_size=12,
        ),
        min_size=1,
        max_size=5,
    )
)
def test_append_takes_the_prefix_the_unit_rule_allows(calls) -> None:
    """Issue 15: ``append``'s check takes exactly the prefix a unit-by-unit
    check takes: in commitlog order, each unit the next of its queue (after the unit
    before it in the call, else after its run), whatever the mix of queues."""
    with tempfile.TemporaryDirectory() as root:
        log = SharedUnitLog.open(os.path.join(root, ".shared"), RECORDS_PER_FILE, read_only=False)
        clog = 100
        try:
            for call in calls:
                ids, offsets, clogs = [], [], []
                nexts: dict[int, int] = {}
                for queue_id, offset_step, clog_step in call:
                    run = log.runs.get(queue_id)
                    base = nexts.get(queue_id, run.end if run is not None else 0)
                    ids.append(queue_id)
                    offsets.append(max(base + offset_step - 1, 0))  # a re-put, the next, gaps
                    nexts[queue_id] = offsets[-1] + 1
                    clog += clog_step - 1  # 0: not above the previous one
                    clogs.append(clog)
                expected = _appendable_reference(log, ids, offsets, clogs)
                got = log.append(
                    np.array(ids, dtype=np.int32), np.array(offsets, dtype=np.int64),
                    np.array(clogs, dtype=np.int64), np.full(len(ids), 9, dtype=np.int32),
                    np.zeros(len(ids), dtype=np.int64), np.full(len(ids), 5, dtype=np.int64),
                )  # fmt: skip
                assert got == expected
                clog = max(clog, log.last_commitlog_offset)
        finally:
            log.close()


def test_records_at_finds_each_commitlog_offset_across_files(tmp_path: Any) -> None:
    shared = SharedUnitLog.open(str(tmp_path / ".shared"), RECORDS_PER_FILE, read_only=False)
    rows = [(q % 3, q // 3, 100 + 2 * q, 50 + q, 7, 9) for q in range(12)]  # 3 files
    assert shared.append(*_columns(rows)) == 12  # type: ignore[arg-type]
    wanted = np.array([99, 100, 101, 108, 110, 111, 122, 123], dtype=np.int64)
    indexes, records = shared.records_at(wanted)
    assert indexes.tolist() == [-1, 0, -1, 4, 5, -1, 11, -1]
    found = indexes >= 0
    assert records["commitlog_offset"][found].tolist() == [100, 108, 110, 122]
    assert records["size"][found].tolist() == [50, 54, 55, 61]
    assert (records["size"][~found] == 0).all()
    assert shared.commitlog_offset_of(5) == 110
    empty, _ = shared.records_at(np.empty(0, dtype=np.int64))
    assert not len(empty)
    shared.close()


def test_point_records_are_the_records_as_tuples(tmp_path: Any) -> None:
    """The point read of a time probe gives what ``records`` gives, across files, and
    refuses a record that is not the queue's unit as ``records`` does."""
    shared = SharedUnitLog.open(str(tmp_path / ".shared"), RECORDS_PER_FILE, read_only=False)
    rows = [(q % 3, q // 3, 100 + 2 * q, 50 + q, 7, 1000 + q) for q in range(12)]  # 3 files
    assert shared.append(*_columns(rows)) == 12  # type: ignore[arg-type]
    for queue_id in range(3):
        for start in range(4):
            for count in range(5 - start):
                expected = shared.records(queue_id, start, count).tolist()
                assert shared.point_records(queue_id, start, count) == expected
    assert shared.point_records(1, 2, 1) == [(100 + 2 * 7, 57, 7, 1, 2, 1007)]
    path = os.path.join(str(tmp_path / ".shared"), _name(1))
    with open(path, "r+b") as file:  # under the open log: record 7 (queue 1 offset 2)
        file.seek(2 * SHARED_RECORD_SIZE_BYTES + 24)  # now claims offset 9
        file.write((9).to_bytes(8, "little"))
    try:
        for read in (shared.records, shared.point_records):
            with pytest.raises(CorruptDataError, match="queue 1 offset 2 is not that unit"):
                read(1, 1, 2)
    finally:
        shared.close()


def test_a_gather_across_files_takes_each_files_units_in_order(tmp_path: Any) -> None:
    """A thin queue's units spread over many files among other queues' units: a read
    of any range gets exactly its units, in order (one fancy index per file)."""
    shared = SharedUnitLog.open(str(tmp_path / ".shared"), RECORDS_PER_FILE, read_only=False)
    # Queue 0 takes every 4th record, the others the rest: 40 records in 8 files.
    rows, offsets = [], {0: 0, 1: 0}
    for record in range(40):
        queue_id = 0 if record % 4 == 0 else 1
        rows.append(
            (queue_id, offsets[queue_id], 1000 + record, 60 + record, record, 5000 + record)
        )
        offsets[queue_id] += 1
    assert shared.append(*_columns(rows)) == 40  # type: ignore[arg-type]
    mine = [row for row in rows if row[0] == 0]
    for start in range(len(mine)):
        for count in range(len(mine) - start + 1):
            got = shared.records(0, start, count)
            want = mine[start : start + count]
            assert got["queue_offset"].tolist() == [row[1] for row in want]
            assert got["commitlog_offset"].tolist() == [row[2] for row in want]
            assert got["size"].tolist() == [row[3] for row in want]
            assert got["timestamp_ms"].tolist() == [row[5] for row in want]
            assert shared.timestamps(0, start, count).tolist() == [row[5] for row in want]
    shared.close()


def test_a_run_is_one_object_for_the_garbage_collector():
    """100,000 queues hold 100,000 runs: each is one object (its positions are its
    own int64 array), which leaves the GC when made (the C module; see below)."""
    run = SharedRun(7, 3)
    run.append(9)
    assert (run.first_offset, run.min_offset, run.end, list(run.positions)) == (7, 7, 9, [3, 9])
    assert run.positions is run
    assert np.frombuffer(run, dtype=np.int64).tolist() == [3, 9]
    del run.positions[1:]
    assert run.end == 8 and len(run) == 1
    tracked = [ref for ref in gc.get_referents(run) if gc.is_tracked(ref) and ref is not SharedRun]
    assert tracked == []
    assert not SharedRun(5)  # empty: falsy, ends at its first offset
    assert SharedRun(5).end == 5


@pytest.mark.skipif(NATIVE is None, reason="mqstore.commitlog._native is not built")
def test_runs_are_out_of_the_garbage_collector(tmp_path: Any) -> None:
    """A run holds raw int64 items and two ints, so it leaves the cyclic GC when made
    (issue 15: full collections walked one run per queue): new, appended, loaded and
    followed runs alike; and nothing it holds is tracked."""
    assert not gc.is_tracked(SharedRun(5)) and not gc.is_tracked(SharedRun(5, 2))
    shared = SharedUnitLog.open(str(tmp_path / ".shared"), 8, read_only=False)
    try:
        rows = [(1, 0, 10, 50, 0, 9), (2, 0, 11, 50, 0, 9), (1, 1, 12, 50, 0, 9)]
        assert shared.append(*_columns(rows)) == 3  # type: ignore[arg-type]
        assert shared.runs and not any(gc.is_tracked(run) for run in shared.runs.values())
        shared.flush()
    finally:
        shared.close()
    for read_only in (False, True):
        reopened = SharedUnitLog.open(str(tmp_path / ".shared"), 8, read_only=read_only)
        try:
            assert sorted(reopened.runs) == [1, 2]
            assert not any(gc.is_tracked(run) for run in reopened.runs.values())
            for run in reopened.runs.values():
                assert all(not gc.is_tracked(ref) for ref in gc.get_referents(run)
                           if ref is not SharedRun)  # fmt: skip
        finally:
            reopened.close()


@pytest.mark.parametrize("failing", ["write", "records"])
def test_a_failed_write_leaves_the_runs_as_they_were(
    tmp_path: Any, monkeypatch, failing: str
) -> None:
    """``append`` adds to the runs as it checks the units; a write that fails (a full
    disk), or the building of its records (no memory), sets every run back: an
    extended one, one begun by the call, and an empty one a call restarted elsewhere."""
    shared = SharedUnitLog.open(str(tmp_path / ".shared"), RECORDS_PER_FILE, read_only=False)
    try:
        assert shared.append(*_columns([(0, 0, 100, 9, 0, 5), (1, 0, 101, 9, 0, 5)])) == 2
        shared.restart_queue(1, 7)  # queue 1: an empty run ending at 7
        before = {qid: (run.first_offset, run.min_offset, list(run))
                  for qid, run in shared.runs.items()}  # fmt: skip
        emptied = shared.runs[1]

        def full(*_args: Any) -> None:
            raise DiskFullError(28, "no space left on device")

        def no_memory(*_args: Any, **_kwargs: Any) -> None:
            raise MemoryError

        rows = [(0, 1, 102, 9, 0, 5), (2, 0, 103, 9, 0, 5), (1, 20, 104, 9, 0, 5),
                (0, 2, 105, 9, 0, 5), (2, 1, 106, 9, 0, 5)]  # fmt: skip
        columns = _columns(rows)  # type: ignore[arg-type]
        if failing == "write":
            monkeypatch.setattr(shared, "_write_records", full)
        else:
            monkeypatch.setattr(shared_log.np, "empty", no_memory)
        with pytest.raises(DiskFullError if failing == "write" else MemoryError):
            shared.append(*columns)
        after = {qid: (run.first_offset, run.min_offset, list(run))
                 for qid, run in shared.runs.items()}  # fmt: skip
        assert after == before and shared.runs[1] is emptied and 2 not in shared.runs
        assert shared.end_record == 2
        monkeypatch.undo()
        assert shared.append(*_columns(rows)) == 5  # type: ignore[arg-type]
        assert list(shared.runs[0]) == [0, 2, 5] and shared.runs[1].first_offset == 20
    finally:
        shared.close()


def _torn_pwrite(monkeypatch: Any, look: Any) -> list[int]:
    """Make the shared log's next pwrite land the first 8 bytes (the commitlog offset) of
    its last record, call ``look()``, then write the rest: what a follower can see
    while the kernel copies a record that straddles two pages. Returns the calls made."""
    real = os.pwrite
    calls: list[int] = []

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if calls or len(data) < SHARED_RECORD_SIZE_BYTES:
            return real(fd, data, offset)
        calls.append(offset)
        last = len(data) - SHARED_RECORD_SIZE_BYTES
        real(fd, data[: last + 8], offset)
        look()
        return real(fd, data[last + 8 :], offset + last + 8) + last + 8

    monkeypatch.setattr(shared_log.os, "pwrite", pwrite)
    return calls


def test_a_follower_never_takes_a_half_written_record(tmp_path: Any, monkeypatch: Any) -> None:
    """A record whose commitlog offset landed and whose size did not looks like a
    tombstone; a follower that took it stepped past it and began the queue's run
    afresh at its next record, losing the units before (a review's reproducer). The
    writer's published end keeps the follower below it."""
    directory = str(tmp_path / ".shared")
    writer = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=False)
    writer.append(*_columns([(0, 0, 100, 9, 0, 5), (0, 1, 101, 9, 0, 5)]))  # type: ignore[arg-type]
    follower = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=True)
    assert list(follower.runs[0].positions) == [0, 1]
    seen: list[int] = []

    def look() -> None:
        follower.follow()
        seen.append(follower.end_record)

    calls = _torn_pwrite(monkeypatch, look)
    writer.append(*_columns([(0, 2, 102, 9, 0, 5)]))  # type: ignore[arg-type]
    assert calls and seen == [2]  # the half-written record 2 was not taken
    monkeypatch.undo()
    writer.append(*_columns([(0, 3, 103, 9, 0, 5)]))  # type: ignore[arg-type]
    follower.follow()
    run = follower.runs[0]
    assert (run.first_offset, run.end) == (0, 4)
    assert follower.units(0, 0, 4)["commitlog_offset"].tolist() == [100, 101, 102, 103]
    # A reload (refresh) stops at the published end too.
    calls = _torn_pwrite(monkeypatch, follower.refresh)
    writer.append(*_columns([(0, 4, 104, 9, 0, 5)]))  # type: ignore[arg-type]
    monkeypatch.undo()
    follower.follow()
    assert follower.units(0, 0, 5)["commitlog_offset"].tolist() == [100, 101, 102, 103, 104]
    follower.close()
    writer.close()


def test_a_follower_stops_below_a_cut_the_writer_has_begun(tmp_path: Any) -> None:
    """A cut lowers the published end before any record is zeroed or deleted."""
    directory = str(tmp_path / ".shared")
    writer = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=False)
    rows = [(0, q, 100 + q, 9, 0, 5) for q in range(8)]  # 2 files
    assert writer.append(*_columns(rows)) == 8  # type: ignore[arg-type]
    published = shared_published.PublishedEnd(directory, read_only=True)
    assert published.get() == 8
    assert writer.truncate_beyond(106) == 2
    assert published.get() == 6
    follower = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=True)
    assert follower.end_record == 6 and follower.runs[0].end == 6
    published.close()
    follower.close()
    writer.close()


def test_a_log_without_a_published_end_is_followed_as_before(tmp_path: Any) -> None:
    """A writer of an older version publishes nothing: its followers take records up
    to the first unused one."""
    directory = str(tmp_path / ".shared")
    writer = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=False)
    writer.append(*_columns([(0, 0, 100, 9, 0, 5)]))  # type: ignore[arg-type]
    os.unlink(os.path.join(directory, shared_published.PUBLISHED_FILE))
    writer._published = shared_published.PublishedEnd(directory + "-elsewhere", False)
    os.makedirs(directory + "-elsewhere")
    follower = SharedUnitLog.open(directory, RECORDS_PER_FILE, read_only=True)
    writer.append(*_columns([(0, 1, 101, 9, 0, 5), (1, 0, 102, 9, 0, 5)]))  # type: ignore[arg-type]
    follower.follow()
    assert follower.end_record == 3
    assert follower.units(0, 0, 2)["commitlog_offset"].tolist() == [100, 101]
    follower.close()
    writer.close()
