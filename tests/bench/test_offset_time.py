"""bench/offset_time.py: its figures, the tail split and the profile a miss carries."""

from __future__ import annotations

import json
import os

from bench import offset_time


def test_a_small_run_writes_the_tail_split_and_a_profile(tmp_path) -> None:
    out = os.path.join(str(tmp_path), "offset_time.json")
    argv = ["--queues", "2", "--messages", "3000", "--samples", "400", "--rounds", "1",
            "--profile", "--profile-samples", "1000", "--dir", str(tmp_path),
            "--out", out]  # fmt: skip
    assert offset_time.main(argv) == 0
    with open(out, encoding="utf-8") as handle:
        result = json.load(handle)
    ours = result["figures"]["mqstore"]
    assert 0 < ours["p50_us"] <= ours["p99_us"]
    assert 0 <= ours["slowest_1pct_first_call_share"] <= 1
    assert ours["first_call_p50_us"] > 0 and ours["p99_other_calls_us"] > 0
    layers = result["profile"]["layers"]
    assert offset_time.SPOT_CHECK in layers
    assert len(layers) == 4 and all(layer["cold_calls"] > 0 for layer in layers.values())
    assert result["profile"]["top_by_own_time"]  # the cProfile rows
    assert result["targets"][0]["met"] is True  # p50 has no target


def test_a_missed_row_carries_the_profile_and_a_met_one_does_not() -> None:
    side = {"p50_us": 5.0, "p99_us": 10.0}
    rows = offset_time.targets({"mqstore": {"p50_us": 9.0, "p99_us": 25.0},
                                "sqlite-indexed": side}, None)  # fmt: skip
    assert [row["met"] for row in rows] == [True, False]  # p99 2.5x: missed
    offset_time.attach_profile(rows, "where the time goes")
    assert "profile" not in rows[0] and rows[1]["profile"] == "where the time goes"
    rows = offset_time.targets({"mqstore": {"p50_us": 9.0, "p99_us": 19.0},
                                "sqlite-indexed": side}, None)  # fmt: skip
    assert rows[1]["met"] is True and rows[1]["ratio"] == 1.9
