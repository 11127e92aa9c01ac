"""Fetch long polls under many parked ones: how long after an append its Fetch is
answered while ``--parked`` other Fetches wait on a topic that gets no data.

Per engine, a broker (embedded, its own loop thread) serves ``--connections`` raw
connections, each with ``PIPELINED`` Fetches pipelined on topic "quiet" (max wait
120 s, the broker's cap raised to match); one more connection long-polls topic
"hot" at its end, a record is appended to "hot" through the engine, and the time
from the append to the Fetch's answer is one sample (``--rounds`` of them, medians).
The threads of the process are counted meanwhile.

Before mqstore.broker.longpoll (a pool of 32 wait threads, 500 ms slices), the hot
Fetch's next slice queued behind the parked ones': 14,977 ms median with 1,024
parked (docs/BROKER.md, "Soak").

Run: ``python -m bench.broker_longpoll [--rounds 5] [--connections 64]``.
Writes bench/results/broker_longpoll.json.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from typing import Any, Final

from bench.common import load_sample, machine_info, write_results

RESULTS: Final = os.path.join(os.path.dirname(__file__), "results", "broker_longpoll.json")
PIPELINED: Final = 16  # the broker's in-flight bound per connection
MAX_WAIT_MS: Final = 120_000
FETCH_VERSION: Final = 11
SETTLE_S: Final = 0.5  # after the broker read every Fetch: their first pass and park
WAKE_TARGET_MS: Final = 50.0
FRAME: Final = struct.Struct(">i")


def fetch_frame(topic: str, offset: int, correlation_id: int) -> bytes:
    from kafka.protocol.consumer import FetchRequest

    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, fetch_offset=offset, partition_max_bytes=1 << 20
    )
    request = FetchRequest(
        version=FETCH_VERSION, replica_id=-1, max_wait_ms=MAX_WAIT_MS, min_bytes=1,
        max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip
    request.with_header(correlation_id=correlation_id, client_id="bench")
    return bytes(request.encode(header=True, framed=True))


def read_frame(conn: socket.socket) -> bytes:
    data = b""
    while len(data) < FRAME.size or len(data) < FRAME.size + FRAME.unpack(data[:4])[0]:
        chunk = conn.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed by the broker")
        data += chunk
    return data[FRAME.size :]


def wait_read(broker: Any, queued_bytes: int) -> None:
    deadline = time.monotonic() + 60
    while broker._queued_bytes != queued_bytes:
        if time.monotonic() > deadline:
            raise RuntimeError(f"broker holds {broker._queued_bytes} bytes, not {queued_bytes}")
        time.sleep(0.02)
    time.sleep(SETTLE_S)


def run(engine_kind: str, connections: int, rounds: int) -> dict[str, Any]:
    from mqstore import MessageStore
    from mqstore.broker import Broker, BrokerConfig
    from mqstore.engine import ProducerRecord
    from mqstore.segmented import SegmentedStore

    with tempfile.TemporaryDirectory(prefix="bench-longpoll-") as directory:
        path = os.path.join(directory, "store")
        engine: Any = (
            MessageStore.open(path) if engine_kind == "commitlog" else SegmentedStore.open(path)
        )
        engine.create_topic("quiet", 1)
        engine.create_topic("hot", 1)
        waits_ms = []
        try:
            with Broker(engine, BrokerConfig(port=0, fetch_wait_max_ms=MAX_WAIT_MS)) as broker:
                address = ("127.0.0.1", broker.port)
                quiet = [fetch_frame("quiet", 0, i) for i in range(PIPELINED)]
                parked = [socket.create_connection(address, timeout=60) for _ in range(connections)]
                for conn in parked:
                    conn.sendall(b"".join(quiet))
                hot = socket.create_connection(address, timeout=180)
                quiet_bytes = sum(len(frame) - 4 for frame in quiet) * connections
                for offset in range(rounds):
                    wake = fetch_frame("hot", offset, 1000 + offset)
                    hot.sendall(wake)
                    wait_read(broker, quiet_bytes + len(wake) - 4)
                    started = time.perf_counter()
                    engine.append_records("hot", 0, [ProducerRecord(None, b"x", (), None)])
                    read_frame(hot)
                    waits_ms.append((time.perf_counter() - started) * 1000)
                threads = threading.active_count()
                for conn in [*parked, hot]:
                    conn.close()
        finally:
            engine.close()
    return {
        "parked": connections * PIPELINED,
        "wake_ms": [round(w, 2) for w in waits_ms],
        "wake_ms_median": round(statistics.median(waits_ms), 2),
        "threads": threads,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--engines", default="commitlog,segmented")
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args(argv)
    loads = [load_sample()]
    cases, rows = {}, []
    for engine in args.engines.split(","):
        cases[engine] = case = run(engine, args.connections, args.rounds)
        loads.append(load_sample())
        print(f"{engine}: {case}", flush=True)
        rows.append(
            {
                "row": f"append to Fetch answer, {case['parked']} Fetches parked ({engine})",
                "value": case["wake_ms_median"], "unit": "ms", "peer": None,
                "peer_value": None, "ratio": None, "target": f"< {WAKE_TARGET_MS:g} ms",
                "met": case["wake_ms_median"] < WAKE_TARGET_MS,
            }
        )  # fmt: skip
    write_results(
        args.output,
        {
            "machine": machine_info(),
            "load": loads,
            "command": "python -m bench.broker_longpoll " + " ".join(argv or sys.argv[1:]),
            "cases": cases,
            "targets": rows,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
