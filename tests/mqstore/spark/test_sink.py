"""The sink while a service process holds the store open: Spark's rows go through
the inbox (spool files the service appends), batch and streaming. Without Spark:
the value column's buffers, a locked-out task's spool files of fixed rows, and the
direct writer taking a sibling's file between its own batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from mqstore import MessageStore, StoreConfig, StoreLockedError
from mqstore.engine import ProducerRecord
from mqstore.inbox import INBOX_DIR, LEDGER_NAME, QUARANTINE_DIR
from mqstore.spark import sink, store_access
from mqstore.spark.sink import WriteOptions, _binary_buffers, _born_times_ms, committed_batch_id
from mqstore.spool import SPOOL_SUFFIX, SpoolWriter
from tests.mqstore.conftest import SMALL

ROOT = Path(__file__).resolve().parents[3]
SERVICE = """
import sys, time
from mqstore import MessageStore, StoreConfig
store = MessageStore.open(sys.argv[1], StoreConfig(**CONFIG))
for name, partitions in (("events", 1), ("out", 3), ("copy", 2)):
    if name not in store.list_topics():
        store.create_topic(name, partitions)
print("open", flush=True)
i = 0
while True:  # a live service: it produces until it is killed
    store.put("events", 0, b"event-%d" % i)
    i += 1
    time.sleep(0.001)  # about a thousand events a second, not a busy loop
