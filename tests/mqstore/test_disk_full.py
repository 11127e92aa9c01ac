"""Disk full: a put raises DiskFullError, nothing stored is lost, writes resume.

Two ways to fill the disk:
- a real 4 MiB tmpfs (``mount -t tmpfs``, needs root; skipped otherwise). The
  scenario runs in a child process, so a SIGBUS (a write through a mapping into a
  hole of a sparse file on a full filesystem) shows up as a signal, not a dead pytest.
  Small tmpfs mounts also show that a new store too big for its filesystem is refused
  at open, naming what it needs (mqstore.room), and that the defaults fit 160 MiB;
- injected ENOSPC from ``os.posix_fallocate``: CommitLog files (allocation service)
  and ConsumeQueue files (created by the dispatcher thread) fail to allocate until
  space "frees".

The disk-usage probe is pinned to 0 % so the retention watermarks (which delete or
reject on purpose) stay out of the way: this tests ENOSPC itself (alibaba/rocketmq#331).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore import DiskFullError, MessageStore, StoreConfig
from tests.mqstore.conftest import SMALL

FS_SIZE = "4m"
BALLAST_BYTES = 768 * 1024  # freed later: "space frees"
PUTS_MAX = 200_000  # bound the fill loop; 4 MiB fills long before
DEADLINE_S = 10.0


def _config(**overrides: object) -> StoreConfig:
    return StoreConfig(**{**SMALL, "consumequeue_units_per_file": 256, **overrides})


def _no_disk_usage() -> float:
    return 0.0


def _body(i: int) -> bytes:
    return b"%08d" % i + b"d" * 300


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _read_all(store: MessageStore, count: int) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < count:
        batch = store.get("t", 0, len(out), 1000)
        assert batch, f"nothing at {len(out)} of {count}"
        out.extend(bytes(m.body) for m in batch)
    return out


def fill_scenario(fs: str) -> dict[str, object]:
    """Run in a child process on the small filesystem ``fs``; returns figures."""
    ballast = os.path.join(fs, "ballast")
    with open(ballast, "wb") as handle:
        handle.write(b"\1" * BALLAST_BYTES)
    path = os.path.join(fs, "store")
    config = _config(index_slot_count=4096, index_entry_count=16384)  # a ~400 KiB sparse index
    store = MessageStore.open(path, config, disk_usage_percent=_no_disk_usage)
    acked = 0
    error: DiskFullError | None = None
    for i in range(PUTS_MAX):
        try:
            store.put("t", 0, _body(i), keys=[f"k{i}"])
        except DiskFullError as caught:
            error = caught
            break
        acked += 1
    assert error is not None, "the filesystem never filled"
    message = str(error)
    try:
        store.put("t", 0, _body(acked))  # the same size: it does not fit either
        second_refused = False
    except DiskFullError:
        second_refused = True
    os.unlink(ballast)  # space frees
    resumed = 0
    for i in range(acked, acked + 50):
        store.put("t", 0, _body(i), keys=[f"k{i}"])
        resumed += 1
    total = acked + resumed
    _wait(lambda: store.max_offset("t", 0) == total, "the dispatcher to catch up")
    assert _read_all(store, total) == [_body(i) for i in range(total)]
    store.close()
    with MessageStore.open(path, config, disk_usage_percent=_no_disk_usage) as again:
        assert _read_all(again, total) == [_body(i) for i in range(total)]
        hits = again.query_by_key("t", f"k{acked - 1}", 0, 2**62, 2)
        assert [bytes(m.body) for m in hits] == [_body(acked - 1)]
    return {"acked": acked, "message": message, "second_refused": second_refused, "total": total}


@contextlib.contextmanager
def _tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted under ``tmp_path`` (the test is skipped without the
    right to mount one)."""
    mount_point = tmp_path / f"fs-{size}"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def small_fs(tmp_path):
    with _tmpfs(tmp_path, FS_SIZE) as mount_point:
        yield mount_point


