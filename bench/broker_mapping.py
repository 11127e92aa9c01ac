"""Kafka batches onto the CommitLog: per-record records (A) vs stored batches (B).

The design question of the broker issue (docs/BROKER.md): store every Kafka record as
a CommitLog record (today's model, one ConsumeQueue unit per message; Fetch builds
batches) or store the producer's batch as one CommitLog record (base offset patched,
Fetch hands the stored bytes out). Measured on real librdkafka batches: a
confluent-kafka producer (batch.size 16384, linger 20 ms, 100-byte values, 12-byte
keys) is pointed at the loopback harness (bench/broker_wire.py) and its Produce
requests are kept; kafka-python's builder stands in when confluent-kafka is absent.

    python -m bench.broker_mapping [--rounds 7] [--batches 600] [--quick]

Cases (per message; medians of interleaved rounds, each case once per round in a
rotated order, a fresh store per produce case):

Produce, from the request's batch bytes to "dispatched" (readers see it):
  A.py     check + decode in Python, MessageStore.append_records (key -> property and
           index key), as the embedded KafkaProducer stores records today;
  A.floor  check + put_batch_buffers of the values, packed with their offsets outside
           the timing (C encode; no key, no header, no decode: A's floor in C);
  B        check + base offset + one put() of the whole batch + (base, count) index;
  B.walk   B plus a C walk of every record's framing (bench/broker_build.c), as Kafka's
           LogValidator does before storing a batch as is;
  B2.units the extra cost of one ConsumeQueue unit per Kafka record (the B variant
           that keeps queue offset = Kafka offset), alone: one put_batch per batch;
  B2.units.x16  the same with the units of 16 batches per put_batch (a dispatch round);
  index.keys  one IndexFile entry per record (Kafka key), alone: paid by A today, and
           by B too if wire keys are indexed.
Fetch, 1 MiB per fetch (max.partition.fetch.bytes), a whole partition read from 0:
  A.py     read_records + encode_record + build_batch (Python);
  A.c      ConsumeQueue units + verify_records (XXH64, C) + bench/broker_build.c + CRC-32C;
  A.c.nover  the same without the XXH64 verify;
  A.memcpy the floor: gather the key+value bytes of each record (C memcpy) + CRC-32C;
  B.get    BatchLog.fetch through MessageStore.get (XXH64 verify per batch record);
  B.raw    BatchLog.fetch slicing the mapping by units (what sendmsg/sendfile gets).
Tail fetch: one producer batch per fetch (a consumer at the head of the log).

Also: what B costs elsewhere (get() decoding stored batches, decompression per codec),
and kafka-python's protocol classes (bench/broker_codec.py). Writes JSON to
bench/results/broker_mapping.json.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, Final

import numpy as np
from crc32c import crc32c

from bench import broker_codec
from bench.broker_codec import check_count
from bench.broker_proto.batch_log import BATCH_TAG, BatchLog
from bench.broker_proto.record_mapping import append_produced, build_fetch_batch
from bench.broker_proto.wire_batch import check_produced
from bench.common import load_sample, machine_info, summarize, write_results
from mqstore import MessageStore, StoreConfig
from mqstore.commitlog.record import HEADER_SIZE, gather, verify_records
from mqstore.consumequeue import ConsumeQueueConfig, ConsumeQueueStore
from mqstore.segmented.record_batch import (
    COVERED,
    HEADER,
    PREFIX,
    BatchHeader,
    decode_records,
)

TOPIC_A: Final = "rec"
TOPIC_B: Final = "bat"
FETCH_BYTES: Final = 1 << 20  # max.partition.fetch.bytes, librdkafka's and Java's default
COMMITLOG_FILE_BYTES: Final = 64 << 20  # as bench/compare.py; a B pass of 600 batches rolls once
CASE_SECONDS_MIN: Final = 0.25  # a fetch case repeats its pass until this much time
HERE: Final = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------- workload


def _value(i: int) -> bytes:
    """100 bytes of JSON-ish text with a 32-hex-digit trace id: compressible about as
    log and event payloads are (gzip ~3x on a 16 KiB batch), not as zeros."""
    trace = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).hexdigest()
    text = f'{{"id":{i},"user":"u{i % 997:04d}","amount":{(i * 7919) % 100000},"trace":"{trace}",'
    return (text + '"note":"ok ok ok ok ok ok ok ok ok ok ok ok')[:98].encode() + b'"}'


def workload(batches: int) -> dict[str, Any]:
    """Produced batches as a client sends them (base offset 0, CRC set)."""
    records = batches * 140
    captured = broker_codec.capture_librdkafka(records, _value)
    if captured is None:
        captured = broker_codec.build_with_kafka_python(records, _value)
    sizes = [len(b) for b in captured["batches"]]
    counts = [check_produced(b).records_count for b in captured["batches"]]
    # The last batch of a flush is short: keep full ones, as a steady producer sends.
    full = [b for b, c in zip(captured["batches"], counts, strict=True) if c >= max(counts) - 2]
    captured["batches"] = full[:batches]
    captured["records_per_batch_median"] = float(np.median(counts))
    captured["batch_bytes_median"] = float(np.median(sizes))
    return captured


def _open(root: str) -> MessageStore:
    return MessageStore.open(root, StoreConfig(commitlog_file_size_bytes=COMMITLOG_FILE_BYTES))


# ---------------------------------------------------------------------- C builder


class CBuilder:
    """bench/broker_build.c compiled with cc and called through ctypes."""

    def __init__(self, directory: str) -> None:
        library = os.path.join(directory, "broker_build.so")
        source = os.path.join(HERE, "broker_build.c")
        subprocess.run(
            ["cc", "-O3", "-std=c11", "-shared", "-fPIC", "-o", library, source], check=True
        )
        # PyDLL: calls keep the GIL, as a C extension function of a few µs would (CDLL
        # releases it, and getting it back from the dispatcher thread costs more).
        self._lib = ctypes.PyDLL(library)
        fn = self._lib.build_records
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                       ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]  # fmt: skip
        self._fn = fn
        validate = self._lib.validate_records
        validate.restype = ctypes.c_int64
        validate.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        self._validate = validate
        self.out = np.zeros(4 * FETCH_BYTES, dtype=np.uint8)  # reused response buffer
        self._ts = np.zeros(2, dtype=np.int64)

    def validate(self, batch: bytes, count: int) -> None:
        """Walk the records of an uncompressed batch (bench/broker_build.c)."""
        address = ctypes.cast(ctypes.c_char_p(batch), ctypes.c_void_p).value  # no copy
        assert address is not None
        bad = self._validate(address + HEADER.size, len(batch) - HEADER.size, count)
        if bad != 0:
            raise ValueError(f"record {-bad - 1} of the batch is malformed")

    def build(
        self, store: MessageStore, topic: str, offset: int, max_records: int, verify: bool
    ) -> tuple[memoryview, int]:
        """One batch v2 of the records from ``offset``; (its bytes, records in it)."""
        units = store.consume_queues.queue(topic, 0).get_range(offset, max_records)
        physicals = units["commitlog_offset"]
        mapped = store.commitlog.file_for(int(physicals[0]))
        end = np.searchsorted(physicals, mapped.start_offset + mapped.size_bytes)
        positions = np.ascontiguousarray(physicals[:end]) - mapped.start_offset
        if verify:
            sizes = units["size"][:end].astype(np.int64)
            if verify_records(mapped.mapping, positions, sizes) >= 0:
                raise RuntimeError("a record failed its checksum")
        data = np.frombuffer(mapped.mapping, dtype=np.uint8)
        out = self.out
        written = self._fn(
            data.ctypes.data, len(data), positions.ctypes.data, len(positions), 0,
            out.ctypes.data + HEADER.size, len(out) - HEADER.size, self._ts.ctypes.data,
        )  # fmt: skip
        if written < 0:
            raise RuntimeError(f"build_records failed: {written}")
        count = len(positions)
        base_ts, max_ts = int(self._ts[0]), int(self._ts[1])
        view = memoryview(out)
        covered = COVERED.pack(0, count - 1, base_ts, max_ts, -1, -1, -1, count)
        view[PREFIX.size : HEADER.size] = covered
        size = HEADER.size + written
        crc = crc32c(view[PREFIX.size : size])
        PREFIX.pack_into(out, 0, offset, size - 12, 0, 2, crc)
        return view[:size], count


# ---------------------------------------------------------------------- produce


def produce_a_py(root: str, batches: list[bytes], passes: int) -> tuple[int, float]:
    store = _open(root)
    try:
        append_produced(store, TOPIC_A, 0, batches[0])  # warm-up: the queue's files exist
        before = store.max_offset(TOPIC_A, 0)
        started = time.perf_counter()
        for _ in range(passes):
            for batch in batches:
                append_produced(store, TOPIC_A, 0, batch)
        records = store.max_offset(TOPIC_A, 0) - before  # waits for dispatch (readers see them)
        return records, time.perf_counter() - started
    finally:
        store.close()


def _prepare_floor(batch: bytes) -> tuple[np.ndarray, bytes, np.ndarray]:
    """What a C decoder would hand the C encoder: value offsets, the values and the
    records' timestamps. Made here, outside the timing (the floor assumes decoding
    costs nothing); put_batch_buffers copies the values out of ``values`` as a C
    decoder's encoder would copy them out of the batch."""
    header = BatchHeader._make(HEADER.unpack_from(batch, 0))
    records = decode_records(batch, 0, header, 0, header.records_count)
    lengths = [len(r.value) for r in records]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    stamps = np.array([r.timestamp_ms for r in records], dtype=np.int64)
    return offsets, b"".join(r.value for r in records), stamps


