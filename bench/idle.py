"""What an open, idle store costs its process: CPU time and context switches while
nothing is written or read (an embedded store idles inside a service most of the time).

    python -m bench.idle [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import tempfile
import time

from mqstore import MessageStore


def idle_round(seconds: float) -> tuple[float, int]:
    """(CPU ms, voluntary context switches) of this process over ``seconds`` idle."""
    directory = tempfile.mkdtemp(prefix="mqstore-idle-")
    store = MessageStore.open(directory)
    try:
        store.create_topic("t", 1)
        store.put("t", 0, b"x")
        time.sleep(0.5)  # the put's dispatch and flush settle
        before = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(seconds)
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu_s * 1000, after.ru_nvcsw - before.ru_nvcsw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rounds = [idle_round(args.seconds) for _ in range(args.rounds)]
    cpu = statistics.median(r[0] for r in rounds)
    switches = statistics.median(r[1] for r in rounds)
    print(f"idle store over {args.seconds:.0f} s: median {cpu:.0f} ms CPU, "
          f"{switches:.0f} voluntary context switches ({args.rounds} rounds)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
