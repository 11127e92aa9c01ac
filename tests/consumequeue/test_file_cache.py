"""FileCache: the bounded LRU of mapped files, deferred syncs, views after eviction."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from mqstore.commitlog.errors import FlushFailedError, StoreError
from mqstore.consumequeue import UNIT
from mqstore.consumequeue import file_cache as file_cache_module
from mqstore.consumequeue.file_cache import FileCache
from mqstore.consumequeue.mapped_file import MappedUnitFile

UPF = 8


def make_file(directory: str, name: str) -> MappedUnitFile:
    path = os.path.join(directory, name)
    MappedUnitFile.create(path, UPF, 0, np.zeros(1, dtype=UNIT))
    return MappedUnitFile.open(path, UPF, read_only=False)


@pytest.fixture
def directory(tmp_path: object) -> str:
    return str(tmp_path)


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(
        file_cache_module, "sync_path", lambda path, directory=False: calls.append(path)
    )
    return calls


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_evicts_the_least_recently_used(directory: str) -> None:
    cache = FileCache(3, threading.RLock())
    files = [make_file(directory, f"f{index}") for index in range(4)]
    for index in range(3):
        cache.add((0, index, 0), files[index])
    assert cache.get((0, 0, 0)) is files[0]  # now the most recently used
    cache.add((0, 3, 0), files[3])
    assert len(cache) == 3
    assert cache.get((0, 1, 0)) is None  # the coldest went
    assert cache.get((0, 0, 0)) is files[0]
    assert cache.max_open_files == 3


def test_eviction_releases_the_descriptor(directory: str) -> None:
    cache = FileCache(2, threading.RLock())
    baseline = open_fds()
    for index in range(10):
        cache.add((0, index, 0), make_file(directory, f"f{index}"))
    assert open_fds() <= baseline + 2
    cache.close()
    assert open_fds() <= baseline


def test_a_view_outlives_eviction(directory: str) -> None:
    cache = FileCache(2, threading.RLock())
    mapped = make_file(directory, "kept")
    mapped.commitlog_offsets[0] = 42
    view = mapped.units[:2]
    cache.add((0, 0, 0), mapped)
    del mapped
    for index in range(1, 5):
        cache.add((0, index, 0), make_file(directory, f"f{index}"))
    assert cache.get((0, 0, 0)) is None
    assert int(view["commitlog_offset"][0]) == 42  # the mapping lives on through the view
    held = open_fds()
    del view
    assert open_fds() == held - 1  # and goes with it


def test_dirty_evicted_files_are_synced_by_flush(directory: str, synced: list[str]) -> None:
    cache = FileCache(2, threading.RLock())
    files = [make_file(directory, f"f{index}") for index in range(4)]
    files[0].dirty = True
    files[2].dirty = True
    for index, mapped in enumerate(files):
        cache.add((0, index, 0), mapped)
    files[3].dirty = True  # still cached
    cache.note_directory_changed(directory)
    cache.flush()
    assert sorted(synced[:3]) == sorted([files[0].path, files[2].path, files[3].path])
    assert synced[3:] == [directory]  # directories after the files
    synced.clear()
    cache.flush()
    assert synced == []


def test_discarded_files_are_not_synced(directory: str, synced: list[str]) -> None:
    cache = FileCache(2, threading.RLock())
    first = make_file(directory, "a")
    first.dirty = True
    cache.add((7, 0, 0), first)
    cache.add((7, 1, 0), make_file(directory, "b"))
    cache.add((8, 0, 0), make_file(directory, "c"))  # evicts "a" (dirty)
    cache.discard((7, 0, 0))
    cache.discard_queue(7)
    assert cache.get((7, 1, 0)) is None
    cache.flush()
    assert first.path in synced  # evicted before it was discarded: still synced
    synced.clear()
    cache.note_file_written(first.path)
    cache.add((9, 0, 0), first)
    cache.discard((9, 0, 0))  # a deleted file is forgotten
    cache.flush()
    assert synced == []


def test_flush_of_one_queue_directory(directory: str, synced: list[str]) -> None:
    cache = FileCache(4, threading.RLock())
    queue_a = os.path.join(directory, "t", "1")
    queue_b = os.path.join(directory, "t", "2")
    for path in (queue_a, queue_b):
        os.makedirs(path)
        cache.note_file_written(os.path.join(path, "x"))
        cache.note_directory_changed(path)
    cache.note_directory_changed(os.path.join(directory, "t"))
    cache.flush(queue_a)
    assert synced == [os.path.join(queue_a, "x"), queue_a, os.path.join(directory, "t")]
    synced.clear()
    cache.flush()
    assert synced == [os.path.join(queue_b, "x"), queue_b]


def test_a_failed_sync_is_never_retried_and_trusted(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linux marks the pages of a failed writeback clean: a second sync of "b" would
    succeed without writing them. So after one failure every flush refuses."""
    cache = FileCache(2, threading.RLock())
    calls: list[str] = []
    failures = [os.path.join(directory, "b")]  # the first sync of "b" fails

    def failing(path: str, directory: bool = False) -> None:
        calls.append(path)
        if path in failures:
            failures.remove(path)
            raise StoreError("disk on fire")

    monkeypatch.setattr(file_cache_module, "sync_path", failing)
    for name in ("a", "b", "c"):
        cache.note_file_written(os.path.join(directory, name))
    with pytest.raises(FlushFailedError, match="disk on fire"):
        cache.flush()
    assert isinstance(cache.failure, StoreError)
    calls.clear()
    cache.note_file_written(os.path.join(directory, "d"))
    with pytest.raises(FlushFailedError, match="disk on fire"):
        cache.flush()
    assert calls == []  # nothing synced, nothing claimed


def test_many_paths_use_one_syncfs(
    directory: str, synced: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    filesystems: list[str] = []

    def sync_filesystem(path: str) -> bool:
        filesystems.append(path)
        return True

    monkeypatch.setattr(file_cache_module, "sync_filesystem", sync_filesystem)
    cache = FileCache(2, threading.RLock())
    for index in range(file_cache_module.SYNCFS_MIN_PATHS):
        cache.note_file_written(os.path.join(directory, f"f{index}"))
    cache.flush()
    assert synced == []
    assert filesystems == [directory]


def test_pending_paths_are_bounded(
    directory: str, synced: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_cache_module, "PENDING_SYNC_MAX", 3)
    monkeypatch.setattr(file_cache_module, "SYNCFS_MIN_PATHS", 100)
    cache = FileCache(2, threading.RLock())
    for index in range(4):
        cache.note_file_written(os.path.join(directory, f"f{index}"))
    assert len(synced) == 4  # the fourth forced a sync of all
    cache.flush()
    assert len(synced) == 4