def produce_a_floor(
    root: str, batches: list[bytes], passes: int, prepared: list[Any]
) -> tuple[int, float]:
    store = _open(root)
    try:
        offsets, values, stamps = prepared[0]
        store.put_batch_buffers(TOPIC_A, 0, offsets, values, born_timestamp_ms=stamps)
        before = store.max_offset(TOPIC_A, 0)  # warm-up, as in produce_a_py
        started = time.perf_counter()
        for _ in range(passes):
            for batch, (offsets, values, stamps) in zip(batches, prepared, strict=True):
                check_produced(batch)
                store.put_batch_buffers(TOPIC_A, 0, offsets, values, born_timestamp_ms=stamps)
        records = store.max_offset(TOPIC_A, 0) - before
        return records, time.perf_counter() - started
    finally:
        store.close()


def produce_b(
    root: str, batches: list[bytes], passes: int, builder: CBuilder | None = None
) -> tuple[int, float]:
    """B; with ``builder``, every batch's records are also walked in C before the append
    (what Kafka's LogValidator checks), which B must do to store batches as they are."""
    store = _open(root)
    log = BatchLog(store)
    try:
        log.append(TOPIC_B, 0, bytearray(batches[0]))  # warm-up, as in produce_a_py
        store.max_offset(TOPIC_B, 0)
        before = log.end_offset(TOPIC_B, 0)
        started = time.perf_counter()
        for _ in range(passes):
            for batch in batches:
                if builder is not None:
                    builder.validate(batch, check_count(batch))
                log.append(TOPIC_B, 0, bytearray(batch))  # the request buffer, made writable
        store.max_offset(TOPIC_B, 0)
        elapsed = time.perf_counter() - started
        return log.end_offset(TOPIC_B, 0) - before, elapsed
    finally:
        store.close()


