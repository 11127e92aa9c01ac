from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mqstore.commitlog.errors import StoreLockedError
from mqstore.commitlog.lock import StoreLock, clear_abort, mark_abort


def test_second_writer_in_the_same_process_is_refused(tmp_path):
    lock = StoreLock.acquire(str(tmp_path))
    with pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"):
        StoreLock.acquire(str(tmp_path))
    lock.release()
    StoreLock.acquire(str(tmp_path)).release()


def test_second_writer_in_another_process_is_refused(tmp_path):
    lock = StoreLock.acquire(str(tmp_path))
    code = (
        "import sys\n"
        "from mqstore.commitlog.lock import StoreLock\n"
        "from mqstore.commitlog.errors import StoreLockedError\n"
        "try:\n"
        f"    StoreLock.acquire({str(tmp_path)!r})\n"
        "except StoreLockedError:\n"
        "    sys.exit(3)\n"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 3
    lock.release()
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_lock_of_a_killed_process_is_taken_over(tmp_path):
    code = (
        "import sys, time\n"
        "from mqstore.commitlog.lock import StoreLock\n"
        f"StoreLock.acquire({str(tmp_path)!r})\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "locked"
    with pytest.raises(StoreLockedError):
        StoreLock.acquire(str(tmp_path))
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 5
    while True:  # the kernel drops the flock when the holder dies
        try:
            StoreLock.acquire(str(tmp_path)).release()
            break
        except StoreLockedError:
            assert time.monotonic() < deadline
            time.sleep(0.01)


def test_abort_marker_tells_a_crash_from_a_clean_close(tmp_path):
    root = str(tmp_path)
    assert mark_abort(root) is False  # first open
    clear_abort(root)
    assert mark_abort(root) is False  # clean close before
    assert mark_abort(root) is True  # never cleared: a crash
