"""The performance targets of every benchmark, read back from their JSON results.

Each benchmark under bench/ writes ``bench/results/<name>.json``. A benchmark written for
the performance issue puts a ``"targets"`` list in it, one entry per target row::

    {"row": str, "value": float, "unit": str, "peer": str | None,
     "peer_value": float | None, "ratio": float | None, "target": str, "met": bool,
     "profile": str (optional: where the time goes, for a miss)}

The older benchmarks (bench/read.py, bench/put.py) state their figures in their own
shape; ``collect`` turns those into the same rows, so that the report has one table.
Nothing here measures: it only reads what a benchmark measured and says where from.
"""

from __future__ import annotations

import json
import os
from typing import Any

#: The benchmarks whose targets the report shows, in the order it shows them.
SOURCES = (
    "read",
    "put",
    "queues",
    "visibility",
    "offset_time",
    "recovery",
    "broker",
    "broker_fetch",
    "broker_soak",
    "broker_longpoll",
    "compaction",
    "replication",
    "replication_acks",
    "chaos",
)

#: bench/put.py's ratios that are targets: (ratio key, row, goal).
PUT_TARGETS = (
    ("mqstore-put / lmdb-writemap", "per-message `put`, async, vs lmdb's per-message form", 1.0),
    ("mqstore-put / rocksdict-put", "per-message `put`, async, vs rocksdict `put`", 1.5),
    ("mqstore-sync-8t / disk-groups-8", "8 threads `put`, sync, vs the disk with groups of 8", 0.7),
)

READ_ROWS = {
    "get_batch": "columnar read (`get_batch`), 100 B",
    "get": "`get(..., 500)` with `bytes(body)` per message",
    "poll": "`KafkaConsumer.poll`",
}


def _load(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            loaded: dict[str, Any] = json.load(handle)
            return loaded
    except FileNotFoundError:
        return None


def _read_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    lmdb = data["lmdb"]["median"]
    for target in data["targets"]:
        entry = data["cases"][target["case"]][target["reader"]]
        rows.append({
            "row": f"{READ_ROWS.get(target['reader'], target['reader'])} ({target['case']})",
            "value": None if entry is None else entry["median"],
            "unit": "msg/s",
            "peer": "lmdb cursor iteration",
            "peer_value": lmdb,
            "ratio": target["ratio"],
            "target": f">= {target['goal_ratio']}x",
            "met": bool(target["met"]),
        })  # fmt: skip
        profile = data.get("profiles", {}).get(f"{target['case']}/{target['reader']}")
        if profile:
            rows[-1]["profile"] = profile
    return rows


def _put_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, row, goal in PUT_TARGETS:
        ratio = data["ratios"].get(key)
        case, peer = key.split(" / ")
        figures = data["figures"]
        rows.append({
            "row": row,
            "value": figures.get(case, {}).get("median_msg_per_s"),
            "unit": "msg/s",
            "peer": peer,
            "peer_value": figures.get(peer, {}).get("median_msg_per_s"),
            "ratio": None if ratio is None else ratio["median_of_rounds"],
            "target": f">= {goal}x",
            "met": ratio is not None and ratio["median_of_rounds"] >= goal,
            **({"profile": data["profiles"][key]} if key in data.get("profiles", {}) else {}),
        })  # fmt: skip
    return rows


def rows_of(name: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """The target rows of one benchmark's results, in the common shape."""
    targets = data.get("targets")
    if targets and all("row" in t for t in targets):
        return [dict(t) for t in targets]
    if name == "read" and targets:
        return _read_rows(data)
    if name == "put" and "ratios" in data:
        return _put_rows(data)
    return []


def collect(results_dir: str) -> list[dict[str, Any]]:
    """Every target row under results_dir, each with the benchmark that measured it."""
    collected = []
    for name in SOURCES:
        path = os.path.join(results_dir, f"{name}.json")
        data = _load(path)
        if data is None:
            continue
        for row in rows_of(name, data):
            row["source"] = f"{name}.json"
            row["command"] = data.get("command", f"python -m bench.{name}")
            row["started"] = data.get("started", "")
            collected.append(row)
    return collected