def produce_b2_units(root: str, batches: list[bytes], passes: int, group: int) -> tuple[int, float]:
    """One ConsumeQueue unit per Kafka record, all pointing into their batch (the unit's
    commitlog offset is batch position + record index, so they strictly increase as
    ConsumeQueue.put_batch demands): the cost B2 adds to B, measured alone. The units
    of ``group`` batches go in one put_batch, as a dispatch round that found that many
    batches of the queue would write them (1: every round finds one)."""
    counts = [check_produced(b).records_count for b in batches]
    sizes = [len(b) + HEADER_SIZE + len(TOPIC_B) + len(BATCH_TAG) for b in batches]
    store = ConsumeQueueStore.open(root, ConsumeQueueConfig())
    queue = store.queue(TOPIC_B, 0)
    # Columns per group of batches, made outside the timing (the dispatcher has them).
    groups = []
    for start in range(0, len(batches), group):
        physical = np.concatenate(
            [np.full(c, sum(sizes[:i]), np.int64) + np.arange(c) for i, c in
             zip(range(start, start + group), counts[start : start + group], strict=False)]
        )  # fmt: skip
        unit_sizes = np.repeat(np.array(sizes[start : start + group], np.int64),
                               counts[start : start + group])  # fmt: skip
        groups.append((physical, unit_sizes, np.zeros(len(physical), np.int64),
                       np.full(len(physical), 1_800_000_000_000, np.int64)))  # fmt: skip
    pass_bytes = sum(sizes)
    try:
        first = np.zeros(1, dtype=np.int64)
        queue.put_batch(0, first, first + 100, first, first + 1)  # warm-up: files exist
        offset = 1
        started = time.perf_counter()
        for number in range(passes):
            base = 1000 + number * pass_bytes
            for physical, unit_sizes, zero, stamp in groups:
                queue.put_batch(offset, base + physical, unit_sizes, zero, stamp)
                offset += len(physical)
        return offset - 1, time.perf_counter() - started
    finally:
        store.close()


