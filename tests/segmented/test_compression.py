"""Producers' batches stored as they came (SegmentedStore.append_batch,
batch_builder.adopt), compressed ones included (segmented.compression): read back
record by record, recovered after a crash, compacted, and bad ones refused whole."""

from __future__ import annotations

import os

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    InvalidRecordError,
    LimitExceededError,
)
from mqstore.engine import TIMESTAMP_LOG_APPEND_TIME
from mqstore.segmented import SegmentedConfig, SegmentedStore
from mqstore.segmented.compression import (
    CODEC_NAMES,
    CodecUnavailableError,
    InflateError,
    InflateLimitError,
    inflate,
)
from mqstore.segmented.record_batch import HEADER, HEADER_SIZE, BatchHeader

from .conftest import SMALL


def produced(codec: str = "none", count: int = 20, keyed: bool = True, first: int = 0) -> bytes:
    """A batch as a client builds it (kafka-python's builder, a producer id set)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=CODEC_NAMES.index(codec), is_transactional=False,
        producer_id=77, producer_epoch=1, base_sequence=first, batch_size=1 << 24,
    )  # fmt: skip
    for i in range(count):
        key = b"k%d" % ((first + i) % 5) if keyed else None
        builder.append(i, timestamp=1_000 + i, key=key, value=b"value-%d" % (first + i),
                       headers=[("h", b"x")] if i == 1 else [])  # fmt: skip
    return bytes(builder.build())


def stored(store: SegmentedStore, topic: str) -> bytes:
    segment = store._logs[(topic, 0)].segments[0]
    return os.pread(segment.fileno(), segment.size_bytes, 0)


@pytest.mark.parametrize("codec", CODEC_NAMES)
def test_a_producers_batch_is_stored_as_it_came_and_reads_back(open_store, codec):
    store = open_store()
    store.create_topic("t")
    batch = produced(codec)
    appended = store.append_batch("t", 0, batch)
    assert (appended.base_offset, appended.record_count) == (0, 20)
    assert appended.max_timestamp_ms == 1_019
    second = store.append_batch("t", 0, produced(codec, first=20))
    assert second.base_offset == 20
    data = stored(store, "t")
    assert data[8 : len(batch)] == batch[8:]  # all but the base offset: the same bytes
    records = store.read_records("t", 0, 3, 100)  # inside the first batch
    assert [r.offset for r in records] == list(range(3, 40))
    assert records[0].value == b"value-3" and records[0].timestamp_ms == 1_003
    assert store.read_records("t", 0, 1, 1)[0].headers == [("h", b"x")]


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_stored_batches_survive_a_crash_and_a_compaction(open_store, tmp_path, codec):
    config = SegmentedConfig(**{**SMALL, "segment_bytes": 1 << 20})
    store = open_store(config)
    store.create_topic("c", topic_configs={"cleanup.policy": "compact"})
    for first in range(0, 100, 20):
        store.append_batch("c", 0, produced(codec, first=first))
    store._crash()
    store = open_store(config)
    assert store.recovered_from_crash and store.latest_offset("c", 0) == 100
    store._logs[("c", 0)].roll()
    assert store.compact("c")
    latest = {r.key: r.offset for r in store.read_records("c", 0, 0, 1000)}
    assert sorted(latest.values()) == [95, 96, 97, 98, 99]  # the last of each of 5 keys


def test_log_append_time_rewrites_the_max_timestamp_and_the_crc(open_store, clock):
    store = open_store()
    store.create_topic("t", timestamp_type="LogAppendTime")
    appended = store.append_batch("t", 0, produced("gzip"))
    assert appended.max_timestamp_ms == clock.now_ms
    header = BatchHeader._make(HEADER.unpack_from(stored(store, "t")))
    assert header.attributes & 0x08 and header.max_timestamp == clock.now_ms
    assert crc32c(stored(store, "t")[21:]) == header.crc
    record = store.read_records("t", 0, 0, 1)[0]
    assert record.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    assert record.timestamp_ms == clock.now_ms


def _flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 1]) + data[position + 1 :]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (lambda: produced()[:-1], InvalidArgumentError),  # cut short
        (lambda: produced() + b"\x00", InvalidArgumentError),  # bytes after it
        (lambda: _flip(produced(), 70), InvalidArgumentError),  # a bit under the CRC
        (lambda: produced(keyed=False), InvalidRecordError),  # compacted: keys needed
        (lambda: produced(count=3000), LimitExceededError),  # over max_message_size
    ],
)
def test_a_bad_batch_is_refused_whole(open_store, bad, error):
    store = open_store(SegmentedConfig(**{**SMALL, "max_message_size_bytes": 4096}))
    store.create_topic("c", topic_configs={"cleanup.policy": "compact"})
    with pytest.raises(error):
        store.append_batch("c", 0, bad())
    assert store.latest_offset("c", 0) == 0 and stored(store, "c") == b""


def test_a_corrupt_compressed_body_on_disk_is_corrupt_data(open_store):
    store = open_store()
    store.create_topic("t")
    store.append_batch("t", 0, produced("zstd"))
    segment = store._logs[("t", 0)].segments[0]
    body = bytearray(stored(store, "t"))
    body[HEADER_SIZE + 4 : HEADER_SIZE + 12] = b"\xff" * 8  # inside the zstd frame
    body[17:21] = crc32c(bytes(body[21:])).to_bytes(4, "big")  # a valid CRC over it
    os.pwrite(segment.fileno(), bytes(body), 0)
    with pytest.raises(CorruptDataError) as caught:
        store.read_records("t", 0, 0, 10)
    assert caught.value.path == segment.log_path and "compressed" in caught.value.reason


def test_inflate_is_bounded_and_its_failures_typed():
    import zlib

    bomb = zlib.compressobj(wbits=31)
    gzip = bomb.compress(b"\x00" * (1 << 20)) + bomb.flush()
    assert len(inflate(1, gzip)) == 1 << 20
    with pytest.raises(InflateLimitError):
        inflate(1, gzip, limit=1 << 16)
    with pytest.raises(InflateError):
        inflate(1, gzip[:-10])
    with pytest.raises(CodecUnavailableError):
        inflate(5, gzip)
