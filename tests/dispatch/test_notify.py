"""The notify file: a writer's bumps wake followers sleeping in futex(2), in this
process and in another one; a missing, short or foreign file leaves followers to
poll (Follower.open returns None) and never raises."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mqstore.dispatch import notify
from mqstore.dispatch.notify import NOTICE_NAME, NOTICE_SIZE, SEQUENCE_OFFSET, Follower, Notifier

pytestmark = pytest.mark.skipif(notify._syscall is None, reason="futex(2) is Linux only")

ROOT = Path(__file__).resolve().parents[2]
LONG_WAIT_S = 60.0  # a follower still asleep after this was never woken
JOIN_S = 30.0


def test_bump_moves_the_sequence_and_wraps(tmp_path):
    notifier = Notifier.create(str(tmp_path))
    follower = Follower.open(str(tmp_path))
    assert notifier is not None
    assert follower is not None
    try:
        before = follower.sequence
        notifier.bump()
        notifier.bump()
        assert follower.sequence == before + 2
        struct.pack_into("<I", notifier._mapping.map, SEQUENCE_OFFSET, 0xFFFF_FFFF)
        notifier.bump()
        assert follower.sequence == 0
    finally:
        follower.close()
        notifier.close()


def test_wait_returns_at_once_on_a_stale_sequence_and_times_out_on_the_current(tmp_path):
    notifier = Notifier.create(str(tmp_path))
    follower = Follower.open(str(tmp_path))
    assert notifier is not None
    assert follower is not None
    try:
        current = follower.sequence
        assert current is not None
        started = time.monotonic()
        follower.wait((current - 1) & 0xFFFF_FFFF, LONG_WAIT_S)  # changed already
        assert time.monotonic() - started < LONG_WAIT_S / 2
        started = time.monotonic()
        follower.wait(current, 0.05)
        assert time.monotonic() - started >= 0.04  # slept (futex timeouts are not early)
    finally:
        follower.close()
        notifier.close()


def test_a_bump_wakes_a_sleeping_follower_thread(tmp_path):
    notifier = Notifier.create(str(tmp_path))
    follower = Follower.open(str(tmp_path))
    assert notifier is not None
    assert follower is not None
    sequence = follower.sequence
    assert sequence is not None
    took: list[float] = []

    def sleeper() -> None:
        started = time.monotonic()
        follower.wait(sequence, LONG_WAIT_S)
        took.append(time.monotonic() - started)

    thread = threading.Thread(target=sleeper)
    thread.start()
    time.sleep(0.1)  # asleep in futex by now (a bump before that also ends the wait)
    notifier.bump()
    thread.join(JOIN_S)
    try:
        assert took and took[0] < LONG_WAIT_S / 2
    finally:
        follower.close()
        notifier.close()


FOLLOWER = """
import sys, time
from mqstore.dispatch.notify import Follower
follower = Follower.open(sys.argv[1])
sequence = follower.sequence
print("ready", flush=True)
started = time.monotonic()
follower.wait(sequence, float(sys.argv[2]))
print(follower.sequence != sequence, time.monotonic() - started, flush=True)
"""


def test_a_bump_wakes_a_follower_in_another_process(tmp_path):
    notifier = Notifier.create(str(tmp_path))
    assert notifier is not None
    child = subprocess.Popen(
        [sys.executable, "-c", FOLLOWER, str(tmp_path), str(LONG_WAIT_S)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.1)
        notifier.bump()
        changed, took_s = child.stdout.readline().split()
        assert changed == "True"
        assert float(took_s) < LONG_WAIT_S / 2
        assert child.wait(JOIN_S) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(JOIN_S)
        notifier.close()


@pytest.mark.parametrize(
    "content",
    [b"", b"\x00" * 8, b"\x00" * NOTICE_SIZE, b"\xff" * NOTICE_SIZE, b"x" * (NOTICE_SIZE * 2)],
    ids=["empty", "short", "zeros", "foreign magic", "too long"],
)
def test_a_bad_notice_file_leaves_the_follower_to_poll(tmp_path, content):
    (tmp_path / NOTICE_NAME).write_bytes(content)
    assert Follower.open(str(tmp_path)) is None


def test_a_missing_notice_file_leaves_the_follower_to_poll(tmp_path):
    assert Follower.open(str(tmp_path)) is None  # a store from before the file existed


def test_another_version_is_not_followed(tmp_path):
    notifier = Notifier.create(str(tmp_path))
    assert notifier is not None
    notifier.close()
    path = tmp_path / NOTICE_NAME
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 4, notify.VERSION + 1)
    path.write_bytes(bytes(data))
    assert Follower.open(str(tmp_path)) is None


def test_the_writer_takes_over_a_bad_file_and_keeps_its_size(tmp_path):
    path = tmp_path / NOTICE_NAME
    path.write_bytes(b"junk" * 100)
    notifier = Notifier.create(str(tmp_path))
    assert notifier is not None
    try:
        assert os.path.getsize(path) == NOTICE_SIZE
        follower = Follower.open(str(tmp_path))
        assert follower is not None
        follower.close()
    finally:
        notifier.close()


def test_bump_after_close_is_a_no_op(tmp_path):
    notifier = Notifier.create(str(tmp_path))
    assert notifier is not None
    notifier.close()
    notifier.bump()  # a round finishing while the store closes
    assert notifier.bumps == 0


def test_a_directory_where_the_notice_file_goes_leaves_followers_to_poll(tmp_path):
    """Not a bare IsADirectoryError at the store's open: the notice is optional."""
    from mqstore import MessageStore

    (tmp_path / NOTICE_NAME).mkdir()
    assert Notifier.create(str(tmp_path)) is None
    assert Follower.open(str(tmp_path)) is None
    store_root = tmp_path / "store"
    store_root.mkdir()
    (store_root / NOTICE_NAME).mkdir()
    with MessageStore.open(store_root) as store:
        store.put("t", 0, b"v")
        with MessageStore.open(store_root, read_only=True) as reader:
            assert reader.wait_for("t", 0, 0, 1_000)
            assert bytes(reader.get("t", 0, 0, 1)[0].body) == b"v"
