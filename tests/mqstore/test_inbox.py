"""The inbox: spool files appended by the store's writer once, quarantine of bad
files, progress after a failed append, a writer SIGKILLed mid-ingest, and a live
writer process ingesting what another process spools while it holds the lock."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mqstore import (
    CorruptDataError,
    DiskFullError,
    FlushFailedError,
    MessageStore,
    StoreClosedError,
    StoreConfig,
    StoreLockedError,
)
from mqstore.inbox import INBOX_DIR, LEDGER_NAME, QUARANTINE_DIR, SpoolRejectedError
from mqstore.spool import SPOOL_SUFFIX, CorruptSpoolError, SpoolWriter
from tests.mqstore.conftest import SMALL

ROOT = Path(__file__).resolve().parents[2]
QUIET = {**SMALL, "inbox_interval_ms": 600_000}  # ingest only when the test says so
DEADLINE_S = 30.0


def _spool(root, name, blocks):
    """Write one spool file into the store's inbox, as a locked-out Spark task does."""
    directory = os.path.join(root, INBOX_DIR)
    os.makedirs(directory, exist_ok=True)
    with SpoolWriter(os.path.join(directory, name + SPOOL_SUFFIX), max_bytes=1 << 30) as w:
        for topic, partition, values, extra in blocks:
            w.add_block(topic, partition, values, **extra)
        w.commit()


def _values(store, topic):
    out = []
    for partition in range(store.describe_topic(topic).partitions):
        offset = store.earliest_offset(topic, partition)
        while records := store.read_records(topic, partition, offset, 1000):
            out.extend(r.value for r in records)
            offset = records[-1].offset + 1
    return out


def _inbox_names(root):
    return sorted(n for n in os.listdir(os.path.join(root, INBOX_DIR)) if n != QUARANTINE_DIR)


def test_ingest_appends_each_file_once_with_keys_headers_and_timestamps(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore.open(root, StoreConfig(**QUIET)) as store:
        store.create_topic("out", 2)
        blocks = [
            ("out", 0, [b"a", b"b"], {"timestamps_ms": [1000, 2000]}),
            ("out", 1, [b"c", None], {"keys": [b"k", None], "headers": [[("h", b"1")], []]}),
        ]
        _spool(root, "task-0", blocks)
        assert store.inbox is not None
        report = store.inbox.ingest()
        assert (report.files, report.rows, report.skipped, report.pending) == (1, 4, 0, 0)
        assert _inbox_names(root) == [LEDGER_NAME]  # the file is gone, the ledger stays
        first = store.read_records("out", 0, 0, 10)
        assert [(r.value, r.timestamp_ms) for r in first] == [(b"a", 1000), (b"b", 2000)]
        second = store.read_records("out", 1, 0, 10)
        assert [(r.key, r.value, r.headers) for r in second] == [
            (b"k", b"c", [("h", b"1")]),
            (None, None, []),
        ]
        _spool(root, "task-0", blocks)  # a retried task rewrites the same name
        report = store.inbox.ingest()
        assert (report.files, report.rows, report.skipped) == (0, 0, 1)
        assert Counter(_values(store, "out")) == Counter([b"a", b"b", b"c", None])
        assert _inbox_names(root) == [LEDGER_NAME]


def test_a_value_only_block_goes_in_as_its_columns_and_rows_without_a_time_are_born_now(
    tmp_path,
):
    root = str(tmp_path / "s")
    now_ms = 1_800_000_000_000
    with MessageStore.open(root, StoreConfig(**QUIET), clock_ms=lambda: now_ms) as store:
        store.create_topic("out", 1)
        directory = os.path.join(root, INBOX_DIR)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "task-0" + SPOOL_SUFFIX)
        with SpoolWriter(path, max_bytes=1 << 30) as writer:
            writer.add_column_block(
                "out",
                0,
                np.array([3, 4, 6, 8], dtype=np.int64),
                b"...a##bc",  # a null may span bytes in Arrow; they are not a value
                nulls=np.array([0, 1, 0], dtype=np.uint8),
                timestamps_ms=np.array([1000, -1, 3000], dtype=np.int64),
            )
            writer.add_column_block("out", 0, np.array([0, 1], dtype=np.int64), b"d")
            writer.commit()
        assert store.inbox is not None
        assert store.inbox.ingest().rows == 4
        records = store.read_records("out", 0, 0, 10)
        assert [r.value for r in records] == [b"a", None, b"bc", b"d"]
        assert [r.timestamp_ms for r in records] == [1000, now_ms, 3000, now_ms]


