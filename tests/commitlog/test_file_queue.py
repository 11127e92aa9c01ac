"""MappedFileQueue.load beside a live writer: a file listed and then removed (the
writer's recovery cutting files past the log end) makes a reader list again, not
fail; the writer itself never tolerates a file that vanishes."""

from __future__ import annotations

import os

import pytest

from mqstore.commitlog import file_queue
from mqstore.commitlog.file_queue import MappedFileQueue
from tests.commitlog.conftest import SMALL_FILE_BYTES


def _two_files(open_log) -> str:
    log = open_log()
    while log.write_position < SMALL_FILE_BYTES + 10:
        log.append("t", 0, b"x" * 1000)
    directory = log.directory
    log.close()
    return directory


def _listing_with_a_ghost(monkeypatch, times: int) -> list[int]:
    """os.listdir that names one file past the end (already removed) ``times`` times."""
    real = os.listdir
    calls = [0]

    def listdir(path):
        names = real(path)
        calls[0] += 1
        if calls[0] <= times:
            last = max(int(name) for name in names if name.isdigit())
            names = [*names, f"{last + SMALL_FILE_BYTES:020d}"]
        return names

    monkeypatch.setattr(file_queue.os, "listdir", listdir)
    return calls


def test_a_reader_lists_again_when_a_listed_file_is_gone(open_log, monkeypatch):
    directory = _two_files(open_log)
    on_disk = sorted(int(name) for name in os.listdir(directory) if name.isdigit())
    calls = _listing_with_a_ghost(monkeypatch, times=2)
    queue = MappedFileQueue(directory, SMALL_FILE_BYTES, read_only=True)
    queue.load()
    try:
        assert [f.start_offset for f in queue.files] == on_disk
        assert calls[0] == 3
    finally:
        for mapped in queue.files:
            mapped.close()


def test_the_writer_and_a_reader_out_of_attempts_still_raise(open_log, monkeypatch):
    directory = _two_files(open_log)
    _listing_with_a_ghost(monkeypatch, times=1)
    with pytest.raises(FileNotFoundError):
        MappedFileQueue(directory, SMALL_FILE_BYTES, read_only=False).load()
    _listing_with_a_ghost(monkeypatch, times=file_queue.LOAD_ATTEMPTS)
    reader = MappedFileQueue(directory, SMALL_FILE_BYTES, read_only=True)
    with pytest.raises(FileNotFoundError):
        reader.load()
    assert reader.files == []


def _ending_at_the_second_file(open_log, files: int) -> str:
    """Write ``files`` files of records, closed, then zero the start of the second:
    the log now ends where it starts. Returns the log's directory."""
    log = open_log()
    while log.write_position < (files - 1) * SMALL_FILE_BYTES + 10:
        log.append("t", 0, b"x" * 1000)
    directory = log.directory
    log.close()
    second = os.path.join(directory, f"{SMALL_FILE_BYTES:020d}")
    with open(second, "r+b") as handle:
        handle.write(b"\0" * 4096)
    return str(directory)


def test_files_removed_past_the_end_stay_removed(open_log, syscalls):
    """Regression: recovery unlinked files past the log end without an fsync of the
    directory, so a power cut could bring a stale file back after the truncation."""
    directory = _ending_at_the_second_file(open_log, 3)
    syscalls.events.clear()
    reopened = open_log()
    assert reopened.write_position == SMALL_FILE_BYTES
    removed = [path for kind, path in syscalls.events if kind == "unlink"]
    assert os.path.join(directory, f"{2 * SMALL_FILE_BYTES:020d}") in removed
    # Only the removals: the allocation thread may be making the next file meanwhile
    # (create, rename, then its directory's fsync), which its own test covers.
    assert [name for name in syscalls.undurable_names() if name[0] == "unlink"] == []


def test_a_file_past_the_end_that_cannot_be_removed_is_a_store_error(open_log, monkeypatch):
    from mqstore.commitlog.errors import StoreError

    directory = _ending_at_the_second_file(open_log, 2)
    third = os.path.join(directory, f"{2 * SMALL_FILE_BYTES:020d}")
    with open(third, "wb") as handle:  # a spare past the end, for recovery to remove
        handle.truncate(SMALL_FILE_BYTES)

    def failing_unlink(path, *args, **kwargs):
        raise OSError(13, "Permission denied", path)

    monkeypatch.setattr(file_queue.os, "unlink", failing_unlink)
    with pytest.raises(StoreError, match="past the end of the log failed"):
        open_log()
    assert os.path.exists(third)
