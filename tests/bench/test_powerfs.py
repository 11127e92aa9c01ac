"""PowerFS's loss model: what a cut keeps and loses, file by file.

Each test mounts a fresh PowerFS, does a few writes and syncs, cuts the power, mounts
the crash state and looks. Skipped without /dev/fuse or mfusepy, unless
MQSTORE_REQUIRE_FUSE=1 (``make test``), which turns a missing FUSE into failures.
"""

from __future__ import annotations

import mmap
import os

import pytest

from bench.powerfs import PAGE_BYTES, SECTOR_BYTES, Mount, available

REASON = available()
REQUIRED = os.environ.get("MQSTORE_REQUIRE_FUSE") == "1"
pytestmark = pytest.mark.skipif(
    REASON is not None and not REQUIRED, reason=f"PowerFS cannot run here: {REASON}"
)
SEEDS = 8  # cuts per "some seeds do X" test (seeded, so the outcome is fixed)


@pytest.fixture
def fs(tmp_path):
    mount = Mount(str(tmp_path / "backing"), str(tmp_path / "mnt"))
    mount.mount()
    yield mount
    mount.unmount()


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path, data, sync=True):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def read(path):
    with open(path, "rb") as handle:
        return handle.read()


def test_fuse_is_available():
    """With MQSTORE_REQUIRE_FUSE=1 a machine without FUSE fails here, not silently."""
    assert REASON is None, REASON


def test_unsynced_write_vanishes_synced_survives(fs):
    root = fs.mountpoint
    write_file(f"{root}/a", b"A" * 100)
    fsync_dir(root)
    fd = os.open(f"{root}/a", os.O_RDWR)
    os.pwrite(fd, b"B" * 100, 100)  # an unsynced extension: lost with the size
    os.close(fd)
    write_file(f"{root}/b", b"never synced", sync=False)
    fsync_dir(root)  # b's name is durable, its content and size are not
    figures = fs.cut(seed=1)
    fs.mount()
    assert read(f"{root}/a") == b"A" * 100
    assert read(f"{root}/b") == b""
    assert figures.sizes_reverted == 2


def test_new_file_without_directory_fsync_is_gone(fs):
    root = fs.mountpoint
    write_file(f"{root}/synced-data-only", b"x" * 10)  # fdatasync, but no directory fsync
    fs.cut(seed=1)
    fs.mount()
    assert os.listdir(root) == [".powerfs"]


def test_rename_without_directory_fsync_is_undone(fs):
    root = fs.mountpoint
    write_file(f"{root}/old.tmp", b"content")
    write_file(f"{root}/target", b"previous")
    fsync_dir(root)
    os.rename(f"{root}/old.tmp", f"{root}/target")
    assert read(f"{root}/target") == b"content"
    fs.cut(seed=1)
    fs.mount()
    assert read(f"{root}/old.tmp") == b"content"
    assert read(f"{root}/target") == b"previous"


def test_rename_with_directory_fsync_survives(fs):
    root = fs.mountpoint
    write_file(f"{root}/old.tmp", b"content")
    fsync_dir(root)
    os.rename(f"{root}/old.tmp", f"{root}/final")
    fsync_dir(root)
    fs.cut(seed=1)
    fs.mount()
    assert sorted(os.listdir(root)) == [".powerfs", "final"]
    assert read(f"{root}/final") == b"content"


def test_unlink_without_directory_fsync_is_undone(fs):
    root = fs.mountpoint
    os.mkdir(f"{root}/d")
    fsync_dir(root)
    write_file(f"{root}/d/f", b"keep me")
    fsync_dir(f"{root}/d")
    os.unlink(f"{root}/d/f")
    fs.cut(seed=1)
    fs.mount()
    assert read(f"{root}/d/f") == b"keep me"


