"""bench/replication_acks.py: how a record's replication lag is computed from the
follower's timed appends and the producer's acks (the figures themselves are the
benchmark's, never timed here)."""

from __future__ import annotations

import numpy as np
import pytest

from bench import replication_acks


def _acks(acked_ns: list[int], sent_ns: list[int]) -> dict[str, np.ndarray]:
    count = len(acked_ns)
    return {
        "offsets": np.arange(count, dtype=np.int64),
        "acked_ns": np.array(acked_ns, dtype=np.int64),
        "sent_ns": np.array(sent_ns, dtype=np.int64),
        "held_s": np.array([1.0]),
        "failed": np.array([0]),
    }


def test_a_record_is_held_at_the_first_append_that_covers_its_end() -> None:
    appends = [(1_000, 100), (2_000, 250), (3_000, 400)]
    ends = np.array([100, 101, 250, 400], dtype=np.int64)
    held = replication_acks.held_times_ns(appends, ends)
    assert held.tolist() == [1_000, 2_000, 2_000, 3_000]


def test_an_end_that_moved_back_never_unholds_a_record() -> None:
    # A truncation lowers the end; a record held before stays held then.
    appends = [(1_000, 300), (2_000, 200), (3_000, 350)]
    held = replication_acks.held_times_ns(appends, np.array([250, 320], dtype=np.int64))
    assert held.tolist() == [1_000, 3_000]


def test_a_record_past_the_last_append_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="past the follower"):
        replication_acks.held_times_ns([(1_000, 100)], np.array([101], dtype=np.int64))


def test_lag_counts_from_the_ack_and_a_record_held_before_it_lags_zero() -> None:
    acks = _acks(acked_ns=[5_000_000, 5_000_000, 9_000_000], sent_ns=[0, 0, 1_000_000])
    held = np.array([4_000_000, 7_000_000, 29_000_000], dtype=np.int64)
    out = replication_acks.lag_summary(held, acks, appends=3)
    assert out["lag_max_ms"] == 20.0
    assert out["lag_p50_ms"] == 2.0  # 0 (held first), 2, 20
    assert out["lag_from_send_max_ms"] == 28.0
    assert out["held_before_ack_share"] == pytest.approx(1 / 3)
    assert out["rate_held"] == pytest.approx(3 / 0.009)  # first send to last ack


def test_the_lag_row_is_missed_when_the_rate_was_not_held() -> None:
    cases = {"acks_all.sync": 60_000.0, "acks1": 100_000.0}
    lag = {"lag_p99_ms": 5.0, "lag_from_send_p50_ms": 80.0, "rate_held": 99_500.0,
           "rate_asked": 100_000}  # fmt: skip
    acks_row, lag_row = replication_acks.targets(cases, lag)
    assert acks_row["ratio"] == 0.6 and acks_row["met"] is True
    assert lag_row["met"] is False  # a queue built up in front of the leader
    lag["lag_from_send_p50_ms"] = 10.0
    assert replication_acks.targets(cases, lag)[1]["met"] is True
