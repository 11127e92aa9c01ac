"""Many queues (issue 15): readable msg/s, open files and RSS against the queue count.

One case = a fresh store in a fresh temp dir, in a fresh child process (so open
files and RSS are the case's own), with one topic of N queues created before the
clock starts. Timed: ``--messages`` puts of 100-byte bodies, round-robin over the N
queues, then the wait until every message is readable (the dispatcher's lag is 0, so
``get`` finds it). A sample of queues is then read back through ``get`` to check.

- CommitLog engine (``MessageStore.put``): 1, 4,096 and 100,000 queues.
- CommitLog engine, ``commitlog-grown``: 100,000 queues met through ``put`` alone, no
  ``create_topic`` first (each put to a new queue grows the topic; timed).
- Segmented engine (``KafkaProducer.send``; readable at once, no dispatch): 4,096
  and 100,000 partitions, when it runs within the open-file limit; a case that fails
  reports its error instead of figures.

Figures per case: readable msg/s, open fds and RSS growth over the empty store
(open, before the topic is created), and the put-only rate. Topic creation is not
timed (the segmented engine opens every partition's files there). Rounds are
interleaved (every case once per round, in a fixed order); medians with [min, max].

    python -m bench.queues [--rounds 3] [--messages 200000] [--no-segmented]

Writes bench/results/queues.json, with a ``targets`` list: the issue's rows (100,000
queues >= 0.5x and 4,096 queues >= 0.8x of the 1-queue readable rate; at 100,000 queues
<= 2,000 more open fds and <= 200 MiB more RSS than the empty store).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import load_sample, machine_info, write_results

TOPIC = "many"
BODY_BYTES = 100
CHILD_TIMEOUT_S = 600  # the slowest case measured (100,000 queues before issue 15) took ~45 s
COMMITLOG_FILE_BYTES = 256 << 20  # one file holds the run: no roll inside the window
PROFILE_LINES = 16  # rows of a missed case's profile kept in the JSON
SAMPLE_QUEUES = 64  # queues read back through get() after a case
RESULTS = os.path.join(os.path.dirname(__file__), "results", "queues.json")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _commitlog_case(
    directory: str, queues: int, messages: int, create: bool = True
) -> dict[str, Any]:
    from mqstore import MessageStore, StoreConfig

    store = MessageStore.open(
        directory, StoreConfig(commitlog_file_size_bytes=COMMITLOG_FILE_BYTES, prewarm=False)
    )
    try:
        fds_before, rss_before = _fds(), _rss_mib()
        if create:  # else the puts grow the topic, timed
            store.create_topic(TOPIC, queues)  # CommitLog: no queue file until a put
        body = b"x" * BODY_BYTES
        put = store.put
        started = time.perf_counter()
        for index in range(messages):
            put(TOPIC, index % queues, body)
        put_s = time.perf_counter() - started
        dispatcher = store._dispatcher
        assert dispatcher is not None
        while dispatcher.lag_bytes():
            time.sleep(0.0005)
        readable_s = time.perf_counter() - started
        fds_after, rss_after = _fds(), _rss_mib()
        step = max(1, queues // SAMPLE_QUEUES)
        for queue_id in range(0, min(queues, messages), step):  # readable through get
            expected = messages // queues + (queue_id < messages % queues)
            if store.max_offset(TOPIC, queue_id) != expected:
                raise AssertionError(f"queue {queue_id}: max offset != {expected}")
            if expected:
                got = store.get(TOPIC, queue_id, expected - 1, 1)
                assert len(got) == 1 and got[0].body == body
        close_started = time.perf_counter()
    finally:
        store.close()
    return {
        "readable_msg_per_s": messages / readable_s,
        "put_msg_per_s": messages / put_s,
        "open_fds_growth": fds_after - fds_before,
        "rss_growth_mib": rss_after - rss_before,
        "close_s": time.perf_counter() - close_started,
    }


def _segmented_case(directory: str, queues: int, messages: int) -> dict[str, Any]:
    from mqstore import KafkaProducer
    from mqstore.segmented import SegmentedConfig, SegmentedStore

    store = SegmentedStore.open(
        directory, SegmentedConfig(segment_bytes=64 << 20, index_max_bytes=1 << 20)
    )
    try:
        fds_before, rss_before = _fds(), _rss_mib()
        store.create_topic(TOPIC, queues)  # opens every partition's files (counted)
        send = KafkaProducer(store).send
        body = b"x" * BODY_BYTES
        started = time.perf_counter()
        for index in range(messages):
            send(TOPIC, body, partition=index % queues)
        readable_s = time.perf_counter() - started
        fds_after, rss_after = _fds(), _rss_mib()
    finally:
        store.close()
    return {
        "readable_msg_per_s": messages / readable_s,
        "put_msg_per_s": messages / readable_s,
        "open_fds_growth": fds_after - fds_before,
        "rss_growth_mib": rss_after - rss_before,
    }


def child(engine: str, queues: int, messages: int, profile: bool = False) -> None:
    """Run one case here and print its figures as one JSON line (with ``profile``, the
    top of a cProfile of the putting thread, by own time, instead of figures)."""
    directory = tempfile.mkdtemp(prefix=f"queues-{engine}-{queues}-")
    profiler = cProfile.Profile() if profile else None
    try:
        if profiler is not None:
            profiler.enable()
        if engine == "segmented":
            result = _segmented_case(directory, queues, messages)
        else:
            result = _commitlog_case(directory, queues, messages, engine == "commitlog")
        if profiler is not None:
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(PROFILE_LINES)
            body = text.getvalue()
            result = {"profile": body[body.find("   ncalls") :]}
    except Exception as error:  # reported, not raised: a failing case is a figure
        result = {"error": f"{type(error).__name__}: {error}"[:500]}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(result))


def run_case(engine: str, queues: int, messages: int, profile: bool = False) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.queues", "--child", engine, str(queues),
               "--messages", str(messages), *(["--profile"] if profile else [])]  # fmt: skip
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT_S} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-500:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [run for run in runs if "error" not in run]
    out: dict[str, Any] = {"runs": runs}
    if not good:
        return out
    for key in good[0]:
        values = [run[key] for run in good]
        out[key] = statistics.median(values)
        out[key + "_range"] = [min(values), max(values)]
    return out


RATE_TARGETS = ((100_000, 0.5), (4_096, 0.8))  # queues, x of the 1-queue rate (issue 15)
FDS_GROWTH_MAX = 2_000  # at 100,000 queues, above an empty store
RSS_GROWTH_MAX_MIB = 200.0


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's target rows, from the medians (a row per target the run measured)."""
    rows: list[dict[str, Any]] = []
    one = summary.get("commitlog/1", {}).get("readable_msg_per_s")
    for queues, ratio_min in RATE_TARGETS:
        case = summary.get(f"commitlog/{queues}", {})
        if one is None or "readable_msg_per_s" not in case:
            continue
        rate = case["readable_msg_per_s"]
        rows.append({
            "row": f"CommitLog, {queues:,} queues: readable msg/s vs 1 queue",
            "value": rate, "unit": "msg/s", "peer": "CommitLog, 1 queue", "peer_value": one,
            "ratio": rate / one, "target": f">= {ratio_min}x", "met": rate / one >= ratio_min,
        })  # fmt: skip
    case = summary.get("commitlog/100000", {})
    if "open_fds_growth" in case:
        for key, label, unit, limit in (
            ("open_fds_growth", "open fds", "fds", FDS_GROWTH_MAX),
            ("rss_growth_mib", "RSS growth", "MiB", RSS_GROWTH_MAX_MIB),
        ):
            rows.append({
                "row": f"CommitLog, 100,000 queues: {label} above an empty store",
                "value": float(case[key]), "unit": unit, "peer": None, "peer_value": None,
                "ratio": None, "target": f"<= {limit:,}", "met": case[key] <= limit,
            })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--queues", default="1,4096,100000", help="CommitLog queue counts")
    parser.add_argument("--grown", default="100000", help="commitlog-grown queue counts ('': none)")
    parser.add_argument("--segmented", default="4096,100000", help="segmented partition counts")
    parser.add_argument("--no-segmented", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "QUEUES"), help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.messages, args.profile)
        return
    cases = [("commitlog", int(n)) for n in args.queues.split(",")]
    cases += [("commitlog-grown", int(n)) for n in args.grown.split(",") if n]
    if not args.no_segmented:
        cases += [("segmented", int(n)) for n in args.segmented.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {f"{e}/{n}": [] for e, n in cases}
    loads = [load_sample()]
    for round_ in range(args.rounds):
        for engine, queues in cases:
            result = run_case(engine, queues, args.messages)
            runs[f"{engine}/{queues}"].append(result)
            shown = result.get("error") or (
                f"{result['readable_msg_per_s']:>11,.0f} readable msg/s  "
                f"fds +{result['open_fds_growth']:<6} RSS +{result['rss_growth_mib']:.0f} MiB"
            )
            print(f"round {round_ + 1} {engine:>9} {queues:>7} queues: {shown}", flush=True)
        loads.append(load_sample())
    summary = {name: summarize(case_runs) for name, case_runs in runs.items()}
    one = summary.get("commitlog/1", {}).get("readable_msg_per_s")
    print("\nmedians:")
    for name, figures in summary.items():
        if "readable_msg_per_s" not in figures:
            print(f"  {name:>18}: {figures['runs'][-1].get('error')}")
            continue
        ratio = f" ({figures['readable_msg_per_s'] / one:.2f}x of 1 queue)" if one else ""
        print(
            f"  {name:>18}: {figures['readable_msg_per_s']:>11,.0f} readable msg/s{ratio}  "
            f"fds +{figures['open_fds_growth']:.0f}  RSS +{figures['rss_growth_mib']:.0f} MiB"
        )
    rows = targets(summary)
    for row in rows:  # a miss gets a profile: one more run of its case, untimed, profiled
        if not row["met"] and row["unit"] == "msg/s":
            queues = int(row["row"].split(" queues")[0].split(", ")[1].replace(",", ""))
            profiled = run_case("commitlog", queues, args.messages, profile=True)
            if "profile" in profiled:
                row["profile"] = (
                    f"cProfile of the putting thread (dispatch rounds it runs itself show; a "
                    f"dispatcher thread's do not), a separate untimed run of {queues:,} queues:\n"
                    + profiled["profile"]
                )
    report = {
        "machine": machine_info(),
        "load": loads,
        "messages": args.messages,
        "body_bytes": BODY_BYTES,
        "rounds": args.rounds,
        "cases": summary,
        "targets": rows,
    }
    write_results(args.output, report)


if __name__ == "__main__":
    main()
