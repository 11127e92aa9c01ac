"""bench/targets.py: every benchmark's targets read back into one shape."""

from __future__ import annotations

import json
import os

from bench import targets


def _write(directory: str, name: str, data: dict) -> None:
    with open(os.path.join(directory, f"{name}.json"), "w", encoding="utf-8") as handle:
        json.dump(data, handle)


def test_rows_in_the_common_shape_are_taken_as_written(tmp_path) -> None:
    row = {"row": "visible p99", "value": 80.0, "unit": "us", "peer": "lmdb + cv",
           "peer_value": 60.0, "ratio": 1.33, "target": "<= 2x", "met": True}  # fmt: skip
    data = {"command": "python -m bench.visibility", "started": "2026-11-24", "targets": [row]}
    _write(str(tmp_path), "visibility", data)
    [got] = targets.collect(str(tmp_path))
    assert got["row"] == "visible p99" and got["met"] is True
    assert got["source"] == "visibility.json"
    assert got["command"] == "python -m bench.visibility"


def test_put_ratios_become_rows_and_a_miss_is_a_miss(tmp_path) -> None:
    figures = {name: {"median_msg_per_s": rate} for name, rate in (
        ("mqstore-put", 1000.0), ("lmdb-writemap", 800.0), ("rocksdict-put", 500.0),
        ("mqstore-sync-8t", 30.0), ("disk-groups-8", 60.0))}  # fmt: skip
    ratios = {
        "mqstore-put / lmdb-writemap": {"median_of_rounds": 1.25},
        "mqstore-put / rocksdict-put": {"median_of_rounds": 2.0},
        "mqstore-sync-8t / disk-groups-8": {"median_of_rounds": 0.5},
    }
    profiles = {"mqstore-sync-8t / disk-groups-8": "acquire"}
    _write(str(tmp_path), "put", {"figures": figures, "ratios": ratios, "profiles": profiles})
    rows = targets.collect(str(tmp_path))
    assert [r["met"] for r in rows] == [True, True, False]
    assert rows[2]["ratio"] == 0.5 and rows[2]["peer_value"] == 60.0
    assert rows[2]["profile"] == "acquire" and "profile" not in rows[0]


def test_read_targets_take_their_figures_from_the_cases(tmp_path) -> None:
    cases = {"1 queue": {"get_batch": {"median": 9.0e6}, "get": None}}
    data = {"lmdb": {"median": 6.0e6}, "cases": cases, "targets": [
        {"case": "1 queue", "reader": "get_batch", "goal_ratio": 1.0, "ratio": 1.5, "met": True},
        {"case": "1 queue", "reader": "get", "goal_ratio": 0.4, "ratio": None, "met": False},
    ]}  # fmt: skip
    data["profiles"] = {"1 queue/get": "garbage collections ..."}  # the miss's profile
    _write(str(tmp_path), "read", data)
    rows = targets.collect(str(tmp_path))
    assert [r["value"] for r in rows] == [9.0e6, None]
    assert [r["met"] for r in rows] == [True, False]
    assert rows[1]["profile"] == "garbage collections ..." and "profile" not in rows[0]


def test_a_missing_or_foreign_result_gives_no_rows(tmp_path) -> None:
    assert targets.collect(str(tmp_path)) == []
    _write(str(tmp_path), "queues", {"cases": {}})
    assert targets.collect(str(tmp_path)) == []
