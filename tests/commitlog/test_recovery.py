"""Crash recovery: torn tails, flipped bits, zeroed tails and real SIGKILLs."""

from __future__ import annotations

import mmap
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest

from mqstore.commitlog import recovery
from mqstore.commitlog.batch import Trailer
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.config import CommitLogConfig
from mqstore.commitlog.errors import CorruptDataError, InvalidArgumentError
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.record import FLAG_GROUP_OPEN

FILE = 64 * 1024


def _fill(directory: str, config: CommitLogConfig, count: int, size: int = 300):
    log = CommitLog.open(directory, config)
    results = [log.append("t", i % 2, bytes([i % 251]) * size) for i in range(count)]
    log.close()
    return results


def _records(directory: str, config: CommitLogConfig):
    log = CommitLog.open(directory, config)
    try:
        return log, list(log.iter_records(log.min_position))
    except BaseException:
        log.close()
        raise


def _file_of(directory: str, position: int) -> tuple[str, int]:
    start = position - position % FILE
    return os.path.join(directory, f"{start:020d}"), position - start


def _patch(directory: str, position: int, data: bytes) -> None:
    path, in_file = _file_of(directory, position)
    with open(path, "r+b") as handle:
        handle.seek(in_file)
        handle.write(data)


def _read(directory: str, position: int, size: int) -> bytes:
    path, in_file = _file_of(directory, position)
    with open(path, "rb") as handle:
        handle.seek(in_file)
        return handle.read(size)


@pytest.fixture
def config() -> CommitLogConfig:
    return CommitLogConfig(file_size_bytes=FILE, prewarm=False)