def index_keys(root: str, batches: list[bytes], passes: int) -> tuple[int, float]:
    """The IndexFile entries of one Kafka key per record (what the dispatcher adds for
    query_by_key), alone: a cost both mappings pay if wire keys are indexed."""
    keyed = []
    for batch in batches:
        header = BatchHeader._make(HEADER.unpack_from(batch, 0))
        records = decode_records(batch, 0, header, 0, header.records_count)
        keyed.append([[r.key.decode()] for r in records])  # type: ignore[union-attr]
    store = _open(root)
    try:
        physical = 0
        store.index.put_batch([TOPIC_A], [["warm-up"]], [physical], [1])
        count = 0
        started = time.perf_counter()
        for _ in range(passes):
            for keys in keyed:
                n = len(keys)
                positions = list(range(physical + 1, physical + 1 + n * 200, 200))
                store.index.put_batch([TOPIC_A] * n, keys, positions, [1_800_000_000_000] * n)
                physical = positions[-1]
                count += n
        return count, time.perf_counter() - started
    finally:
        store.close()


# ---------------------------------------------------------------------- fetch


def fill_store(root: str, batches: list[bytes]) -> tuple[MessageStore, BatchLog, dict[str, float]]:
    """Both mappings of the same batches in one store; and the CommitLog bytes each
    took per record (ConsumeQueue units, 20 + 8 B per unit, and index entries aside)."""
    store = _open(root)
    log = BatchLog(store)
    used = {"A": 0, "B": 0}
    for batch in batches:
        before = store.commitlog.write_position
        append_produced(store, TOPIC_A, 0, batch)
        middle = store.commitlog.write_position
        log.append(TOPIC_B, 0, bytearray(batch))
        used["A"] += middle - before
        used["B"] += store.commitlog.write_position - middle
    records = store.max_offset(TOPIC_A, 0)
    wire = sum(len(b) for b in batches) / records
    footprint = {
        "wire_batch_bytes_per_record": wire,
        "A_commitlog_bytes_per_record": used["A"] / records,
        "B_commitlog_bytes_per_record": used["B"] / records,
    }
    return store, log, footprint


def _repeat(one_pass: Callable[[], int]) -> tuple[int, float]:
    """Run a whole-partition pass until CASE_SECONDS_MIN; (records, seconds)."""
    records, started = 0, time.perf_counter()
    while True:
        records += one_pass()
        elapsed = time.perf_counter() - started
        if elapsed >= CASE_SECONDS_MIN:
            return records, elapsed