def test_the_scheduled_job_ingests_while_the_store_is_open(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore.open(root, StoreConfig(**{**SMALL, "inbox_interval_ms": 20})) as store:
        store.create_topic("out", 1)
        _spool(root, "task-0", [("out", 0, [b"x%d" % i for i in range(100)], {})])
        assert store.wait_for("out", 0, 99, int(DEADLINE_S * 1000))
        assert _values(store, "out") == [b"x%d" % i for i in range(100)]


def test_a_corrupt_file_is_quarantined_with_a_typed_error(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore.open(root, StoreConfig(**QUIET)) as store:
        store.create_topic("out", 1)
        _spool(root, "bad", [("out", 0, [b"payload"] * 5, {})])
        path = os.path.join(root, INBOX_DIR, "bad" + SPOOL_SUFFIX)
        raw = bytearray(Path(path).read_bytes())
        raw[-2] ^= 0x01
        Path(path).write_bytes(bytes(raw))
        _spool(root, "good", [("out", 0, [b"ok"], {})])
        assert store.inbox is not None
        report = store.inbox.ingest()
        assert report.files == 1  # the good file still goes in
        (quarantined,) = report.quarantined
        assert quarantined.name == "bad" + SPOOL_SUFFIX
        assert isinstance(quarantined.error, CorruptSpoolError)
        assert isinstance(quarantined.error, CorruptDataError)  # the store's error root
        assert _values(store, "out") == [b"ok"]
        assert store.inbox.quarantined() == ["bad" + SPOOL_SUFFIX]
        note_path = os.path.join(root, INBOX_DIR, QUARANTINE_DIR, "bad.spool.json")
        with open(note_path, encoding="utf-8") as handle:
            note = json.load(handle)
        assert (note["error"], note["blocks_done"]) == ("CorruptSpoolError", 0)
        assert Path(root, INBOX_DIR, QUARANTINE_DIR, "bad.spool").read_bytes() == bytes(raw)


def test_a_file_for_a_missing_partition_is_rejected_before_any_append(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore.open(root, StoreConfig(**QUIET)) as store:
        store.create_topic("out", 1)
        _spool(root, "t", [("out", 0, [b"first"], {}), ("out", 5, [b"nowhere"], {})])
        assert store.inbox is not None
        (quarantined,) = store.inbox.ingest().quarantined
        assert isinstance(quarantined.error, SpoolRejectedError)
        assert "partition 5" in str(quarantined.error)
        assert _values(store, "out") == []  # nothing of a refused file went in


class _FailingStore:
    """The real store, with put_batch_buffers failing with ``error`` once at call
    ``fail_at``."""

    def __init__(self, store, fail_at, error):
        self.store = store
        self.calls = 0
        self.fail_at = fail_at
        self.error = error

    def describe_topic(self, name):
        return self.store.describe_topic(name)

    def topic_for_write(self, name):
        return self.store.topic_for_write(name)

    def stats(self):
        return self.store.stats()

    def append_records(self, topic, partition, records):
        return self.store.append_records(topic, partition, records)

    def put_batch_buffers(self, topic, queue_id, offsets, data, **kwargs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error
        return self.store.put_batch_buffers(topic, queue_id, offsets, data, **kwargs)


@pytest.mark.parametrize("closing", [False, True])
def test_a_failed_append_resumes_from_the_recorded_block(tmp_path, closing):
    from mqstore.inbox import Inbox

    root = str(tmp_path / "s")
    with MessageStore.open(root, StoreConfig(**QUIET)) as store:
        store.create_topic("out", 1)
        blocks = [("out", 0, [b"b%d-%d" % (b, i) for i in range(3)], {}) for b in range(3)]
        _spool(root, "t", blocks)
        _spool(root, "u", [("out", 0, [b"later"], {})])
        error = StoreClosedError("closed") if closing else DiskFullError("no space left")
        failing = _FailingStore(store, fail_at=2, error=error)
        inbox = Inbox(os.path.join(root, INBOX_DIR), failing, sync=lambda: None)
        if closing:  # a store closing under a scheduled ingest: it stops quietly
            assert inbox.ingest().rows == 3
        else:
            with pytest.raises(DiskFullError):
                inbox.ingest()
        assert _values(store, "out") == [b"b0-0", b"b0-1", b"b0-2"]
        assert _inbox_names(root) == [LEDGER_NAME, "t.spool", "u.spool"]  # kept for the retry
        report = inbox.ingest()
        assert (report.files, report.rows) == (2, 7)
        expected = [b"b%d-%d" % (b, i) for b in range(3) for i in range(3)] + [b"later"]
        assert _values(store, "out") == expected  # block 0 was not appended twice


def test_a_corrupt_ledger_stops_ingest_but_keeps_the_files(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore.open(root, StoreConfig(**QUIET)) as store:
        store.create_topic("out", 1)
        _spool(root, "t", [("out", 0, [b"x"], {})])
        Path(root, INBOX_DIR, LEDGER_NAME).write_text('{"format": "mqstore-inbox-ledger"}')
        assert store.inbox is not None
        with pytest.raises(CorruptDataError, match="ledger"):
            store.inbox.ingest()
        assert "t.spool" in _inbox_names(root)
        store.put("out", 0, b"the store itself keeps working")


KILLER = """
import os, signal, sys
from mqstore import MessageStore, StoreConfig
from mqstore import inbox as inbox_module

root, point, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = MessageStore.open(root, StoreConfig(**CONFIG))
calls = [0]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point == "after_block":
    put_batch_buffers = store.put_batch_buffers
    def counted(*args, **kwargs):
        result = put_batch_buffers(*args, **kwargs)
        calls[0] += 1
        if calls[0] == at:
            die()
        return result
    store.put_batch_buffers = counted
else:
    mark_done = inbox_module._Ledger.mark_done
    def counted(self, *args):
        calls[0] += 1
        if point == "before_ledger" and calls[0] == at:
            die()
        mark_done(self, *args)
        if point == "after_ledger" and calls[0] == at:
            die()
    inbox_module._Ledger.mark_done = counted
store.inbox.ingest()
print("not killed")
""".replace("CONFIG", repr(QUIET))

FILES, BLOCKS, ROWS = 3, 2, 4


def _expected(file, block):
    return [b"f%d-b%d-r%d" % (file, block, row) for row in range(ROWS)]


@pytest.mark.parametrize(
    ("point", "at", "twice"),
    [
        ("after_block", 3, [(1, 0)]),  # file 1's first block went in, then the kill
        ("before_ledger", 2, [(1, 0), (1, 1)]),  # all of file 1 went in, not its ledger entry
        ("after_ledger", 2, []),  # file 1 is in the ledger, not yet deleted
    ],
)
def test_writer_killed_mid_ingest_loses_nothing(tmp_path, point, at, twice):
    root = str(tmp_path / "s")
    with MessageStore.open(root, StoreConfig(**QUIET)) as store:
        store.create_topic("out", 2)
    for file in range(FILES):
        blocks = [("out", block, _expected(file, block), {}) for block in range(BLOCKS)]
        _spool(root, f"task-{file}", blocks)
    child = subprocess.run(
        [sys.executable, "-c", KILLER, root, point, str(at)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    with MessageStore.open(root, StoreConfig(**QUIET)) as store:
        assert store.recovered_from_crash
        assert store.inbox is not None
        store.inbox.ingest()
        assert _inbox_names(root) == [LEDGER_NAME]
        seen = Counter(_values(store, "out"))
    expected = Counter()
    for file in range(FILES):
        for block in range(BLOCKS):
            times = 2 if (file, block) in twice else 1
            expected.update({value: times for value in _expected(file, block)})
    assert seen == expected  # every row at least once; twice only where documented


SERVICE = """
import sys, time
from mqstore import MessageStore, StoreConfig
config = StoreConfig(**CONFIG)
store = MessageStore.open(sys.argv[1], config)
store.create_topic("events", 1)
store.create_topic("out", 2)
print("open", flush=True)
i = 0
while True:  # a live service: it produces until it is killed
    store.put("events", 0, b"event-%d" % i)
    i += 1
    time.sleep(0.001)  # about a thousand events a second, not a busy loop
""".replace("CONFIG", repr({**SMALL, "inbox_interval_ms": 20}))


def test_a_live_writer_process_ingests_what_another_process_spools(tmp_path):
    root = str(tmp_path / "s")
    service = subprocess.Popen(
        [sys.executable, "-c", SERVICE, root], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert service.stdout is not None
        assert service.stdout.readline().strip() == "open"
        with pytest.raises(StoreLockedError):
            MessageStore.open(root, StoreConfig(**SMALL))
        for task in range(4):
            blocks = [("out", task % 2, [b"t%d-%d" % (task, i) for i in range(50)], {})]
            _spool(root, f"task-{task}", blocks)
        reader = MessageStore.open(root, StoreConfig(**SMALL), read_only=True)
        try:
            deadline = time.monotonic() + DEADLINE_S
            while sum(reader.max_offset("out", p) for p in range(2)) < 200:
                assert time.monotonic() < deadline, "the service did not ingest the spool"
                time.sleep(0.02)
            produced = reader.max_offset("events", 0)
            assert reader.wait_for("events", 0, produced, int(DEADLINE_S * 1000))  # still live
            values = Counter(_values(reader, "out"))
        finally:
            reader.close()
        assert values == Counter(b"t%d-%d" % (t, i) for t in range(4) for i in range(50))
        assert service.poll() is None
        # A spool is deleted after its records are appended (readable): wait for it.
        deadline = time.monotonic() + DEADLINE_S
        while _inbox_names(root) != [LEDGER_NAME] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _inbox_names(root) == [LEDGER_NAME]
    finally:
        service.kill()
        service.wait(10)


def test_a_retry_with_different_rows_is_appended_not_deleted_unread(tmp_path):
    """A retried Spark task over non-deterministic input rewrites its name with other
    rows: at-least-once means they go in (the first attempt's rows stay too)."""
    root = str(tmp_path / "s")
    with MessageStore.open(root, StoreConfig(**QUIET)) as store:
        store.create_topic("out", 1)
        assert store.inbox is not None
        _spool(root, "task-0", [("out", 0, [b"first-a", b"first-b"], {})])
        assert store.inbox.ingest().files == 1
        _spool(root, "task-0", [("out", 0, [b"retry-a", b"retry-b", b"retry-c"], {})])
        report = store.inbox.ingest()
        assert _values(store, "out") == [b"first-a", b"first-b", b"retry-a", b"retry-b", b"retry-c"]
        assert (report.files, report.rows, report.skipped, report.rewritten) == (1, 3, 0, 1)
        _spool(root, "task-0", [("out", 0, [b"retry-a", b"retry-b", b"retry-c"], {})])
        report = store.inbox.ingest()  # the same rows again: the ledger appends them once
        assert (report.files, report.rows, report.skipped, report.rewritten) == (0, 0, 1, 0)
        assert len(_values(store, "out")) == 5
        assert _inbox_names(root) == [LEDGER_NAME]


def test_a_corrupt_retry_of_a_done_name_is_quarantined_not_deleted(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore.open(root, StoreConfig(**QUIET)) as store:
        store.create_topic("out", 1)
        assert store.inbox is not None
        _spool(root, "task-0", [("out", 0, [b"payload"] * 3, {})])
        store.inbox.ingest()
        _spool(root, "task-0", [("out", 0, [b"payload"] * 3, {})])
        path = Path(root, INBOX_DIR, "task-0" + SPOOL_SUFFIX)
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0x01
        path.write_bytes(bytes(raw))
        (quarantined,) = store.inbox.ingest().quarantined
        assert isinstance(quarantined.error, CorruptSpoolError)
        assert Path(root, INBOX_DIR, QUARANTINE_DIR, "task-0.spool").read_bytes() == bytes(raw)


class _Fdatasync:
    """os.fdatasync failing with ENOSPC while ``full`` is set: the CommitLog's sync
    (MappedFile.flush) then raises DiskFullError, as on a full disk."""

    def __init__(self, real):
        self.real = real
        self.full = False
        self.refused = 0

    def __call__(self, fd):
        if self.full:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.real(fd)


def test_a_failed_sync_after_the_appends_does_not_append_them_again_next_tick(tmp_path):
    from mqstore.inbox import Inbox

    root = str(tmp_path / "s")
    with MessageStore.open(root, StoreConfig(**QUIET)) as store:
        store.create_topic("out", 1)
        _spool(
            root, "t", [("out", 0, [b"b%d-%d" % (b, i) for i in range(3)], {}) for b in range(3)]
        )
        syncs = []

        def sync():  # the disk is full at the first two syncs, has room at the third
            syncs.append(1)
            if len(syncs) <= 2:
                raise DiskFullError(errno.ENOSPC, "flush of the commitlog: disk full")

        expected = [b"b%d-%d" % (b, i) for b in range(3) for i in range(3)]
        inbox = Inbox(os.path.join(root, INBOX_DIR), store, sync=sync)
        for _ in range(2):  # the next tick while the disk is still full appends nothing
            with pytest.raises(DiskFullError):
                inbox.ingest()
            assert "t.spool" in _inbox_names(root)
            assert _values(store, "out") == expected
        report = inbox.ingest()
        assert (report.files, report.rows) == (1, 0)
        assert _values(store, "out") == expected  # no block appended twice
        assert _inbox_names(root) == [LEDGER_NAME]


@pytest.mark.parametrize("power_cut", [False, True])
def test_a_disk_full_commitlog_sync_does_not_append_the_blocks_again_after_reopen(
    tmp_path, monkeypatch, power_cut
):
    """The store's real path: ENOSPC from fdatasync in the CommitLog's flush poisons
    the log (FlushFailedError). The next writer recovers it and must not append again
    the blocks recovery kept; blocks a power cut took are appended again, not lost."""
    root = str(tmp_path / "s")
    disk = _Fdatasync(os.fdatasync)
    monkeypatch.setattr(os, "fdatasync", disk)
    config = StoreConfig(**QUIET)
    with MessageStore.open(root, config) as store:
        store.create_topic("out", 1)
    blocks = [("out", 0, [b"b%d-%d" % (b, i) for i in range(3)], {}) for b in range(3)]
    _spool(root, "t", blocks)
    store = MessageStore.open(root, config)
    assert store.inbox is not None
    synced_end = store.stats()["write_position"]
    disk.full = True
    try:
        with pytest.raises(FlushFailedError) as caught:
            store.inbox.ingest()
        assert isinstance(caught.value.__cause__, DiskFullError)
        with pytest.raises(FlushFailedError):
            store.inbox.ingest()  # the next tick: the log refuses appends until reopened
    finally:
        disk.full = False
        with pytest.raises(FlushFailedError):
            store.close()
    assert disk.refused >= 1
    assert "t.spool" in _inbox_names(root)
    if power_cut:  # the unsynced bytes never reached the disk
        files = sorted(Path(root, "commitlog").iterdir())
        log_file = max(f for f in files if int(f.name) <= synced_end)  # named by start
        raw = bytearray(log_file.read_bytes())
        cut = synced_end - int(log_file.name)
        raw[cut:] = bytes(len(raw) - cut)
        log_file.write_bytes(bytes(raw))
    with MessageStore.open(root, config) as store:
        assert store.recovered_from_crash
        assert store.inbox is not None
        store.inbox.ingest()
        expected = [b"b%d-%d" % (b, i) for b in range(3) for i in range(3)]
        assert _values(store, "out") == expected  # once each: none twice, none lost
        assert _inbox_names(root) == [LEDGER_NAME]


class _RewritingStore(_FailingStore):
    """The real store; a retried task renames a new attempt over the file being
    ingested while its first block goes in."""

    def __init__(self, store, root):
        super().__init__(store, fail_at=0, error=None)
        self.root = root

    def put_batch_buffers(self, topic, queue_id, offsets, data, **kwargs):
        if self.calls == 0:
            _spool(self.root, "t", [("out", 0, [b"retry"], {})])
        return super().put_batch_buffers(topic, queue_id, offsets, data, **kwargs)


def test_a_retry_renamed_over_a_file_being_ingested_is_kept_and_appended(tmp_path):
    from mqstore.inbox import Inbox

    root = str(tmp_path / "s")
    with MessageStore.open(root, StoreConfig(**QUIET)) as store:
        store.create_topic("out", 1)
        _spool(root, "t", [("out", 0, [b"first"], {})])
        inbox = Inbox(
            os.path.join(root, INBOX_DIR), _RewritingStore(store, root), sync=lambda: None
        )
        assert inbox.ingest().files == 1
        assert "t.spool" in _inbox_names(root)  # the retry's file, not deleted unread
        assert inbox.ingest().rewritten == 1
        assert _values(store, "out") == [b"first", b"retry"]
        assert _inbox_names(root) == [LEDGER_NAME]
