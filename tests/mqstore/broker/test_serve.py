"""``mqstore serve`` as a process: SIGTERM drains and closes the store cleanly; a
SIGKILL mid-stream with acks=all under sync flush loses nothing acknowledged."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from kafka import KafkaProducer

from mqstore.broker.serve import parse_listen
from mqstore.commitlog.errors import ConfigError
from tests.mqstore.engines import ENGINES

SMALL_FILES = {"commitlog": ["commitlog_file_size_bytes=1048576"], "segmented": []}

confluent_kafka = pytest.importorskip("confluent_kafka")

START_S = 60.0


def start_serve(
    store: Any, engine: str, *config: str, serve_args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "mqstore", "--store", str(store), "--engine", engine]
    for item in (*SMALL_FILES[engine], *config):
        command += ["--config", item]
    command += ["serve", "--listen", "127.0.0.1:0", *serve_args]
    errors = open(f"{store}.stderr", "w")  # noqa: SIM115 - the child writes it until it ends
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=errors, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    errors.close()  # the child holds its own descriptor
    assert process.stdout is not None
    line = process.stdout.readline()  # "mqstore: serving PATH on HOST:PORT"
    found = re.search(r" on (\S+:\d+)$", line.strip())
    if found is None:
        process.kill()
        with open(f"{store}.stderr") as logged:
            raise AssertionError(f"serve did not start: {line!r} {logged.read()}")
    return process, found.group(1)


def reopen(engine: str, path: Any) -> Any:
    """The store as serve left it, with the layout it was created with."""
    if engine == "commitlog":
        from mqstore import MessageStore

        return MessageStore.open(path)
    from mqstore.segmented import SegmentedConfig, SegmentedStore

    return SegmentedStore.open(path, SegmentedConfig())


@pytest.mark.parametrize("engine", ENGINES)
def test_sigterm_drains_and_closes_the_store(tmp_path: Any, engine: str) -> None:
    store_path = tmp_path / "store"
    process, bootstrap = start_serve(store_path, engine)
    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        for i in range(100):
            producer.send("served", value=b"v%d" % i)
        producer.flush(timeout=30)
        producer.close(timeout=5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not os.path.exists(store_path / "abort")  # a clean close removes the marker
    store = reopen(engine, store_path)
    try:
        assert store.latest_offset("served", 0) == 100
        if engine == "commitlog":
            assert not store.recovered_from_crash
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_sigkill_mid_stream_loses_nothing_acknowledged(tmp_path: Any, engine: str) -> None:
    store_path = tmp_path / "store"
    process, bootstrap = start_serve(store_path, engine, "flush_mode=sync")
    acknowledged: dict[int, bytes] = {}
    lock = threading.Lock()

    def delivered(error: Any, message: Any) -> None:
        if error is None:
            with lock:
                acknowledged[message.offset()] = message.value()

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2,
            "message.timeout.ms": 3000, "enable.idempotence": True,
        }
    )  # fmt: skip
    try:
        sent = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            producer.produce("durable", value=b"payload-%d" % sent, on_delivery=delivered)
            sent += 1
            producer.poll(0)
            if sent % 200 == 0:
                producer.poll(0.01)
            with lock:
                if len(acknowledged) >= 2_000:
                    break
        process.send_signal(signal.SIGKILL)  # mid-stream: more are in flight
        process.wait(timeout=10)
        producer.flush(5)  # what was in flight fails: it is not acknowledged
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with lock:
        acked = dict(acknowledged)
    assert len(acked) >= 2_000
    store = reopen(engine, store_path)
    try:
        end = store.latest_offset("durable", 0)
        assert end >= max(acked) + 1
        stored: dict[int, bytes] = {}
        offset = 0
        while offset < end:
            batch = store.read_batch("durable", 0, offset, 5_000)
            stored.update(zip(batch.offsets, (bytes(v) for v in batch.values), strict=True))
            offset = batch.offsets[-1] + 1
        missing = [o for o, value in acked.items() if stored.get(o) != value]
        assert missing == []
    finally:
        store.close()


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9092") == ("127.0.0.1", 9092)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("9092", "host:", "host:99999", "host:x"):
        with pytest.raises(ConfigError):
            parse_listen(bad)


def test_connection_bounds_are_set_from_the_command_line(tmp_path: Any) -> None:
    """``--max-connections-per-ip`` (and ``--max-connections``) set BrokerConfig's
    bounds: a third connection from 127.0.0.1 is refused at 2; a bound out of range
    stops serve with the config error."""
    import socket

    from tests.mqstore.broker.conftest import read_frame
    from tests.mqstore.broker.test_protocol import request_frame
    from tests.mqstore.broker.test_server import _api_versions_request

    store = tmp_path / "store"
    limits = ("--max-connections-per-ip", "2", "--max-connections", "100")
    process, bootstrap = start_serve(store, "commitlog", serve_args=limits)
    host, port = parse_listen(bootstrap)
    try:
        held = [socket.create_connection((host, port), timeout=30) for _ in range(3)]
        answers = []
        for conn in held:
            conn.sendall(request_frame(_api_versions_request(), 1))
            answers.append(read_frame(conn) is not None)
        assert sorted(answers) == [False, True, True]  # one of the three refused
        for conn in held:
            conn.close()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    bad = subprocess.run(
        [sys.executable, "-m", "mqstore", "--store", str(tmp_path / "other"), "serve",
         "--listen", "127.0.0.1:0", "--max-connections-per-ip", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode != 0
    assert "connections_per_address_max" in bad.stderr


def test_a_replicated_serve_shows_no_more_than_the_last_hw(tmp_path: Any) -> None:
    """``serve --replica-ids`` opens the store held (``MessageStore.open(replicated=
    True)``): readers see what the last checkpoint recorded as readable (at most the
    HW then), not the tail its followers may lack; without followers, everything."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from mqstore import MessageStore, StoreConfig

    path = tmp_path / "store"
    store = MessageStore.open(path, StoreConfig(commitlog_file_size_bytes=1 << 20))
    store.create_topic("held", partitions=1)
    for i in range(5):
        store.put("held", 0, b"acked-%d" % i)
    high_watermark = store.commitlog.write_position
    store.set_commit_limit(lambda: high_watermark)  # the rest never reached a follower
    for i in range(5):
        store.put("held", 0, b"only-here-%d" % i)
    store.close()

    def latest(*serve_args: str) -> int:
        process, address = start_serve(path, "commitlog", serve_args=serve_args)
        try:
            admin = AdminClient({"bootstrap.servers": address})
            wanted = TopicPartition("held", 0)
            futures = admin.list_offsets({wanted: OffsetSpec.latest()})
            return int(futures[wanted].result(30).offset)
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(60) == 0

    assert latest("--replica-ids", "1") == 5
    assert latest() == 10
