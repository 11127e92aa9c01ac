"""The allocation service (commitlog/allocator.py): files parked or being built past a
cut are discarded, so that no spare follows a gap in the CommitLog directory."""

from __future__ import annotations

import os
import threading
import time

import pytest

from mqstore.commitlog.allocator import AllocationService

from .conftest import SMALL_FILE_BYTES


def _path(directory: str, start: int) -> str:
    return os.path.join(directory, f"{start:020d}")


def _wait_exists(path: str) -> None:
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} was never built"
        time.sleep(0.01)


def test_a_parked_file_past_the_cut_is_removed_and_built_again_on_demand(tmp_path):
    directory = str(tmp_path)
    service = AllocationService(directory, SMALL_FILE_BYTES, prewarm=False, mlock=False)
    try:
        service.request(3 * SMALL_FILE_BYTES)
        _wait_exists(_path(directory, 3 * SMALL_FILE_BYTES))
        assert service.discard_from(SMALL_FILE_BYTES) == 1
        assert os.listdir(directory) == []
        assert service.discard_from(0) == 0  # nothing left
        mapped = service.take(3 * SMALL_FILE_BYTES)  # made now, not the discarded one
        assert os.listdir(directory) == [f"{3 * SMALL_FILE_BYTES:020d}"]
        mapped.close()
    finally:
        service.close()


def test_a_parked_file_below_the_cut_stays(tmp_path):
    directory = str(tmp_path)
    service = AllocationService(directory, SMALL_FILE_BYTES, prewarm=False, mlock=False)
    try:
        service.request(SMALL_FILE_BYTES)
        _wait_exists(_path(directory, SMALL_FILE_BYTES))
        assert service.discard_from(2 * SMALL_FILE_BYTES) == 0
        mapped = service.take(SMALL_FILE_BYTES)
        assert mapped.path == _path(directory, SMALL_FILE_BYTES)
        mapped.close()
    finally:
        service.close()


def test_a_discard_waits_for_the_build_in_progress_and_removes_it(tmp_path, monkeypatch):
    started, release = threading.Event(), threading.Event()
    real_build = AllocationService._build

    def gated_build(self, start_offset, hurry=None):
        started.set()
        assert release.wait(30)
        return real_build(self, start_offset, hurry)

    monkeypatch.setattr(AllocationService, "_build", gated_build)
    directory = str(tmp_path)
    service = AllocationService(directory, SMALL_FILE_BYTES, prewarm=False, mlock=False)
    try:
        service.request(2 * SMALL_FILE_BYTES)
        assert started.wait(30)
        removed: list[int] = []
        discard = threading.Thread(target=lambda: removed.append(service.discard_from(0)))
        discard.start()
        discard.join(0.2)
        assert discard.is_alive()  # it waits for the build: the file is not on disk yet
        release.set()
        discard.join(30)
        assert removed == [1]
        assert os.listdir(directory) == []
    finally:
        release.set()
        service.close()


def test_a_failed_unlink_is_a_store_error_and_every_parked_file_is_closed(tmp_path, monkeypatch):
    from mqstore.commitlog.errors import StoreError
    from mqstore.commitlog.mapped_file import MappedFile

    directory = str(tmp_path)
    service = AllocationService(directory, SMALL_FILE_BYTES, prewarm=False, mlock=False)
    closed: list[str] = []
    real_close = MappedFile.close

    def counting_close(self):
        closed.append(self.path)
        real_close(self)

    def failing_unlink(path, *args, **kwargs):
        raise OSError(5, "Input/output error", path)

    try:
        service.request(SMALL_FILE_BYTES)
        _wait_exists(_path(directory, SMALL_FILE_BYTES))
        monkeypatch.setattr(MappedFile, "close", counting_close)
        monkeypatch.setattr("mqstore.commitlog.allocator.os.unlink", failing_unlink)
        with pytest.raises(StoreError, match="parked CommitLog file"):
            service.discard_from(0)
        assert closed == [_path(directory, SMALL_FILE_BYTES)]
    finally:
        service.close()
