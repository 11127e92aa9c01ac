"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import cProfile
import io
import json
import os
import platform
import pstats
import resource
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["load_sample", "machine_info", "read_text", "summarize"]


def summarize(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Per figure of the repeated runs: the median, and ``<figure>_range`` [min, max]."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [run[key] for run in runs]
        out[key] = statistics.median(values)
        out[key + "_range"] = [min(values), max(values)]
    return out


def profile_rows(profile: cProfile.Profile, limit: int) -> list[dict[str, Any]]:
    """The ``limit`` functions of a cProfile run with the most own time, as JSON rows
    (function, calls, own_s, cumulative_s): what a missed target's row shows."""
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    for (filename, line, name), (_cc, calls, own, cumulative, _) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda item: -item[1][2],
    )[:limit]:
        rows.append({"function": f"{os.path.basename(filename)}:{line}({name})", "calls": calls,
                     "own_s": round(own, 4), "cumulative_s": round(cumulative, 4)})  # fmt: skip
    return rows


def read_text(path: str) -> str:
    """The text of a (/proc) file, or "" when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def timed_threads(work: Callable[[int], None], threads: int) -> float:
    """Run ``work(0)`` .. ``work(threads - 1)`` in as many threads, started together
    behind a barrier; return the seconds from the barrier to the last join."""
    start = threading.Barrier(threads + 1)

    def run(index: int) -> None:
        start.wait()
        work(index)

    workers = [threading.Thread(target=run, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started


def machine_info() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in read_text("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "mem_total": next(
            (ln.split(":")[1].strip() for ln in read_text("/proc/meminfo").splitlines()
             if ln.startswith("MemTotal")), "?"),
        "open_files_limit": [soft, hard],
        "max_map_count": read_text("/proc/sys/vm/max_map_count").strip(),
        "tmp_fs": _fs_of(tempfile.gettempdir()),
    }  # fmt: skip


def _fs_of(path: str) -> str:
    best = ("", "?", "?")
    for line in read_text("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) >= 4 and path.startswith(parts[1]) and len(parts[1]) >= len(best[0]):
            best = (parts[1], parts[2], parts[3])
    return f"{best[1]} on {best[0]} ({best[2]})"


def load_sample() -> dict[str, Any]:
    """Load average and the busiest other processes, to state the noise."""
    load = read_text("/proc/loadavg").split()[:3]
    try:
        top = subprocess.run(
            ["ps", "-eo", "pcpu,etimes,comm", "--sort=-pcpu"],
            capture_output=True, text=True, timeout=5, check=False,
        ).stdout.splitlines()[1:6]  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        top = []
    return {"time": time.strftime("%H:%M:%S"), "loadavg": load, "top": [t.strip() for t in top]}


def write_results(path: str, results: dict[str, Any]) -> None:
    """Write a benchmark's results as indented JSON (making its directory) and say where;
    results without a ``started`` stamp get the time of writing (the report shows it)."""
    results.setdefault("started", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    print(f"wrote {path}")


def spawn_serve(
    command: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Start ``mqstore serve`` (``command``) and return the process and the bootstrap
    address its first stdout line names (it listens by then).

    Raises:
        RuntimeError: the process ended or printed something else first.
    """
    import re

    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r" on (\S+:\d+)$", line.strip())
    if found is None:
        process.kill()
        process.wait()
        raise RuntimeError(f"mqstore serve did not start: {line!r}")
    return process, found.group(1)


def stop_serve(process: subprocess.Popen[str], timeout_s: float = 60.0) -> int:
    """SIGTERM (a clean drain and close), SIGKILL after ``timeout_s``; the exit status
    (-9 when it had to be killed)."""
    import signal

    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return -9
