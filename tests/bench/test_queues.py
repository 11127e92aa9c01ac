"""bench/queues.py's CommitLog case, small: the topic created first or grown by the
puts, every sampled queue read back (the case raises if one is short)."""

from __future__ import annotations

import pytest

from bench.queues import _commitlog_case


@pytest.mark.parametrize("create", [True, False])
def test_the_commitlog_case_reads_back_every_sampled_queue(tmp_path, create):
    figures = _commitlog_case(str(tmp_path / "s"), 300, 700, create=create)
    assert figures["readable_msg_per_s"] > 0
    assert figures["put_msg_per_s"] >= figures["readable_msg_per_s"]
    assert figures["open_fds_growth"] < 100  # 300 queues share their topic's unit log


def test_fewer_messages_than_queues_samples_only_queues_that_exist(tmp_path):
    figures = _commitlog_case(str(tmp_path / "s"), 1_000, 10, create=False)
    assert figures["readable_msg_per_s"] > 0