def fetch_cases(
    store: MessageStore, log: BatchLog, builder: CBuilder, per_fetch: int, batch_bytes: int
) -> dict[str, Callable[[], tuple[int, float]]]:
    """Whole-partition readers, each fetch bounded like a 1 MiB Fetch (A: the same
    record count as B's 1 MiB of batches); ``batch_bytes`` bounds a tail fetch."""
    end = store.max_offset(TOPIC_A, 0)
    assert end == log.end_offset(TOPIC_B, 0)
    queue = store.consume_queues.queue(TOPIC_A, 0)
    first = store.get(TOPIC_A, 0, 0, 1)[0]
    tail_len = len(first.properties_raw) + len(first.body)  # key property + value
    out = np.zeros(4 * FETCH_BYTES, dtype=np.uint8)
    tail_records = check_produced(log.fetch(TOPIC_B, 0, 0, 1)[0]).records_count

    def a_py(count: int) -> Callable[[], int]:
        def one_pass() -> int:
            offset = 0
            while offset < end:
                offset += check_produced(
                    build_fetch_batch(store, TOPIC_A, 0, offset, count)
                ).records_count
            return end

        return one_pass  # fmt: skip

    def a_c(count: int, verify: bool) -> Callable[[], int]:
        def one_pass() -> int:
            offset = 0
            while offset < end:
                offset += builder.build(store, TOPIC_A, offset, count, verify)[1]
            return end

        return one_pass

    def a_memcpy() -> int:
        offset = 0
        while offset < end:
            units = queue.get_range(offset, per_fetch)
            mapped = store.commitlog.file_for(int(units["commitlog_offset"][0]))
            starts = units["commitlog_offset"] - mapped.start_offset + units["size"] - tail_len
            lengths = np.full(len(units), tail_len, dtype=np.int64)
            gather(mapped.mapping, starts, lengths, out)
            crc32c(memoryview(out)[: tail_len * len(units)])
            offset += len(units)
        return end

    def b(max_bytes: int, verify: bool) -> Callable[[], int]:
        def one_pass() -> int:
            offset = 0
            while offset < end:
                views = log.fetch(TOPIC_B, 0, offset, max_bytes, verify)
                offset = log_offset_after(views)
            return end

        return one_pass

    def log_offset_after(views: list[memoryview]) -> int:
        last = HEADER.unpack_from(views[-1], 0)
        return int(last[0] + last[6] + 1)  # base_offset + last_offset_delta + 1

    return {
        "A.py": lambda: _repeat(a_py(per_fetch)),
        "A.c": lambda: _repeat(a_c(per_fetch, True)),
        "A.c.nover": lambda: _repeat(a_c(per_fetch, False)),
        "A.memcpy": lambda: _repeat(a_memcpy),
        "B.get": lambda: _repeat(b(FETCH_BYTES, True)),
        "B.raw": lambda: _repeat(b(FETCH_BYTES, False)),
        "tail.A.c": lambda: _repeat(a_c(tail_records, True)),
        "tail.B.get": lambda: _repeat(b(batch_bytes, True)),
        "tail.B.raw": lambda: _repeat(b(batch_bytes, False)),
    }


# ---------------------------------------------------------------------- real clients


class RecordBackend:
    """Option A behind the wire harness; Fetch built in Python or with the C builder."""

    def __init__(self, store: MessageStore, builder: CBuilder | None) -> None:
        self.store = store
        self.builder = builder

    def produce(self, topic: str, partition: int, records: bytes) -> int:
        return append_produced(self.store, topic, partition, records)

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int) -> list[Any]:
        count = max(1, max_bytes // 128)  # records of ~128 B on the wire per fetch
        if self.builder is None:
            return [build_fetch_batch(self.store, topic, partition, offset, count)]
        return [bytes(self.builder.build(self.store, topic, offset, count, True)[0])]

    def end_offset(self, topic: str, partition: int) -> int:
        try:
            return self.store.max_offset(topic, partition)
        except KeyError:  # UnknownTopicError: nothing produced yet
            return 0


class BatchBackend:
    """Option B behind the wire harness."""

    def __init__(self, store: MessageStore) -> None:
        self.log = BatchLog(store)

    def produce(self, topic: str, partition: int, records: bytes) -> int:
        return self.log.append(topic, partition, bytearray(records))

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int) -> list[Any]:
        return self.log.fetch(topic, partition, offset, max_bytes, verify=True)

    def end_offset(self, topic: str, partition: int) -> int:
        return self.log.end_offset(topic, partition)


