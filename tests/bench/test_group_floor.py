"""bench/group_floor.py's group commit is correct (every put is written and synced
once, in groups); its speed is bench/put.py's business, never a test's."""

from __future__ import annotations

import os
import threading

from bench.group_floor import _Groups, python_groups


def test_every_put_is_written_once_and_the_file_holds_them(tmp_path):
    path = str(tmp_path / "groups")
    assert python_groups(path, 80, 4, 10) > 0
    with open(path, "rb") as file:
        assert file.read() == b"g" * 800  # the zeros written first, all overwritten


def test_puts_share_syncs_and_a_writer_joining_during_a_sync_leads_the_next(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        groups = _Groups(fd, 8, 4)
        workers = [
            threading.Thread(target=lambda: [groups.put() for _ in range(25)]) for _ in range(4)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
        assert not any(worker.is_alive() for worker in workers)  # nobody left waiting
        assert 25 <= groups.syncs < 100  # at least one per put of a writer, and shared
        assert os.fstat(fd).st_size == 100 * 8
    finally:
        os.close(fd)
