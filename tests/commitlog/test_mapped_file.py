from __future__ import annotations

import os
import threading

import pytest

from mqstore.commitlog.errors import CorruptDataError
from mqstore.commitlog.mapped_file import MappedFile, file_name, parse_file_name


def test_names_are_20_digits_and_sort_numerically():
    names = [file_name(n) for n in (0, 1 << 30, 5 << 30)]
    assert names == sorted(names)
    assert all(len(n) == 20 for n in names)
    assert [parse_file_name(n) for n in names] == [0, 1 << 30, 5 << 30]
    assert parse_file_name("abc") is None
    assert parse_file_name("0" * 19 + "x") is None


@pytest.mark.parametrize("prewarm", [False, True])
def test_create_allocates_full_size_zeroed(tmp_path, prewarm):
    mapped = MappedFile.create(str(tmp_path), 0, 128 * 1024, prewarm, lock_memory=False)
    try:
        assert os.path.getsize(mapped.path) == 128 * 1024
        assert os.stat(mapped.path).st_blocks * 512 >= 128 * 1024  # really allocated
        assert mapped.mapping[:] == b"\0" * (128 * 1024)
        assert not any(n.endswith(".allocating") for n in os.listdir(tmp_path))
    finally:
        mapped.close()


def test_mlock_does_not_break_create(tmp_path):
    mapped = MappedFile.create(str(tmp_path), 0, 64 * 1024, True, lock_memory=True)
    mapped.mapping[0:3] = b"abc"
    mapped.close()


def test_zero_from_only_writes_non_zero_chunks(tmp_path):
    mapped = MappedFile.create(str(tmp_path), 0, 64 * 1024, False, lock_memory=False)
    mapped.mapping[100:110] = b"x" * 10
    assert mapped.zero_from(105) > 0
    assert mapped.mapping[100:105] == b"xxxxx"
    assert mapped.mapping[105:110] == b"\0" * 5
    assert mapped.zero_from(0 + 200) == 0
    mapped.close()


def test_wrong_size_is_corrupt(tmp_path):
    path = tmp_path / file_name(0)
    path.write_bytes(b"\0" * 1000)
    with pytest.raises(CorruptDataError, match="expected 4096"):
        MappedFile(str(path), 0, 4096, read_only=True)


def test_close_with_a_live_view_defers_unmap(tmp_path):
    mapped = MappedFile.create(str(tmp_path), 0, 64 * 1024, False, lock_memory=False)
    mapped.mapping[0:5] = b"hello"
    view = memoryview(mapped.mapping)[0:5]
    mapped.close()  # must not raise BufferError
    assert bytes(view) == b"hello"
    view.release()


def test_create_makes_the_size_and_the_name_durable(tmp_path, syscalls):
    """Regression: the file was renamed into place with no fsync of its directory
    (nor of its size), so a power cut could lose a file holding acknowledged records."""
    mapped = MappedFile.create(str(tmp_path), 0, 64 * 1024, False, lock_memory=False)
    mapped.close()
    tmp = os.path.join(str(tmp_path), file_name(0)) + ".allocating"
    assert syscalls.undurable_names() == []
    kinds = [(kind, path) for kind, path in syscalls.events]
    assert kinds.index(("fdatasync", tmp)) < kinds.index(("rename", mapped.path))


class _CountingEvent(threading.Event):
    """A hurry event that records how prewarm waits on it (and never sleeps)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        return super().wait(0)


def test_a_background_prewarm_pauses_between_slices(tmp_path):
    """Given a hurry event (the allocation service's background build), prewarm
    faults the file in by slices and pauses on the event after each but the last, as
    long as the slice took and at least the minimum; every page is faulted in. A set
    event ends the pauses (Event.wait returns at once); without one, none are taken."""
    from mqstore.commitlog.mapped_file import PREWARM_PAUSE_MIN_S, PREWARM_SLICE_BYTES

    hurry = _CountingEvent()
    size = PREWARM_SLICE_BYTES * 3
    mapped = MappedFile.create(str(tmp_path), 0, size, True, False, hurry=hurry)
    try:
        assert len(hurry.waits) == 2
        assert min(hurry.waits) >= PREWARM_PAUSE_MIN_S
        assert bytes(mapped.mapping[size - 8 : size]) == bytes(8)
    finally:
        mapped.close()
