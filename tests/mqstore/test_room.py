"""A new store whose first files do not fit is refused before anything is recorded;
an existing store is never refused. The filesystem's free space is injected here;
tests/mqstore/test_disk_full.py checks the same on a real small tmpfs."""

from __future__ import annotations

import os

import pytest

from mqstore import DiskFullError, MessageStore, StoreConfig
from mqstore.layout import LAYOUT_FILE
from tests.mqstore.conftest import SMALL

MIB = 1 << 20


class _Statvfs:
    """os.statvfs with ``free_bytes`` available (4 KiB blocks)."""

    def __init__(self, free_bytes: int) -> None:
        self.free_bytes = free_bytes
        self.real = os.statvfs

    def __call__(self, path):
        real = self.real(path)
        return os.statvfs_result((4096, 4096, real.f_blocks, self.free_bytes // 4096,
                                  self.free_bytes // 4096, *real[5:]))  # fmt: skip


def test_a_new_store_that_does_not_fit_names_the_sizes_and_settings(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "statvfs", _Statvfs(64 * MIB))
    path = tmp_path / "s"
    with pytest.raises(DiskFullError) as caught:
        MessageStore.open(path, StoreConfig.broker(prewarm=False))
    message = str(caught.value)
    assert "1493741872 bytes" in message  # 1 GiB of CommitLog + a 420,000,048-byte index
    assert "67108864 bytes" in message  # free
    assert "StoreConfig.commitlog_file_size_bytes=1073741824; default 134217728" in message
    assert "index_slot_count=5000000, index_entry_count=20000000" in message
    assert not os.path.exists(path / LAYOUT_FILE)  # nothing recorded: the caller may retry
    assert not os.path.exists(path / "commitlog")
    smaller = StoreConfig(**{**SMALL, "commitlog_file_size_bytes": 16 * MIB})
    with MessageStore.open(path, smaller) as store:  # lowered: it fits
        store.put("t", 0, b"x", keys=["k"])


def test_an_index_file_that_does_not_fit_is_named(tmp_path, monkeypatch):
    config = StoreConfig(**{**SMALL, "index_slot_count": 1 << 20, "index_entry_count": 1 << 22})
    monkeypatch.setattr(os, "statvfs", _Statvfs(32 * MIB))  # the CommitLog file alone fits
    with pytest.raises(DiskFullError) as caught:
        MessageStore.open(tmp_path / "s", config)
    message = str(caught.value)
    assert "a 84.0 MiB index file (index_slot_count=1048576, index_entry_count=4194304" in message
    assert "a 0.2 MiB CommitLog file" in message


def test_an_existing_store_is_never_refused(tmp_path, monkeypatch):
    path = tmp_path / "s"
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:
        store.put("t", 0, b"kept", keys=["k"])
    monkeypatch.setattr(os, "statvfs", _Statvfs(0))
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:
        assert [bytes(m.body) for m in store.get("t", 0, 0, 5)] == [b"kept"]