def test_truncated_last_record_is_dropped_and_zeroed(tmp_path, config):
    directory = str(tmp_path / "cl")
    results = _fill(directory, config, 500)
    last = results[-1]
    # Tear the last record: keep its first half, zero the rest (a torn write).
    _patch(directory, last.physical_offset + last.size // 2, b"\0" * (last.size - last.size // 2))
    log, records = _records(directory, config)
    try:
        assert len(records) == 499
        assert log.write_position == last.physical_offset
        assert _read(directory, last.physical_offset, last.size) == b"\0" * last.size
        again = log.append("t", 1, b"new")  # record 499 was in queue 1
        assert again.physical_offset == last.physical_offset
        assert again.queue_offset == last.queue_offset
    finally:
        log.close()


def test_flipped_bit_in_last_record_is_dropped(tmp_path, config):
    directory = str(tmp_path / "cl")
    results = _fill(directory, config, 300)
    last = results[-1]
    position = last.physical_offset + 100
    byte = _read(directory, position, 1)[0]
    _patch(directory, position, bytes([byte ^ 0x10]))
    log, records = _records(directory, config)
    try:
        assert [r.physical_offset for r in records] == [r.physical_offset for r in results[:-1]]
        # The queue offset freed by the dropped record is given out again, densely.
        assert log.append("t", 1, b"replacement").queue_offset == 149
        assert all(bytes(r.body) == bytes([i % 251]) * 300 for i, r in enumerate(records))
    finally:
        log.close()


def test_zeroed_tail_spanning_files(tmp_path, config):
    directory = str(tmp_path / "cl")
    results = _fill(directory, config, 1000)
    cut = results[600]
    # Zero everything from record 600 on, including whole later files.
    _patch(directory, cut.physical_offset, b"\0" * (FILE - cut.physical_offset % FILE))
    last_file_start = results[-1].physical_offset - results[-1].physical_offset % FILE
    for start in range(
        cut.physical_offset - cut.physical_offset % FILE + FILE, last_file_start + FILE, FILE
    ):
        _patch(directory, start, b"\0" * FILE)
    log, records = _records(directory, config)
    try:
        assert len(records) == 600
        assert log.write_position == cut.physical_offset
        files = sorted(n for n in os.listdir(directory) if n.isdigit())
        assert int(files[-1]) <= cut.physical_offset + FILE  # later files removed (one spare)
    finally:
        log.close()


def test_garbage_after_a_gap_never_resurfaces(tmp_path, config):
    """Valid-looking bytes after the end (stale or unsynced) are zeroed, not kept."""
    directory = str(tmp_path / "cl")
    results = _fill(directory, config, 100)
    victim = results[50]
    _patch(directory, victim.physical_offset + 20, b"\xff\xff")  # corrupt record 50
    log, records = _records(directory, config)
    log.close()
    assert len(records) == 50
    # Records 51..99 were zeroed: reopening again must not find them.
    log, records = _records(directory, config)
    try:
        assert len(records) == 50
        assert _read(directory, results[70].physical_offset, 16) == b"\0" * 16
    finally:
        log.close()


def test_recovery_scan_is_bounded_by_the_checkpoint(tmp_path, config):
    directory = str(tmp_path / "cl")
    results = _fill(directory, config, 400)
    # Corrupt an OLD record that lies before the checkpointed position: a bounded scan
    # starting at the checkpoint never reads it, so the log end is kept.
    _patch(directory, results[5].physical_offset + 30, b"\xee")
    checkpoint = results[390].physical_offset
    log = CommitLog.open(directory, config, recover_from=checkpoint)
    try:
        assert log.write_position == results[-1].physical_offset + results[-1].size
        with pytest.raises(CorruptDataError):  # but reading it still refuses bad bytes
            log.record_at(results[5].physical_offset)
    finally:
        log.close()


def test_open_never_claims_a_file_it_did_not_sync_as_flushed(tmp_path, config):
    """A dead writer may leave every file past the checkpoint dirty: the recovered
    log claims as flushed only what precedes the scan start, until a flush has
    synced every file that holds bytes of [start, end) (several files here)."""
    directory = str(tmp_path / "cl")
    results = _fill(directory, config, 1000)
    start = results[10].physical_offset  # the checkpoint: in the first file
    synced: list[int] = []

    def counting(mapped) -> None:
        synced.append(mapped.start_offset)
        mapped.flush()

    log = CommitLog.open(directory, config, recover_from=start, syncer=counting)
    try:
        end = log.write_position
        assert end == results[-1].physical_offset + results[-1].size
        assert end - start > 2 * FILE  # the range spans several files
        first = start - start % FILE
        holding = set(range(first, end, FILE))  # files with bytes of [start, end)
        claimed = set(range(first, log.flushed_position, FILE))  # [start, flushed)
        if log.flushed_position <= start:
            claimed = set()
        assert claimed <= set(synced), (sorted(claimed), sorted(synced))
        log.flush_to(end)
        assert log.flushed_position == end
        assert holding <= set(synced)
    finally:
        log.close()


def test_zeros_over_a_corrupt_tail_are_synced_at_open(tmp_path, config):
    """Before a new record follows the zeroed tail, the zeros are durable."""
    directory = str(tmp_path / "cl")
    results = _fill(directory, config, 100)
    _patch(directory, results[50].physical_offset + 20, b"\xff\xff")
    synced: list[int] = []

    def counting(mapped) -> None:
        synced.append(mapped.start_offset)
        mapped.flush()

    log = CommitLog.open(directory, config, syncer=counting)
    try:
        assert log.write_position == results[50].physical_offset
        end_file = results[50].physical_offset - results[50].physical_offset % FILE
        assert synced == [end_file]
    finally:
        log.close()


def test_checkpoint_past_the_log_is_refused(tmp_path, config):
    directory = str(tmp_path / "cl")
    _fill(directory, config, 10)
    with pytest.raises(CorruptDataError, match="past the CommitLog"):
        CommitLog.open(directory, config, recover_from=50 * FILE)


def test_wrong_file_size_is_refused(tmp_path, config):
    directory = str(tmp_path / "cl")
    _fill(directory, config, 10)
    with open(os.path.join(directory, "0" * 20), "r+b") as handle:
        handle.truncate(FILE - 1)
    with pytest.raises(CorruptDataError) as caught:
        CommitLog.open(directory, config)
    assert caught.value.path.endswith("0" * 20)


CHILD = textwrap.dedent(
    """
    import os, sys
    from mqstore.commitlog.commitlog import CommitLog
    from mqstore.commitlog.config import CommitLogConfig
    directory, seed = sys.argv[1], int(sys.argv[2])
    config = CommitLogConfig(file_size_bytes=64 * 1024, prewarm=False, flush_mode="sync")
    log = CommitLog.open(directory, config)
    out = os.fdopen(1, "w", buffering=1)
    i = 0
    while True:
        body = f"{seed}-{i}-".encode() * (1 + i % 40)
        result = log.append("t", i % 3, body)
        out.write(f"{result.physical_offset} {result.queue_offset} {i % 3} {body.hex()}\\n")
        i += 1
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_sigkill_mid_append_keeps_every_acknowledged_record(tmp_path, seed):
    directory = str(tmp_path / "cl")
    rng = random.Random(seed)
    acked: list[tuple[int, int, int, bytes]] = []
    for round_ in range(3):  # kill, recover, append more, kill again
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, directory, str(seed * 10 + round_)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        first = child.stdout.readline()  # appending: start the clock only now (slow imports)
        time.sleep(0.05 + rng.random() * 0.3)
        child.send_signal(signal.SIGKILL)
        output, _ = child.communicate()
        output = first + output
        for line in output.splitlines():
            parts = line.split()
            if len(parts) == 4:  # a line cut by the kill was never acknowledged
                acked.append((int(parts[0]), int(parts[1]), int(parts[2]), bytes.fromhex(parts[3])))
        config = CommitLogConfig(file_size_bytes=64 * 1024, prewarm=False)
        log = CommitLog.open(directory, config)
        try:
            records = {r.physical_offset: r for r in log.iter_records(0)}  # verifies all
            for physical, queue_offset, queue_id, body in acked:
                record = records[physical]
                assert bytes(record.body) == body
                assert (record.queue_offset, record.queue_id) == (queue_offset, queue_id)
            for queue_id in range(3):
                offsets = [r.queue_offset for r in records.values() if r.queue_id == queue_id]
                assert offsets == list(range(len(offsets)))  # dense, no duplicate
        finally:
            log.close()
    assert len(acked) > 50  # the children really did acknowledge work


# ---------------------------------------------------------------- append groups


def _state(first: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A trailer's record naming the batch's first queue offset."""
    return b"state of %d" % first, [("k", b"producer")]


def _group(log: CommitLog, count: int, size: int = 300):
    """A batch of ``count`` records in queue ("t", 0) with a trailer in ("s", 0)."""
    trailer = Trailer("s", 0, _state)
    return log.append_batch("t", 0, [bytes(size)] * count, trailer=trailer)


def _ends(log: CommitLog) -> list[tuple[int, int]]:
    """(end, flags) of every record."""
    return [(r.physical_offset + r.size, r.flags) for r in log.iter_records(log.min_position)]


def test_a_batch_and_its_trailer_are_one_group(tmp_path, config):
    log = CommitLog.open(str(tmp_path / "cl"), config)
    try:
        log.append("t", 0, b"before")
        result = _group(log, 5)
        records = list(log.iter_records(log.min_position))
        assert [r.topic for r in records] == ["t"] * 6 + ["s"]
        assert [r.flags for r in records] == [0] + [FLAG_GROUP_OPEN] * 5 + [0]
        assert result.first_queue_offset == 1
        assert records[-1].body == b"state of 1"  # called with the batch's first offset
        assert records[-1].physical_offset == records[-2].physical_offset + records[-2].size
    finally:
        log.close()


def test_a_trailer_that_raises_appends_nothing(tmp_path, config):
    def broken(first: int) -> tuple[bytes, list]:
        raise InvalidArgumentError("no state")

    log = CommitLog.open(str(tmp_path / "cl"), config)
    try:
        log.append("t", 0, b"before")
        end = log.write_position
        with pytest.raises(InvalidArgumentError):
            log.append_batch("t", 0, [b"x"] * 3, trailer=Trailer("s", 0, broken))
        assert log.write_position == end
        assert log.append("t", 0, b"after").queue_offset == 1
    finally:
        log.close()


@pytest.mark.parametrize("seed", range(6))
def test_a_group_cut_short_by_a_crash_is_dropped_whole(tmp_path, config, seed):
    """Any tail of the last group lost (its trailer, part of its batch, a torn record
    inside it): the log ends where the group started, and every queue's next offset
    is what it was before the group, as if it was never appended."""
    directory = str(tmp_path / "cl")
    log = CommitLog.open(directory, config)
    log.append("t", 0, b"before")
    _group(log, 8)
    start = log.write_position  # the group that the crash cuts
    _group(log, 8)
    end = log.write_position
    log.close()
    cut = random.Random(seed).randrange(start + 1, end)  # from here on the bytes are lost
    _patch(directory, cut, b"\0" * (end - cut))
    log, records = _records(directory, config)
    try:
        assert log.write_position == start
        assert len(records) == 1 + 9
        assert log.append("t", 0, b"after").queue_offset == 9
        assert log.append("s", 0, b"after").queue_offset == 1
    finally:
        log.close()


def test_a_group_that_does_not_fit_the_file_starts_the_next_one(tmp_path, config):
    log = CommitLog.open(str(tmp_path / "cl"), config)
    try:
        while log.write_position < FILE - 8_000:
            log.append("t", 1, bytes(1000))
        result = _group(log, 25)  # ~9 KiB: it would straddle the files
        assert int(result.physical_offsets[0]) == FILE
        assert log.write_position < 2 * FILE
    finally:
        log.close()


def test_a_group_larger_than_a_file_spans_files_and_is_dropped_whole(tmp_path, config):
    """A group that cannot fit one file spans two (an end-of-file blank record in
    between); cut short, recovery drops it across the file boundary."""
    directory = str(tmp_path / "cl")
    log = CommitLog.open(directory, config)
    log.append("t", 0, b"before")
    start = log.write_position
    result = _group(log, 300)  # ~90 KiB of 64 KiB files
    end = log.write_position
    assert int(result.physical_offsets[-1]) >= FILE > int(result.physical_offsets[0])
    log.close()
    _patch(directory, end - 10, b"\0" * 10)  # the trailer is torn
    log, records = _records(directory, config)
    try:
        assert (log.write_position, len(records)) == (start, 1)
        assert not os.path.exists(_file_of(directory, FILE)[0])  # the later file is gone
        assert log.append("t", 0, b"after").queue_offset == 1
    finally:
        log.close()


@pytest.mark.parametrize("damage", [None, 2, -1])
def test_files_scanned_ahead_give_what_one_sequential_scan_gives(
    tmp_path, config, monkeypatch, damage
):
    """Runs of 8 records, so that every file after the first is scanned ahead in a
    thread (commitlog/recovery.py, ``Prefetch``): the end, the newest timestamp and the
    queue-offset table are the sequential scan's, with a flipped bit in the third
    file (the files after it, scanned ahead, are thrown away) or in the last one."""
    from mqstore.commitlog import recovery

    directory = str(tmp_path / "log")
    results = _fill(directory, config, 1200, size=300)  # about 6 files of 64 KiB
    files = sorted({r.physical_offset // FILE for r in results})
    assert len(files) >= 5
    if damage is not None:
        victim = next(r for r in results if r.physical_offset // FILE == files[damage])
        _patch(directory, victim.physical_offset + 100, b"\xff")

    def scan(rows: int) -> tuple[int, int, dict, int]:
        monkeypatch.setattr(recovery, "SCAN_ROWS", rows)
        started = []
        real = recovery.Prefetch

        def counting(produce, depth, name):
            started.append(name)
            return real(produce, depth, name)

        monkeypatch.setattr(recovery, "Prefetch", counting)
        log = CommitLog.open(directory, config, read_only=True)
        try:
            table: dict = {}
            end, newest = recovery.scan_log(log._files, 0, table, 0)
        finally:
            log.close()
        return end, newest, table, len(started)

    end, newest, table, ahead = scan(8)
    assert ahead >= 3  # the scan went ahead, and a ring of columns was taken again
    assert (end, newest, table) == scan(1 << 16)[:3]  # no run fills: no scan ahead
    if damage is None:
        assert end == results[-1].physical_offset + results[-1].size
    else:
        assert end == victim.physical_offset


def test_an_error_in_a_file_scanned_ahead_is_raised(tmp_path, config, monkeypatch):
    from mqstore.commitlog import recovery

    directory = str(tmp_path / "log")
    _fill(directory, config, 600, size=300)
    monkeypatch.setattr(recovery, "SCAN_ROWS", 8)
    real_scan = recovery._scan

    def failing(mapped, in_file, columns):
        if mapped.start_offset == FILE:  # the second file: scanned ahead
            raise MemoryError("scan ahead failed")
        return real_scan(mapped, in_file, columns)

    log = CommitLog.open(directory, config, read_only=True)
    monkeypatch.setattr(recovery, "_scan", failing)
    try:
        with pytest.raises(MemoryError, match="scan ahead failed"):
            recovery.scan_log(log._files, 0, {}, 0)
    finally:
        log.close()


def test_a_failure_while_taking_runs_ahead_leaves_no_scanner_running(tmp_path, config, monkeypatch):
    """The caller fails while folding the runs of a file scanned ahead: that file's
    scanner is stopped and joined too, not left polling with the file mapped."""
    import threading

    from mqstore.commitlog import recovery

    directory = str(tmp_path / "log")
    _fill(directory, config, 900, size=300)
    monkeypatch.setattr(recovery, "SCAN_ROWS", 8)
    log = CommitLog.open(directory, config, read_only=True)
    real_fold = recovery.fold_columns

    def failing(buffer, count, columns, table, first=0):
        if int(columns.positions[0]) == 0 and len(table) and buffer is not log.files()[0].mapping:
            raise ValueError("fold failed")  # the second file's first run: taken ahead
        return real_fold(buffer, count, columns, table, first)

    monkeypatch.setattr(recovery, "fold_columns", failing)
    try:
        with pytest.raises(ValueError, match="fold failed"):
            recovery.scan_log(log._files, 0, {}, 0)
    finally:
        log.close()
    assert not [t for t in threading.enumerate() if t.name == "mqstore-scan"]


@pytest.mark.parametrize("twin", [False, True])
def test_populate_read_maps_a_window_of_a_mapping_and_refuses_a_range_outside(tmp_path, twin):
    """The scan's look-ahead (recovery._populate): on a file's mapping it maps the
    window (a kernel before 5.14 says False), on a buffer that is not a page-aligned
    mapping it does nothing, and a range outside the buffer is a ValueError, in C
    as in the twin."""
    if not twin and NATIVE is None:
        pytest.skip("the C module is not built")
    populate = recovery.populate_read_py if twin else NATIVE.populate_read
    path = tmp_path / "f"
    path.write_bytes(b"x" * (3 * mmap.PAGESIZE))
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)
    try:
        done = populate(mapping, mmap.PAGESIZE + 5, mmap.PAGESIZE)
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
        assert done is True or (done is False and (major, minor) < (5, 14))
        assert populate(mapping, 0, 0) is False
        for start, length in ((-1, 1), (0, 3 * mmap.PAGESIZE + 1), (3 * mmap.PAGESIZE, 1)):
            with pytest.raises(ValueError):
                populate(mapping, start, length)
    finally:
        mapping.close()
    if twin:  # (C tries any page-aligned buffer: a bytes object's data may be one)
        assert populate(b"abc", 0, 3) is False
    with pytest.raises(ValueError):
        populate(b"abc", 2, 2)


PAGE = mmap.PAGESIZE


def _populate_twins() -> list[Any]:
    return [
        pytest.param(lambda: recovery.populate_read_py, id="python"),
        pytest.param(lambda: NATIVE.populate_read, id="c", marks=pytest.mark.skipif(
            NATIVE is None, reason="the C module is not built")),
    ]  # fmt: skip


def _mapped_pages(buffer: Any, pages: int) -> list[int]:
    """Which of the first ``pages`` pages of ``buffer`` (page-aligned) are mapped in
    this process: the "present" bit (63) of /proc/self/pagemap, a page-table fact."""
    base = np.frombuffer(buffer, dtype=np.uint8).ctypes.data
    assert base % PAGE == 0
    try:
        with open("/proc/self/pagemap", "rb") as handle:
            handle.seek(base // PAGE * 8)
            entries = np.frombuffer(handle.read(8 * pages), dtype="<u8")
    except OSError as error:
        pytest.skip(f"no /proc/self/pagemap: {error}")
    return np.flatnonzero(entries >> np.uint64(63)).tolist()


def _populate_works() -> bool:
    major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    return (major, minor) >= (5, 14)  # MADV_POPULATE_READ


@pytest.mark.parametrize("populate", _populate_twins())
def test_populate_read_maps_exactly_the_pages_of_its_range(populate):
    """The contract of ``populate_read`` (C and the twin alike), on an anonymous
    mapping (no fault-around there, so the pages mapped are exactly those asked):
    [start, start + length) is mapped from start's page to the page of its last byte,
    nothing before or after; True when done, False (and nothing mapped) for an empty
    range; a range outside the buffer is a ValueError that maps nothing."""
    populate = populate()
    if not _populate_works():
        pytest.skip("MADV_POPULATE_READ needs Linux 5.14")
    mapping = mmap.mmap(-1, 32 * PAGE)
    try:
        assert _mapped_pages(mapping, 32) == []  # fresh: nothing mapped yet
        assert populate(mapping, 10 * PAGE + 5, 3 * PAGE) is True  # last byte in page 13
        assert _mapped_pages(mapping, 32) == [10, 11, 12, 13]
        assert populate(mapping, 20 * PAGE - 1, 1) is True  # one byte: its page alone
        assert _mapped_pages(mapping, 32) == [10, 11, 12, 13, 19]
        assert populate(mapping, 31 * PAGE, PAGE) is True  # up to the end
        assert populate(mapping, 32 * PAGE, 0) is False  # empty, at the end: nothing
        assert populate(mapping, 2 * PAGE, 0) is False
        outside = ((-PAGE, 2 * PAGE), (0, -1), (0, 32 * PAGE + 1), (25 * PAGE, 8 * PAGE))
        for start, length in outside:
            with pytest.raises(ValueError, match="outside the buffer"):
                populate(mapping, start, length)
        assert _mapped_pages(mapping, 32) == [10, 11, 12, 13, 19, 31]
        assert bytes(mapping[10 * PAGE : 14 * PAGE]) == bytes(4 * PAGE)  # read, not written
    finally:
        mapping.close()


@pytest.mark.parametrize("populate", _populate_twins())
def test_populate_read_maps_a_window_of_a_file_and_nothing_of_a_copy(tmp_path, populate):
    """A CommitLog file's read-only mapping (the scan's case) gets the pages of the
    window mapped (fault-around may map neighbours too); a buffer that is no
    page-aligned mapping (a view from byte 1) is left alone: False, nothing mapped;
    wrong arguments are a TypeError."""
    populate = populate()
    if not _populate_works():
        pytest.skip("MADV_POPULATE_READ needs Linux 5.14")
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * (64 * PAGE // 256))
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)
    anonymous = mmap.mmap(-1, 8 * PAGE)
    view = memoryview(anonymous)[1:]
    try:
        assert populate(mapping, 40 * PAGE + 7, 5 * PAGE) is True
        assert set(range(40, 46)) <= set(_mapped_pages(mapping, 64))
        assert populate(view, 2 * PAGE, PAGE) is False  # not page-aligned: no madvise
        assert _mapped_pages(anonymous, 8) == []
        with pytest.raises(TypeError):
            populate(mapping, 0)
        with pytest.raises(TypeError):
            populate(12, 0, 0)  # not a buffer
    finally:
        view.release()
        anonymous.close()
        mapping.close()
