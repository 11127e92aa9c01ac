"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["summarize"]


def summarize(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Per figure of the repeated runs: the median, and ``<figure>_range`` [min, max]."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [run[key] for run in runs]
        out[key] = statistics.median(values)
        out[key + "_range"] = [min(values), max(values)]
    return out