def test_full_tmpfs_refuses_puts_keeps_data_and_resumes(small_fs):
    root = Path(__file__).resolve().parents[2]
    code = (
        "import json, sys; from tests.mqstore.test_disk_full import fill_scenario; "
        "print(json.dumps(fill_scenario(sys.argv[1])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(small_fs)],
        capture_output=True,
        cwd=root,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr.decode()[-3000:])
    figures = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert figures["acked"] > 1_000
    assert "no room" in figures["message"] or "disk full" in figures["message"]
    assert figures["second_refused"]


def _du_bytes(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks, as du counts)."""
    return sum(
        os.stat(os.path.join(directory, name)).st_blocks * 512
        for directory, _, names in os.walk(path)
        for name in names
    )


def test_the_broker_profile_is_refused_by_512_mib_and_the_defaults_open(tmp_path):
    with _tmpfs(tmp_path, "512m") as fs:
        path = fs / "store"
        with pytest.raises(DiskFullError) as caught:
            MessageStore.open(path, StoreConfig.broker(), disk_usage_percent=_no_disk_usage)
        message = str(caught.value)
        assert "need 1493741872 bytes" in message  # 1 GiB CommitLog file + 420 MB index
        assert "StoreConfig.commitlog_file_size_bytes=1073741824" in message
        assert "lower those settings" in message
        assert not (path / "layout").exists()  # nothing recorded: open again, smaller
        with MessageStore.open(path, disk_usage_percent=_no_disk_usage) as store:  # defaults
            store.put("orders", 0, b"first", keys=["order-1"])
            _wait(lambda: store.query_by_key("orders", "order-1", 0, 2**62, 1), "the index")
        used_bytes = _du_bytes(path)
        assert 128 << 20 <= used_bytes <= 152 << 20  # one CommitLog file, one index file
        with MessageStore.open(path, read_only=True) as reader:
            assert reader.config.commitlog_file_size_bytes == 128 << 20
            assert [bytes(m.body) for m in reader.get("orders", 0, 0, 5)] == [b"first"]


def test_the_defaults_open_on_160_mib(tmp_path):
    with (
        _tmpfs(tmp_path, "160m") as fs,
        MessageStore.open(fs / "store", disk_usage_percent=_no_disk_usage) as store,
    ):
        assert store.put("orders", 0, b"first", keys=["order-1"]).queue_offset == 0
        _wait(lambda: store.query_by_key("orders", "order-1", 0, 2**62, 1), "the index")


class _Disk:
    """posix_fallocate that fails with ENOSPC while ``full`` is set."""

    def __init__(self, real) -> None:
        self.real = real
        self.full = False
        self.refused = 0

    def __call__(self, fd: int, offset: int, length: int) -> None:
        if self.full:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.real(fd, offset, length)


def test_injected_enospc_in_commitlog_and_consumequeue_files(tmp_path, monkeypatch, caplog):
    disk = _Disk(os.posix_fallocate)
    monkeypatch.setattr(os, "posix_fallocate", disk)
    config = _config(commitlog_file_size_bytes=64 * 1024, consumequeue_units_per_file=64)
    store = MessageStore.open(tmp_path / "s", config, disk_usage_percent=_no_disk_usage)
    try:
        acked = 0
        for i in range(100):
            store.put("t", 0, _body(i))
            acked += 1
        _wait(lambda: store.max_offset("t", 0) == acked, "dispatch before the disk fills")
        disk.full = True
        with pytest.raises(DiskFullError) as caught:
            for i in range(acked, acked + 1_000):  # fits in what is left, then the roll fails
                store.put("t", 0, _body(i))
                acked += 1
        assert "no room" in str(caught.value)
        assert disk.refused >= 1
        # The dispatcher cannot create the next ConsumeQueue file either: it must log
        # and retry, and a reader must never see a wrong message meanwhile.
        visible = store.max_offset("t", 0)
        assert visible <= acked
        disk.full = False
        for i in range(acked, acked + 100):
            store.put("t", 0, _body(i))
            acked += 1
        _wait(lambda: store.max_offset("t", 0) == acked, "the dispatcher to catch up")
        assert _read_all(store, acked) == [_body(i) for i in range(acked)]
    finally:
        store.close()
    with MessageStore.open(tmp_path / "s", config, disk_usage_percent=_no_disk_usage) as again:
        assert _read_all(again, acked) == [_body(i) for i in range(acked)]