def client_factories(tmp: str, builder: CBuilder) -> dict[str, Callable[[], tuple[Any, Any]]]:
    def opened(make: Callable[[MessageStore], Any]) -> Callable[[], tuple[Any, Any]]:
        def factory() -> tuple[Any, Any]:
            root = tempfile.mkdtemp(dir=tmp)
            store = _open(root)

            def close() -> None:
                store.close()
                shutil.rmtree(root, ignore_errors=True)

            return make(store), close

        return factory

    return {
        "A.py": opened(lambda store: RecordBackend(store, None)),
        "A.c": opened(lambda store: RecordBackend(store, builder)),
        "B": opened(BatchBackend),
    }


# ---------------------------------------------------------------------- B elsewhere


def b_readers(store: MessageStore, log: BatchLog, limit: int) -> dict[str, float]:
    """ns per record for readers that want records, not batches: A's get()
    (read_records) against decoding B's stored batches in Python."""
    end = min(limit, store.max_offset(TOPIC_A, 0))

    def a_get() -> int:
        offset = 0
        while offset < end:
            offset += len(store.read_records(TOPIC_A, 0, offset, 1000))
        return end

    def b_decode() -> int:
        offset = 0
        while offset < end:
            for view in log.fetch(TOPIC_B, 0, offset, 1 << 16, True):
                header = BatchHeader._make(HEADER.unpack_from(view, 0))
                offset += len(decode_records(view, 0, header, offset, 1 << 20))
        return end

    out = {}
    for name, fn in (("A.read_records", a_get), ("B.decode_batches", b_decode)):
        records, seconds = _repeat(fn)
        out[name + "_ns_per_record"] = seconds / records * 1e9
    return out


# ---------------------------------------------------------------------- driver


