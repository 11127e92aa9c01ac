"""``make bench``: every benchmark the report draws on, one after another, then the report.

Each benchmark runs as its own process (a fresh interpreter, so one case's heap, threads
and mappings never weigh on the next) and writes its JSON under bench/results/; the
report (bench/REPORT.md, bench/plots/) is then generated from those files alone, by
``bench.compare_report``. A benchmark that fails stops the suite: the report is never
generated from a mix of new and stale figures without saying so.

    python -m bench.suite            # the quick suite (make bench)
    python -m bench.suite --full     # the complete sweep (make bench-full)
    python -m bench.suite --only read put   # some benchmarks, then the report
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

#: (name, quick arguments, full arguments); each writes bench/results/<name>.json.
BENCHMARKS: tuple[tuple[str, list[str], list[str]], ...] = (
    ("compare", ["--quick"], ["--full"]),
    ("read", ["--messages", "1000000", "--rounds", "5"], ["--rounds", "7"]),
    ("put", ["--rounds", "5"], ["--rounds", "7"]),
    ("queues", ["--rounds", "3"], ["--rounds", "5"]),
    ("offset_time", ["--rounds", "5"], ["--rounds", "7"]),
    ("visibility", ["--rounds", "9", "--messages", "20000"], ["--rounds", "9"]),
    (
        "recovery",
        ["--mib", "1024", "--rounds", "3", "--body-bytes", "1024", "100"],
        ["--mib", "1024", "--rounds", "5", "--body-bytes", "1024", "100"],
    ),
    ("broker", ["--rounds", "3"], ["--rounds", "5"]),
    ("broker_fetch", ["--rounds", "3", "--profile"], ["--rounds", "5", "--profile"]),
    ("broker_longpoll", ["--rounds", "5"], ["--rounds", "9"]),
    ("producer_state", ["--rounds", "5"], ["--rounds", "9"]),
    ("broker_soak", ["--minutes", "1"], ["--minutes", "10"]),
    (
        "compaction",
        ["--rounds", "3"],
        ["--rounds", "3", "--records", "10000000", "--keys", "1000000"],
    ),
    ("replication", ["--mib", "1024", "--rounds", "3"], ["--mib", "1024", "--rounds", "5"]),
    ("replication_acks", ["--rounds", "3"], ["--rounds", "5", "--messages", "500000"]),
    (
        "chaos",
        ["--seconds", "120", "--failover"],
        ["--seconds", "600", "--seed", "1", "2", "3", "--failover"],
    ),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the complete sweep")
    parser.add_argument("--only", nargs="*", help="run only these benchmarks")
    args = parser.parse_args(argv)
    names = [name for name, _, _ in BENCHMARKS]
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; known: {names}")
    started = time.perf_counter()
    for name, quick, full in BENCHMARKS:
        if args.only and name not in args.only:
            continue
        command = [sys.executable, "-m", f"bench.{name}", *(full if args.full else quick)]
        print(f"== {' '.join(command[1:])}", flush=True)
        if name == "compare":  # it regenerates the report itself; the suite does at the end
            command += ["--report", "/dev/null", "--plots", "bench/plots"]
        subprocess.run(command, check=True)
        print(f"== {name} done at {time.perf_counter() - started:.0f} s", flush=True)
    from bench import compare_report

    compare_report.generate("bench/results/compare.json", "bench/REPORT.md", "bench/plots")
    print(f"suite done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