def test_new_directory_needs_its_parents_fsync(fs):
    root = fs.mountpoint
    os.mkdir(f"{root}/d")
    write_file(f"{root}/d/f", b"data")
    fsync_dir(f"{root}/d")  # d's entries, but not d itself
    fs.cut(seed=1)
    fs.mount()
    assert not os.path.exists(f"{root}/d")


def test_fdatasynced_mmap_page_survives(fs):
    root = fs.mountpoint
    fd = os.open(f"{root}/m", os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, 4 * PAGE_BYTES)
    os.fdatasync(fd)
    fsync_dir(root)
    mapping = mmap.mmap(fd, 4 * PAGE_BYTES)
    mapping[PAGE_BYTES : PAGE_BYTES + 5] = b"hello"
    os.fdatasync(fd)  # writes the mapping's dirty page back, then syncs
    mapping.close()
    os.close(fd)
    fs.cut(seed=1)
    fs.mount()
    data = read(f"{root}/m")
    assert len(data) == 4 * PAGE_BYTES
    assert data[PAGE_BYTES : PAGE_BYTES + 5] == b"hello"


def test_unsynced_mmap_page_is_lost_in_some_cuts_kept_in_others(tmp_path):
    outcomes = set()
    for seed in range(SEEDS):
        mount = Mount(str(tmp_path / f"b{seed}"), str(tmp_path / f"m{seed}"))
        with mount:
            path = f"{mount.mountpoint}/m"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            os.posix_fallocate(fd, 0, PAGE_BYTES)
            os.fdatasync(fd)
            fsync_dir(mount.mountpoint)
            mapping = mmap.mmap(fd, PAGE_BYTES)
            mapping[:5] = b"later"  # no msync: written back on close, never synced
            mapping.close()
            os.close(fd)
            mount.cut(seed)
        with mount:
            outcomes.add(read(path)[:5])
    assert b"\0" * 5 in outcomes  # lost
    assert b"later" in outcomes  # written back before the cut


def test_torn_pages_appear_in_some_seeds(tmp_path):
    pages = 8
    torn = 0
    for seed in range(SEEDS):
        mount = Mount(str(tmp_path / f"b{seed}"), str(tmp_path / f"m{seed}"))
        with mount:
            path = f"{mount.mountpoint}/f"
            write_file(path, b"\x11" * pages * PAGE_BYTES)
            fsync_dir(mount.mountpoint)
            write_file(path, b"\x22" * pages * PAGE_BYTES, sync=False)
            figures = mount.cut(seed)
        with mount:
            data = read(path)
        assert len(data) == pages * PAGE_BYTES
        for page in range(pages):
            chunk = data[page * PAGE_BYTES : (page + 1) * PAGE_BYTES]
            sectors = {chunk[s : s + SECTOR_BYTES] for s in range(0, PAGE_BYTES, SECTOR_BYTES)}
            assert sectors <= {b"\x11" * SECTOR_BYTES, b"\x22" * SECTOR_BYTES}
            torn += len(sectors) == 2
        assert figures.dirty_pages == pages
    assert torn > 0


def test_unsynced_shrink_is_undone(fs):
    root = fs.mountpoint
    write_file(f"{root}/f", b"z" * 3 * PAGE_BYTES)
    fsync_dir(root)
    os.truncate(f"{root}/f", 10)
    fs.cut(seed=3)
    fs.mount()
    data = read(f"{root}/f")
    assert len(data) == 3 * PAGE_BYTES
    assert data[:10] == b"z" * 10


def test_writes_after_the_cut_are_discarded(fs):
    root = fs.mountpoint
    write_file(f"{root}/f", b"before")
    fsync_dir(root)
    fd = os.open(f"{root}/f", os.O_RDWR)
    control = os.open(f"{root}/.powerfs", os.O_WRONLY)
    try:
        os.write(control, b"cut 1 all")
        os.pwrite(fd, b"after!", 0)
        os.fdatasync(fd)
    finally:
        os.close(control)
        os.close(fd)
    fs.unmount()
    fs.mount()
    assert read(f"{root}/f") == b"before"
