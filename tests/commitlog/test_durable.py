"""Directory durability helpers: every new directory's entry is fsynced in its
parent, and sync failures become typed errors."""

from __future__ import annotations

import errno
import os

import pytest

from mqstore.commitlog import durable
from mqstore.commitlog.durable import fsync_directory, fsync_file, makedirs_durable
from mqstore.commitlog.errors import DiskFullError, StoreError


def test_makedirs_durable_fsyncs_the_parent_of_every_new_directory(tmp_path, syscalls):
    target = tmp_path / "a" / "b" / "c"
    makedirs_durable(str(target))
    assert target.is_dir()
    synced = [path for kind, path in syscalls.events if kind == "fsync"]
    assert synced == [str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b")]
    syscalls.events.clear()
    makedirs_durable(str(target))  # nothing new: nothing to sync
    assert syscalls.events == []


@pytest.mark.parametrize(
    ("code", "expected"), [(errno.ENOSPC, DiskFullError), (errno.EIO, StoreError)]
)
def test_sync_failures_are_typed(tmp_path, monkeypatch, code, expected):
    def failing(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(durable.os, "fsync", failing)
    monkeypatch.setattr(durable.os, "fdatasync", failing)
    with pytest.raises(expected):
        fsync_directory(str(tmp_path))
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with pytest.raises(expected):
            fsync_file(fd, str(tmp_path / "f"))
    finally:
        os.close(fd)