""".replace("CONFIG", repr({**SMALL, "inbox_interval_ms": 50}))


@pytest.fixture
def service(tmp_path):
    """A service process that holds the store at tmp_path/s open for writing."""
    path = tmp_path / "s"
    child = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "open"
        with pytest.raises(StoreLockedError):
            MessageStore.open(path, StoreConfig(**SMALL))
        yield path
        assert child.poll() is None, "the service kept running through the Spark job"
    finally:
        child.kill()
        child.wait(10)


def _inbox(path):
    return sorted(os.listdir(os.path.join(path, INBOX_DIR)))


def _read(spark, path, topic):
    return spark.read.format("mqstore").option("path", str(path)).option("subscribe", topic).load()


def test_batch_write_while_a_service_process_holds_the_store(spark, service):
    data = [(b"k%d" % (i % 7), b"v%d" % i) for i in range(300)] + [(None, b"nokey")]
    df = spark.createDataFrame(data, "key binary, value binary").repartition(2)
    df.write.format("mqstore").option("path", str(service)).option("topic", "out").mode(
        "append"
    ).save()
    back = _read(spark, service, "out").collect()  # readable when save() returns
    assert Counter((r.key, r.value) for r in back) == Counter(data)
    by_key = {}
    for r in back:
        if r.key is not None:
            by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(parts) == 1 for parts in by_key.values())  # a key keeps its partition
    assert _inbox(service) == [LEDGER_NAME, QUARANTINE_DIR]  # every spool file ingested
    with open(os.path.join(service, INBOX_DIR, LEDGER_NAME), encoding="utf-8") as handle:
        done = json.load(handle)["body"]["done"]
    assert sum(entry["rows"] for entry in done.values()) == len(data)


def test_value_and_timestamp_write_round_trip(spark, tmp_path):
    """The fast path (value column buffers to put_batch_buffers), with null values and
    a null timestamp, from two tasks: one appends, the other may spool."""
    import datetime

    path = tmp_path / "s"
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:
        store.create_topic("fast", 2)
        store.put("fast", 0, b"first")  # queue files exist: later opens agree on the layout
        store.put("fast", 1, b"first")
    base = datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC)
    data = [
        (None if i % 10 == 3 else b"v%d" % i, None if i == 5 else base.replace(second=i % 60))
        for i in range(200)
    ]
    df = spark.createDataFrame(data, "value binary, timestamp timestamp").repartition(2)
    df.write.format("mqstore").option("path", str(path)).option("topic", "fast").mode(
        "append"
    ).save()
    back = [r for r in _read(spark, path, "fast").collect() if r.value != b"first"]
    assert Counter(r.value for r in back) == Counter(v for v, _ in data)
    stamps = {r.value: r.timestamp for r in back if r.value is not None}
    for value, stamp in data:
        if value is not None and stamp is not None:
            assert stamps[value] == stamp.replace(tzinfo=None)
    assert stamps[b"v5"] > base.replace(tzinfo=None)  # no timestamp: the time of the write


def test_streaming_write_while_a_service_holds_the_store_is_idempotent(spark, tmp_path):
    path = tmp_path / "s"
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:
        store.create_topic("src", 2)
        for p in range(2):
            store.append_records(
                "src", p, [ProducerRecord(None, b"s%d-%d" % (p, i), (), None) for i in range(15)]
            )
    checkpoint = str(tmp_path / "checkpoint")

    def run():
        stream = (
            spark.readStream.format("mqstore").option("path", str(path))
            .option("subscribe", "src").option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "10").load()
        )  # fmt: skip
        query = (
            stream.select("value").writeStream.format("mqstore").option("path", str(path))
            .option("topic", "copy").option("sinkId", "copy")
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination()
        return query

    child = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "open"
        query = run()
        copied = Counter(r.value for r in _read(spark, path, "copy").collect())
        assert copied == Counter(b"s%d-%d" % (p, i) for p in range(2) for i in range(15))
        assert committed_batch_id(str(path), "copy") == 2  # 30 rows, 10 per trigger
        with open(os.path.join(path, INBOX_DIR, LEDGER_NAME), encoding="utf-8") as handle:
            names = list(json.load(handle)["body"]["done"])
        assert names
        assert all(name.startswith(f"copy.q{query.id}.b") for name in names)
        run()  # a restart from the checkpoint: nothing new, nothing written again
        assert _read(spark, path, "copy").count() == 30
        assert child.poll() is None
    finally:
        child.kill()
        child.wait(10)


# --- the fast path and the spool hand-off, without Spark ------------------------------


@pytest.fixture
def closes_readers():
    yield
    store_access._close_readers()  # the sink's cached read-only stores of this process


def _options(path, topic="out", **overrides):
    fields = dict(
        path=str(path),
        topic=topic,
        sink_id="unit",
        lock_timeout_ms=0,
        spool_wait_ms=30_000,
        columns=("value",),
    )
    return WriteOptions(**{**fields, **overrides})


def _value_batches(values, rows_per_batch):
    for first in range(0, len(values), rows_per_batch):
        column = pa.array(values[first : first + rows_per_batch], pa.binary())
        yield pa.RecordBatch.from_arrays([column], names=["value"])


def _all_values(store, topic):
    out = []
    for partition in range(store.describe_topic(topic).partitions):
        offset = store.earliest_offset(topic, partition)
        while records := store.read_records(topic, partition, offset, 1000):
            out.extend(r.value for r in records)
            offset = records[-1].offset + 1
    return out


@pytest.mark.parametrize(
    "column",
    [
        pa.array([b"a", None, b"", b"bcd", None, b"e"], pa.binary()).slice(1, 4),
        pa.array(["x", None, "yz"], pa.string()),
        pa.array([b"p", None, b"qr"], pa.large_binary()),
        pa.array([b"", b""], pa.binary()),
    ],
    ids=["sliced", "string", "large_binary", "empty_values"],
)
def test_binary_buffers_lay_out_the_column_without_copying(column):
    offsets, data, nulls = _binary_buffers(column)
    raw = bytes(memoryview(data))
    flags = [False] * len(column) if nulls is None else nulls.astype(bool).tolist()
    bounds = offsets.tolist()
    values = [None if n else raw[bounds[i] : bounds[i + 1]] for i, n in enumerate(flags)]
    expected = [v.encode() if isinstance(v, str) else v for v in column.to_pylist()]
    assert values == expected


def test_born_times_are_ms_and_a_null_time_is_the_write_time():
    micros = pa.array([1_500_000, None, 7_000], pa.timestamp("us", tz="UTC"))
    stamps = _born_times_ms(micros)
    assert stamps is not None
    assert (stamps[0], stamps[2]) == (1_500, 7)
    assert stamps[1] > 1_500_000_000_000  # a wall-clock time in ms
    assert _born_times_ms(pa.array([None, None], pa.timestamp("us", tz="UTC"))) is None


def test_a_locked_out_task_spools_files_of_fixed_rows_that_the_holder_appends(
    tmp_path, monkeypatch, closes_readers
):
    monkeypatch.setattr(sink, "SPOOL_FILE_ROWS_MAX", 5)
    root = tmp_path / "s"
    values = [b"v%d" % i for i in range(23)] + [None]
    committed = []
    commit = sink._SpoolSink._commit_open_file

    def recording(self):
        commit(self)
        committed.append(os.path.basename(self.committed[-1]))

    monkeypatch.setattr(sink._SpoolSink, "_commit_open_file", recording)
    config = StoreConfig(**{**SMALL, "inbox_interval_ms": 20})
    with MessageStore.open(root, config) as holder:  # the live writer: we cannot lock
        holder.create_topic("out", 1)
        result = sink._write(_options(root), _value_batches(values, 7), "unit.wX.p00000")
        assert (result.spooled, result.ingested, result.rows) == (True, True, {"out/0": 24})
        assert committed == [f"unit.wX.p00000.c{k:06d}{SPOOL_SUFFIX}" for k in range(5)]
        assert _all_values(holder, "out") == values  # in order, across the files
        retry = sink._write(_options(root), _value_batches(values, 7), "unit.wX.p00000")
        assert retry.ingested  # a retried task rewrites the same names: the ledger skips them
        assert _all_values(holder, "out") == values
        keyed = [ProducerRecord(b"k", b"r%d" % i, [("h", b"1")], 5) for i in range(12)]
        spool = sink._SpoolSink(os.path.join(root, INBOX_DIR), "unit.keys")
        spool.append_records("out", 0, keyed)  # rows with keys split at the same bounds
        paths = spool.commit()
        assert len(paths) == 3
        assert sink._await_ingest(_options(root), paths, time.time())
        assert _all_values(holder, "out")[len(values) :] == [r.value for r in keyed]


def test_the_direct_writer_appends_a_sibling_spool_file_while_it_writes(tmp_path, closes_readers):
    root = tmp_path / "s"
    with MessageStore.open(root, StoreConfig(**SMALL)) as store:
        store.create_topic("out", 1)
    sibling = os.path.join(root, INBOX_DIR, f"sibling.c000000{SPOOL_SUFFIX}")

    def batches():
        batch = next(_value_batches([b"mine"] * 3, 3))
        yield batch
        os.makedirs(os.path.dirname(sibling), exist_ok=True)
        with SpoolWriter(sibling, max_bytes=1 << 20) as writer:  # a locked-out task's file
            writer.add_block("out", 0, [b"theirs"] * 2)
            writer.commit()
        yield batch
        assert not os.path.exists(sibling)  # taken between our batches, not after

    result = sink._write(_options(root), batches(), "unit.wY.p00000")
    assert (result.spooled, result.rows) == (False, {"out/0": 6})
    # the layout the sink opened with: its queue files were created by that open
    with MessageStore.open(root, store_access.layout_config(str(root)), read_only=True) as store:
        assert Counter(_all_values(store, "out")) == Counter({b"mine": 6, b"theirs": 2})