def rounds(work: dict[str, Any], rounds_count: int, passes_b: int, tmp: str) -> dict[str, Any]:
    """Every round: the produce cases, the fetch cases, the readers, and one sample of
    every codec and decompression call, each group in an order rotated per round."""
    batches = work["batches"]
    codec_calls, codec_info = broker_codec.codec_calls(work)
    compression_calls, compression_info = broker_codec.compression_calls(_value)
    codec_runs: list[dict[str, float]] = []
    prepared = [_prepare_floor(batch) for batch in batches]
    builder = CBuilder(tmp)
    for batch in batches:  # the walk accepts every real batch (else B.walk measures errors)
        builder.validate(batch, check_count(batch))
    produce_runs: list[dict[str, float]] = []
    fetch_runs: list[dict[str, float]] = []
    footprint: dict[str, float] = {}
    readers: list[dict[str, float]] = []
    per_batch = work["records_per_batch_median"]
    for number in range(rounds_count):
        sample: dict[str, float] = {}
        cases: list[tuple[str, Callable[[str], tuple[int, float]]]] = [
            ("A.py", lambda r: produce_a_py(r, batches, 1)),
            ("A.floor", lambda r: produce_a_floor(r, batches, passes_b, prepared)),
            ("B", lambda r: produce_b(r, batches, passes_b)),
            ("B.walk", lambda r: produce_b(r, batches, passes_b, builder)),
            ("B2.units", lambda r: produce_b2_units(r, batches, passes_b, 1)),
            ("B2.units.x16", lambda r: produce_b2_units(r, batches, passes_b, 16)),
            ("index.keys", lambda r: index_keys(r, batches, 1)),
        ]
        shift = number % len(cases)
        for name, case in cases[shift:] + cases[:shift]:
            root = tempfile.mkdtemp(dir=tmp)
            try:
                records, seconds = case(root)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            sample[name + "_ns_per_record"] = seconds / records * 1e9
            sample[name + "_records_per_s"] = records / seconds
        produce_runs.append(sample)
        root = tempfile.mkdtemp(dir=tmp)
        store, log, footprint = fill_store(root, batches)
        try:
            per_fetch = int(round(FETCH_BYTES / work["batch_bytes_median"]) * per_batch)
            fetches = fetch_cases(store, log, builder, per_fetch, int(work["batch_bytes_median"]))
            names = list(fetches)
            shift = number % len(names)
            sample = {}
            for name in names[shift:] + names[:shift]:
                records, seconds = fetches[name]()
                sample[name + "_ns_per_record"] = seconds / records * 1e9
                sample[name + "_records_per_s"] = records / seconds
            fetch_runs.append(sample)
            readers.append(b_readers(store, log, 40_000))
            codec_runs.append(broker_codec.time_calls({**codec_calls, **compression_calls}, number))
        finally:
            store.close()
            shutil.rmtree(root, ignore_errors=True)
        print(f"round {number + 1}/{rounds_count} done", flush=True)
    codec_us = summarize(codec_runs)
    for name, entry in compression_info.items():
        if name + "_decompress" in codec_us:
            entry["decompress_us_per_batch"] = codec_us[name + "_decompress"]
            entry["decompress_us_per_batch_range"] = codec_us[name + "_decompress_range"]
            entry["decompress_ns_per_record"] = (
                entry["decompress_us_per_batch"] * 1e3 / entry["records"]
            )
    return {
        "produce": summarize(produce_runs),
        "fetch": summarize(fetch_runs),
        "readers": summarize(readers),
        "codec": {
            **codec_info,
            "timings_us": {
                k: v
                for k, v in codec_us.items()
                if not k.split("_range")[0].endswith("_decompress")
            },
        },
        "compression": compression_info,
        "footprint": footprint,
        "records_per_fetch_A": int(round(FETCH_BYTES / work["batch_bytes_median"]) * per_batch),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=600, help="captured batches per pass")
    parser.add_argument("--passes-b", type=int, default=5, help="passes over them for B cases")
    parser.add_argument("--quick", action="store_true", help="2 rounds, 100 batches")
    parser.add_argument("--out", default="bench/results/broker_mapping.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.batches, args.passes_b = 2, 100, 2
    tmp = tempfile.mkdtemp(prefix="mqstore-broker-")
    started = time.time()
    load_before = load_sample()
    try:
        work = workload(args.batches)
        print(
            f"workload: {len(work['batches'])} batches from {work['source']}, "
            f"{work['records_per_batch_median']:.0f} records / "
            f"{work['batch_bytes_median']:.0f} B per batch",
            flush=True,
        )
        measured = rounds(work, args.rounds, args.passes_b, tmp)
        try:
            clients = broker_codec.client_checks(client_factories(tmp, CBuilder(tmp)), _value)
        except Exception as error:  # keep the figures measured so far
            clients = {"error": f"{type(error).__name__}: {error}"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "command": " ".join(
            [sys.executable, "-m", "bench.broker_mapping", *(argv or sys.argv[1:])]
        ),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds": time.time() - started,
        "machine": machine_info(),
        "load_before": load_before,
        "load_after": load_sample(),
        "workload": {k: v for k, v in work.items() if k not in ("batches", "frames")},
        **measured,
        "clients": clients,
    }
    print_summary(result)
    write_results(args.out, result)
    return 0


def print_summary(result: dict[str, Any]) -> None:
    for section in ("produce", "fetch"):
        print(f"{section} (ns per record, median; records/s)")
        for key, value in result[section].items():
            if key.endswith("_ns_per_record"):
                name = key[: -len("_ns_per_record")]
                rate = result[section][name + "_records_per_s"]
                print(f"  {name:12s} {value:10.1f} ns   {rate:14,.0f} /s")
    print(
        "readers", {k: round(v, 1) for k, v in result["readers"].items() if not k.endswith("range")}
    )
    timings = result["codec"]["timings_us"]
    print("codec µs", {k: round(v, 2) for k, v in timings.items() if not k.endswith("range")})
    print("compression", result["compression"])
    print("clients", result["clients"])


if __name__ == "__main__":
    raise SystemExit(main())
