"""A crash of a sync-flush broker must not turn an idempotent retry into a duplicate
(found by the chaos suite, bench/chaos.py: duplicates right after a power cut of the
leader, and, on a loaded machine, right after a SIGKILL of the leader: the same batch
twice at adjacent offsets).

It happened while the producers' state was a side journal written after the sync
flush returned and never synced. The state then became a record of the CommitLog
(``__mqstore_producer_state``) appended right after its batch, both before one sync
(``CommitLog.one_sync``): an acknowledged batch's state was durable with it (the power
cut test passed), but the SIGKILL test still failed: it stops the FUSE daemon to hold
the fsync, which also blocked the state record's own page fault, so the kill landed
between the two appends. Now the state record is the batch's trailer, one append
group with it (FLAG_GROUP_OPEN): recovery drops the batch whose trailer the kill cut
off, as Kafka's batch header carries the producer's sequences with its records, and
the retry is appended once.

Skipped without /dev/fuse or mfusepy, unless MQSTORE_REQUIRE_FUSE=1 (``make test``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from bench.powerfs import Mount, available
from mqstore.commitlog.durable import fsync_directory
from tests.mqstore.broker.test_handlers import idempotent_batch, produce_answer, produce_frame
from tests.mqstore.broker.test_producers import _kafka_python_batch, _resend

REASON = available()
REQUIRED = os.environ.get("MQSTORE_REQUIRE_FUSE") == "1"
pytestmark = pytest.mark.skipif(
    REASON is not None and not REQUIRED, reason=f"PowerFS cannot run here: {REASON}"
)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def _serve(store: str) -> tuple[subprocess.Popen[str], int]:
    """``mqstore serve`` in sync flush mode, run as the power-loss harness runs its
    writers (bench.chaos_node: no trust in this boot's abort marker, no syncfs)."""
    command = [
        sys.executable,
        "-m",
        "bench.chaos_node",
        "--store",
        store,
        "--config",
        "commitlog_file_size_bytes=1048576",
        "--config",
        "flush_mode=sync",
        "--config",
        "prewarm=false",
        "serve",
        "--listen",
        "127.0.0.1:0",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert " on 127.0.0.1:" in line, line
    return process, int(line.strip().rsplit(":", 1)[1])


def test_a_retry_after_a_power_cut_is_not_appended_again(tmp_path: Any) -> None:
    from mqstore import MessageStore

    mount = Mount(str(tmp_path / "backing"), str(tmp_path / "mnt"))
    mount.mount()
    store = os.path.join(mount.mountpoint, "store")
    os.makedirs(store)
    fsync_directory(mount.mountpoint)
    process = None
    try:
        process, port = _serve(store)
        pid, epoch, offset = _kafka_python_batch(f"127.0.0.1:{port}", "idem")
        process.kill()  # the power goes: the ack was sent, the journal write is unsynced
        process.wait(30)
        mount.cut(seed=1)
        mount.mount()
        process, port = _serve(store)
        answer = _resend(port, "idem", pid, epoch)  # the producer's retry of that batch
        process.terminate()
        assert process.wait(60) == 0
        with MessageStore.open(store, read_only=True) as reopened:
            values = [r.value for r in reopened.read_records("idem", 0, 0, 10)]
        assert values.count(b"once") == 1, values  # fails today: [b'once', b'once']
        assert (answer.error_code, answer.base_offset) == (0, offset)
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(30)
        mount.unmount()


def _values(store: str) -> list[bytes | None]:
    from mqstore import MessageStore

    with MessageStore.open(store, read_only=True) as reopened:
        return [r.value for r in reopened.read_records("idem", 0, 0, 10)]


def test_a_retry_after_a_sigkill_during_the_flush_is_not_appended_again(tmp_path: Any) -> None:
    mount = Mount(str(tmp_path / "backing"), str(tmp_path / "mnt"))
    mount.mount()
    store = os.path.join(mount.mountpoint, "store")
    os.makedirs(store)
    fsync_directory(mount.mountpoint)
    assert mount.process is not None
    process = None
    try:
        process, port = _serve(store)
        pid, epoch, _ = _kafka_python_batch(f"127.0.0.1:{port}", "idem")
        retried = idempotent_batch(pid, 1, 1, epoch=epoch, value=b"retried")
        mount.process.send_signal(signal.SIGSTOP)  # the disk hangs: the fsync waits
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(produce_frame("idem", retried, 5))  # appended, then the flush
            time.sleep(1.0)
            process.kill()  # inside the flush: the page cache keeps the record
            time.sleep(0.5)
            mount.process.send_signal(signal.SIGCONT)
            process.wait(30)
        process, port = _serve(store)
        answer = produce_answer(port, produce_frame("idem", retried, 6))  # the retry
        process.terminate()
        assert process.wait(60) == 0
        values = _values(store)
        assert values.count(b"retried") == 1, values  # was: [b"once", b"retried", b"retried"]
        assert (answer.error_code, answer.base_offset) == (0, 1)
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(30)
        if mount.process is not None:
            mount.process.send_signal(signal.SIGCONT)  # never leave the daemon stopped
        mount.unmount()
